"""algos/unizero.py end to end: smoke with both searches, determinism, resume,
a hyperparameter sweep, the command line, bad input."""

import dataclasses
import importlib
import importlib.util
import os
import subprocess
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import ROOT, assert_killed_run_resumes_exactly, assert_videos_show_first_episodes, run_copied_script
from flax import nnx

from jaxzoo import cli, logger, runner
from jaxzoo.algos import unizero as uz

LOSSES = ("loss", "latent_loss", "reward_loss", "policy_loss", "value_loss", "grad_norm")


def tiny(tmp_path, **overrides) -> uz.Args:
    return dataclasses.replace(cli.preset_args(uz.Args, "unizero", "tiny"), run_root=str(tmp_path), **overrides)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """Gumbel MuZero search, 2 seeds: 5 updates, chunks of 2, a checkpoint every 2."""
    args = tiny(tmp_path_factory.mktemp("runs"), num_seeds=2)
    return args, uz.main(args)


def test_smoke_gumbel_two_seeds(tiny_run):
    args, result = tiny_run
    assert result.chunk_traces == 1
    for name in LOSSES + ("value_target", "root_value", "search_entropy"):
        assert result.metrics[name].shape == (2, args.num_updates) and np.isfinite(result.metrics[name]).all(), name
    assert (result.metrics["gradient_steps"][:, -1] == args.num_updates * args.gradient_steps).all()
    assert result.eval_returns.shape == (2, args.eval_episodes) and (result.eval_returns > 0).all()
    assert len(logger.read_metrics(result.run_dir)["update"]) == 2 * args.num_updates
    # Replay holds the search's policy targets: distributions over the actions.
    stored = result.state.buffer.data.search_policy  # [seeds, rows, envs, A]
    written = np.asarray(result.state.buffer.size)[0]
    np.testing.assert_allclose(np.asarray(stored)[:, :written].sum(-1), 1.0, atol=1e-5)


def test_smoke_puct(tmp_path):
    """MuZero's PUCT search with Dirichlet noise, through the cached search
    (--search-kv-cache), the whole run as one jitted `train` (compiled without
    LLVM optimisation: it runs once)."""
    args = tiny(tmp_path, search_policy="puct", search_kv_cache=True)
    algo = uz.make_train(args)
    state, metrics = jax.jit(algo.train, compiler_options=runner.RUN_ONCE)(jax.random.key(0))
    for name in LOSSES:
        assert np.isfinite(np.asarray(metrics[name])).all(), name
    # Collection acts on visit counts: the stored policy targets are visit fractions in steps of 1 / simulations.
    weights = np.asarray(state.buffer.data.search_policy)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(weights * args.num_simulations, np.round(weights * args.num_simulations), atol=1e-4)


def test_same_seed_reruns_identically_and_a_killed_run_resumes_exactly(tiny_run, tmp_path, monkeypatch):
    """One rerun serves both checks (each run costs a trace on a busy CPU): the
    killed run starts from scratch with the same seed and logs updates 1-4
    before dying (after the checkpoint at 2); resumed, it must end with a
    bit-identical state (parameters, optimizer, replay, env states, keys) and
    evaluation, and its logged metrics (6 significant digits in metrics.csv)
    are the uninterrupted run's."""
    args, full = tiny_run
    assert_killed_run_resumes_exactly(uz, dataclasses.replace(args, run_root=str(tmp_path)), 4, 2, monkeypatch, full)
    (run_dir,) = (tmp_path / "killed").iterdir()
    rows = logger.read_metrics(run_dir)
    for name in ("loss", "root_value", "search_entropy", "episode_return"):
        for seed in range(args.num_seeds):
            logged = rows[name][rows["seed_index"] == seed][np.argsort(rows["update"][rows["seed_index"] == seed])]
            np.testing.assert_allclose(logged, full.metrics[name][seed], rtol=1e-5, err_msg=name)


