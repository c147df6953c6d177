"""algos/ppo.py end to end: smoke, determinism, one compile, resume, bad input, learning."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import ROOT, assert_killed_run_resumes_exactly, assert_videos_show_first_episodes, run_copied_script

from jaxzoo import checkpoint, cli, logger, pixels, runner
from jaxzoo.algos import ppo


def tiny(tmp_path, **overrides) -> ppo.Args:
    args = cli.preset_args(ppo.Args, "ppo", "tiny")
    return dataclasses.replace(args, run_root=str(tmp_path), **overrides)


@pytest.fixture(scope="module")
def two_seed_run(tmp_path_factory):
    args = tiny(tmp_path_factory.mktemp("runs"), num_seeds=2)
    return args, ppo.main(args)


def test_smoke_two_seeds(two_seed_run):
    args, result = two_seed_run
    assert result.chunk_traces == 1  # one compile for the whole run
    for name in (
        "policy_loss",
        "value_loss",
        "entropy",
        "approx_kl",
        "clip_fraction",
        "explained_variance",
        "learning_rate",
        "steps_per_second",
    ):
        assert result.metrics[name].shape == (2, args.num_updates), name
        assert np.isfinite(result.metrics[name]).all(), name
    assert np.isfinite(result.metrics["episode_return"]).any()
    assert result.eval_returns.shape == (2, args.eval_episodes)
    # The learning rate anneals linearly to (almost) zero.
    lr = result.metrics["learning_rate"][0]
    assert lr[0] == pytest.approx(args.learning_rate) and lr[-1] < lr[0] / args.num_updates * 1.5
    columns = logger.read_metrics(result.run_dir)
    assert len(columns["update"]) == 2 * args.num_updates
    assert set(columns["seed_index"]) == {0.0, 1.0}
    assert columns["global_step"].max() == args.num_updates * args.batch_size
    saved = json.loads(open(f"{result.run_dir}/args.json").read())
    assert saved["num_seeds"] == 2 and saved["env_id"] == args.env_id


def test_checkpoint_reloads_into_the_state(two_seed_run):
    args, result = two_seed_run
    assert checkpoint.latest_update(result.run_dir) == args.num_updates
    template = jax.eval_shape(jax.vmap(ppo.make_train(args).init), jax.random.split(jax.random.key(0), 2))
    restored, update = checkpoint.restore(result.run_dir, template)
    for a, b in zip(jax.tree.leaves(restored.params), jax.tree.leaves(result.state.params)):
        np.testing.assert_array_equal(a, b)


def test_eval_checkpoint_repeats_the_final_evaluation_read_only(two_seed_run, tmp_path):
    """benchmarks/eval_checkpoint.py on a finished run's last checkpoint gives
    the run's own final greedy returns, and writes nothing into the run; a
    run that common/runner.py did not write is refused by name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("eval_checkpoint", ROOT / "benchmarks" / "eval_checkpoint.py")
    eval_checkpoint = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(eval_checkpoint)
    args, result = two_seed_run
    before = {p: p.stat().st_mtime_ns for p in sorted(Path(result.run_dir).rglob("*"))}
    update, returns = eval_checkpoint.evaluate_checkpoint(result.run_dir)
    assert update == args.num_updates
    np.testing.assert_array_equal(returns, result.eval_returns)
    # --set: the same parameters under another value of a field the state's shapes do not depend on
    overrides = eval_checkpoint.parse_overrides(args, ["eval_episodes=3"])
    assert overrides == {"eval_episodes": 3}
    assert eval_checkpoint.evaluate_checkpoint(result.run_dir, overrides=overrides)[1].shape == (args.num_seeds, 3)
    assert {p: p.stat().st_mtime_ns for p in sorted(Path(result.run_dir).rglob("*"))} == before
    for setting, message in [
        ("no_such_field=1", "FIELD one of the run's args"),
        ("eval_episodes=three", "eval_episodes is a int; got 'three'"),
        ("anneal_lr=yes", "anneal_lr is a bool; accepted: true or false"),
    ]:
        with pytest.raises(SystemExit, match=message):
            eval_checkpoint.main([result.run_dir, "--set", setting])
    with pytest.raises(ValueError, match=r"eval_episodes=0 is out of range"):
        eval_checkpoint.main([result.run_dir, "--set", "eval_episodes=0"])
    with pytest.raises(SystemExit, match="no args.json"):
        eval_checkpoint.main([str(Path(result.run_dir) / "checkpoints")])
    staged = tmp_path / "world_models_run"
    staged.mkdir()
    (staged / "args.json").write_text(json.dumps({"algorithm": "world_models"}))
    with pytest.raises(SystemExit, match="world_models.py's own loop"):
        eval_checkpoint.main([str(staged)])


