"""Fail loudly, lose nothing, on every algorithm file's tiny preset: one test
per fault of docs/reliability.md (tests/test_faults.py checks the same
machinery on a toy algorithm, faster and in more detail)."""

import dataclasses
import importlib
import json
import os
import signal
import subprocess
import sys
import warnings

import jax
import numpy as np
import pytest
from conftest import ROOT, slow_except

from jaxzoo import cli, logger, runner

ALGOS = ["impala", "mpo", "planet", "ppo", "rainbow", "unizero", "unizero_ppo", "world_models"]
# The learning rates that make each tiny preset blow up when set to 1e30 (at
# 1e9 Adam's steps of ~1e9 can leave a saturated network finite).
LEARNING_RATES = {"mpo": ("policy_lr", "critic_lr"), "world_models": ("vae_learning_rate", "mdn_learning_rate")}
CONTINUOUS_ONLY = ("mpo", "planet")


def module_of(algo: str):
    return importlib.import_module(f"jaxzoo.algos.{algo}")


def tiny(algo: str, tmp_path, **overrides):
    args = cli.preset_args(module_of(algo).Args, algo, "tiny")
    return dataclasses.replace(args, run_root=str(tmp_path / "runs"), **overrides)


def only_run_dir(tmp_path):
    (run_dir,) = (tmp_path / "runs").iterdir()
    return run_dir


def final_state(result):
    return result["outputs"] if isinstance(result, dict) else result.state