def test_continue_script_trains_on_from_a_checkpoint_into_a_new_run_dir(tiny_run, tmp_path, capsys):
    """benchmarks/unizero_continue.py restores a finished run's last checkpoint,
    runs one more update under changed hyperparameters and args, and saves it
    as a new run directory (never an existing one), leaving the run untouched;
    eval_checkpoint.py reads the new directory with the changed args."""
    args, result = tiny_run
    load = lambda name: importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    spec = load("unizero_continue")
    continue_script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(continue_script)
    before = {p: p.stat().st_mtime_ns for p in sorted(Path(result.run_dir).rglob("*"))}
    saved = tmp_path / "continued"
    options = ["--steps", str(args.steps_per_update), "--chunk", "1", "--hparam", "q_rescale_min_gap=0.01"]
    continue_script.main([result.run_dir, *options, "--set", "explore_epsilon=0.5", "--save", str(saved)])
    assert "changed: {'q_rescale_min_gap': 0.01, 'explore_epsilon': 0.5}" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in sorted(Path(result.run_dir).rglob("*"))} == before
    continued = cli.load_run_args(uz.Args, saved, "unizero")
    assert (continued.explore_epsilon, continued.q_rescale_min_gap) == (0.5, 0.01)
    spec = load("eval_checkpoint")
    eval_checkpoint = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(eval_checkpoint)
    update, returns = eval_checkpoint.evaluate_checkpoint(str(saved))
    assert update == args.num_updates + 1 and returns.shape == (args.num_seeds, args.eval_episodes)
    with pytest.raises(SystemExit, match="exists; name a new directory"):
        continue_script.main([result.run_dir, *options, "--save", str(saved)])
    with pytest.raises(SystemExit, match="NAME one of learning_rate"):
        continue_script.main([result.run_dir, "--hparam", "no_such=1"])


def test_cli_tiny_run(tmp_path):
    # Same program as tiny_run (2 seeds), so the compilation cache of the session serves it.
    out = run_copied_script(
        "unizero", ["--preset", "tiny", "--num-seeds", "2", "--run-root", str(tmp_path), "--capture-video"]
    )
    assert out.returncode == 0, out.stderr
    assert "greedy evaluation" in out.stdout
    (run_dir,) = tmp_path.iterdir()
    assert_videos_show_first_episodes(run_dir, 2)


@pytest.mark.slow
def test_train_is_vmappable_over_hyperparameters(tmp_path):
    """`jax.vmap(train, in_axes=(None, 0))` over a stacked Hyperparams is a
    sweep in one compile: the member at the args' learning rate is the unswept
    run, and a learning rate 100x larger fits the reward and value heads much
    faster in the same 5 updates (same seed, same replay draws)."""
    args = tiny(tmp_path)
    algo = uz.make_train(args)
    base = uz.Hyperparams.from_args(args)
    rates = np.array([args.learning_rate, 100 * args.learning_rate], np.float32)
    sweep = jax.tree.map(lambda x: np.stack([x, x]), base).replace(learning_rate=rates)
    key = jax.random.key(0)
    _, swept = jax.jit(jax.vmap(algo.train, in_axes=(None, 0)), compiler_options=runner.RUN_ONCE)(key, sweep)
    _, single = jax.jit(algo.train, compiler_options=runner.RUN_ONCE)(key)
    assert swept["loss"].shape == (2, args.num_updates)
    for name in single:
        np.testing.assert_allclose(swept[name][0], single[name], rtol=1e-5, atol=1e-6, err_msg=name)
    for name in ("reward_loss", "value_loss"):
        assert float(swept[name][1, -1]) < 0.5 * float(swept[name][0, -1]), name


def test_bad_input(tmp_path):
    with pytest.raises(ValueError, match="Pendulum-v1 has a continuous action space"):
        uz.make_train(tiny(tmp_path, env_id="Pendulum-v1"))
    with pytest.raises(ValueError, match="context_steps=6 exceeds num_unroll_steps=5 .*; accepted: context_steps <= 5"):
        uz.Args(context_steps=6)
    with pytest.raises(ValueError, match="support_size=20 is even; accepted: an odd number >= 3"):
        uz.Args(support_size=20)
    with pytest.raises(ValueError, match="target_update_rate=0.0 is out of range; accepted: in \\(0, 1\\]"):
        uz.Args(target_update_rate=0.0)
    with pytest.raises(
        ValueError, match="priority_correction=0.5 with priority_exponent=0: .*accepted: --priority-exp"
    ):
        uz.Args(priority_correction=0.5)


