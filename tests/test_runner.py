"""common/runner.py on a toy algorithm: evaluation during training, the clock column."""

import dataclasses
import gc
import time
import weakref
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Killed

from jaxzoo import checkpoint, logger, runner


@dataclass(frozen=True)
class ToyArgs:
    exp_name: str = "toy"
    seed: int = 0
    num_seeds: int = 2
    env_id: str = "Toy"
    log_every: int = 2
    track: bool = False
    tensorboard: bool = False
    save_model: bool = False
    checkpoint_every: int = 100
    resume: str | None = None
    run_root: str = "runs"
    eval_episodes: int = 3
    parallel: str = "auto"
    distributed: bool = False
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    distributed_timeout: int = 120
    capture_video: bool = False


def toy_algorithm():
    """The state counts updates; a seed's evaluation returns its count (plus
    the seed, to tell seeds apart) on every episode."""

    def init(key):
        return {"count": jnp.float32(0), "offset": jax.random.key_data(key)[-1].astype(jnp.float32)}

    def update(state):
        state = {**state, "count": state["count"] + 1}
        return state, {"episode_return": state["count"]}

    def evaluate(state, _key):
        return jnp.full(3, state["count"] + 1000 * state["offset"])

    return init, update, evaluate


def run_toy(tmp_path, eval_every, num_updates=9):
    init, update, evaluate = toy_algorithm()
    args = ToyArgs(run_root=str(tmp_path / f"every{eval_every}"))
    return runner.run(args, "toy", init, update, evaluate, num_updates=num_updates, steps_per_update=10, eval_every=eval_every)


def test_eval_every_logs_evaluations_at_chunk_ends_and_the_end(tmp_path):
    result = run_toy(tmp_path, eval_every=3)
    rows = logger.read_metrics(result.run_dir)
    offsets = np.asarray(result.state["offset"])
    for seed_index in range(2):
        mine = rows["seed_index"] == seed_index
        evaluated = mine & np.isfinite(rows["eval_return"])
        # Chunks of 2 end at updates 2, 4, 6, 8, 9: the first at or past 3, 6, 9, and the last.
        assert list(rows["update"][evaluated]) == [4, 6, 9]
        np.testing.assert_allclose(rows["eval_return"][evaluated], np.array([4, 6, 9]) + 1000 * offsets[seed_index])
    # The final evaluation is the last logged one.
    np.testing.assert_allclose(result.eval_returns.mean(1), 9 + 1000 * offsets)
    assert np.all(np.diff(rows["wall_seconds"][rows["seed_index"] == 0]) >= 0)


def test_eval_every_leaves_training_unchanged(tmp_path):
    with_eval, without = run_toy(tmp_path, eval_every=3), run_toy(tmp_path, eval_every=0)
    for a, b in zip(jax.tree.leaves(with_eval.state), jax.tree.leaves(without.state)):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(with_eval.eval_returns, without.eval_returns)
    assert "eval_return" not in logger.read_metrics(without.run_dir)


def test_negative_eval_every_is_refused(tmp_path):
    with pytest.raises(ValueError, match="eval_every must be >= 0"):
        run_toy(tmp_path, eval_every=-1)


def test_a_resumed_run_continues_the_clock(tmp_path, monkeypatch):
    """`wall_seconds` after a resume continues from the row of the update the
    run resumes at, so it counts the training loop of the whole run."""
    init, update, evaluate = toy_algorithm()
    args = ToyArgs(run_root=str(tmp_path), save_model=True, checkpoint_every=2)
    original_log = logger.Run.log

    def slow_then_die(self, update_index, global_step, metrics):
        original_log(self, update_index, global_step, metrics)
        if update_index[-1] == 2:
            time.sleep(0.3)  # the chunk of updates 3-4 reaches the host >= 0.3 s into the loop
        if update_index[-1] == 6:
            raise Killed()  # after the checkpoint at 4, before the one at 6

    monkeypatch.setattr(logger.Run, "log", slow_then_die)
    with pytest.raises(Killed):
        runner.run(args, "toy", init, update, evaluate, num_updates=8, steps_per_update=10)
    monkeypatch.setattr(logger.Run, "log", original_log)
    (run_dir,) = tmp_path.iterdir()
    killed = logger.read_metrics(run_dir)
    clock_at_4 = killed["wall_seconds"][killed["update"] == 4].max()
    assert clock_at_4 >= 0.3

    runner.run(dataclasses.replace(args, resume=str(run_dir)), "toy", init, update, evaluate, num_updates=8,
               steps_per_update=10)
    rows = logger.read_metrics(run_dir)
    mine = rows["seed_index"] == 0
    assert list(rows["update"][mine]) == list(range(1, 9))
    clock = rows["wall_seconds"][mine]
    assert np.all(np.diff(clock) >= 0) and clock[4:].min() >= clock_at_4