def assert_same_state(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(x, y)


# --------------------------------------------------------------------------- #
# Divergence is an error, not a result
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("algo", slow_except(("impala", "mpo", "ppo"), ALGOS))
def test_a_huge_learning_rate_stops_the_run_as_diverged(algo, tmp_path):
    blow_up = {field: 1e30 for field in LEARNING_RATES.get(algo, ("learning_rate",))}
    with pytest.raises(cli.Diverged, match=r"seed index \d+ \(seed \d+\) at update \d+: first non-finite value"):
        module_of(algo).main(tiny(algo, tmp_path, **blow_up))
    run_dir = only_run_dir(tmp_path)
    assert not (run_dir / "eval.json").exists()
    # Whatever checkpoints were written hold finite states (the diverged one never is).
    for path in sorted(run_dir.rglob("update_*.npz")):
        with np.load(path) as stored:
            for name in stored.files:
                if np.issubdtype(stored[name].dtype, np.floating):
                    assert np.isfinite(stored[name]).all(), (path, name)


# --------------------------------------------------------------------------- #
# Every argument is checked before anything is built
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("algo", ALGOS)
def test_bad_values_are_refused_naming_field_value_and_range(algo):
    Args = module_of(algo).Args
    fields = {f.name for f in dataclasses.fields(Args)}
    rate = LEARNING_RATES.get(algo, ("learning_rate",))[0]
    bad = {rate: float("nan"), "eval_episodes": 0, "num_seeds": 0, "log_every": 0}
    bad.update({name: value for name, value in [("gamma", 1.5), ("discount", 1.5), ("ent_coef", -1.0),
                                                ("vf_coef", -1.0), ("max_grad_norm", -1.0)] if name in fields})
    hidden = next((f.name for f in dataclasses.fields(Args) if f.name.endswith(("hidden_sizes", "_layers"))), None)
    if hidden:
        bad[hidden] = (0,)
    for name, value in bad.items():
        with pytest.raises(ValueError, match=rf"{name}=.* (is out of range|is not a finite number); accepted"):
            Args(**{name: value})


@pytest.mark.parametrize("algo", ALGOS)
def test_the_command_line_exits_2_on_a_bad_value(algo, tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "algos" / f"{algo}.py"), "--eval-episodes", "0"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == cli.EXIT_USAGE, out.stderr[-2000:]
    message = " ".join(out.stderr.replace("│", " ").split())  # tyro prints it in a box, wrapped
    assert "eval_episodes=0 is out of range; accepted: >= 1" in message and "Traceback" not in out.stderr


@pytest.mark.parametrize("algo", ALGOS)
def test_an_unknown_env_id_suggests_the_closest(algo, tmp_path):
    typo, meant = ("Pendulum-v2", "Pendulum-v1") if algo in CONTINUOUS_ONLY else ("CartPole-v2", "CartPole-v1")
    with pytest.raises(ValueError, match=rf"'{typo}'.*did you mean '{meant}'"):
        module_of(algo).main(tiny(algo, tmp_path, env_id=typo))


@pytest.mark.parametrize("algo", ALGOS)
def test_a_run_root_that_is_a_file_is_refused_before_building(algo, tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        module_of(algo).main(dataclasses.replace(tiny(algo, tmp_path), run_root=str(tmp_path / "afile" / "runs")))


# --------------------------------------------------------------------------- #
# A run directory is never damaged, never shared by accident
# --------------------------------------------------------------------------- #
def fake_run_dir(tmp_path, algo: str, args) -> str:
    run_dir = tmp_path / f"{algo}-run"
    run_dir.mkdir()
    logger.write_args_json(run_dir, args, {"algorithm": algo, "jaxzoo_version": runner.package_version()})
    return str(run_dir)


@pytest.mark.parametrize("algo", ALGOS)
def test_resuming_another_algorithms_run_is_refused(algo, tmp_path):
    other = "rainbow" if algo == "ppo" else "ppo"
    run_dir = fake_run_dir(tmp_path, other, tiny(other, tmp_path))
    with pytest.raises(ValueError, match=rf"with {algo}.py: it was written by {other}.py"):
        module_of(algo).main(module_of(algo).Args(resume=run_dir))
    assert os.listdir(run_dir) == ["args.json"]  # nothing was written into it


@pytest.mark.parametrize("algo", ALGOS)
def test_flags_that_differ_from_the_saved_run_are_refused(algo, tmp_path):
    run_dir = fake_run_dir(tmp_path, algo, tiny(algo, tmp_path))
    with pytest.raises(ValueError, match=r"flags differ from the saved run \(seed: run has 0, given 7\)"):
        module_of(algo).main(dataclasses.replace(tiny(algo, tmp_path), resume=run_dir, seed=7))


@pytest.mark.parametrize("algo", ALGOS)
def test_a_second_process_on_the_run_directory_is_refused(algo, tmp_path):
    run_dir = fake_run_dir(tmp_path, algo, tiny(algo, tmp_path))
    with runner.locked_run_dir(run_dir):  # another open file: as another process holding it
        with pytest.raises(ValueError, match="is in use by process"):
            module_of(algo).main(module_of(algo).Args(resume=run_dir))


@pytest.mark.parametrize("algo", slow_except(("ppo",), ALGOS))
def test_sigterm_checkpoints_resumes_and_survives_a_damaged_checkpoint(algo, tmp_path, monkeypatch, capsys):
    """SIGTERM after the first logged chunk: a checkpoint at the next chunk
    boundary, exit 143 and the resume command. The resumed run ends exactly
    where an uninterrupted one ends; with its newest checkpoint then damaged,
    a resume falls back to the one before and ends there again."""
    module = module_of(algo)
    args = tiny(algo, tmp_path, save_model=True, log_every=1, checkpoint_every=1)  # chunks of one update
    straight = module.main(dataclasses.replace(args, run_root=str(tmp_path / "straight")))

    original_log = logger.Run.log
    sent = []

    def log_then_signal(self, update, global_step, metrics):
        original_log(self, update, global_step, metrics)
        if not sent:
            sent.append(int(update[-1]))
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(logger.Run, "log", log_then_signal)
    with pytest.raises(SystemExit) as stopped:
        module.main(args)
    monkeypatch.setattr(logger.Run, "log", original_log)
    assert stopped.value.code == 128 + signal.SIGTERM == 143
    run_dir = only_run_dir(tmp_path)
    assert "stopped by SIGTERM" in capsys.readouterr().out and not (run_dir / "eval.json").exists()
    assert list(run_dir.rglob("update_*.npz"))

    resumed = module.main(module.Args(resume=str(run_dir)))
    assert_same_state(final_state(straight), final_state(resumed))

    newest = sorted(run_dir.rglob("update_*.npz"))[-1]
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = module.main(module.Args(resume=str(run_dir)))
    assert any("skipping damaged checkpoint" in str(w.message) for w in caught)
    assert_same_state(final_state(straight), final_state(again))
    if not isinstance(straight, dict):
        rows = logger.read_metrics(run_dir)
        assert sorted(rows["update"][rows["seed_index"] == 0]) == list(range(1, int(rows["update"].max()) + 1))
    assert json.loads((run_dir / "args.json").read_text())["algorithm"] == algo


# --------------------------------------------------------------------------- #
# Seeds mean what the docs say
# --------------------------------------------------------------------------- #
def test_a_seed_alone_starts_exactly_as_its_index_in_a_multi_seed_run(tmp_path):
    """`--seed 3 --num-seeds 1` and seed index 3 of `--seed 0 --num-seeds 4`:
    the same key stream, so bit-identical initial states (parameters, env
    states, keys), and the same first update up to floating-point
    reassociation (a vmapped program sums in another order)."""
    module = module_of("ppo")
    many, alone = tiny("ppo", tmp_path, num_seeds=4, seed=0), tiny("ppo", tmp_path, num_seeds=1, seed=3)
    ppo_many, ppo_alone = module.make_train(many), module.make_train(alone)
    init_many = runner.init_seeds(ppo_many.init, np.arange(4, dtype=np.int32))
    init_alone = runner.init_seeds(ppo_alone.init, np.array([3], np.int32))
    assert_same_state(jax.tree.map(lambda x: x[3:4], init_many), init_alone)
    after_many = jax.vmap(ppo_many.update)(init_many)
    after_alone = ppo_alone.update(jax.tree.map(lambda x: x[0], init_alone))
    for a, b in zip(jax.tree.leaves(jax.tree.map(lambda x: x[3], after_many)), jax.tree.leaves(after_alone)):
        if not jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