@pytest.mark.parametrize("algo", ["unizero", "unizero_ppo"])
def test_dropout_draws_the_bits_of_a_draw_in_its_own_shape(algo):
    """Both files draw dropout's mask flat and reshape it (a compile-time saving,
    docs/performance.md): the mask must be the one a draw in x's own shape
    gives, so results from before the change still reproduce."""
    module = importlib.import_module(f"jaxzoo.algos.{algo}")
    key, rate = jax.random.key(7), 0.1
    for shape in [(256, 2, 10, 10), (3, 5, 64), (8,)]:
        x = jax.random.normal(jax.random.key(1), shape) + 2.0  # no zeros: a dropped entry is 0 exactly
        keep = np.asarray(jax.random.bernoulli(key, 1.0 - rate, shape))
        got = np.asarray(jax.jit(module.dropout, static_argnums=1)(x, rate, key))
        np.testing.assert_array_equal(got != 0, keep)
        np.testing.assert_allclose(got[keep], np.asarray(x)[keep] / (1.0 - rate), rtol=1e-6)
        assert 0 < (~keep).mean() < 0.2


def test_max_grad_norm_zero_turns_clipping_off():
    """--max-grad-norm 0 means no clipping (docs/glossary.md), not a clip to
    norm 0 that zeroes every update: the first update's gradient steps move the
    parameters by Adam's step size (weight decay off, so only gradients move them)."""
    args = cli.preset_args(uz.Args, "unizero", "tiny")
    args = dataclasses.replace(args, max_grad_norm=0.0, weight_decay=0.0)
    algo = uz.make_train(args)
    state = algo.init(jax.random.key(0))
    after, metrics = jax.jit(algo.update, compiler_options=runner.RUN_ONCE)(state)
    assert int(after.gradient_steps) == args.gradient_steps > 0 and float(metrics["grad_norm"]) > 0
    moved = max(
        float(np.abs(np.asarray(a) - np.asarray(b)).max())
        for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(after.params))
    )
    assert args.learning_rate / 2 < moved <= args.gradient_steps * args.learning_rate * 1.01


def test_prioritised_replay_samples_by_priority_and_writes_new_ones():
    """--priority-exponent 1: the first update's gradient steps replace the
    sampled windows' priorities (new steps enter at 1, the largest seen) with
    their |search value - n-step target| + epsilon, and the losses stay finite."""
    args = dataclasses.replace(cli.preset_args(uz.Args, "unizero", "tiny"), priority_exponent=1.0)
    algo = uz.make_train(args)
    after, metrics = jax.jit(algo.update, compiler_options=runner.RUN_ONCE)(algo.init(jax.random.key(0)))
    for name in LOSSES:
        assert np.isfinite(float(metrics[name])), name
    written = int(after.buffer.size)
    priority = np.asarray(after.buffer.priority)[:written]
    rescored = priority != 1.0
    assert int(after.gradient_steps) == args.gradient_steps > 0 and rescored.any()
    assert (priority[rescored] >= uz.PRIORITY_EPSILON).all() and np.isfinite(priority).all()
    assert float(after.buffer.max_priority) == max(1.0, float(priority.max()))
    assert 0 < float(metrics["search_value_error"]) < float(after.buffer.max_priority)



def test_td_steps_age_reaches_the_gradient_steps():
    """--td-steps-age 1: every replayed window is older than 1 env step, so
    its value targets bootstrap after one reward instead of td_steps; the first
    update's losses stay finite and its mean value target moves."""
    args = cli.preset_args(uz.Args, "unizero", "tiny")

    def first_update(a: uz.Args):
        algo = uz.make_train(a)
        return jax.jit(algo.update, compiler_options=runner.RUN_ONCE)(algo.init(jax.random.key(0)))[1]

    plain, aged = first_update(args), first_update(dataclasses.replace(args, td_steps_age=1))
    for name in LOSSES:
        assert np.isfinite(float(aged[name])), name
    assert abs(float(aged["value_target"]) - float(plain["value_target"])) > 1e-6