def test_same_seed_gives_identical_metrics(two_seed_run, tmp_path):
    args, first = two_seed_run
    second = ppo.main(dataclasses.replace(args, run_root=str(tmp_path)))
    # Seed index 1 of a two-seed run is the run of seed 1 alone: the same
    # episodes to the step, and every loss equal up to float32 rounding (the
    # vmapped program sums in another order; measured 2026-12-02: 4.8e-7 on an
    # advantage mean of 8.3, 3.8e-6 on a value loss of 43.5). The policy loss is
    # a mean of unit-scale terms (normalised advantages) that cancels to ~1e-4,
    # so its rounding is bounded absolutely (atol), not relative to itself.
    alone = ppo.main(dataclasses.replace(args, run_root=str(tmp_path), seed=1, num_seeds=1))
    for name, values in first.metrics.items():
        if name in runner.CLOCK_COLUMNS:
            continue
        np.testing.assert_array_equal(values, second.metrics[name], err_msg=name)
        if name.startswith("episode"):
            np.testing.assert_array_equal(alone.metrics[name][0], values[1], err_msg=name)
        else:
            np.testing.assert_allclose(alone.metrics[name][0], values[1], rtol=1e-5, atol=1e-6, err_msg=name)


def test_killed_and_resumed_run_matches_uninterrupted(two_seed_run, tmp_path, monkeypatch):
    # 16 updates, chunks of 4, a checkpoint every 8
    args, full = two_seed_run
    assert_killed_run_resumes_exactly(ppo, dataclasses.replace(args, run_root=str(tmp_path)), 12, 8, monkeypatch, full)


def test_resume_of_a_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        ppo.main(ppo.Args(resume=str(tmp_path / "does-not-exist")))


def test_batch_that_does_not_divide_into_minibatches():
    with pytest.raises(ValueError, match=r"4 \* 30 = 120 does not divide into num_minibatches=7"):
        ppo.Args(num_envs=4, num_steps=30, num_minibatches=7)


def test_max_episode_steps_sets_the_time_limit(tmp_path):
    assert ppo.make_train(tiny(tmp_path, max_episode_steps=200)).spec.max_episode_steps == 200
    assert ppo.make_train(tiny(tmp_path)).spec.max_episode_steps == 500  # CartPole-v1's own
    with pytest.raises(ValueError, match=r"max_episode_steps=-1 is out of range; accepted: >= 0"):
        ppo.Args(max_episode_steps=-1)


def test_bad_values_name_the_field_the_value_and_what_is_accepted():
    for overrides, message in [
        (dict(eval_episodes=0), r"eval_episodes=0 is out of range; accepted: >= 1"),
        (dict(gae_lambda=1.5), r"gae_lambda=1.5 is out of range; accepted: in \[0, 1\]"),
        (dict(clip_coef=0.0), r"clip_coef=0.0 is out of range; accepted: > 0"),
        (dict(target_kl=-0.1), r"target_kl=-0.1 is out of range; accepted: >= 0"),
        (dict(hidden_sizes=(64, 0)), r"hidden_sizes=\(64, 0\) \(element 0\) is out of range; accepted: >= 1"),
        (dict(learning_rate=float("inf")), r"learning_rate=inf is not a finite number"),
        (dict(total_timesteps=100), r"total_timesteps=100 is less than one batch .*accepted: total_timesteps >= 512"),
    ]:
        with pytest.raises(ValueError, match=message):
            ppo.Args(**overrides)
    assert ppo.Args().target_kl == 0  # 0: no early stop (docs/glossary.md: 0, never None, is off)


