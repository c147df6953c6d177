"""Time the compiled training loop alone: this file's `train` against PureJaxRL's
`make_train` (dqn.py) at equal settings, both as `jax.jit(jax.vmap(train))` over
seeds, compiled first, minimum of `--repeats` runs. Whole processes (imports,
compiling, evaluation, checkpoints) are timed by `bash benchmarks/rainbow.sh timing`.

    python benchmarks/rainbow_loop_timing.py --seeds 8 --steps 100000 \
        --purejaxrl-dir /path/to/harness   # holds PureJaxRL's dqn.py and run_dqn_lib.py

PureJaxRL's code is not part of this repository; without --purejaxrl-dir only
this file's loop is timed. The harness directory's run_dqn_lib.py is run_dqn.py
without its last line (`dqn.main()`): importing it adapts gymnax >= 1.0 and stubs
wandb so that dqn.py imports unchanged (docs/rainbow.md, Speed).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax

from jaxzoo.algos import rainbow  # noqa: E402


def time_compiled(train, keys, repeats: int) -> tuple[float, float, float]:
    """(compile CPU s, min run wall s, min run CPU s) of jit(vmap(train))(keys)."""
    cpu_start = time.process_time()
    compiled = jax.jit(jax.vmap(train)).lower(keys).compile()
    compile_cpu = time.process_time() - cpu_start
    walls, cpus = [], []
    for _ in range(repeats):
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        jax.block_until_ready(compiled(keys))
        walls.append(time.perf_counter() - wall_start)
        cpus.append(time.process_time() - cpu_start)
    return compile_cpu, min(walls), min(cpus)


def purejaxrl_train(harness: Path, steps: int, seeds: int):
    """PureJaxRL dqn.py's make_train with the settings of the `dqn` preset."""
    sys.path[:0] = [str(harness / "site"), str(harness)]
    import dqn  # noqa: PLC0415 (PureJaxRL's file, unchanged)
    import run_dqn_lib  # noqa: F401, PLC0415 (the harness: patches gymnax's LogWrapper, stubs wandb)

    config = {
        "NUM_ENVS": 10, "BUFFER_SIZE": 10_000, "BUFFER_BATCH_SIZE": 128, "TOTAL_TIMESTEPS": float(steps),
        "EPSILON_START": 1.0, "EPSILON_FINISH": 0.05, "EPSILON_ANNEAL_TIME": 0.5 * steps,
        "TARGET_UPDATE_INTERVAL": 500, "LR": 2.5e-4, "LEARNING_STARTS": 10_000, "TRAINING_INTERVAL": 10,
        "LR_LINEAR_DECAY": False, "GAMMA": 0.99, "TAU": 1.0, "ENV_NAME": "CartPole-v1", "SEED": 0,
        "NUM_SEEDS": seeds, "WANDB_MODE": "disabled",
    }
    return dqn.make_train(config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--purejaxrl-dir", type=Path, default=None)
    args = parser.parse_args()
    keys = jax.random.split(jax.random.key(0), args.seeds)
    ours = rainbow.make_train(rainbow.Args(total_timesteps=args.steps, num_seeds=args.seeds))
    timings = {"jaxzoo": time_compiled(ours.train, keys, args.repeats)}
    if args.purejaxrl_dir is not None:
        legacy_keys = jax.random.split(jax.random.PRNGKey(0), args.seeds)  # dqn.py splits raw uint32 keys
        train = purejaxrl_train(args.purejaxrl_dir, args.steps, args.seeds)
        timings["purejaxrl"] = time_compiled(train, legacy_keys, args.repeats)
    print(f"{args.seeds} seed(s) x {args.steps:,} steps, min of {args.repeats} runs, compile excluded")
    for name, (compile_cpu, wall, cpu) in timings.items():
        print(f"{name:10s} compile {compile_cpu:5.1f} s CPU | loop {wall:6.2f} s wall, {cpu:6.2f} s CPU")


if __name__ == "__main__":
    main()
