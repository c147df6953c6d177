"""Fail loudly, lose nothing: the runner's fault handling on a toy algorithm
(fast), one test per fault. tests/test_fault_injection.py runs the same faults
through every algorithm file's tiny preset."""

import dataclasses
import gzip
import json
import os
import signal
from dataclasses import dataclass
from typing import Annotated  # noqa: F401 (the string annotations of Guarded name it)

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxzoo import checkpoint, cli, logger, runner
from jaxzoo.checks import AtLeastOne, Fraction, Positive, Range, check_fields


@dataclass(frozen=True)
class ToyArgs:
    exp_name: str = "toy"
    seed: int = 0
    num_seeds: int = 2
    env_id: str = "Toy"
    total_timesteps: int = 80
    log_every: int = 2
    track: bool = False
    tensorboard: bool = False
    save_model: bool = True
    checkpoint_every: int = 2
    resume: str | None = None
    run_root: str = "runs"
    eval_episodes: int = 3
    compile_cache: bool = False
    parallel: str = "auto"
    distributed: bool = False
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    distributed_timeout: int = 120
    capture_video: bool = False
    blow_up_at: int = 0
    """update after which seed index 1's weight becomes NaN (0: never)"""


def toy_algorithm(args: ToyArgs):
    """A 'weight' that grows by one per update; seed index 1's weight turns NaN
    after update `blow_up_at`."""

    def init(key):
        seed_index = jax.random.key_data(key)[-1].astype(jnp.float32) - args.seed
        return {"weight": jnp.float32(0), "seed_index": seed_index, "count": jnp.int32(0)}

    def update(state):
        count = state["count"] + 1
        nan = (state["seed_index"] == 1) & (count >= args.blow_up_at) & (args.blow_up_at > 0)
        weight = jnp.where(nan, jnp.nan, state["weight"] + 1)
        return {**state, "weight": weight, "count": count}, {"loss": weight * 2, "episode_return": jnp.float32(jnp.nan)}

    def evaluate(state, _key):
        return jnp.full(3, state["weight"])

    return init, update, evaluate


def run_toy(args: ToyArgs, num_updates: int = 8):
    init, update, evaluate = toy_algorithm(args)
    return runner.run(args, "toy", init, update, evaluate, num_updates=num_updates, steps_per_update=10)


# --------------------------------------------------------------------------- #
# Divergence is an error, not a result
# --------------------------------------------------------------------------- #
def test_a_non_finite_seed_stops_the_run_naming_seed_update_and_leaf(tmp_path):
    args = ToyArgs(run_root=str(tmp_path), blow_up_at=5)
    with pytest.raises(cli.Diverged) as error:
        run_toy(args)
    message = str(error.value)
    assert "seed index 1 (seed 1) at update 5" in message and "['weight']" in message
    assert "non-finite metrics at that update: loss" in message and "seed index 0" not in message
    (run_dir,) = tmp_path.iterdir()
    assert not (run_dir / "eval.json").exists()
    # The checkpoint at update 4 is the last finite one; the NaN state was never written.
    assert checkpoint.latest_update(run_dir) == 4
    init, update, evaluate = toy_algorithm(args)
    state, _ = checkpoint.restore(run_dir, jax.eval_shape(lambda s: runner.init_seeds(init, s), np.arange(2)))
    assert np.isfinite(np.asarray(state["weight"])).all()


def test_a_diverged_script_exits_with_its_documented_code(capsys):
    with pytest.raises(SystemExit) as stopped, cli.user_errors():
        raise cli.Diverged("seed index 0 at update 3")
    assert stopped.value.code == cli.EXIT_DIVERGED == 3
    assert "diverged: seed index 0 at update 3" in capsys.readouterr().err


def test_first_nonfinite_leaf_skips_integers_and_keys():
    tree = {"a": jnp.arange(3), "b": jnp.ones(2), "c": jnp.array([1.0, jnp.inf]), "k": jax.random.key(0)}
    assert int(runner.first_nonfinite_leaf(tree)) == 2  # leaves in key order: a, b, c, k
    assert int(runner.first_nonfinite_leaf({"a": jnp.ones(2)})) == -1


# --------------------------------------------------------------------------- #
# Arguments are checked before anything is built
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class Guarded:
    learning_rate: "Annotated[float, Positive]" = 1e-3
    gamma: "Annotated[float, Fraction]" = 0.99
    hidden_sizes: "Annotated[tuple[int, ...], AtLeastOne]" = (8, 8)
    target_kl: "Annotated[float | None, Positive]" = None
    coef: "Annotated[float, Range(ge=0, lt=10)]" = 0.5
    free: float = 1.0

    def __post_init__(self):
        check_fields(self)