@pytest.mark.parametrize("preset", ["cartpole", "cartpole-v0", "cartpole-v0-puct", "breakout-minatar"])
def test_presets_build(preset):
    """Every preset builds its model and state; MinAtar's conv-encoder update traces (no compile)."""
    args = cli.preset_args(uz.Args, "unizero", preset)
    algo = uz.make_train(args)
    state = jax.eval_shape(algo.init, jax.random.key(0))
    assert state.buffer.data.obs.shape[1:] == (args.num_envs,) + algo.spec.obs_shape
    if preset == "breakout-minatar":
        assert algo.spec.obs_shape == (10, 10, 4)
        _, metrics = jax.eval_shape(algo.update, state)
        assert metrics["loss"].shape == ()


@pytest.mark.skipif(
    not Path("/usr/bin/time").exists(), reason="benchmarks/unizero.sh times each process with /usr/bin/time"
)
def test_breakout_puct_preset_is_the_benchmarks_flags(tmp_path):
    """configs/unizero.toml's `breakout-minatar-500k-puct` is the command line of
    `benchmarks/unizero.sh breakout-500k-puct-decay-terminal` at its defaults, so the
    preset reproduces the documented seeds. The flags are the script's own: a dry run
    of a copy of it (PYTHON=echo, in tmp_path so its run roots land there) prints them."""
    (tmp_path / "benchmarks").mkdir()
    script = tmp_path / "benchmarks" / "unizero.sh"
    script.write_text((ROOT / "benchmarks" / "unizero.sh").read_text())
    env = {"PATH": os.environ["PATH"], "PYTHON": "echo", "SEEDS": "1"}
    dry_run = subprocess.run(
        ["bash", str(script), "breakout-500k-puct-decay-terminal"], env=env, capture_output=True, text=True, check=True
    )
    commands = [line.split()[1:] for line in dry_run.stdout.splitlines() if line.startswith("algos/unizero.py ")]
    assert len(commands) == 1, dry_run.stdout
    flags = commands[0]
    for per_run in ("--seed", "--run-root", "--exp-name"):  # the seed and where it writes, not the settings
        at = flags.index(per_run)
        del flags[at : at + 2]
    assert flags[:2] == ["--preset", "breakout-minatar-500k"] and "--search-policy" in flags, flags
    from_flags = cli.parse(uz.Args, "unizero", flags)
    from_preset = cli.parse(uz.Args, "unizero", ["--preset", "breakout-minatar-500k-puct"])
    assert from_preset.exp_name == "unizero-minatar-500k-puct"
    assert dataclasses.replace(from_flags, exp_name=from_preset.exp_name) == from_preset
    assert from_preset != cli.preset_args(uz.Args, "unizero", "breakout-minatar-500k")


# ---- Atari through envpool (common/atari.py; the `atari` extra) ----------------------------
needs_envpool = pytest.mark.skipif(
    importlib.util.find_spec("envpool") is None, reason='envpool is not installed (pip install -e ".[atari]")'
)