def test_max_grad_norm_zero_turns_clipping_off(tmp_path):
    """0 is no clipping (the same update as an unreachable clip), not a clip to 0."""
    after = {}
    for max_grad_norm in (0.0, 1e9):
        algo = ppo.make_train(tiny(tmp_path, max_grad_norm=max_grad_norm))
        state = algo.init(jax.random.key(0))
        after[max_grad_norm] = (state.params, jax.jit(algo.update)(state)[0].params)
    before, unclipped = after[0.0]
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(unclipped)))
    for a, b in zip(jax.tree.leaves(unclipped), jax.tree.leaves(after[1e9][1])):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_adam_keeps_one_vector_of_moments_for_all_parameters(tmp_path):
    """optax.flatten (docs/ppo.md detail 21): Adam's first and second moments are
    each one vector as long as all parameters together, with or without the clip."""
    for max_grad_norm in (0.0, 0.5):
        state = ppo.make_train(tiny(tmp_path, max_grad_norm=max_grad_norm)).init(jax.random.key(0))
        num_params = sum(x.size for x in jax.tree.leaves(state.params))
        moments = [
            leaf
            for path, leaf in jax.tree_util.tree_leaves_with_path(state.opt_state)
            if jax.tree_util.keystr(path).endswith((".mu", ".nu"))
        ]
        assert [m.shape for m in moments] == [(num_params,), (num_params,)]


def test_unknown_env_id(tmp_path):
    with pytest.raises(ValueError, match="unknown env_id 'Pong-v0'"):
        ppo.main(tiny(tmp_path, env_id="Pong-v0"))


def test_cnn_torso_needs_images(tmp_path):
    with pytest.raises(ValueError, match="torso='cnn' needs image observations"):
        ppo.make_train(tiny(tmp_path, torso="cnn"))


@pytest.mark.parametrize(
    "overrides",
    [
        dict(env_id="Pendulum-v1", normalize_obs=True, normalize_reward=True),  # continuous, Gaussian
        dict(env_id="Breakout-MinAtar", hidden_sizes=(32,)),  # CNN torso
        dict(target_kl=1e-4, learning_rate=0.01, kl_coef=0.2, shared_torso=True, activation="relu", clip_vloss=False),
    ],
    ids=["pendulum", "minatar-cnn", "kl-options"],
)
def test_variants_run(tmp_path, overrides):
    args = tiny(tmp_path, total_timesteps=512, log_every=2, **overrides)
    result = ppo.main(args)
    assert np.isfinite(result.metrics["policy_loss"]).all()
    assert np.isfinite(result.eval_returns).all()
    if overrides.get("target_kl"):
        epochs, kl = result.metrics["epochs_completed"][0], result.metrics["approx_kl"][0]
        stopped = epochs < args.update_epochs
        assert stopped.any()
        # An update stops only after an epoch whose mean KL passed the target.
        assert (kl[stopped] > args.target_kl).all()
        # The adaptive coefficient follows RLlib's rule from one update to the next.
        coef = result.metrics["kl_coef"][0]
        expected = np.where(kl > 2 * args.kl_target, coef * 1.5, np.where(kl < 0.5 * args.kl_target, coef * 0.5, coef))
        np.testing.assert_allclose(coef[1:], expected[:-1], rtol=1e-6)