@pytest.mark.parametrize("field, value, message", [
    ("learning_rate", float("nan"), "learning_rate=nan is not a finite number; accepted: > 0"),
    ("learning_rate", 0.0, "learning_rate=0.0 is out of range; accepted: > 0"),
    ("gamma", 1.5, r"gamma=1.5 is out of range; accepted: in \[0, 1\]"),
    ("hidden_sizes", (8, 0), r"hidden_sizes=\(8, 0\) \(element 0\) is out of range; accepted: >= 1"),
    ("target_kl", -0.1, "target_kl=-0.1 is out of range; accepted: > 0"),
    ("coef", 10.0, r"coef=10.0 is out of range; accepted: in \[0, 10\)"),
    ("free", float("inf"), "free=inf is not a finite number"),
])
def test_a_bad_value_names_the_field_the_value_and_the_range(field, value, message):
    with pytest.raises(ValueError, match=message):
        Guarded(**{field: value})
    Guarded(target_kl=0.02)  # None and in-range values pass


def test_an_unknown_env_id_suggests_the_closest(tmp_path):
    from jaxzoo import envs

    with pytest.raises(ValueError, match=r"unknown env_id 'CartPole-v2'.*did you mean 'CartPole-v1'"):
        envs.make("CartPole-v2")
    with pytest.raises(ValueError, match=r"did you mean 'Breakout-MinAtar'"):
        envs.make("breakout-minatar")


def test_a_run_root_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        cli.check_run_root(tmp_path / "file" / "runs")
    cli.check_run_root(tmp_path / "new" / "runs")  # a directory that does not exist yet is fine
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ValueError, match="not writable"):
            cli.check_run_root(locked)


# --------------------------------------------------------------------------- #
# A run directory is never damaged, never shared by accident
# --------------------------------------------------------------------------- #
def finished_toy_run(tmp_path) -> tuple[ToyArgs, str]:
    args = ToyArgs(run_root=str(tmp_path / "runs"))
    return args, run_toy(args).run_dir


def test_args_json_records_the_algorithm_and_the_version(tmp_path):
    _, run_dir = finished_toy_run(tmp_path)
    saved = json.loads((tmp_path / "runs" / os.path.basename(run_dir) / "args.json").read_text())
    assert saved["algorithm"] == "toy" and saved["jaxzoo_version"] == runner.package_version() != "unknown"


def test_resuming_another_algorithms_run_is_refused(tmp_path):
    _, run_dir = finished_toy_run(tmp_path)
    with pytest.raises(ValueError, match=r"cannot resume .* with ppo.py: it was written by toy.py"):
        cli.resolve_resume(ToyArgs(resume=run_dir), "ppo")
    # A run written before args.json named its algorithm is told apart by its fields.
    path = os.path.join(run_dir, "args.json")
    saved = json.loads(open(path).read())
    del saved["algorithm"], saved["blow_up_at"]
    saved["num_envs"] = 4
    open(path, "w").write(json.dumps(saved))
    with pytest.raises(ValueError, match=r"another algorithm file \(its fields differ: \['num_envs'\]"):
        cli.resolve_resume(ToyArgs(resume=run_dir), "toy")


def test_flags_that_differ_from_the_saved_run_are_refused_on_resume(tmp_path):
    args, run_dir = finished_toy_run(tmp_path)
    with pytest.raises(ValueError, match=r"flags differ from the saved run \(exp_name: run has 'toy', given 'other'; "
                                         r"blow_up_at: run has 0, given 3\)"):
        cli.resolve_resume(ToyArgs(resume=run_dir, blow_up_at=3, exp_name="other"), "toy")
    # A longer run, other reporting: allowed and applied.
    resumed = cli.resolve_resume(ToyArgs(resume=run_dir, total_timesteps=160, log_every=4), "toy")
    assert (resumed.total_timesteps, resumed.log_every, resumed.run_root) == (160, 4, args.run_root)
    # A run resumed past its end with a longer budget continues.
    result = run_toy(dataclasses.replace(args, resume=run_dir), num_updates=12)
    assert np.all(np.asarray(result.state["count"]) == 12)
    with pytest.raises(ValueError, match="past this run's 6 updates"):
        run_toy(dataclasses.replace(args, resume=run_dir), num_updates=6)