@pytest.mark.slow
@needs_envpool
def test_tiny_atari_trains_end_to_end_and_logs_the_game_score(tmp_path):
    """tiny-atari: Breakout from 32x32 RGB bytes through envpool, the
    downsampling ResNet encoder, PUCT search, 3 updates in chunks of 2. Games
    are cut at 30 agent steps, so each env's first game ends in the second
    update (steps 16-31) and its whole-game score is logged."""
    args = dataclasses.replace(cli.preset_args(uz.Args, "unizero", "tiny-atari"), run_root=str(tmp_path))
    result = uz.main(args)
    assert result.chunk_traces == 1
    for name in LOSSES + ("value_target", "root_value", "search_entropy"):  # learning starts in the first update
        assert result.metrics[name].shape == (1, args.num_updates) and np.isfinite(result.metrics[name]).all(), name
    # Replay keeps the frames as bytes: [seeds, rows, envs, 32, 32, 3] uint8, real screens.
    frames = np.asarray(result.state.buffer.data.obs)
    assert frames.shape == (1, args.buffer_size // args.num_envs, args.num_envs, 32, 32, 3) and frames.dtype == np.uint8
    assert 0 < frames.mean() < 255
    rows = logger.read_metrics(result.run_dir)
    ended = np.isfinite(rows["game_score"])
    np.testing.assert_array_equal(ended, [False, True, False])  # 2 envs x 16 steps per update
    assert (rows["game_length"][ended] == args.max_episode_steps).all() and (rows["game_score"][ended] >= 0).all()
    np.testing.assert_array_equal(rows["episodes_finished"], [0, args.num_envs, 0])
    assert result.eval_returns.shape == (1, args.eval_episodes) and np.isfinite(result.eval_returns).all()


@needs_envpool
@pytest.mark.parametrize(
    "preset, colours, channels, width", [("atari-100k", 3, 64, 768), ("atari-100k-cpu", 1, 16, 128)]
)
def test_atari_100k_preset_builds_lightzeros_shapes(preset, colours, channels, width):
    """atari-100k: 64x64 RGB single frames stored as bytes (8 envs), the
    encoder's 8 x 8 x 64 = 4096 features projected to 768 (LightZero's
    RepresentationNetworkUniZero), and its update traces (no compile);
    atari-100k-cpu 64x64 grayscale frames, the same replay, 8 x 8 x 16
    features to 128."""
    args = cli.preset_args(uz.Args, "unizero", preset)
    assert args.num_seeds == 1 and args.frame_stack == 1
    algo = uz.make_train(args)
    assert algo.spec.obs_shape == (64, 64, colours) and algo.spec.num_actions == 4
    state = jax.eval_shape(algo.init, jax.random.key(0))
    assert state.buffer.data.obs.shape == (args.buffer_size // 8, 8, 64, 64, colours)
    assert state.buffer.data.obs.dtype == np.uint8 and state.history.obs.dtype == np.uint8
    assert state.params["encoder"]["linear"]["kernel"].shape == (8 * 8 * channels, width)
    _, metrics = jax.eval_shape(algo.update, state)
    assert metrics["loss"].shape == metrics["game_score"].shape == ()


@pytest.mark.parametrize("stride", [1, 2])
def test_atari_encoder_convolution_and_pooling_are_laxs(stride):
    """conv3x3 (patches @ kernel over one pixel of zero padding) is lax.conv with
    padding 1; average_pool is a 3x3 window sum / 9 with stride 2 over zero
    padding (PyTorch's AvgPool2d(3, 2, 1), count_include_pad)."""
    x = jax.random.normal(jax.random.key(0), (2, 7, 8, 3))
    kernel = nnx.Linear(27, 5, rngs=nnx.Rngs(0))
    weights = kernel.kernel[...].reshape(3, 3, 3, 5)  # HWIO, tap (i, j) at rows (3i + j) * C ...
    padding, layout = ((1, 1), (1, 1)), ("NHWC", "HWIO", "NHWC")
    expected = kernel.bias[...] + jax.lax.conv_general_dilated(
        x, weights, (stride, stride), padding, dimension_numbers=layout, precision=jax.lax.Precision.HIGHEST
    )
    assert expected.shape == (2, -(-7 // stride), -(-8 // stride), 5)
    np.testing.assert_allclose(uz.conv3x3(x, kernel, stride), expected, rtol=1e-4, atol=1e-5)
    pooled = jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0)))
    np.testing.assert_allclose(uz.average_pool(x), pooled / 9, rtol=1e-5, atol=1e-6)


def test_atari_bad_input():
    """envpool ids: one seed per process (envpool's XLA calls cannot be vmapped),
    refused before anything is built, with the bad value named."""
    with pytest.raises(ValueError, match="envpool:Breakout-v5.*num_seeds must be 1, got 2"):
        uz.Args(env_id="envpool:Breakout-v5", num_seeds=2)
    with pytest.raises(ValueError, match="--parallel data is not supported"):
        uz.Args(env_id="envpool:Breakout-v5", parallel="data")
