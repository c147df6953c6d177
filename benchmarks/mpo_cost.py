"""Milliseconds per MPO learner step (one seed, jitted, after compiling) at
several sizes: what decides how long an MPO run takes on a CPU. With
`--seeds 1 4` a second column times the step vmapped over 4 seeds, as the
4-seed runs take it.

    PYTHONPATH=. python benchmarks/mpo_cost.py [--seeds 1 4]

Each learner step runs the target critic on batch x num_samples sampled actions
twice (the E-step at s, the expected value at s') plus the critic, dual and
M-step updates. Prints a markdown table (median of 5 timings of 20 steps).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp

from jaxzoo.algos import mpo

SIZES = [  # (label, Args overrides)
    ("seed 004 / Acme defaults: networks 256x3 / 512-512-256, batch 256 x 20 samples", {}),
    ("256-256 networks, batch 256 x 20 samples", dict(policy_layers=(256, 256), critic_layers=(256, 256))),
    (
        "256-256 networks, batch 128 x 10 samples (`pendulum` preset until 2026-11-27)",
        dict(policy_layers=(256, 256), critic_layers=(256, 256), batch_size=128, num_samples=10),
    ),
    (
        "64-64 networks, batch 128 x 10 samples (`pendulum` preset)",
        dict(policy_layers=(64, 64), critic_layers=(64, 64), batch_size=128, num_samples=10),
    ),
]


def milliseconds_per_step(overrides: dict, seeds: int = 1, steps: int = 20, repeats: int = 5) -> float:
    args = mpo.Args(**overrides)
    algo = mpo.make_train(args)
    keys = jax.random.split(jax.random.key(0), seeds)
    state = jax.vmap(algo.init)(keys)
    # A batch of windows [seeds, B, n] with the buffer's leaf shapes; the values do not change the cost.
    windows = jax.tree.map(
        lambda x: jnp.ones((seeds, args.batch_size, args.n_step) + x.shape[3:], x.dtype), state.buffer.data
    )
    step = jax.jit(jax.vmap(algo.learner_step))
    learner, _ = step(state.learner, windows, keys)
    jax.block_until_ready(learner)
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(steps):
            learner, _ = step(learner, windows, jax.random.split(jax.random.key(i), seeds))
        jax.block_until_ready(learner)
        timings.append((time.perf_counter() - start) / steps * 1e3)
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1], help="seed counts to time (vmapped)")
    seed_counts = parser.parse_args().seeds
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(
        f"machine: {cpu}, {os.cpu_count()} cores, {platform.system()}, jax {jax.__version__}, "
        f"load average {os.getloadavg()[0]:.1f}\n"
    )
    columns = " | ".join(f"ms per step ({n} seed{'s' if n > 1 else ''})" for n in seed_counts)
    print(f"| learner step | {columns} |\n| --- |{' --- |' * len(seed_counts)}")
    for label, overrides in SIZES:
        times = " | ".join(f"{milliseconds_per_step(overrides, n):.1f}" for n in seed_counts)
        print(f"| {label} | {times} |", flush=True)


if __name__ == "__main__":
    main()
