"""algos/rainbow.py end to end: every preset through `tiny`, determinism, resume, bad input."""

import dataclasses
import subprocess
import sys
import tomllib

import jax
import numpy as np
import pytest
from conftest import ROOT, assert_killed_run_resumes_exactly, assert_videos_show_first_episodes, run_copied_script

from jaxzoo import checkpoint, cli, logger
from jaxzoo.algos import rainbow

TABLES = tomllib.loads((ROOT / "configs" / "rainbow.toml").read_text())
# Presets that only change the game of another preset are covered by that preset.
GAME_ONLY = [p for p, t in TABLES.items() if "extends" in t and set(t) <= {"extends", "env_id", "exp_name"}]
# Atari presets (envpool ids) need the atari extra: tests/test_rainbow_atari.py covers them.
ATARI = [p for p in TABLES if cli.preset_args(rainbow.Args, "rainbow", p).env_id.startswith("envpool:")]
PRESETS = [p for p in TABLES if p != "tiny" and p not in GAME_ONLY and p not in ATARI]


def tiny(tmp_path, **overrides) -> rainbow.Args:
    return dataclasses.replace(cli.preset_args(rainbow.Args, "rainbow", "tiny"), run_root=str(tmp_path), **overrides)


def shrink(preset: str, tmp_path) -> rainbow.Args:
    """A preset's components with the tiny budget and sizes."""
    args = cli.preset_args(rainbow.Args, "rainbow", preset)
    small = cli.preset_args(rainbow.Args, "rainbow", "tiny")
    keep = {f: getattr(small, f) for f in ("total_timesteps", "steps_per_update", "buffer_size", "batch_size",
                                           "learning_starts", "target_update_period", "hidden_sizes", "log_every",
                                           "checkpoint_every", "eval_episodes")}
    num_envs = args.num_envs if args.num_envs <= 4 else 2
    train_frequency = num_envs * max(1, args.train_frequency // args.num_envs)
    steps = keep["steps_per_update"] // train_frequency * train_frequency
    return dataclasses.replace(args, **{**keep, "num_envs": num_envs, "train_frequency": train_frequency,
                                        "steps_per_update": steps, "total_timesteps": steps * 4,
                                        "run_root": str(tmp_path)})


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_traces_at_a_tiny_budget(preset, tmp_path):
    """Every preset's whole run traces with consistent shapes (jax.eval_shape: no compile)."""
    args = shrink(preset, tmp_path)
    algo = rainbow.make_train(args)
    state, metrics = jax.eval_shape(algo.train, jax.random.key(0))
    assert metrics["loss"].shape == (args.num_updates,), preset
    returns = jax.eval_shape(algo.evaluate, state, jax.random.key(1))
    assert returns.shape == (args.eval_episodes,)


# The tiny preset runs every component at once; these run the two other code paths:
# plain DQN (epsilon-greedy, MSE, one atom) and RLlib's DQN (Huber, grad clip, fixed beta, 256x256 tanh).
@pytest.mark.parametrize("preset", ["dqn", "rllib-dqn"])
def test_presets_train_at_a_tiny_budget(preset, tmp_path):
    args = shrink(preset, tmp_path)
    algo = rainbow.make_train(args)
    state, metrics = jax.jit(algo.train)(jax.random.key(0))
    assert np.isfinite(np.asarray(metrics["loss"])[-1]), preset
    assert int(state.gradient_steps) > 0
    returns = jax.jit(algo.evaluate)(state, jax.random.key(1))
    assert returns.shape == (args.eval_episodes,) and np.isfinite(np.asarray(returns)).all()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    args = tiny(tmp_path_factory.mktemp("runs"), num_seeds=2)
    return args, rainbow.main(args)


def test_smoke_two_seeds(tiny_run):
    args, result = tiny_run
    assert result.chunk_traces == 1
    assert result.metrics["loss"].shape == (2, args.num_updates)
    assert np.isfinite(result.metrics["loss"][:, -1]).all()
    assert np.isnan(result.metrics["loss"][:, 0]).all()  # learning starts after learning_starts steps
    # Args.num_gradient_steps (the --anneal-lr horizon) counts the gradient steps the run takes.
    np.testing.assert_array_equal(result.metrics["gradient_steps"][:, -1], args.num_gradient_steps)
    # Noisy nets log their noise: sigma0 before learning starts, and how often it changes the greedy action.
    np.testing.assert_allclose(result.metrics["noise_scale"][:, 0], args.sigma0, rtol=1e-6)
    assert ((result.metrics["noisy_action_changes"] >= 0) & (result.metrics["noisy_action_changes"] <= 1)).all()
    assert len(logger.read_metrics(result.run_dir)["update"]) == 2 * args.num_updates
    assert checkpoint.latest_update(result.run_dir) == args.num_updates


def test_same_seed_gives_identical_metrics(tiny_run, tmp_path):
    args, first = tiny_run
    second = rainbow.main(dataclasses.replace(args, run_root=str(tmp_path)))
    for name in ("loss", "q_value", "episode_return"):
        np.testing.assert_array_equal(first.metrics[name], second.metrics[name], err_msg=name)


def test_killed_and_resumed_run_matches_uninterrupted(tiny_run, tmp_path, monkeypatch):
    # 10 updates, chunks of 3, a checkpoint every 6
    args, full = tiny_run
    assert_killed_run_resumes_exactly(rainbow, dataclasses.replace(args, run_root=str(tmp_path)), 9, 6, monkeypatch, full)


def test_continuous_action_space_is_refused(tmp_path):
    with pytest.raises(ValueError, match="continuous action space"):
        rainbow.make_train(tiny(tmp_path, env_id="Pendulum-v1"))


def test_bad_values_are_named():
    with pytest.raises(ValueError, match="train_frequency=5 must be a multiple of num_envs=2"):
        rainbow.Args(num_envs=2, train_frequency=5)
    with pytest.raises(ValueError, match="num_atoms >= 3"):
        rainbow.Args(num_atoms=2)
    for overrides, message in [
        (dict(eval_episodes=0), r"eval_episodes=0 is out of range; accepted: >= 1"),
        (dict(tau=0.0), r"tau=0.0 is out of range; accepted: in \(0, 1\]"),
        (dict(per_beta1=1.5), r"per_beta1=1.5 is out of range; accepted: in \[0, 1\]"),
        (dict(hidden_sizes=(120, 0)), r"hidden_sizes=\(120, 0\) \(element 0\) is out of range; accepted: >= 1"),
        (dict(v_max=float("nan")), r"v_max=nan is not a finite number"),
        (dict(buffer_size=6, num_envs=2, train_frequency=2, n_step=3), r"buffer_size=6 is too small .* accepted: "
                                                                        r"buffer_size >= num_envs \* \(n_step \+ 1\) = 8"),
    ]:
        with pytest.raises(ValueError, match=message):
            rainbow.Args(**overrides)


def test_a_run_that_would_never_learn_is_refused(tmp_path):
    """learning_starts at or past the run's env steps: once every loss row was NaN and the run exited 0."""
    with pytest.raises(ValueError, match=r"learning_starts=2000 is not below total_timesteps=2000: no gradient step "
                                         r"would be taken; accepted: learning_starts < 2000"):
        tiny(tmp_path, learning_starts=2000)
    # 2100 steps are 10 whole updates of 200: the run takes 2000.
    with pytest.raises(ValueError, match=r"learning_starts=2050 is not below the 2000 env steps per seed the run "
                                         r"takes \(total_timesteps=2100"):
        tiny(tmp_path, total_timesteps=2100, learning_starts=2050)
    assert tiny(tmp_path, learning_starts=1999).num_gradient_steps > 0


def test_max_grad_norm_zero_turns_clipping_off(tmp_path):
    """0 is no clipping (the same step as an unreachable clip), not a clip to 0."""
    after = {}
    for max_grad_norm in (0.0, 1e9):
        algo = rainbow.make_train(tiny(tmp_path, max_grad_norm=max_grad_norm, total_timesteps=400, learning_starts=200))
        state = algo.init(jax.random.key(0))
        after[max_grad_norm] = (state.params, jax.jit(algo.update)(state)[0])
    before, unclipped = after[0.0][0], after[0.0][1]
    assert int(unclipped.gradient_steps) > 0
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(unclipped.params)))
    for a, b in zip(jax.tree.leaves(unclipped.params), jax.tree.leaves(after[1e9][1].params)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_cli_tiny_run_and_help(tmp_path):
    out = run_copied_script("rainbow", ["--preset", "tiny", "--num-seeds", "2", "--run-root", str(tmp_path), "--capture-video"])
    assert out.returncode == 0, out.stderr
    assert "greedy evaluation" in out.stdout
    (run_dir,) = tmp_path.iterdir()
    assert_videos_show_first_episodes(run_dir, 2)
    help_out = subprocess.run([sys.executable, str(ROOT / "algos" / "rainbow.py"), "--help"],
                              capture_output=True, text=True)
    assert "--double-q" in help_out.stdout and "rllib-rainbow" in help_out.stdout


@pytest.mark.slow
def test_train_is_vmappable_over_hyperparameters(tmp_path):
    """A 2-member sweep of gamma in one compile: the member at the args' value is the
    unswept run, and gamma 0.5 learns Q-values near 1 / (1 - 0.5) = 2 (CartPole pays 1
    per step), far below gamma 0.99's."""
    args = tiny(tmp_path, total_timesteps=1200, learning_rate=5e-3)
    algo = rainbow.make_train(args)
    base = rainbow.Hyperparams.from_args(args)
    sweep = jax.tree.map(lambda x: np.stack([x, x]), base).replace(gamma=np.array([args.gamma, 0.5], np.float32))
    key = jax.random.key(0)
    _, swept = jax.jit(jax.vmap(algo.train, in_axes=(None, 0)))(key, sweep)
    _, alone = jax.jit(algo.train)(key)
    for name, values in alone.items():
        np.testing.assert_allclose(swept[name][0], values, rtol=1e-5, atol=1e-6, err_msg=name)
    assert 1.0 < swept["q_value"][1, -1] < 2.5 < swept["q_value"][0, -1]