def test_a_second_process_on_a_run_directory_is_refused(tmp_path):
    args, run_dir = finished_toy_run(tmp_path)
    with runner.locked_run_dir(run_dir):  # held as another process would hold it (a separate open file)
        with pytest.raises(ValueError, match=rf"run directory '{run_dir}' is in use by process {os.getpid()}"):
            run_toy(dataclasses.replace(args, resume=run_dir))
    run_toy(dataclasses.replace(args, resume=run_dir))  # free again


@pytest.mark.parametrize("damage", ["truncate", "flip", "no-checksum-and-truncated"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_newest_intact_one(tmp_path, damage):
    args, run_dir = finished_toy_run(tmp_path)
    newest, older = checkpoint.list_checkpoints(run_dir)[::-1][:2]
    data = newest.read_bytes()
    if damage == "flip":
        newest.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    else:
        newest.write_bytes(data[: len(data) // 2])
    if damage.startswith("no-checksum"):
        checkpoint.checksum_path(newest).unlink()
    init, _, _ = toy_algorithm(args)
    template = jax.eval_shape(lambda s: runner.init_seeds(init, s), np.arange(2))
    with pytest.warns(UserWarning, match=f"skipping damaged checkpoint .*{newest.name}"):
        _, update = checkpoint.restore(run_dir, template)
    assert update == checkpoint.update_of(older) == 6
    assert checkpoint.latest_update(run_dir) == 6


def test_a_half_written_last_metrics_row_is_trimmed(tmp_path):
    args, run_dir = finished_toy_run(tmp_path)
    csv_path = os.path.join(run_dir, "metrics.csv")
    with open(csv_path, "a") as f:
        f.write("9,90,0,0,1.2")  # a row cut off mid-write
    rows = logger.read_metrics(run_dir)
    assert rows["update"].max() == 8
    run_toy(dataclasses.replace(args, resume=run_dir), num_updates=10)
    rows = logger.read_metrics(run_dir)
    assert sorted(rows["update"][rows["seed_index"] == 0]) == list(range(1, 11))


def test_metrics_kept_compressed_read_the_same(tmp_path):
    """docs/data keeps runs' metrics as metrics.csv.gz; read_metrics reads
    that copy where metrics.csv is gone, to the same columns."""
    _, run_dir = finished_toy_run(tmp_path)
    csv_path = os.path.join(run_dir, "metrics.csv")
    plain = logger.read_metrics(run_dir)
    with open(csv_path, "rb") as f, gzip.open(csv_path + ".gz", "wb") as g:
        g.write(f.read())
    os.remove(csv_path)
    packed = logger.read_metrics(run_dir)
    assert packed.keys() == plain.keys() and len(plain["update"]) > 0
    for column in plain:
        np.testing.assert_array_equal(packed[column], plain[column])


# --------------------------------------------------------------------------- #
# Ctrl-C / SIGTERM: a checkpoint at the next chunk boundary, then exit 130 / 143
# --------------------------------------------------------------------------- #
def signal_after_logging_update_2(monkeypatch, signum):
    """Make the run's logger send this process `signum` once update 2 is
    logged (the chunk of updates 3-4 may already be in flight); returns the
    original logger, to put back."""
    original_log = logger.Run.log

    def log_then_signal(self, update, global_step, metrics):
        original_log(self, update, global_step, metrics)
        if update[-1] == 2:
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(logger.Run, "log", log_then_signal)
    return original_log


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_checkpoints_at_the_next_chunk_boundary_and_exits(tmp_path, monkeypatch, capsys, signum):
    args = ToyArgs(run_root=str(tmp_path), checkpoint_every=100)
    original_log = signal_after_logging_update_2(monkeypatch, signum)
    with pytest.raises(SystemExit) as stopped:
        run_toy(args, num_updates=20)
    assert stopped.value.code == 128 + signum
    (run_dir,) = tmp_path.iterdir()
    out = capsys.readouterr().out
    assert f"stopped by {signal.Signals(signum).name} after update 4 of 20" in out and f"--resume {run_dir}" in out
    # The chunk in flight when the signal came (updates 3-4) finished and was saved.
    assert checkpoint.latest_update(run_dir) == 4 and not (run_dir / "eval.json").exists()
    monkeypatch.setattr(logger.Run, "log", original_log)
    resumed = run_toy(dataclasses.replace(args, resume=str(run_dir)), num_updates=20)
    straight = run_toy(dataclasses.replace(args, run_root=str(tmp_path / "straight")), num_updates=20)
    np.testing.assert_array_equal(resumed.state["weight"], straight.state["weight"])
    assert signal.getsignal(signum) is not None  # the previous handler is back


def test_a_signal_without_checkpoints_offers_no_resume_command(tmp_path, monkeypatch, capsys):
    """--no-save-model writes no checkpoint, so the stop message must not
    print a --resume command that would fail."""
    args = ToyArgs(run_root=str(tmp_path), save_model=False)
    signal_after_logging_update_2(monkeypatch, signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped:
        run_toy(args, num_updates=20)
    assert stopped.value.code == 128 + signal.SIGTERM
    (run_dir,) = tmp_path.iterdir()
    out = capsys.readouterr().out
    assert "no checkpoint (--no-save-model), so nothing to resume" in out and "--resume" not in out
    assert checkpoint.latest_update(run_dir) is None


def test_slow_chunks_are_shortened_so_a_signal_is_answered_quickly(tmp_path, monkeypatch):
    """With updates that take 0.3 s, a chunk of 4 would take 1.2 s: after a
    first chunk of one update is timed, chunks hold at most CHUNK_SECONDS of
    updates, and every multiple of log_every is still a chunk boundary."""
    import time

    monkeypatch.setattr(runner, "CHUNK_SECONDS", 0.7)
    args = ToyArgs(run_root=str(tmp_path), num_seeds=1, log_every=4, save_model=False)
    init, update, evaluate = toy_algorithm(args)

    def slow(weight):
        time.sleep(0.3)
        return weight

    def slow_update(state):
        state, metrics = update(state)
        weight = jax.pure_callback(slow, jax.ShapeDtypeStruct((), jnp.float32), state["weight"])
        return {**state, "weight": weight}, metrics

    sizes = []
    original_log = logger.Run.log
    monkeypatch.setattr(logger.Run, "log", lambda self, u, g, m: (sizes.append(len(u)), original_log(self, u, g, m)))
    result = runner.run(args, "toy", init, slow_update, evaluate, num_updates=12, steps_per_update=10)
    assert sizes[0] == 1 and max(sizes) <= 2 and sum(sizes) == 12
    assert {4, 8, 12} <= set(np.cumsum(sizes))
    assert float(result.state["weight"][0]) == 12  # every update ran once


def test_a_signal_waits_for_one_paced_chunk_at_most(tmp_path, monkeypatch):
    """Paced chunks (an algorithm slow enough that its chunks are cut to
    CHUNK_SECONDS) are not dispatched ahead: a SIGTERM that arrives while the
    loop waits for update 5's chunk stops the run right after it, with a
    checkpoint at update 5 (a pipelined loop would already have dispatched
    update 6 and stopped after it: one slow update later)."""
    import os

    monkeypatch.setattr(runner, "CHUNK_SECONDS", 1e-9)  # every update is slow enough: chunks of one update
    args = ToyArgs(run_root=str(tmp_path), num_seeds=1, log_every=4, checkpoint_every=100)
    init, update, evaluate = toy_algorithm(args)
    record = runner._ChunkLoop.record

    def record_with_signal(self, metrics, health, first_update, count, *rest):
        if first_update + count == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        return record(self, metrics, health, first_update, count, *rest)

    monkeypatch.setattr(runner._ChunkLoop, "record", record_with_signal)
    with pytest.raises(SystemExit) as stopped:
        runner.run(args, "toy", init, update, evaluate, num_updates=40, steps_per_update=10)
    assert stopped.value.code == 128 + signal.SIGTERM
    (run_dir,) = tmp_path.iterdir()
    assert checkpoint.latest_update(run_dir) == 5


def test_a_resumed_run_that_logs_other_metrics_keeps_every_row(tmp_path):
    """A newer version may log a metric the run's metrics.csv lacks (or drop
    one): the rows already written stay, aligned, with nan where a column is new."""
    args, run_dir = finished_toy_run(tmp_path)
    init, update, evaluate = toy_algorithm(args)

    def update_with_more(state):
        state, metrics = update(state)
        return state, {**metrics, "extra": state["weight"] * 0 + 7}

    runner.run(dataclasses.replace(args, resume=run_dir), "toy", init, update_with_more, evaluate, num_updates=10,
               steps_per_update=10)
    rows = logger.read_metrics(run_dir)
    mine = rows["seed_index"] == 0
    assert sorted(rows["update"][mine]) == list(range(1, 11))
    assert np.isnan(rows["extra"][mine & (rows["update"] <= 8)]).all()
    assert (rows["extra"][mine & (rows["update"] > 8)] == 7).all()
    np.testing.assert_array_equal(rows["loss"][mine], 2 * np.arange(1, 11))