def test_a_checkpoints_host_copy_is_freed_once_written(tmp_path, monkeypatch):
    """The runner's host copy of the state lives only while its checkpoint is
    written: kept, a run with a large replay held a second copy of its whole state
    until the next checkpoint, and a third while that one was gathered."""
    init, update, evaluate = toy_algorithm()
    args = ToyArgs(run_root=str(tmp_path), save_model=True, checkpoint_every=2)
    host_copies, original_save, original_log = [], checkpoint.save, logger.Run.log

    def save_and_watch(run_dir, update_index, state, **kwargs):
        host_copies.extend(weakref.ref(leaf) for leaf in jax.tree.leaves(state) if isinstance(leaf, np.ndarray))
        return original_save(run_dir, update_index, state, **kwargs)

    def log_and_check(self, update_index, global_step, metrics):
        gc.collect()
        held = sum(ref() is not None for ref in host_copies)
        assert held == 0, f"at update {update_index[-1]}: {held} leaves of a written checkpoint's host copy are held"
        original_log(self, update_index, global_step, metrics)

    monkeypatch.setattr(checkpoint, "save", save_and_watch)
    monkeypatch.setattr(logger.Run, "log", log_and_check)
    runner.run(args, "toy", init, update, evaluate, num_updates=8, steps_per_update=10)
    assert len(host_copies) == 4 * 2  # checkpoints at updates 2, 4, 6, 8; two leaves each


def test_an_evaluated_chunk_is_clocked_when_its_evaluation_ends(tmp_path):
    """The row of a chunk followed by an evaluation is written only after the
    next chunk is dispatched; its `wall_seconds` must still be the moment the
    evaluation ended, not the end of the next chunk (the evaluation's time to
    a return is read from it)."""
    init, update, evaluate = toy_algorithm()

    def slow(count):
        time.sleep(0.25)  # per seed and update: a chunk of 2 updates x 2 seeds takes >= 1 s
        return count

    def slow_update(state):
        state, metrics = update(state)
        count = jax.pure_callback(slow, jax.ShapeDtypeStruct((), jnp.float32), state["count"], vmap_method="sequential")
        return {**state, "count": count}, metrics

    args = ToyArgs(run_root=str(tmp_path))
    result = runner.run(args, "toy", init, slow_update, evaluate, num_updates=4, steps_per_update=10, eval_every=2)
    rows = logger.read_metrics(result.run_dir)
    mine = rows["seed_index"] == 0
    clock = dict(zip(rows["update"][mine], rows["wall_seconds"][mine]))
    assert clock[4] - clock[2] >= 0.8  # the second chunk ran after the first evaluation's row was clocked


def test_an_evaluation_that_fails_to_trace_stops_the_run_early(tmp_path):
    """The evaluation is traced and compiled in the background while chunks run;
    its error still stops the run within a few chunks, not after all of them."""
    init, update, _ = toy_algorithm()
    updates_run = []

    def counted_update(state):
        jax.debug.callback(lambda: updates_run.append(1))
        return update(state)

    def broken_evaluate(state, _key):
        raise ValueError("evaluate cannot be traced")

    args = ToyArgs(run_root=str(tmp_path / "broken"), log_every=1)
    num_updates = 2000
    with pytest.raises(ValueError, match="evaluate cannot be traced"):
        runner.run(args, "toy", init, counted_update, broken_evaluate, num_updates=num_updates, steps_per_update=10)
    assert len(updates_run) < num_updates // 10  # (the seeds are vmapped: one callback per update)
