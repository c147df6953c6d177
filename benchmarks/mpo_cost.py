"""Milliseconds per MPO learner step (one seed, jitted, after compiling) at
several sizes: what decides how long an MPO run takes on a CPU. With
`--seeds 1 4` a second column times the step vmapped over 4 seeds, as the
4-seed runs take it.

    PYTHONPATH=. python benchmarks/mpo_cost.py [--seeds 1 4] [--sizes ablation]

`--sizes pendulum` times only the `pendulum` preset's row (the one
benchmarks/speed.py compares with Stoix's). `--sizes ablation` times the
256-256, batch 128 step with one piece changed at a time (1 sampled action,
batch 64, 8-8 networks) and adds XLA's own count of
the compiled step (GFLOP, fused kernels, matrix products): where the update's
time goes (docs/performance.md).

Each learner step runs the target critic on batch x num_samples sampled actions
twice (the E-step at s, the expected value at s') plus the critic, dual and
M-step updates. Prints a markdown table (median of 5 timings of 20 steps, each
timing one compiled call that scans the 20 steps, as a run's loop does).
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
PENDULUM_256 = dict(policy_layers=(256, 256), critic_layers=(256, 256), batch_size=128, num_samples=10)
ABLATION = [  # (label, Args overrides): the 256-256 step with one piece changed
    ("256-256 networks, batch 128 x 10 samples", PENDULUM_256),
    ("the same, 1 sampled action", {**PENDULUM_256, "num_samples": 1}),
    ("the same, batch 64", {**PENDULUM_256, "batch_size": 64}),
    ("the same, 8-8 networks", {**PENDULUM_256, "policy_layers": (8, 8), "critic_layers": (8, 8)}),
    (
        "64-64 networks, batch 128 x 10 samples (`pendulum` preset)",
        {**PENDULUM_256, "policy_layers": (64, 64), "critic_layers": (64, 64)},
    ),
]


def compiled_counts(overrides: dict) -> str:
    """XLA's cost analysis of the compiled 1-seed step: GFLOP, fused kernels, matrix products."""
    args = mpo.Args(**overrides)
    algo = mpo.make_train(args)
    state = algo.init(jax.random.key(0))
    windows = jax.tree.map(lambda x: jnp.ones((args.batch_size, args.n_step) + x.shape[2:], x.dtype), state.buffer.data)
    compiled = jax.jit(algo.learner_step).lower(state.learner, windows, jax.random.key(1)).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    text = compiled.as_text()
    return f"{cost.get('flops', 0.0) / 1e9:.3f} | {text.count('fusion(')} | {text.count(' dot(')}"


def milliseconds_per_step(overrides: dict, seeds: int = 1, steps: int = 20, repeats: int = 5) -> float:
    """Median over `repeats` of (one compiled call running `steps` learner steps
    in a `lax.scan`) / steps: the way a run executes them, inside its jitted
    loop. Calling a jitted step from Python once per step instead adds the
    host's dispatch (flattening the NNX state's 70-odd Variables, making the
    key): 1-2 ms a step here, more than the whole 64-64 step itself."""
    args = mpo.Args(**overrides)
    algo = mpo.make_train(args)
    keys = jax.random.split(jax.random.key(0), seeds)
    state = jax.vmap(algo.init)(keys)
    # A batch of windows [seeds, B, n] with the buffer's leaf shapes; the values do not change the cost.
    windows = jax.tree.map(
        lambda x: jnp.ones((seeds, args.batch_size, args.n_step) + x.shape[3:], x.dtype), state.buffer.data
    )
    step = jax.vmap(algo.learner_step)

    @jax.jit
    def run_steps(learner, key):
        def one(learner, key):
            learner, metrics = step(learner, windows, jax.random.split(key, seeds))
            return learner, metrics["critic_loss"]

        return jax.lax.scan(one, learner, jax.random.split(key, steps))[0]

    learner = jax.block_until_ready(run_steps(state.learner, jax.random.key(1)))
    timings = []
    for repeat in range(repeats):
        start = time.perf_counter()
        learner = jax.block_until_ready(run_steps(learner, jax.random.key(repeat)))
        timings.append((time.perf_counter() - start) / steps * 1e3)
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1], help="seed counts to time (vmapped)")
    parser.add_argument("--sizes", choices=["sizes", "pendulum", "ablation"], default="sizes")
    cli_args = parser.parse_args()
    ablation = cli_args.sizes == "ablation"
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(
        f"machine: {cpu}, {os.cpu_count()} cores, {platform.system()}, jax {jax.__version__}, "
        f"load average {os.getloadavg()[0]:.1f}\n"
    )
    columns = [f"ms per step ({n} seed{'s' if n > 1 else ''})" for n in cli_args.seeds]
    columns += ["GFLOP", "fused kernels", "matrix products"] if ablation else []
    print(f"| learner step | {' | '.join(columns)} |\n| --- |{' --- |' * len(columns)}")
    rows = {"sizes": SIZES, "pendulum": SIZES[-1:], "ablation": ABLATION}[cli_args.sizes]
    for label, overrides in rows:
        cells = [f"{milliseconds_per_step(overrides, n):.2f}" for n in cli_args.seeds]
        cells += [compiled_counts(overrides)] if ablation else []
        print(f"| {label} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
