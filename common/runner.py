"""The chunked host loop every algorithm's `main` uses.

An algorithm supplies three pure functions for one seed:

    init(key) -> state
    update(state) -> (state, metrics)      # one iteration; metrics: dict of [] arrays
    evaluate(state, key) -> returns [E]    # greedy episodes at the end

and `run` does the rest: vmaps them over `num_seeds` seeds (seed index i uses
`jax.random.key(args.seed + i)`: `--seed 3 --num-seeds 1` starts from the
bit-identical state and key stream of seed index 3 of a multi-seed run, and
follows it up to floating-point reassociation, see docs/reliability.md), jits
`log_every` updates as one `lax.scan` ("a chunk") with the state donated so
XLA updates it in place, and between chunks writes metrics, the progress line
and checkpoints. Nothing leaves the device inside a chunk. The chunk is traced
and compiled once: a chunk of fewer updates (the last one, or a slow
algorithm's, see CHUNK_SECONDS) runs the same compiled scan with the surplus
updates skipped by a `lax.cond` on the update counter.

Faults are loud (docs/reliability.md): every update checks that the seed's
whole state is finite, and a non-finite seed stops the run with
`cli.Diverged` before its state is checkpointed or evaluated; the run
directory is locked for the run's life; SIGINT / SIGTERM write a checkpoint at
the next chunk boundary and exit with 128 + the signal number. `init` and `evaluate` run once, so they are
compiled without LLVM optimisation (half the compile time, which matters more
than their run time) and on a background thread: `init` while Python traces the
chunk, the evaluation while the first chunk runs (a periodic evaluation, compiled
optimised: while XLA compiles the chunk), so most of their compile time is
hidden.

The `args` dataclass must have the shared fields: exp_name, seed, num_seeds,
env_id, log_every, track, tensorboard, save_model, checkpoint_every, resume,
run_root, eval_episodes, and the layout fields of jaxzoo.parallel: parallel,
distributed, coordinator_address, num_processes, process_id,
distributed_timeout.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxzoo import checkpoint, cli, logger, parallel, results


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


# After a first chunk of one update (timed), a chunk holds at most as many
# updates as run in about this many seconds (and at most `log_every`), so a
# slow algorithm answers Ctrl-C / SIGTERM within a few seconds; fast ones keep
# `log_every`.
CHUNK_SECONDS = 2.0

# Exit code of a run stopped by a signal: 128 + its number (130 for SIGINT, 143 for SIGTERM).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def first_nonfinite_leaf(tree) -> jax.Array:
    """int32 []: the index (in `jax.tree.leaves(tree)`) of the first floating
    leaf holding a NaN or inf, or -1 if every one is finite. Integer, boolean
    and key leaves cannot be non-finite and are skipped."""
    leaves = jax.tree.leaves(tree)
    checked = [i for i, x in enumerate(leaves) if jnp.issubdtype(x.dtype, jnp.inexact)]
    if not checked:
        return jnp.int32(-1)
    bad = jnp.stack([~jnp.isfinite(leaves[i]).all() for i in checked])
    return jnp.where(bad.any(), jnp.asarray(checked, jnp.int32)[jnp.argmax(bad)], -1)


def make_chunk(update: Callable, log_every: int) -> tuple[Callable, Callable[[], int]]:
    """`chunk(state, first_update, last_update) -> (state, metrics, health)`:
    updates first_update + 1 ... min(first_update + log_every, last_update) of
    one seed in a `lax.scan` of length `log_every` (the others are skipped, so
    one compiled program serves every chunk). `health` int32 [2]: (the first
    update after which the state was non-finite, the index of its first
    non-finite leaf), or (-1, -1). Returns the chunk and a function giving how
    often it has been traced."""
    traces = 0

    def chunk(state, first_update, last_update):
        nonlocal traces
        traces += 1
        traced_metrics = []  # the metrics of `update`'s one trace, for `skip` to copy the structure of

        def run_update(state):
            state, metrics = update(state)
            traced_metrics.append(metrics)
            return state, metrics, first_nonfinite_leaf(state)

        def skip(state):
            # lax.cond traces its true branch first, so `update` is traced once, not again by
            # eval_shape (measured on PPO's cartpole preset: tracing 0.77 -> 0.68 s; more
            # where an update is costlier to trace).
            metrics = traced_metrics[0] if traced_metrics else jax.eval_shape(update, state)[1]
            return state, jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype), metrics), jnp.int32(-1)

        def step(carry, index):  # `index` counts from 1
            state, health = carry
            state, metrics, bad_leaf = jax.lax.cond(index <= last_update, run_update, skip, state)
            first = (health[0] < 0) & (bad_leaf >= 0)
            return (state, jnp.where(first, jnp.stack([index, bad_leaf]), health)), metrics

        no_fault = jnp.full((2,), -1, jnp.int32)
        (state, health), metrics = jax.lax.scan(step, (state, no_fault), first_update + 1 + jnp.arange(log_every))
        return state, metrics, health

    return chunk, lambda: traces


def check_health(
    health: np.ndarray, state, metrics: dict[str, np.ndarray], first_update: int, args, run_dir: str | Path
) -> None:
    """Raise `cli.Diverged` if a seed's chunk `health` ([num_seeds, 2] from
    `make_chunk`) reports a non-finite state, naming the seed index, the update,
    the first non-finite leaf of the state and the metrics that were non-finite
    at that update. `metrics` are the chunk's host metrics [num_seeds, count]."""
    bad_seeds = np.flatnonzero(np.asarray(health)[:, 0] >= 0)
    if not len(bad_seeds):
        return
    names = [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
    lines = []
    for i in bad_seeds:
        update, leaf = (int(v) for v in health[i])
        column = update - first_update - 1
        nonfinite = sorted(
            k
            for k, v in metrics.items()
            if 0 <= column < v.shape[1] and not np.isfinite(v[i, column]) and not k.startswith(("episode_", "eval_"))
        )
        lines.append(
            f"seed index {i} (seed {args.seed + i}) at update {update}: first non-finite value in state"
            f"{names[leaf]}" + (f"; non-finite metrics at that update: {', '.join(nonfinite)}" if nonfinite else "")
        )
    kept = checkpoint.latest_update(run_dir)
    raise cli.Diverged(
        "the run stopped: " + " | ".join(lines) + f". Nothing after the last finite checkpoint was saved "
        f"({'update ' + str(kept) if kept is not None else 'none written'}) and no evaluation was written. "
        f"Run directory: {run_dir}. A smaller learning rate, gradient clipping (max_grad_norm) or a different seed "
        f"may help."
    )


class StopRequest:
    """While active (`with StopRequest() as stop:`), SIGINT and SIGTERM only set
    `stop.signum`: the loop checkpoints at its next chunk boundary and exits
    with 128 + signum. A second signal of the same kind stops at once (the
    previous handler runs). Outside the main thread (no signals there), inert."""

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame):
        if self.signum is not None:  # asked twice: stop now
            previous = self._previous.get(signum)
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signum = signum
        print(
            f"\n{signal.Signals(signum).name}: stopping at the next chunk boundary after a checkpoint "
            "(send it again to stop at once)",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        return False


@contextlib.contextmanager
def locked_run_dir(run_dir: str | Path):
    """Hold an exclusive OS lock on `run_dir/.lock` for the run's life, so a
    second process on the same run directory is refused at once (the lock goes
    with the process, however it ends)."""
    path = Path(run_dir) / ".lock"
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise ValueError(
            f"run directory {str(run_dir)!r} is in use by {holder}; two processes never share a "
            "run directory (wait for it to finish, or start a new run)"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"process {os.getpid()}\n")
    handle.flush()
    try:
        yield Path(run_dir)
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


package_version = checkpoint.package_version


def data_axis(args) -> tuple[int, str] | None:
    """(size, name) of the run's data axis, the one `--parallel data` splits
    over the devices: the Args field its class names in `DATA_AXIS` (a
    ClassVar, e.g. "num_envs"), read here by `prepare` and `run` alike; None
    for Args without one (a file with no data mode)."""
    name = getattr(type(args), "DATA_AXIS", None)
    return None if name is None else (getattr(args, name), name)


def prepare(args, algorithm: str):
    """The first call of every algorithm's `main`, before anything is built:
    resolve `--resume` (refusing another algorithm's run and flags that differ
    from the saved run), refuse an unusable `--run-root`, and set up JAX's
    compilation cache; with --capture-video, check the video writer is
    installed (before training, not after it). With a data axis (`data_axis`),
    `--parallel data` gets one CPU device per core that divides it. Returns the
    Args to run with."""
    args = cli.resolve_resume(args, algorithm)
    if args.capture_video:
        from jaxzoo import video

        video.check_writer()
    parallel.initialize_distributed(args)  # before any other JAX call
    # On a CPU, the seeds (or with --parallel data one run's batch) over every core, before JAX creates its backend.
    axis = data_axis(args)
    parallel.split_cpu(args, axis[0] if axis is not None else None)
    if args.resume is None:
        cli.check_run_root(args.run_root)
    elif not Path(args.resume).is_dir():
        raise FileNotFoundError(f"--resume {args.resume!r} is not a run directory")
    cli.configure_jax(args.compile_cache)
    return args


def open_run_dir(args, algorithm: str):
    """A context manager over the run's directory, created (new run) or reused
    (`args.resume`), locked for the run's life. In a distributed run only
    process 0 creates and locks it; the others get its path on resume (to read
    the checkpoint) and a placeholder path otherwise, and write nothing."""
    if not parallel.is_writer():
        placeholder = Path(args.run_root) / "(written by process 0)"
        return contextlib.nullcontext(Path(args.resume) if args.resume is not None else placeholder)
    run_dir = (
        Path(args.resume)
        if args.resume is not None
        else logger.new_run_dir(args.run_root, args.env_id, args.exp_name, args.seed)
    )
    return locked_run_dir(run_dir)


def resume_command(run_dir: str | Path) -> str:
    script = sys.argv[0] if sys.argv and sys.argv[0].endswith(".py") else "<algorithm file>.py"
    return f"python {script} --resume {run_dir}"


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


def write_checkpoint(run_dir: str | os.PathLike, update: int, state) -> None:
    """Write `state` as the checkpoint of `update` (every process takes part in
    gathering a sharded state; the first writes it). The host copy lives only
    inside this call: held past it (as by the training loops until 2026-11-29),
    a run kept a second copy of its whole state until the next checkpoint and a
    third while that one was gathered. UniZero on Breakout-MinAtar with 1.5 GB
    of replay (`--buffer-size 500000`), 4,000 steps, checkpoints every 10
    updates: peak RSS 4.2 and 4.9 GiB before, 2.7 GiB after."""
    host_state = parallel.to_host(state)
    if parallel.is_writer():
        checkpoint.save(run_dir, update, host_state)


def run(
    args,
    algorithm: str,
    init: Callable,
    update: Callable,
    evaluate: Callable,
    *,
    num_updates: int,
    steps_per_update: int,
    eval_every: int = 0,
    data_axes: Callable | None = None,
) -> RunResult:
    """Train `num_seeds` seeds for `num_updates` updates and evaluate them.

    `algorithm` names the file (`"ppo"`): args.json records it, and a resume
    by another file is refused. `steps_per_update` (env steps per seed per
    update) turns update counts into the `global_step` column. With
    `args.resume` set, the state and the update counter come from the newest
    intact checkpoint of that run directory.

    `eval_every` > 0 also runs the greedy evaluation during training, between
    chunks, every `eval_every` updates (rounded up to a chunk boundary) and at
    the end: the same compiled program and keys as the final evaluation, so
    the last logged `eval_return` is the final one. Each seed's mean return
    goes to the `eval_return` column on the row of the chunk's last update
    (NaN on the other rows). The training trajectory is the same with or
    without it. Every row also has `wall_seconds`, the training loop's time
    when its chunk's metrics reached the host; a resumed run continues the
    clock from the row of the update it resumes at.

    `args.parallel` lays the run out over the visible devices
    (jaxzoo.parallel): "seeds" shards the seed axis; "data" shards one run's
    data, for an algorithm that supports it by passing `data_axes` (the
    per-seed state -> a prefix tree of the data axis of each part, int, or
    None for replicated parts) and naming the axis in its Args' `DATA_AXIS`
    (`data_axis`: the field whose size the device count must divide).

    Raises `cli.Diverged` when a seed's state becomes non-finite, and
    SystemExit(128 + signum) after checkpointing when SIGINT / SIGTERM arrive.
    """
    if eval_every < 0:
        raise ValueError(f"eval_every must be >= 0 (0: evaluate only at the end), got {eval_every}")
    data_size, data_name = None, "the data axis"
    if data_axes is not None:
        axis = data_axis(args)
        if axis is None:
            raise TypeError(f"{type(args).__name__} has no DATA_AXIS: name the field data_axes splits")
        data_size, data_name = axis
    layout = parallel.make_layout(args.parallel, args.num_seeds, data_size, data_name)
    with (
        open_run_dir(args, algorithm) as run_dir,
        StopRequest() as stop,
        ThreadPoolExecutor(max_workers=1) as background,
    ):
        return _run_locked(
            args,
            algorithm,
            run_dir,
            stop,
            background,
            init,
            update,
            evaluate,
            num_updates,
            steps_per_update,
            eval_every,
            Placement.of(layout, init, args, data_axes),
        )


@dataclass
class Placement:
    """Where a run's arrays live: its Layout, the sharding of every runner-state
    leaf and of the seed-stacked outputs (None on one device), and the seeds
    [num_seeds] as the jitted programs take them."""

    layout: parallel.Layout
    state: Any
    outputs: Any
    seeds: Any

    @staticmethod
    def of(layout: parallel.Layout, init: Callable, args, data_axes: Callable | None) -> Placement:
        seeds = args.seed + np.arange(args.num_seeds, dtype=np.int32)
        if layout.mesh is None:
            return Placement(layout, None, None, seeds)
        axes = None if data_axes is None else data_axes(jax.eval_shape(init, jax.random.key(0)))
        abstract = jax.eval_shape(lambda s: init_seeds(init, s), seeds)
        outputs = layout.seed_sharding()
        return Placement(layout, layout.state_shardings(abstract, axes), outputs, parallel.put(seeds, outputs))


def _run_locked(
    args,
    algorithm,
    run_dir,
    stop,
    background,
    init,
    update,
    evaluate,
    num_updates,
    steps_per_update,
    eval_every,
    placement: Placement,
) -> RunResult:
    """`run` inside its locked run directory, with signals caught."""
    compile_start = time.perf_counter()
    chunk, trace_count = make_chunk(update, args.log_every)
    seeds, sharded = placement.seeds, placement.layout.mesh is not None
    # In data mode, `parallel.constrain_data` inside the traced programs shards over the mesh.
    with placement.layout.tracing():
        # Traced once: its output shapes are the state's, for the chunk and for resuming.
        init_lowered = jax.jit(
            lambda seeds: init_seeds(init, seeds),
            compiler_options=RUN_ONCE,
            **({"out_shardings": placement.state} if sharded else {}),
        ).lower(seeds)
        abstract_state = init_lowered.out_info
        updates_done = 0
        clock_before_resume = 0.0  # training-loop seconds already spent on the updates a resumed run keeps
        if args.resume is not None:
            state, updates_done = checkpoint.restore(run_dir, abstract_state)
            if updates_done > num_updates:
                raise ValueError(
                    f"--resume {run_dir}: its checkpoint is at update {updates_done}, past this run's "
                    f"{num_updates} updates (total_timesteps={args.total_timesteps}); give a larger "
                    "--total-timesteps to continue it"
                )
            state = parallel.put(state, placement.state)
            kept = logger.read_metrics(run_dir) if (run_dir / "metrics.csv").exists() else {}
            if "wall_seconds" in kept and (kept["update"] == updates_done).any():
                clock_before_resume = float(kept["wall_seconds"][kept["update"] == updates_done].max())
        else:
            init_compiled = background.submit(init_lowered.compile)  # XLA compiles `init` while Python traces the chunk
        shardings: dict[str, Any] = (
            {
                "in_shardings": (placement.state, None, None),
                "out_shardings": (placement.state, placement.outputs, placement.outputs),
            }
            if sharded
            else {}
        )
        chunk_lowered = jax.jit(
            over_seeds(chunk, args.num_seeds, (0, None, None)), donate_argnums=0, **shardings
        ).lower(abstract_state, jnp.int32(0), jnp.int32(0))
    compile_evaluation = partial(_compile_evaluation, args, evaluate, abstract_state, placement, eval_every)
    # A periodic evaluation is traced and compiled on the background thread (after `init`) while
    # XLA compiles the chunk here: that compile leaves a core idle for part of its time (its HLO
    # passes run on one thread), and the first chunks then run with no compile beside them. A cold
    # UniZero CartPole-v0 run evaluated every 5 updates reached its second evaluation 2.1 and
    # 4.6 s sooner (medians of two interleaved sets; docs/performance.md, "The evaluation compiled
    # beside the chunk"). The final-only evaluation still starts once the first chunk is
    # dispatched: started early, a cold PPO CartPole run was no faster (13.53 s against 13.39 s).
    compiled_eval = background.submit(compile_evaluation) if eval_every else None
    if args.resume is None:
        state = init_compiled.result()(seeds)
    run_chunk = chunk_lowered.compile()
    compile_seconds = time.perf_counter() - compile_start
    run_log = (logger.Run if parallel.is_writer() else logger.Silent)(
        args,
        run_dir,
        total_steps=num_updates * steps_per_update,
        tensorboard=args.tensorboard,
        track=args.track,
        resume_from_update=updates_done if args.resume else None,
        meta={"algorithm": algorithm, "jaxzoo_version": package_version()},
    )
    try:
        return _train(
            args,
            run_dir,
            run_log,
            stop,
            background,
            run_chunk,
            trace_count,
            state,
            seeds,
            compile_evaluation,
            compiled_eval,
            abstract_state,
            updates_done,
            clock_before_resume,
            compile_seconds,
            num_updates,
            steps_per_update,
            eval_every,
            placement,
        )
    finally:
        run_log.close()


def _train(
    args,
    run_dir,
    run_log,
    stop,
    background,
    run_chunk,
    trace_count,
    state,
    seeds,
    compile_evaluation: Callable,
    compiled_eval: Future | None,
    abstract_state,
    updates_done,
    clock_before_resume,
    compile_seconds,
    num_updates,
    steps_per_update,
    eval_every,
    placement: Placement,
):
    """The chunked loop (`_ChunkLoop`), the final evaluation and eval.json."""
    run_log.print(
        f"{args.env_id}: {args.num_seeds} seed(s) x {num_updates} updates x {steps_per_update} steps "
        f"on {placement.layout.describe()} -> {run_log.dir}"
        + (f" (resumed at update {updates_done})" if args.resume else "")
        + f"; compiled in {compile_seconds:.1f}s"
    )
    loop = _ChunkLoop(
        args,
        run_dir,
        run_log,
        background,
        compile_evaluation,
        compiled_eval,
        abstract_state,
        clock_before_resume,
        num_updates,
        steps_per_update,
        eval_every,
    )
    state = loop.run(state, run_chunk, seeds, stop, updates_done)
    train_seconds = time.perf_counter() - loop.start
    run_log.progress(loop.dispatched * steps_per_update, final=True)
    if loop.stop_signum is not None and loop.dispatched < num_updates:
        _exit_stopped(args, run_log, loop.stop_signum, loop.dispatched, loop.last_checkpoint, num_updates)
    eval_returns = loop.final_evaluation(state, seeds)
    history = loop.history
    # MPO's skip-and-count policy: `skipped_updates` is each seed's running count.
    skipped = (
        {"skipped_updates": int(history["skipped_updates"][-1][:, -1].sum())} if "skipped_updates" in history else {}
    )
    write_evaluation(
        args,
        run_log,
        eval_returns,
        chunk_traces=trace_count(),
        compile_seconds=compile_seconds,
        train_seconds=train_seconds,
        extra=skipped,
        note=f"; learner steps skipped for non-finite batches, all seeds: {skipped['skipped_updates']}"
        if skipped
        else "",
    )
    stacked = {k: np.concatenate(v, axis=1) for k, v in loop.history.items()}
    return RunResult(str(run_log.dir), state, stacked, eval_returns, trace_count(), compile_seconds, train_seconds)


def evaluation_program(args, evaluate: Callable, eval_every: int = 0, **shardings):
    """The run's greedy evaluation, `(state [num_seeds, ...], seeds [num_seeds])
    -> returns [num_seeds, eval_episodes]`: `evaluate` vmapped over seeds and
    jitted. Evaluation keys: fold_in(key(seed), 1), independent of the training
    stream. Run once, it compiles unoptimised; run every `eval_every` updates, it
    runs long enough to be worth optimising (UniZero's search: 2.6x faster).
    benchmarks/eval_checkpoint.py evaluates a checkpoint with the same program."""
    return jax.jit(
        over_seeds(
            lambda state, seed: evaluate(state, jax.random.fold_in(jax.random.key(seed), 1)),
            args.num_seeds,
            (0, 0),
        ),
        compiler_options=None if eval_every else RUN_ONCE,
        **shardings,
    )


def _compile_evaluation(args, evaluate: Callable, abstract_state, placement: Placement, eval_every: int):
    """`evaluation_program` placed on the run's devices, lowered and compiled
    (on the background thread)."""
    shardings: dict[str, Any] = (
        {"in_shardings": (placement.state, placement.outputs), "out_shardings": placement.outputs}
        if placement.layout.mesh is not None
        else {}
    )
    with placement.layout.tracing():
        lowered = evaluation_program(args, evaluate, eval_every, **shardings).lower(abstract_state, placement.seeds)
    return lowered.compile()


class _ChunkLoop:
    """The pipelined chunk loop of `_train` and what it accumulates.

    A chunk is dispatched (asynchronously) before the previous chunk's metrics
    are copied and written, so host work overlaps device work, except for
    paced chunks (`paced`), each waited for before the next is dispatched, so
    a signal waits for one chunk at most. A checkpoint
    waits for its chunk and writes its metrics first, so metrics.csv never
    lacks rows that a resumed run would not redo, and a non-finite state is
    found before it could be saved. Metrics rows are [num_seeds, updates]."""

    def __init__(
        self,
        args,
        run_dir,
        run_log,
        background: ThreadPoolExecutor,
        compile_evaluation: Callable,
        compiled_eval: Future | None,
        abstract_state,
        clock_before_resume: float,
        num_updates: int,
        steps_per_update: int,
        eval_every: int,
    ):
        self.args, self.run_dir, self.run_log, self.background = args, run_dir, run_log, background
        self.compile_evaluation, self.abstract_state = compile_evaluation, abstract_state
        self.clock_before_resume = clock_before_resume
        self.num_updates, self.steps_per_update, self.eval_every = num_updates, steps_per_update, eval_every
        self.compiled_eval = compiled_eval  # a future: started by `run`, or once the first chunk has run
        self.history: dict[str, list[np.ndarray]] = {}  # metric -> [num_seeds, updates] per recorded chunk
        self.last_clock = time.perf_counter()  # when the last recorded chunk ended
        self.seconds_per_update: float | None = None  # the slowest chunk's, once one is recorded
        self.start = self.last_clock  # the training loop's start (reset by `run`)
        self.dispatched = self.last_checkpoint = 0  # updates dispatched / checkpointed so far
        self.stop_signum: int | None = None  # the signal that stopped the loop (any process's)
        self.eval_returns: np.ndarray | None = None  # [num_seeds, eval_episodes] of the final state, if the loop ran it
        self.videos: list = []  # futures of the videos being written (--capture-video)

    def run(self, state, run_chunk: Callable, seeds: np.ndarray, stop: StopRequest, updates_done: int):
        """Chunks from update `updates_done` to `num_updates` (or to the chunk
        boundary after a signal arrives), with checkpoints and the periodic
        evaluation. Returns the final state."""
        args, num_updates, eval_every = self.args, self.num_updates, self.eval_every
        self.start = time.perf_counter()
        self.last_checkpoint = self.dispatched = updates_done
        next_eval = (updates_done // eval_every + 1) * eval_every if eval_every else 0
        # (metrics, health, first update, updates[, evaluation, finished_at]) of the chunk on the device
        in_flight: tuple | None = None
        stop_at = num_updates  # the update the loop stops after: earlier when a signal arrives
        while self.dispatched < stop_at or in_flight is not None:
            if self.stop_asked(stop):
                stop_at = min(stop_at, self.dispatched)  # dispatch nothing more
            previous, in_flight = in_flight, None
            if self.dispatched < stop_at:
                count = min(self.next_chunk_size(), num_updates - self.dispatched)
                state, metrics, health = run_chunk(
                    state, jnp.int32(self.dispatched), jnp.int32(self.dispatched + count)
                )
                first, self.dispatched = self.dispatched, self.dispatched + count
                in_flight = (metrics, health, first, count)
            if previous is not None:
                self.record(*previous)  # waits for the previous chunk only; the one just dispatched runs on
            if self.stop_asked(stop):
                stop_at = self.dispatched
            if (
                in_flight is not None
                and eval_every
                and (self.dispatched >= next_eval or self.dispatched == num_updates)
            ):
                in_flight = in_flight + self.evaluate_now(state, seeds)
                while next_eval <= self.dispatched:
                    next_eval += eval_every
            done = self.dispatched
            due = done - self.last_checkpoint >= args.checkpoint_every or done in (num_updates, stop_at)
            if args.save_model and due and self.dispatched > self.last_checkpoint:
                if in_flight is not None:
                    self.record(*in_flight)
                    in_flight = None
                write_checkpoint(self.run_log.dir, self.dispatched, state)
                self.last_checkpoint = self.dispatched
            if in_flight is not None and (self.seconds_per_update is None or self.paced()):
                # The first chunk is timed before the next one is sized; a paced
                # chunk is waited for before the next is dispatched.
                self.record(*in_flight)
                in_flight = None
        return state

    def stop_asked(self, stop: StopRequest) -> bool:
        """Whether SIGINT / SIGTERM has arrived (at any process of a
        distributed run: they agree, so all stop at the same chunk boundary)."""
        self.stop_signum = parallel.agree_max(stop.signum or 0) or None
        return self.stop_signum is not None

    def paced(self) -> bool:
        """Whether chunks are cut to about CHUNK_SECONDS (an algorithm slow
        enough that `log_every` updates would outlast it). Such a chunk is not
        overlapped with the next one: a signal then waits for one chunk at most
        (not two), and overlapping would save only the host's milliseconds of
        logging per chunk of seconds."""
        return self.seconds_per_update is not None and self.seconds_per_update * self.args.log_every > CHUNK_SECONDS

    def next_chunk_size(self) -> int:
        """The first chunk of a process is one update, timed before the next is
        sized; later chunks hold `log_every` updates, or fewer for an algorithm
        slow enough that a chunk would outlast CHUNK_SECONDS. A chunk never
        crosses a multiple of `log_every`, so those stay chunk boundaries."""
        if self.seconds_per_update is None:
            return 1
        log_every = self.args.log_every
        fits = int(np.clip(CHUNK_SECONDS // max(self.seconds_per_update, 1e-9), 1, log_every))
        return min(fits, log_every - self.dispatched % log_every)

    def record(self, metrics, health, first_update: int, count: int, evaluation=None, finished_at: float | None = None):
        """Copy one finished chunk's metrics (and its evaluation, if one ran
        after it) to the host, log them, and stop the run if a seed's state
        became non-finite. `finished_at` is when the chunk and its evaluation
        were known to be done (the loop blocked on them); without it, the
        moment the metrics arrive is the chunk's end."""
        args, num_seeds = self.args, self.args.num_seeds
        metrics, health = parallel.to_host((metrics, health))
        metrics = {k: v[:, :count] for k, v in metrics.items()}  # drop skipped updates
        now = time.perf_counter() if finished_at is None else finished_at
        elapsed, self.last_clock = now - self.last_clock, now
        # The slowest chunk so far sets the pace: with pipelining, a chunk's
        # measured time can be shortened by the overlap with the one before it.
        # The processes of a distributed run agree on it (the slowest's), so they size chunks alike.
        self.seconds_per_update = parallel.agree_max(max(self.seconds_per_update or 0.0, elapsed / count))
        update_index = np.arange(first_update + 1, first_update + count + 1)
        metrics["steps_per_second"] = np.full((num_seeds, count), count * self.steps_per_update * num_seeds / elapsed)
        metrics["wall_seconds"] = np.full((num_seeds, count), self.clock_before_resume + now - self.start)
        if self.eval_every:
            metrics["eval_return"] = np.full((num_seeds, count), np.nan)
            if evaluation is not None:
                metrics["eval_return"][:, -1] = parallel.to_host(evaluation).mean(axis=1)
        self.run_log.log(update_index, update_index * self.steps_per_update, metrics)
        for k, v in metrics.items():
            self.history.setdefault(k, []).append(v)
        check_health(health, self.abstract_state, metrics, first_update, args, self.run_dir)
        self.start_eval_compile()

    def start_eval_compile(self) -> Future:
        """The compiled evaluation's future, started now if `run` did not start it."""
        if self.compiled_eval is None:
            # Lowered, then compiled, by the one background thread while chunks run.
            self.compiled_eval = self.background.submit(self.compile_evaluation)
        elif self.compiled_eval.done():
            self.compiled_eval.result()  # an evaluation that fails to trace or compile stops the run now, not at its end
        return self.compiled_eval

    def evaluate_now(self, state, seeds: np.ndarray) -> tuple[jax.Array, float]:
        """The evaluation of the state just dispatched: (returns [num_seeds,
        eval_episodes], the moment the chunk and its evaluation were done, which
        is its row's wall_seconds though the row is written after the next
        dispatch)."""
        evaluation = self.split_video(self.start_eval_compile().result()(state, seeds), seeds)
        jax.block_until_ready(evaluation)  # before the next chunk takes (donates) the state
        finished_at = time.perf_counter()
        if self.dispatched == self.num_updates:
            self.eval_returns = parallel.to_host(evaluation)
        return evaluation, finished_at

    def split_video(self, evaluation, seeds: np.ndarray) -> jax.Array:
        """The returns of an evaluation; with --capture-video (the evaluation is
        `(returns, envs.Recording)`), its recorded episodes are rendered and
        written in the background, one video per seed, `videos/update<N>-seed<S>.mp4`."""
        if not isinstance(evaluation, tuple):
            return evaluation
        returns, recording = evaluation
        recording = parallel.to_host(recording)  # every process takes part in gathering
        if parallel.is_writer():
            from jaxzoo import video

            label, seeds = f"update{self.dispatched}", parallel.to_host(seeds)
            write = partial(video.write_recordings, self.run_log.dir / "videos", self.args.env_id)
            self.videos.append(self.background.submit(write, recording, seeds, label))
        return returns

    def final_evaluation(self, state, seeds: np.ndarray) -> np.ndarray:
        """The final state's evaluation [num_seeds, eval_episodes] (run by the
        loop, or now), once its videos (if any) are written (`write_evaluation`
        then refuses non-finite returns)."""
        eval_returns = self.eval_returns
        if eval_returns is None:
            # (started here only when no chunk ran: resumed at the end)
            eval_returns = parallel.to_host(self.split_video(self.start_eval_compile().result()(state, seeds), seeds))
        for written in self.videos:
            written.result()  # raises what the writer raised
        return eval_returns


def _exit_stopped(args, run_log, signum: int, updates_done: int, last_checkpoint: int, num_updates: int):
    """After a SIGINT / SIGTERM: say where the run stopped and how to resume it, exit 128 + signum."""
    if args.save_model:
        how_to_go_on = f"checkpoint at update {last_checkpoint} written. Resume with:\n  {resume_command(run_log.dir)}"
    else:  # --resume needs a checkpoint: say so rather than print a command that would fail
        how_to_go_on = "no checkpoint (--no-save-model), so nothing to resume: a new run starts from update 0"
    run_log.print(
        f"stopped by {signal.Signals(signum).name} after update {updates_done} of {num_updates}; {how_to_go_on}"
    )
    raise SystemExit(128 + signum)


def write_evaluation(
    args,
    run_log,
    eval_returns: np.ndarray,
    *,
    chunk_traces: int,
    compile_seconds: float,
    train_seconds: float,
    extra: dict | None = None,
    per_seed: bool = True,
    note: str = "",
) -> None:
    """The end of every run, shared by `run` and loops of their own (IMPALA's
    --architecture sebulba): refuse a non-finite evaluation with
    `cli.Diverged` (nothing written), print the greedy evaluation
    [num_seeds, eval_episodes], write eval.json and, in the process that
    writes the run directory, summary.json and run_info.json (jaxzoo.results).

    `extra` adds fields to eval.json after the standard ones; the printed line
    shows each seed's mean unless `per_seed` is False, and ends with `note`."""
    if not np.isfinite(eval_returns).all():
        raise cli.Diverged(
            f"the greedy evaluation returned non-finite returns {eval_returns.tolist()}; "
            f"no eval.json was written (run directory {run_log.dir})"
        )
    run_log.print(
        f"greedy evaluation, {args.eval_episodes} episodes x {args.num_seeds} seed(s): "
        f"{eval_returns.mean():.2f} +- {eval_returns.std():.2f}"
        + (" (per seed: " + ", ".join(f"{r:.1f}" for r in eval_returns.mean(1)) + ")" if per_seed else "")
        + f"; training loop {train_seconds:.1f}s"
        + note
    )
    run_log.write_json(
        "eval.json",
        {
            "returns": eval_returns,
            "mean": float(eval_returns.mean()),
            "compile_seconds": compile_seconds,
            "train_seconds": train_seconds,
            "chunk_traces": chunk_traces,
            **(extra or {}),
        },
    )
    if isinstance(run_log, logger.Run):  # the process that writes the run directory
        # summary.json (marl-eval / Stoix layout) and run_info.json: jaxzoo.results
        results.write_summary(run_log.dir, results.machine_info())