def test_cli_tiny_run(tmp_path):
    out = run_copied_script(
        "ppo", ["--preset", "tiny", "--num-seeds", "2", "--run-root", str(tmp_path), "--capture-video"]
    )
    assert out.returncode == 0, out.stderr
    assert "greedy evaluation" in out.stdout and "steps/s" in out.stdout
    (run_dir,) = tmp_path.iterdir()
    assert (run_dir / "metrics.csv").exists() and (run_dir / "eval.json").exists()
    assert_videos_show_first_episodes(run_dir, 2)


def test_train_is_vmappable_over_seeds_and_hyperparameters(tmp_path):
    args = tiny(tmp_path, total_timesteps=256)
    algo = ppo.make_train(args)
    base = ppo.Hyperparams.from_args(args)
    sweep = jax.tree.map(lambda x: np.stack([x, x]), base).replace(ent_coef=np.array([0.0, 0.5], np.float32))
    keys = jax.random.split(jax.random.key(0), 3)
    train = jax.jit(jax.vmap(jax.vmap(algo.train, in_axes=(0, None)), in_axes=(None, 0)))
    _, metrics = train(keys, sweep)
    assert metrics["entropy"].shape == (2, 3, args.num_updates)
    # A large entropy bonus keeps the policy more random than none.
    assert metrics["entropy"][1, :, -1].mean() > metrics["entropy"][0, :, -1].mean()


def test_a_hyperparameter_sweep_reproduces_the_unswept_run(tmp_path):
    """vmap of `train` over a 2-member sweep of the learning rate on the tiny
    preset: the member at the args' value is the plain `train(key)`; a 20x
    larger rate is a real effect (the policy leaves uniform sooner)."""
    args = tiny(tmp_path)
    algo = ppo.make_train(args)
    base = ppo.Hyperparams.from_args(args)
    rates = np.array([args.learning_rate, 20 * args.learning_rate], np.float32)
    sweep = jax.tree.map(lambda x: np.stack([x, x]), base).replace(learning_rate=rates)
    key = jax.random.key(0)
    _, swept = jax.jit(jax.vmap(algo.train, in_axes=(None, 0)))(key, sweep)
    _, plain = jax.jit(algo.train)(key)
    for name in ("episode_return", "policy_loss", "value_loss", "entropy", "approx_kl"):
        np.testing.assert_allclose(swept[name][0], plain[name], rtol=1e-5, atol=1e-7, err_msg=name)
    assert swept["entropy"][1, -1] < plain["entropy"][-1] - 0.05


