"""The chunked host loop every algorithm's `main` uses.

An algorithm supplies three pure functions for one seed:

    init(key) -> state
    update(state) -> (state, metrics)      # one iteration; metrics: dict of [] arrays
    evaluate(state, key) -> returns [E]    # greedy episodes at the end

and `run` does the rest: vmaps them over `num_seeds` seeds (seed index i uses
`jax.random.key(args.seed + i)`, so `--seed 3 --num-seeds 1` reproduces seed
index 3 of a multi-seed run), jits `log_every` updates as one `lax.scan`
("a chunk") with the state donated so XLA updates it in place, and between
chunks writes metrics, the progress line and checkpoints. Nothing leaves the
device inside a chunk. The chunk is traced and compiled once: the last, partial
chunk runs the same compiled scan with the surplus updates skipped by a
`lax.cond` on the update counter. `init` and `evaluate` run once, so they are
compiled without LLVM optimisation (half the compile time, which matters more
than their run time) and on a background thread: `init` while Python traces the
chunk, the evaluation while training runs, so most of their compile time is
hidden.

The `args` dataclass must have the shared fields: exp_name, seed, num_seeds,
env_id, log_every, track, tensorboard, save_model, checkpoint_every, resume,
run_root, eval_episodes.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxzoo import checkpoint, logger


@dataclass
class RunResult:
    """What `run` (and so every algorithm's `main`) returns."""

    run_dir: str
    state: Any  # final runner state, leaves [num_seeds, ...]
    metrics: dict[str, np.ndarray]  # [num_seeds, updates run in this process]
    eval_returns: np.ndarray  # [num_seeds, eval_episodes]
    chunk_traces: int  # times the chunk function was traced: 1 means compiled once
    compile_seconds: float  # tracing and compiling `init` and the chunk
    train_seconds: float  # wall time of the training loop (compiled code, logging, checkpoints)


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
            return jax.lax.cond(index <= num_updates, update, skip, state)  # `index` counts from 1

        return jax.lax.scan(step, state, first_update + 1 + jnp.arange(log_every))

    return chunk, lambda: traces


def over_seeds(fn: Callable, num_seeds: int, in_axes: tuple) -> Callable:
    """`jax.vmap(fn, in_axes)`, except that one seed runs `fn` unbatched and
    adds the seed axis to its outputs: on XLA:CPU a vmap of size 1 made
    CartPole's training loop about 20% slower (docs/ppo.md, Speed)."""
    if num_seeds > 1:
        return jax.vmap(fn, in_axes=in_axes)

    def single(*args):
        args = [a if axis is None else jax.tree.map(lambda x: x[0], a) for a, axis in zip(args, in_axes)]
        return jax.tree.map(lambda x: x[None], fn(*args))

    return single


def init_seeds(init: Callable, seeds: jax.Array):
    """`init(key(seed))` for each seed, stacked: leaves [num_seeds, ...].

    One seed after another (`lax.map`, not `vmap`): init runs once, so this
    costs nothing measurable, and XLA:CPU's concurrency-optimised scheduler
    (jaxlib 0.10.2) deadlocks, all threads idle, on the vmapped initialisation
    of two MinAtar CNN torsos for 2+ seeds (tests/test_ppo.py pins it).
    """
    return jax.lax.map(lambda seed: init(jax.random.key(seed)), seeds)


# For programs that run once: compile time matters more than run time.
RUN_ONCE = {"xla_backend_optimization_level": 0}

# Columns read from the host clock: they differ between two runs of the same seed.
CLOCK_COLUMNS = ("steps_per_second", "wall_seconds")


def run(
    args,
    init: Callable,
    update: Callable,
    evaluate: Callable,
    *,
    num_updates: int,
    steps_per_update: int,
    eval_every: int = 0,
) -> RunResult:
    """Train `num_seeds` seeds for `num_updates` updates and evaluate them.

    `steps_per_update` (env steps per seed per update) turns update counts into
    the `global_step` column. With `args.resume` set, the state and the update
    counter come from the newest checkpoint of that run directory.

    `eval_every` > 0 also runs the greedy evaluation during training, between
    chunks, every `eval_every` updates (rounded up to a chunk boundary) and at
    the end: the same compiled program and keys as the final evaluation, so
    the last logged `eval_return` is the final one. Each seed's mean return
    goes to the `eval_return` column on the row of the chunk's last update
    (NaN on the other rows). The training trajectory is the same with or
    without it. Every row also has `wall_seconds`, the training loop's time
    when its chunk's metrics reached the host; a resumed run continues the
    clock from the row of the update it resumes at.
    """
    if eval_every < 0:
        raise ValueError(f"eval_every must be >= 0 (0: evaluate only at the end), got {eval_every}")
    compile_start = time.perf_counter()
    chunk, trace_count = make_chunk(update, num_updates, args.log_every)
    seeds = args.seed + np.arange(args.num_seeds, dtype=np.int32)
    # Traced once: its output shapes are the state's, for the chunk and for resuming.
    init_lowered = jax.jit(lambda seeds: init_seeds(init, seeds), compiler_options=RUN_ONCE).lower(seeds)
    abstract_state = init_lowered.out_info
    background = ThreadPoolExecutor(max_workers=1)
    updates_done = 0
    clock_before_resume = 0.0  # training-loop seconds already spent on the updates a resumed run keeps
    if args.resume is not None:
        state, updates_done = checkpoint.restore(args.resume, abstract_state)
        state = jax.device_put(state)
        kept = logger.read_metrics(args.resume)
        if "wall_seconds" in kept and (kept["update"] == updates_done).any():
            clock_before_resume = float(kept["wall_seconds"][kept["update"] == updates_done].max())
    else:
        init_compiled = background.submit(init_lowered.compile)  # XLA compiles `init` while Python traces the chunk
    run_chunk = jax.jit(over_seeds(chunk, args.num_seeds, (0, None)), donate_argnums=0)
    run_chunk = run_chunk.lower(abstract_state, jnp.int32(0))
    if args.resume is None:
        state = init_compiled.result()(seeds)
    run_chunk = run_chunk.compile()
    compile_seconds = time.perf_counter() - compile_start
    run_log = logger.Run(
        args, args.resume, total_steps=num_updates * steps_per_update, tensorboard=args.tensorboard,
        track=args.track, resume_from_update=updates_done if args.resume else None,
    )
    run_log.print(
        f"{args.env_id}: {args.num_seeds} seed(s) x {num_updates} updates x {steps_per_update} steps "
        f"-> {run_log.dir}" + (f" (resumed at update {updates_done})" if args.resume else "")
        + f"; compiled in {compile_seconds:.1f}s"
    )

    # Evaluation keys: fold_in(key(seed), 1), independent of the training stream.
    # Run once, it compiles unoptimised; run every `eval_every` updates, it runs
    # long enough to be worth optimising (UniZero's search: 2.6x faster).
    eval_lowered = jax.jit(
        over_seeds(lambda state, seed: evaluate(state, jax.random.fold_in(jax.random.key(seed), 1)), args.num_seeds, (0, 0)),
        compiler_options=None if eval_every else RUN_ONCE,
    ).lower(abstract_state, seeds)
    compiled_eval = None  # a future, started once the first chunk has run

    history: dict[str, list[np.ndarray]] = {}
    clock = {"last": time.perf_counter()}

    def record(metrics, first_update: int, count: int, evaluation=None, finished_at: float | None = None) -> None:
        """Copy one finished chunk's metrics (and its evaluation, if one ran
        after it) to the host and log them. `finished_at` is when the chunk and
        its evaluation were known to be done (the loop blocked on them); without
        it, the moment the metrics arrive is the chunk's end."""
        metrics = {k: v[:, :count] for k, v in jax.device_get(metrics).items()}  # drop skipped updates
        now = time.perf_counter() if finished_at is None else finished_at
        elapsed, clock["last"] = now - clock["last"], now
        update_index = np.arange(first_update + 1, first_update + count + 1)
        metrics["steps_per_second"] = np.full((args.num_seeds, count), count * steps_per_update * args.num_seeds / elapsed)
        metrics["wall_seconds"] = np.full((args.num_seeds, count), clock_before_resume + now - start)
        if eval_every:
            metrics["eval_return"] = np.full((args.num_seeds, count), np.nan)
            if evaluation is not None:
                metrics["eval_return"][:, -1] = np.asarray(evaluation).mean(axis=1)
        run_log.log(update_index, update_index * steps_per_update, metrics)
        for k, v in metrics.items():
            history.setdefault(k, []).append(v)
        start_eval_compile()

    def start_eval_compile() -> None:
        nonlocal compiled_eval
        if compiled_eval is None:
            compiled_eval = background.submit(eval_lowered.compile)  # compiles while the next chunks run

    # The loop is pipelined: a chunk is dispatched (asynchronously) before the
    # previous chunk's metrics are copied and written, so host work overlaps
    # device work. A checkpoint waits for its chunk and writes its metrics first,
    # so metrics.csv never lacks rows that a resumed run would not redo.
    start = time.perf_counter()
    last_checkpoint = dispatched = updates_done
    next_eval = (updates_done // eval_every + 1) * eval_every if eval_every else None
    eval_returns = None  # the evaluation of the final state, if the loop ran it
    in_flight = None  # (metrics, first update, updates[, evaluation, finished_at]) of the chunk on the device
    while dispatched < num_updates or in_flight is not None:
        previous, in_flight = in_flight, None
        if dispatched < num_updates:
            state, metrics = run_chunk(state, jnp.int32(dispatched))
            if eval_every:
                start_eval_compile()  # compiles while the first chunk runs
            count = min(args.log_every, num_updates - dispatched)
            first, dispatched = dispatched, dispatched + count
            in_flight = (metrics, first, count)
        if previous is not None:
            record(*previous)  # waits for the previous chunk only; the one just dispatched runs on
        if in_flight is not None and eval_every and (dispatched >= next_eval or dispatched == num_updates):
            start_eval_compile()
            evaluation = compiled_eval.result()(state, seeds)
            jax.block_until_ready(evaluation)  # before the next chunk takes (donates) the state
            # The chunk and its evaluation are done now: its wall_seconds is this
            # moment, though its row is written only after the next dispatch.
            in_flight = in_flight + (evaluation, time.perf_counter())
            while next_eval <= dispatched:
                next_eval += eval_every
            if dispatched == num_updates:
                eval_returns = np.asarray(evaluation)
        due = dispatched - last_checkpoint >= args.checkpoint_every or dispatched == num_updates
        if in_flight is not None and args.save_model and due:
            record(*in_flight)
            in_flight = None
            checkpoint.save(run_log.dir, dispatched, state)
            last_checkpoint = dispatched
    updates_done = dispatched
    train_seconds = time.perf_counter() - start
    run_log.progress(updates_done * steps_per_update, final=True)

    if eval_returns is None:
        start_eval_compile()  # a no-op unless resumed at the end (no chunk ran)
        eval_returns = np.asarray(compiled_eval.result()(state, seeds))
    background.shutdown()
    run_log.print(
        f"greedy evaluation, {args.eval_episodes} episodes x {args.num_seeds} seed(s): "
        f"{eval_returns.mean():.2f} +- {eval_returns.std():.2f} (per seed: "
        + ", ".join(f"{r:.1f}" for r in eval_returns.mean(1))
        + f"); training loop {train_seconds:.1f}s"
    )
    run_log.write_json(
        "eval.json",
        {"returns": eval_returns, "mean": float(eval_returns.mean()), "compile_seconds": compile_seconds,
         "train_seconds": train_seconds, "chunk_traces": trace_count()},
    )
    run_log.close()
    stacked = {k: np.concatenate(v, axis=1) for k, v in history.items()}
    return RunResult(str(run_log.dir), state, stacked, eval_returns, trace_count(), compile_seconds, train_seconds)
