"""The chunked host loop every algorithm's `main` uses.

An algorithm supplies three pure functions for one seed:

    init(key) -> state
    update(state) -> (state, metrics)      # one iteration; metrics: dict of [] arrays
    evaluate(state, key) -> returns [E]    # greedy episodes at the end

and `run` does the rest: vmaps them over `num_seeds` seeds (seed index i uses
`jax.random.key(args.seed + i)`), jits `log_every` updates as one `lax.scan`
("a chunk") with the state donated so XLA updates it in place, and between
chunks writes metrics, the progress line and checkpoints. Nothing leaves the
device inside a chunk. The chunk is traced and compiled once: the last, partial
chunk runs the same compiled scan with the surplus updates skipped by a
`lax.cond` on the update counter. The evaluation is compiled on a background
thread while training runs, so its compile time is hidden.

The `args` dataclass must have the shared fields: exp_name, seed, num_seeds,
env_id, log_every, track, tensorboard, save_model, checkpoint_every, resume,
run_root, eval_episodes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from common import checkpoint, logger


@dataclass
class RunResult:
    """What `run` (and so every algorithm's `main`) returns."""

    run_dir: str
    state: Any  # final runner state, leaves [num_seeds, ...]
    metrics: dict[str, np.ndarray]  # [num_seeds, updates run in this process]
    eval_returns: np.ndarray  # [num_seeds, eval_episodes]
    chunk_traces: int  # times the chunk function was traced: 1 means compiled once
    train_seconds: float  # wall time of the training loop, compile included


def seed_keys(args) -> jax.Array:
    """One typed key per seed index: `key(seed + i)`, so `--seed 3 --num-seeds 1`
    reproduces seed index 3 of a multi-seed run."""
    return jax.vmap(jax.random.key)(args.seed + jnp.arange(args.num_seeds))


def make_chunk(update: Callable, num_updates: int, log_every: int) -> tuple[Callable, Callable[[], int]]:
    """`chunk(state, first_update) -> (state, metrics)`: `log_every` updates of
    one seed in a `lax.scan`; updates numbered past `num_updates` are skipped.
    Returns the chunk and a function giving how often it has been traced."""
    traces = 0

    def chunk(state, first_update):
        nonlocal traces
        traces += 1
        metrics_shape = jax.eval_shape(update, state)[1]

        def skip(state):
            return state, jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype), metrics_shape)

        def step(state, index):
            active = index <= num_updates  # `index` counts from 1
            state, metrics = jax.lax.cond(active, update, skip, state)
            return state, {**metrics, "active": active, "update": index}

        return jax.lax.scan(step, state, first_update + 1 + jnp.arange(log_every))

    return chunk, lambda: traces


def run(
    args,
    init: Callable,
    update: Callable,
    evaluate: Callable,
    *,
    num_updates: int,
    steps_per_update: int,
) -> RunResult:
    """Train `num_seeds` seeds for `num_updates` updates and evaluate them.

    `steps_per_update` (env steps per seed per update) turns update counts into
    the `global_step` column. With `args.resume` set, the state and the update
    counter come from the newest checkpoint of that run directory.
    """
    chunk, trace_count = make_chunk(update, num_updates, args.log_every)
    run_chunk = jax.jit(jax.vmap(chunk, in_axes=(0, None)), donate_argnums=0)
    keys = seed_keys(args)
    vmapped_init = jax.vmap(init)
    updates_done = 0
    if args.resume is not None:
        state, updates_done = checkpoint.restore(args.resume, jax.eval_shape(vmapped_init, keys))
        state = jax.device_put(state)
    else:
        state = jax.jit(vmapped_init)(keys)
    run_log = logger.Run(
        args, args.resume, total_steps=num_updates * steps_per_update, tensorboard=args.tensorboard,
        track=args.track, resume_from_update=updates_done if args.resume else None,
    )
    run_log.print(
        f"{args.env_id}: {args.num_seeds} seed(s) x {num_updates} updates x {steps_per_update} steps "
        f"-> {run_log.dir}" + (f" (resumed at update {updates_done})" if args.resume else "")
    )

    eval_keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)
    eval_fn = jax.jit(jax.vmap(evaluate))
    abstract = (jax.eval_shape(vmapped_init, keys), eval_keys)
    compiled_eval: list = []
    eval_compiler = threading.Thread(
        target=lambda: compiled_eval.append(eval_fn.lower(*abstract).compile()), daemon=True
    )

    history: dict[str, list[np.ndarray]] = {}
    last_checkpoint = updates_done
    start = time.perf_counter()
    while updates_done < num_updates:
        chunk_start = time.perf_counter()
        state, metrics = run_chunk(state, jnp.int32(updates_done))
        metrics = jax.device_get(metrics)
        elapsed = time.perf_counter() - chunk_start
        active = metrics.pop("active")[0]
        update_index = metrics.pop("update")[0][active]
        metrics = {k: v[:, active] for k, v in metrics.items()}
        metrics["steps_per_second"] = np.full(
            (args.num_seeds, len(update_index)), len(update_index) * steps_per_update * args.num_seeds / elapsed
        )
        run_log.log(update_index, update_index * steps_per_update, metrics)
        for k, v in metrics.items():
            history.setdefault(k, []).append(v)
        if not eval_compiler.is_alive() and not compiled_eval:
            run_log.print(f"first chunk (compile + {len(update_index)} updates): {elapsed:.1f}s")
            eval_compiler.start()  # compiles while the next chunks run
        updates_done = int(update_index[-1])
        due = updates_done - last_checkpoint >= args.checkpoint_every or updates_done == num_updates
        if args.save_model and due:
            checkpoint.save(run_log.dir, updates_done, state)
            last_checkpoint = updates_done
    train_seconds = time.perf_counter() - start
    run_log.progress(updates_done * steps_per_update, final=True)

    if not compiled_eval and not eval_compiler.is_alive():
        eval_compiler.start()  # resumed at the end: nothing ran
    eval_compiler.join()
    eval_returns = np.asarray(compiled_eval[0](state, eval_keys))
    run_log.print(
        f"greedy evaluation, {args.eval_episodes} episodes x {args.num_seeds} seed(s): "
        f"{eval_returns.mean():.2f} +- {eval_returns.std():.2f} (per seed: "
        + ", ".join(f"{r:.1f}" for r in eval_returns.mean(1))
        + f"); training loop {train_seconds:.1f}s"
    )
    run_log.write_json(
        "eval.json",
        {"returns": eval_returns, "mean": float(eval_returns.mean()), "train_seconds": train_seconds,
         "chunk_traces": trace_count()},
    )
    run_log.close()
    stacked = {k: np.concatenate(v, axis=1) for k, v in history.items()}
    return RunResult(str(run_log.dir), state, stacked, eval_returns, trace_count(), train_seconds)