def test_cartpole_learns(tmp_path):
    """The `cartpole` preset (PureJaxRL's settings) solves CartPole-v1: the
    greedy policy of each of 2 seeds averages >= 475 after 500k steps. Run as
    the CLI in a process of its own compiled with XLA's optimisations (the
    suite turns them off): 33 s instead of 54 s on 2 cores."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "algos" / "ppo.py"),
            "--preset",
            "cartpole",
            "--num-seeds",
            "2",
            "--log-every",
            "50",
            "--no-save-model",
            "--run-root",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    (run_dir,) = tmp_path.iterdir()
    returns = np.asarray(json.loads((run_dir / "eval.json").read_text())["returns"])
    assert returns.shape[0] == 2 and returns.mean(axis=1).min() >= 475, returns.mean(axis=1)


@pytest.mark.parametrize("seeding", ["init_seeds"])
def test_multi_seed_cnn_init_does_not_deadlock(seeding):
    """XLA:CPU's concurrency-optimised scheduler (jaxlib 0.10.2) hangs forever on
    `jax.vmap` of this init (two MinAtar CNN torsos, 2 seeds: swap `seeding` for
    "vmap" to see it time out); `runner.init_seeds` maps over seeds instead. The
    scheduler is on by default; the flag pins it on whatever the default becomes."""
    code = (
        "import jax, numpy as np\n"
        "from flax import nnx\n"
        "from jaxzoo.algos import ppo\n"
        "from jaxzoo import envs, runner\n"
        "spec = envs.spec(*envs.make('Breakout-MinAtar', 16))\n"
        "init = lambda key: nnx.split(ppo.ActorCritic(spec, 'cnn', (128,), 'relu', False, nnx.Rngs(key)))[1]\n"
        f"seeding = {seeding!r}\n"
        "if seeding == 'vmap':\n"
        "    program = jax.vmap(lambda seed: init(jax.random.key(seed)))\n"
        "else:\n"
        "    program = lambda seeds: runner.init_seeds(init, seeds)\n"
        "jax.block_until_ready(jax.jit(program)(np.arange(2, dtype=np.int32)))\n"
        "print('initialised')\n"
    )
    env = {**os.environ, "XLA_FLAGS": "--xla_cpu_enable_concurrency_optimized_scheduler=true"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=90, env=env)
    assert out.returncode == 0 and "initialised" in out.stdout, out.stderr


def test_documented_presets_exist():
    """The presets docs/ppo.md and benchmarks/ppo.sh use (one was once lost in an edit)."""
    import tomllib

    presets = tomllib.loads((ROOT / "configs" / "ppo.toml").read_text())
    for name in (
        "cartpole",
        "pendulum",
        "rllib",
        "breakout-minatar",
        "space-invaders-minatar",
        "tiny",
        "atari",
        "rllib-breakout",
        "tiny-atari",
        "pixel-cartpole",
        "pixel-pendulum",
        "cartpole-fast",
    ):
        assert name in presets, name
        cli.preset_args(ppo.Args, "ppo", name)  # every key is an Args field


@pytest.mark.parametrize("env_id", [f"pixels:{name}" for name in pixels.RENDERERS])
def test_every_pixel_env_trains(tmp_path, env_id):
    """Every env of the pixels: family (common/pixels.py's renderers) runs end to
    end: small images through the cnn torso, stacked frames."""
    args = tiny(tmp_path, env_id=env_id, image_size=12, frame_stack=2, total_timesteps=256, log_every=2)
    result = ppo.main(args)
    algo = ppo.make_train(args)
    assert algo.spec.obs_shape == (12, 12, 2) and result.chunk_traces == 1
    assert np.isfinite(result.eval_returns).all()


def test_one_intra_op_thread_only_for_presets_of_mlps():
    """`cpu_threads = 1` suits tiny MLPs only (docs/ppo.md detail 22): a
    convolutional torso with one XLA:CPU thread ran pixel-cartpole's training
    loop 30% slower and to other bits, so no preset that resolves to images
    may inherit it (pixel-cartpole extends cartpole and sets 0)."""
    one_thread = []
    for name in cli.presets("ppo"):
        args = cli.preset_args(ppo.Args, "ppo", name)
        if args.cpu_threads == 1:
            one_thread.append(name)
            assert args.torso in ("auto", "mlp"), (name, args.torso)
            assert ":" not in args.env_id and "MinAtar" not in args.env_id, (name, args.env_id)
    assert {"cartpole", "cartpole-fast"} <= set(one_thread), one_thread


@pytest.mark.parametrize("preset, num_envs", [("pixel-cartpole", 8), ("pixel-pendulum", 16)])
def test_pixel_presets_build_bytes_for_the_nature_torso(tmp_path, preset, num_envs):
    args = dataclasses.replace(cli.preset_args(ppo.Args, "ppo", preset), run_root=str(tmp_path))
    env, env_params, _, spec, torso = ppo.make_envs(args)
    obs, _ = jax.eval_shape(env.reset, jax.random.key(0), env_params)
    assert torso == "nature" and spec.obs_shape == (64, 64, 4) and obs.dtype == np.uint8 and obs.shape[0] == num_envs


@pytest.mark.parametrize(
    "overrides, message",
    [({"normalize_obs": True}, "normalize_obs and torso='mlp'"), ({"torso": "mlp"}, "normalize_obs and torso='mlp'")],
)
def test_pixel_env_refuses_what_is_for_vectors(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny(tmp_path, env_id="pixels:CartPole-v1", **overrides)
