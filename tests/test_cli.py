"""common/cli.py: presets, errors for unknown presets and keys, --help."""

import dataclasses
import re
import subprocess
import sys
import tomllib

import pytest
from conftest import ROOT

from jaxzoo import cli
from jaxzoo.algos.ppo import Args


def test_preset_sets_defaults_and_flags_override():
    args = cli.parse(Args, "ppo", ["--preset", "tiny", "--seed", "5"])
    tiny = tomllib.loads((ROOT / "configs" / "ppo.toml").read_text())["tiny"]
    assert args.total_timesteps == tiny["total_timesteps"] and args.seed == 5
    assert args.hidden_sizes == tuple(tiny["hidden_sizes"])
    args = cli.parse(Args, "ppo", ["--num-envs", "8", "--preset=tiny"])
    assert args.num_envs == 8  # an explicit flag wins wherever it stands


def test_no_preset_gives_defaults():
    assert cli.parse(Args, "ppo", []) == Args()


def test_unknown_preset_lists_presets(capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.parse(Args, "ppo", ["--preset", "nope"])
    assert stopped.value.code == cli.EXIT_USAGE == 2  # a usage error, like tyro's own
    assert re.search("unknown preset 'nope'.*tiny", capsys.readouterr().err)


def test_unknown_key_in_a_preset_is_named():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['learning_rat'\]"):
        cli.apply_overrides(Args(), {"learning_rat": 1.0}, "test")


def test_help_lists_fields_and_presets():
    out = subprocess.run([sys.executable, str(ROOT / "algos" / "ppo.py"), "--help"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0
    assert "--total-timesteps" in out.stdout and "--preset NAME" in out.stdout and "tiny" in out.stdout
    assert "surrogate clipping epsilon" in out.stdout  # field docstrings reach --help


def test_bad_values_fail_with_the_value_named():
    out = subprocess.run([sys.executable, str(ROOT / "algos" / "ppo.py"), "--preset", "tiny", "--env-id", "CartPole-v9"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode != 0 and "CartPole-v9" in out.stderr and "valid ids" in out.stderr
    assert "Traceback" not in out.stderr


def test_extends_resolves_the_base_preset():
    args = cli.preset_args(Args, "ppo", "space-invaders-minatar")
    base = cli.preset_args(Args, "ppo", "breakout-minatar")
    assert args.env_id == "SpaceInvaders-MinAtar"
    assert dataclasses.replace(args, env_id=base.env_id) == base


def test_user_errors_freezes_the_heap_and_still_maps_errors(capsys):
    """`user_errors` freezes what is alive at entry (tracing then skips it) and
    at exit, also when it turns a ValueError into exit code 2."""
    import gc

    gc.unfreeze()
    try:
        with cli.user_errors():
            frozen_at_entry = gc.get_freeze_count()
        assert frozen_at_entry > 0
        with pytest.raises(SystemExit) as exit_info:
            with cli.user_errors():
                made_inside = [[] for _ in range(1000)]  # tracked containers created during the run
                raise ValueError("bad value")
        assert exit_info.value.code == cli.EXIT_USAGE and "error: bad value" in capsys.readouterr().err
        assert gc.get_freeze_count() >= frozen_at_entry + len(made_inside)
    finally:
        gc.unfreeze()  # the rest of the test session collects as usual


@pytest.mark.parametrize("algo", sorted(p.stem for p in (ROOT / "configs").glob("*.toml")))
def test_every_preset_resolves_to_valid_args(algo):
    """Every table of configs/<algo>.toml (its `extends` chain included) names
    only fields of that file's Args, with values its validation accepts: a
    typo in a preset fails here, not when a user runs it."""
    import importlib

    args_cls = importlib.import_module(f"jaxzoo.algos.{algo}").Args
    for preset in cli.presets(algo):
        assert isinstance(cli.preset_args(args_cls, algo, preset), args_cls), preset
