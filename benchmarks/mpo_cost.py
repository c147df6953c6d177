"""Milliseconds per MPO learner step (one seed, jitted, after compiling) at
several sizes: what decides how long an MPO run takes on a CPU.

    PYTHONPATH=. python benchmarks/mpo_cost.py

Each learner step runs the target critic on batch x num_samples sampled actions
twice (the E-step at s, the expected value at s') plus the critic, dual and
M-step updates. Prints a markdown table (median of 5 timings of 20 steps).
"""

from __future__ import annotations

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
    ("256-256 networks, batch 128 x 10 samples (`pendulum` preset)",
     dict(policy_layers=(256, 256), critic_layers=(256, 256), batch_size=128, num_samples=10)),
]


def milliseconds_per_step(overrides: dict, steps: int = 20, repeats: int = 5) -> float:
    args = mpo.Args(**overrides)
    algo = mpo.make_train(args)
    state = algo.init(jax.random.key(0))
    # A batch of windows [B, n] with the buffer's leaf shapes; the values do not change the cost.
    windows = jax.tree.map(lambda x: jnp.ones((args.batch_size, args.n_step) + x.shape[2:], x.dtype), state.buffer.data)
    step = jax.jit(algo.learner_step)
    learner, _ = step(state.learner, windows, jax.random.key(1))
    jax.block_until_ready(learner)
    timings = []
    for repeat in range(repeats):
        start = time.perf_counter()
        for i in range(steps):
            learner, _ = step(learner, windows, jax.random.key(i))
        jax.block_until_ready(learner)
        timings.append((time.perf_counter() - start) / steps * 1e3)
    return statistics.median(timings)


def main() -> None:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"machine: {cpu}, {os.cpu_count()} cores, {platform.system()}, jax {jax.__version__}, "
          f"load average {os.getloadavg()[0]:.1f}\n")
    print("| learner step | ms per step (1 seed) |\n| --- | --- |")
    for label, overrides in SIZES:
        print(f"| {label} | {milliseconds_per_step(overrides):.1f} |", flush=True)


if __name__ == "__main__":
    main()
