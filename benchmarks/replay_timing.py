"""Replay speed: common/buffers.py against flashbax, the maintained JAX replay
library PureJaxRL's dqn.py uses, at the `dqn` preset's sizes.

    python benchmarks/replay_timing.py --flashbax-dir /path/with/flashbax

One step = add one transition from each of 10 envs, then sample a batch of 128
(uniform), or sample and write 128 new priorities (prioritized, alpha 0.5);
1,000 steps in one `lax.scan` from a full 10k-transition buffer, vmapped over
8 seeds, compiled first, median of --repeats runs. flashbax is not a
dependency of this project: point --flashbax-dir at a folder that has it
(`pip install --no-deps --target DIR flashbax`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxzoo import buffers  # noqa: E402

SEEDS, ENVS, CAPACITY, BATCH, STEPS, ALPHA = 8, 10, 10_000, 128, 1_000, 0.5
OBS = 4  # CartPole


def transition(key):
    """One step of every env: obs, action, reward, terminated, next obs."""
    obs = jax.random.normal(key, (ENVS, OBS))
    return {"obs": obs, "action": jnp.zeros(ENVS, jnp.int32), "reward": jnp.ones(ENVS),
            "terminated": jnp.zeros(ENVS, bool), "next_obs": obs}


def ours(prioritized: bool):
    example = jax.tree.map(lambda x: x[0], transition(jax.random.key(0)))

    def init(key):
        buffer = buffers.init(example, CAPACITY, ENVS)
        return jax.lax.fori_loop(0, CAPACITY // ENVS, lambda i, b: buffers.add(b, transition(jax.random.fold_in(key, i))), buffer)

    def step(buffer, key):
        add_key, sample_key = jax.random.split(key)
        buffer = buffers.add(buffer, transition(add_key))
        sample = buffers.sample(buffer, sample_key, BATCH, 1, ALPHA if prioritized else None)
        if prioritized:
            buffer = buffers.set_priorities(buffer, sample.rows, sample.envs, sample.windows["reward"][:, 0] + 0.5)
        return buffer, sample.windows["obs"].sum()

    return init, step


def flashbax_buffer(prioritized: bool):
    import flashbax  # noqa: PLC0415

    kwargs = dict(max_length=CAPACITY, min_length=BATCH, sample_batch_size=BATCH, add_batch_size=ENVS)
    fbx = flashbax.make_prioritised_flat_buffer(**kwargs, priority_exponent=ALPHA) if prioritized else flashbax.make_flat_buffer(**kwargs)
    example = jax.tree.map(lambda x: x[0], transition(jax.random.key(0)))

    def init(key):
        state = fbx.init(example)
        return jax.lax.fori_loop(0, CAPACITY // ENVS, lambda i, s: fbx.add(s, transition(jax.random.fold_in(key, i))), state)

    def step(state, key):
        add_key, sample_key = jax.random.split(key)
        state = fbx.add(state, transition(add_key))
        sample = fbx.sample(state, sample_key)
        if prioritized:
            state = fbx.set_priorities(state, sample.indices, sample.experience.first["reward"] + 0.5)
        return state, sample.experience.first["obs"].sum()

    return init, step


def time_buffer(init, step, repeats: int) -> float:
    """Median seconds of STEPS add + sample steps from a full buffer, SEEDS seeds vmapped."""
    keys = jax.random.split(jax.random.key(1), SEEDS)
    full = jax.jit(jax.vmap(init))(keys)
    run = jax.vmap(lambda state, key: jax.lax.scan(step, state, jax.random.split(key, STEPS))[1].sum())
    compiled = jax.jit(run).lower(full, keys).compile()
    jax.block_until_ready(compiled(full, keys))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(full, keys))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flashbax-dir", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.flashbax_dir is not None:
        sys.path.insert(0, str(args.flashbax_dir))
    print(f"{SEEDS} seeds x {STEPS:,} steps of add {ENVS} + sample {BATCH}, buffer {CAPACITY:,}; median of {args.repeats}")
    for prioritized in (False, True):
        kind = "prioritized" if prioritized else "uniform"
        print(f"{kind:12s} common/buffers.py: {time_buffer(*ours(prioritized), args.repeats) * 1e3:8.1f} ms")
        if args.flashbax_dir is not None:
            print(f"{kind:12s} flashbax:          {time_buffer(*flashbax_buffer(prioritized), args.repeats) * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
