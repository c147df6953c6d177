"""algos/world_models.py end to end: the four stages (tiny preset), the fused
program, dream training from another run's V and M, resuming each stage,
the CLI, bad input, the CarRacing path."""

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import Killed, run_copied_script
from flax import nnx

from jaxzoo import checkpoint, cli, logger, runner
from jaxzoo.algos import world_models as wm


def tiny(tmp_path, **overrides) -> wm.Args:
    return dataclasses.replace(cli.preset_args(wm.Args, "world_models", "tiny"), run_root=str(tmp_path), **overrides)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    args = tiny(tmp_path_factory.mktemp("runs"))
    return args, wm.main(args)


def test_smoke_all_stages(tiny_run):
    args, result = tiny_run
    run_dir = Path(result["run_dir"])
    assert result["chunk_traces"] == {"collect": 1, "vae": 1, "mdn": 1, "controller": 1}
    metrics = {stage: logger.read_metrics(run_dir / stage) for stage in wm.STAGES}
    assert len(metrics["collect"]["update"]) == 1 and len(metrics["vae"]["update"]) == args.vae_updates
    assert len(metrics["mdn"]["update"]) == args.mdn_updates and len(metrics["controller"]["update"]) == args.generations
    for stage, names in {"vae": ("vae_loss", "reconstruction_loss", "kl"), "mdn": ("z_nll", "done_loss", "reward_loss"),
                         "controller": ("fitness_best", "sigma")}.items():
        for name in names:
            assert np.isfinite(metrics[stage][name]).all(), (stage, name)
    assert 8 <= float(metrics["collect"]["random_episode_length"][0]) <= args.rollout_steps  # random CartPole
    returns = np.asarray(result["returns"])
    assert returns.shape == (1, args.eval_episodes) and (returns >= 1).all() and (returns <= 500).all()
    saved = json.loads((run_dir / "eval.json").read_text())
    assert set(saved["stage_seconds"]) == {*wm.STAGES, "evaluate"}
    np.testing.assert_allclose(saved["mean"], returns.mean())


def test_rollouts_keep_final_frames_and_mask_after_the_end(tiny_run):
    args, result = tiny_run
    data = result["outputs"]["collect"]
    n, t = args.num_rollouts, args.rollout_steps
    assert data.frames.shape == (1, n, t + 1, 16, 16, 1) and data.frames.dtype == jnp.uint8
    valid, terminated = np.asarray(data.valid[0]), np.asarray(data.terminated[0])
    lengths = valid.sum(1)
    assert (valid == (np.arange(t) < lengths[:, None])).all()  # valid is a prefix: one episode per rollout
    ended = lengths < t
    assert terminated[ended, lengths[ended] - 1].all()  # an episode shorter than t terminated at its last step
    assert terminated.sum() == terminated[np.arange(n), lengths - 1].sum()  # and nowhere else
    np.testing.assert_array_equal(np.asarray(data.rewards[0]), valid.astype(np.float32))  # CartPole: 1 per step
    assert np.asarray(data.actions[0]).sum(-1).max() == 1.0  # one-hot actions
    frames = np.asarray(data.frames[0])
    i = int(np.argmax(ended))
    assert not np.array_equal(frames[i, lengths[i]], frames[i, 0])  # the final frame, not a fresh reset


def test_dream_controller_from_another_runs_v_and_m(tiny_run, tmp_path):
    args, result = tiny_run
    dream_args = dataclasses.replace(args, run_root=str(tmp_path), stages=("controller",), controller_env="dream",
                                     source_run=result["run_dir"])
    dream = wm.main(dream_args)
    run_dir = Path(dream["run_dir"])
    assert sorted(p.name for p in run_dir.iterdir() if p.is_dir()) == ["controller"]
    assert dream["controller_env"] == "dream" and np.isfinite(dream["mean"])
    fitness = logger.read_metrics(run_dir / "controller")["fitness_best"]
    assert np.isfinite(fitness).all() and (np.abs(fitness) <= 3 * args.controller_max_steps).all()  # capped dreams


def test_collect_with_an_earlier_runs_controller(tiny_run, tmp_path):
    """--collect-with (the paper's iterative procedure): the collect stage's last
    (1 - collect_random_fraction) episodes are played by the earlier run's V, M
    and C, whose actions replayed on the stored frames are exactly the stored
    ones; the first episodes stay random; a run that does not fit is refused."""
    args, result = tiny_run
    again = dataclasses.replace(
        args, run_root=str(tmp_path), stages=("collect",), collect_with=result["run_dir"], collect_random_fraction=0.25
    )
    collected = wm.main(again)
    data = jax.tree.map(lambda x: np.asarray(x[0]), collected["outputs"]["collect"])
    n = args.num_rollouts
    num_random = round(n * 0.25)
    metrics = logger.read_metrics(Path(collected["run_dir"]) / "collect")
    assert {"random_episode_length", "controller_episode_length"} <= set(metrics)
    # Replay V, M and C (the earlier run's seed-0 controller) over each controlled episode's frames.
    params = jax.tree.map(lambda x: x[0], result["outputs"]["mdn"].params)
    theta = result["outputs"]["controller"].cma.mean[0]
    setup_spec = wm.make_train(again)
    models = setup_spec.merge(params)
    carry = (jnp.zeros((n, args.rnn_size)), jnp.zeros((n, args.rnn_size)))
    chosen = []
    for t in range(args.rollout_steps):
        z, _ = models.vae.encode(wm.to_float(jnp.asarray(data.frames[:, t])))
        raw = wm.controller_action(jnp.broadcast_to(theta, (n, theta.size)), z, carry[1], 2)
        action = jnp.argmax(raw, -1)
        carry, _ = models.mdn.step(carry, z, jax.nn.one_hot(jnp.asarray(data.actions[:, t].argmax(-1)), 2))
        chosen.append(np.asarray(action))
    chosen = np.stack(chosen, 1)  # [N, T]
    stored = data.actions.argmax(-1)
    played = data.valid[num_random:]
    np.testing.assert_array_equal(chosen[num_random:][played], stored[num_random:][played])
    assert (chosen[:num_random][data.valid[:num_random]] != stored[:num_random][data.valid[:num_random]]).any()

    with pytest.raises(ValueError, match=r"--collect-with .*: its V, M and C do not fit this run \(z_size=4 there, 8 here\)"):
        wm.main(dataclasses.replace(again, z_size=8))
    with pytest.raises(ValueError, match=r"acts on the collect stage, which stages \['vae'\] do not run"):
        dataclasses.replace(again, stages=("vae",), source_run=result["run_dir"])


def test_cut_into_rollouts_keeps_every_step_in_order():
    """Episodes of 6 steps cut into pieces of 2: piece k of episode n is
    rollout 3 n + k, holds steps 2k, 2k + 1 and frames 2k ... 2k + 2."""
    n, e, steps = 2, 6, 2
    frames = jnp.arange(n * (e + 1)).reshape((n, e + 1, 1, 1, 1)).astype(jnp.uint8)
    per_step = jnp.arange(n * e).reshape((n, e))
    episodes = wm.Rollouts(frames, per_step[..., None].astype(jnp.float32), per_step.astype(jnp.float32),
                           per_step == 3, per_step < 4)
    pieces = jax.tree.map(np.asarray, wm.cut_into_rollouts(episodes, steps))
    assert pieces.frames.shape == (6, 3, 1, 1, 1) and pieces.valid.shape == (6, 2)
    for i in range(n):
        for k in range(e // steps):
            np.testing.assert_array_equal(pieces.frames[i * 3 + k, :, 0, 0, 0], frames[i, 2 * k: 2 * k + 3, 0, 0, 0])
            np.testing.assert_array_equal(pieces.rewards[i * 3 + k], per_step[i, 2 * k: 2 * k + 2])
    np.testing.assert_array_equal(pieces.valid[:3].ravel(), [True] * 4 + [False] * 2)  # episode 0 ended at step 3
    np.testing.assert_array_equal(pieces.terminated.ravel(), per_step.ravel() == 3)
    assert wm.cut_into_rollouts(episodes, e) is episodes  # one piece: unchanged


def test_collect_steps_stores_long_episodes_as_consecutive_rollouts(tmp_path):
    """--collect-steps 40 with rollout_steps 10: the same 8 episodes as
    rollout_steps 40 (same seed), cut into 4 rollouts each; a piece after its
    episode's end has no valid frame, and the dreams' start states skip it
    (the nearest piece before it that started)."""
    whole = wm.main(tiny(tmp_path / "whole", stages=("collect",), rollout_steps=40, mdn_batch_size=4))
    cut = wm.main(tiny(tmp_path / "cut", stages=("collect",), rollout_steps=10, collect_steps=40))
    episodes = jax.tree.map(lambda x: x[0], whole["outputs"]["collect"])
    pieces = jax.tree.map(lambda x: np.asarray(x[0]), cut["outputs"]["collect"])
    assert pieces.valid.shape == (32, 10)
    expected = jax.tree.map(np.asarray, wm.cut_into_rollouts(episodes, 10))
    for got, want in zip(jax.tree.leaves(pieces), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(got, want)
    started = pieces.valid[:, 0]
    assert started[::4].all() and not started.all()  # random CartPole episodes end before 40 steps: dead pieces
    assert (np.asarray(wm.frame_valid(pieces))[:, 0] == started).all()
    metrics = logger.read_metrics(Path(cut["run_dir"]) / "collect")
    np.testing.assert_allclose(metrics["random_episode_length"][0], pieces.valid.reshape(8, 40).sum(1).mean())

    world = wm.make_train(tiny(tmp_path, rollout_steps=10, collect_steps=40))
    params = wm.Params(*nnx.split(wm.Models(tiny(tmp_path), 2, nnx.Rngs(0)), wm.VAE_PART, ...)[1:])
    latents = np.asarray(world.initial_latents(params, jax.tree.map(jnp.asarray, pieces)))
    for i in np.flatnonzero(~started):  # a dead piece starts where the last started piece before it does
        source = max(j for j in range(i) if started[j])
        np.testing.assert_array_equal(latents[i], latents[source])
    with pytest.raises(ValueError, match=r"collect_steps=25 is not a multiple of rollout_steps=10"):
        tiny(tmp_path, rollout_steps=10, collect_steps=25)


def test_collect_keep_adds_the_new_episodes_to_the_earlier_runs(tiny_run, tmp_path):
    """--collect-with RUN --collect-keep: the stored rollouts are RUN's, then
    this run's; a later run reading them with --source-run gets them all."""
    args, result = tiny_run
    keep = dataclasses.replace(args, run_root=str(tmp_path), stages=("collect",), collect_with=result["run_dir"],
                               collect_keep=True, total_timesteps=160)
    kept = wm.main(keep)
    earlier = jax.tree.map(np.asarray, result["outputs"]["collect"])
    data = jax.tree.map(np.asarray, kept["outputs"]["collect"])
    n0 = args.num_rollouts
    assert data.valid.shape == (1, n0 + keep.num_rollouts, args.rollout_steps)
    for got, want in zip(jax.tree.leaves(data), jax.tree.leaves(earlier)):
        np.testing.assert_array_equal(got[:, :n0], want)
    assert logger.read_metrics(Path(kept["run_dir"]) / "collect")["rollouts_kept"][0] == n0
    later = wm.main(dataclasses.replace(args, run_root=str(tmp_path), stages=("vae",), source_run=kept["run_dir"]))
    assert later["outputs"]["collect"].valid.shape == data.valid.shape  # loaded at the collecting run's shapes
    assert np.isfinite(logger.read_metrics(Path(later["run_dir"]) / "vae")["vae_loss"]).all()

    with pytest.raises(ValueError, match=r"rollout_steps=20 there, 10 here"):
        wm.main(dataclasses.replace(keep, rollout_steps=10))
    with pytest.raises(ValueError, match=r"collect_keep keeps the rollouts of the --collect-with run"):
        dataclasses.replace(args, collect_keep=True)


def test_v_from_a_run_with_another_m(tiny_run, tmp_path):
    """Only V is read from a V stage: M can change (--done-hidden here) with V
    from --source-run; a V of other sizes is refused, naming what to match."""
    args, result = tiny_run
    again = wm.main(dataclasses.replace(args, run_root=str(tmp_path), stages=("mdn",), done_hidden=4,
                                        source_run=result["run_dir"]))
    first = again["outputs"]["mdn"].params.mdn["mdn"]["done"]["layers"][0]["kernel"].value
    assert first.shape == (1, args.rnn_size, 4)
    assert np.isfinite(logger.read_metrics(Path(again["run_dir"]) / "mdn")["done_loss"]).all()
    with pytest.raises(ValueError, match=r"trained another V .*accepted: --source-run with a run of the same V sizes"):
        wm.main(dataclasses.replace(args, run_root=str(tmp_path), stages=("mdn",), z_size=8, source_run=result["run_dir"]))


def kill_after(monkeypatch, stage: str, update: int):
    original = logger.Run.log

    def log_then_die(self, updates, global_step, metrics):
        original(self, updates, global_step, metrics)
        if self.dir.name == stage and updates[-1] == update:
            raise Killed()

    monkeypatch.setattr(logger.Run, "log", log_then_die)
    return original


def test_killed_run_resumes_every_stage_exactly(tiny_run, tmp_path, monkeypatch):
    """Killed after logging generation 2 of C, before its checkpoint (the last
    is at 1): --resume restores the final checkpoints of collect, V and M and
    C's checkpoint at generation 1, continues C, and ends with the
    uninterrupted run's states and evaluation, bit for bit."""
    args, full = tiny_run
    stage = "controller"
    original = kill_after(monkeypatch, stage, 2)
    with pytest.raises(Killed):
        wm.main(dataclasses.replace(args, run_root=str(tmp_path)))
    monkeypatch.setattr(logger.Run, "log", original)
    (run_dir,) = tmp_path.iterdir()
    assert checkpoint.latest_update(run_dir / stage) == 1
    resumed = wm.main(wm.Args(resume=str(run_dir)))
    for name in wm.STAGES:
        for a, b in zip(jax.tree.leaves(full["outputs"][name]), jax.tree.leaves(resumed["outputs"][name])):
            if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
                a, b = jax.random.key_data(a), jax.random.key_data(b)
            np.testing.assert_array_equal(a, b)
    updates = logger.read_metrics(run_dir / stage)["update"]
    assert sorted(updates) == list(range(1, getattr(wm.make_train(args), stage).num_updates + 1))
    np.testing.assert_array_equal(full["returns"], resumed["returns"])


def test_the_whole_pipeline_traces_as_one_program():
    args = cli.preset_args(wm.Args, "world_models", "tiny")
    params, controller, returns = jax.eval_shape(wm.make_train(args).train, jax.random.key(0))
    assert returns.shape == (args.eval_episodes,)
    assert controller.cma.mean.shape == (2 * (args.z_size + args.rnn_size) + 2,)


@pytest.mark.slow
def test_train_is_vmappable_over_hyperparameters():
    """`jax.vmap(train, in_axes=(None, 0))` over a stacked Hyperparams is a
    sweep of the whole pipeline in one compile: the member with the args' V
    learning rate reproduces the unswept run (up to float reassociation in the
    batched program), and a 300x larger one trains a V that reconstructs the
    frames measurably differently."""
    args = cli.preset_args(wm.Args, "world_models", "tiny")
    algo = wm.make_train(args)
    sweep = jax.tree.map(lambda x: np.stack([x, x]), wm.Hyperparams.from_args(args))
    sweep = sweep.replace(vae_learning_rate=np.array([args.vae_learning_rate, 3e-2], np.float32))
    key = jax.random.key(0)
    swept = jax.jit(jax.vmap(algo.train, in_axes=(None, 0)), compiler_options=runner.RUN_ONCE)(key, sweep)
    single = jax.jit(algo.train, compiler_options=runner.RUN_ONCE)(key)
    member = jax.tree.map(lambda x: x[0], swept)
    # CMA-ES's eigenvectors are defined up to sign and rotation within equal
    # eigenvalues, so they are compared through the covariance they span.
    eigen = lambda c: (c.eigvecs * c.eigvals) @ c.eigvecs.T  # noqa: E731
    np.testing.assert_allclose(eigen(member[1].cma), eigen(single[1].cma), rtol=1e-5, atol=1e-6)
    drop_eigvecs = lambda out: (out[0], out[1].replace(cma=out[1].cma.replace(eigvecs=jnp.zeros(()))), out[2])  # noqa: E731
    for a, b in zip(jax.tree.leaves(drop_eigvecs(member)), jax.tree.leaves(drop_eigvecs(single))):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    frames = algo.collect.init(jax.random.key(1)).frames.reshape((-1, *args.image_shape))  # unseen frames
    errors = []
    for i in range(2):
        params = jax.tree.map(lambda x: x[i], swept[0])
        mean, _ = algo.encode(params, frames)
        decoded = algo.merge(params).vae.decode(mean)
        errors.append(float(jnp.square(decoded - frames.astype(jnp.float32) / 255.0).sum((-3, -2, -1)).mean()))
    assert abs(errors[1] - errors[0]) > 0.1 * errors[0], errors


def test_paper_sizes_trace():
    # The paper's CarRacing V, M and C (shapes only): z 32, LSTM 256, 5 mixtures, C = 3 x (32 + 256) + 3 = 867.
    args = dataclasses.replace(
        cli.preset_args(wm.Args, "world_models", "carracing-paper"), env_id="CartPole-v1", collect_policy="uniform"
    )
    graphdef, state = nnx.split(nnx.eval_shape(lambda: wm.Models(args, 3, nnx.Rngs(0))))
    run = lambda fn, *xs: jax.eval_shape(lambda s, *xs: fn(nnx.merge(graphdef, s), *xs), state, *xs)  # noqa: E731
    z = jax.ShapeDtypeStruct((7, 32), jnp.float32)
    mean, _ = run(lambda m, x: m.vae.encode(x), jax.ShapeDtypeStruct((7, 64, 64, 3), jnp.float32))
    assert mean.shape == (7, 32) and run(lambda m: jnp.zeros(m.vae.flat)).shape == (1024,)  # the paper's 2 x 2 x 256
    assert run(lambda m, z: m.vae.decode(z), z).shape == (7, 64, 64, 3)
    carry = (jax.ShapeDtypeStruct((7, 256), jnp.float32),) * 2
    _, out = run(lambda m, c, z, a: m.mdn.step(c, z, a), carry, z, jax.ShapeDtypeStruct((7, 3), jnp.float32))
    assert out.logits.shape == (7, 32, 5)
    assert 3 * (32 + 256) + 3 == 867


def test_cli_runs_a_stage_alone(tmp_path):
    out = run_copied_script("world_models", ["--preset", "tiny", "--stages", "collect", "--run-root", str(tmp_path)],
                            timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    (run_dir,) = tmp_path.iterdir()
    assert json.loads((run_dir / "args.json").read_text())["stages"] == ["collect"]
    assert checkpoint.latest_update(run_dir / "collect") == 1 and not (run_dir / "vae").exists()


def test_bad_input_names_the_value_and_what_is_accepted(tmp_path):
    with pytest.raises(ValueError, match="env_id 'Acrobot-v1' is not supported; accepted: Pendulum-v1, CartPole-v1, "
                                         "CarRacing-v3"):
        tiny(tmp_path, env_id="Acrobot-v1")
    with pytest.raises(ValueError, match=r"env_id 'CartPole-v2' is not supported \(did you mean 'CartPole-v1'\?\)"):
        tiny(tmp_path, env_id="CartPole-v2")
    with pytest.raises(ValueError, match=r"population=1 is out of range; accepted: >= 2"):
        tiny(tmp_path, population=1)
    with pytest.raises(ValueError, match=r"stages \['vae', 'collect'\] must be distinct and in pipeline order"):
        tiny(tmp_path, stages=("vae", "collect"))
    with pytest.raises(ValueError, match=r"stages \['train'\] are not a non-empty subset of \['collect', 'vae'"):
        tiny(tmp_path, stages=("train",))
    with pytest.raises(ValueError, match="controller_env='dream' needs M's reward and done heads.*predict_done=False"):
        tiny(tmp_path, controller_env="dream", predict_done=False)
    with pytest.raises(ValueError, match="controller_env must be 'real' or 'dream', got 'sim'"):
        tiny(tmp_path, controller_env="sim")
    with pytest.raises(ValueError, match="image_size=48 is not supported; accepted: one of \\[16, 32, 64\\]"):
        tiny(tmp_path, image_size=48)
    with pytest.raises(ValueError, match="mdn_batch_size=99 exceeds the 16 rollouts"):
        tiny(tmp_path, mdn_batch_size=99)
    with pytest.raises(ValueError, match="dream_temperature=0.0 is out of range; accepted: > 0"):
        tiny(tmp_path, dream_temperature=0.0)
    with pytest.raises(ValueError, match=r"stages \['mdn'\] start after 'collect': pass --source-run RUN_DIR"):
        wm.main(tiny(tmp_path, stages=("mdn",)))
    with pytest.raises(FileNotFoundError, match="stage 'collect' is needed but not in --stages.*no checkpoint"):
        wm.main(tiny(tmp_path, stages=("controller",), source_run=str(tmp_path / "nowhere")))


def test_carracing_without_box2d_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "Box2D", None)  # import Box2D now raises ImportError
    args = dataclasses.replace(cli.preset_args(wm.Args, "world_models", "carracing-small"), run_root=str(tmp_path))
    with pytest.raises(ValueError, match=r"env_id 'CarRacing-v3' needs gymnasium's box2d extra.*pip install -e '\.\[carracing\]'"):
        wm.make_train(args)


@pytest.mark.skipif(importlib.util.find_spec("Box2D") is None,
                    reason="CarRacing-v3 needs box2d (pip install -e '.[carracing]'), not installed in this environment")
@pytest.mark.slow
def test_carracing_small_preset_runs_on_the_host(tmp_path):
    args = cli.preset_args(wm.Args, "world_models", "carracing-small")
    result = wm.main(dataclasses.replace(args, run_root=str(tmp_path), capture_video=True))
    assert np.asarray(result["returns"]).shape == (1, 1) and np.isfinite(result["mean"])
    assert result["outputs"]["collect"].frames.shape[-3:] == (16, 16, 3)
    # --capture-video: the evaluation episode's own 96 x 96 frames, one per step (10: controller_max_steps)
    import imageio.v3 as iio

    (video,) = (Path(result["run_dir"]) / "videos").iterdir()
    assert video.name == "final-seed0.mp4" and iio.imread(video).shape == (10, 288, 288, 3)
    # the dream recipe (carracing-cpu-dream's flags) on that run's collect and V: C evolved in M's
    # dream, then evaluated in the host env (it once went to the traced evaluation and failed)
    dream_args = dataclasses.replace(
        args, run_root=str(tmp_path / "dream"), predict_reward=True, predict_done=True, controller_env="dream",
        stages=("mdn", "controller"), source_run=result["run_dir"],
    )
    dreamed = wm.main(dream_args)
    assert dreamed["controller_env"] == "dream" and np.asarray(dreamed["returns"]).shape == (1, 1)
    assert np.isfinite(dreamed["mean"]) and dreamed["mean"] != 0.0  # real CarRacing rewards: -0.1 a step, tiles


def test_carracing_squash_and_random_controller_collection_are_the_authors():
    """CarRacing's C output goes to (tanh, (tanh + 1) / 2, clip(tanh, 0, 1))
    as the authors' model.py; --collect-policy random-controller drives nearly
    straight at half gas without braking (their extract.py's random C), where
    uniform actions brake as hard as they accelerate; other envs refuse it."""
    raw = np.array([[0.0, 0.0, 0.0], [2.0, -2.0, -1.0], [-0.5, 1.0, 0.7]])
    expected = np.stack([np.tanh(raw[:, 0]), (np.tanh(raw[:, 1]) + 1) / 2, np.clip(np.tanh(raw[:, 2]), 0, 1)], -1)
    np.testing.assert_allclose(wm.CarRacingHost.squash(jnp.asarray(raw)), expected, rtol=1e-6)
    np.testing.assert_allclose(wm.CarRacingHost.squash(jnp.zeros(3)), [0.0, 0.5, 0.0])
    args = cli.preset_args(wm.Args, "world_models", "carracing-small")
    assert args.collect_policy == "random-controller"
    host = object.__new__(wm.CarRacingHost)  # random_policy needs only args: no box2d, no processes
    host.args = args
    act = host.random_policy([5, 6, 7])
    episode, starting = np.array([0, 1, 2, -1]), np.zeros(4, bool)
    actions = np.stack([act(np.zeros((4, 16, 16, 3)), episode, starting) for _ in range(200)])  # [200, 4, 3]
    steer, gas, brake = actions[:, :3, 0], actions[:, :3, 1], actions[:, :3, 2]
    assert np.abs(steer).max() < 0.3 and np.abs(gas - 0.5).max() < 0.15 and brake.min() == 0.0 and brake.max() < 0.3
    assert np.all(actions[:, 3] == 0) and 0.3 < (brake == 0).mean() < 0.7  # the idle process; brake clipped half the time
    # an episode's draws are its own: the same whichever process plays it and whatever the others do
    again = host.random_policy([7, 6, 5])
    np.testing.assert_array_equal(again(None, np.array([-1, -1, 2]), starting[:3])[2], actions[0, 0])
    host.args = dataclasses.replace(args, collect_policy="uniform")
    uniform = host.random_policy([5, 6, 7])(np.zeros((4, 16, 16, 3)), episode, starting)
    assert uniform.shape == (4, 3) and uniform[:3, 2].mean() > 0.1
    with pytest.raises(ValueError, match="collect_policy='random-controller' is the authors' CarRacing collection"):
        dataclasses.replace(cli.preset_args(wm.Args, "world_models", "tiny"), collect_policy="random-controller")


class FakeCarRacingProcesses:
    """AsyncVectorEnv's interface without autoreset, as CarRacingHost makes it:
    the episode on track seed s lasts s % 7 + 2 steps and ends `terminated`;
    a frame is filled with 10 s + t; reward 1 + s per step; an idle process
    (reset with options idle) returns its last frame and 0 without counting a
    simulated step, as make_idle_when_asked's wrapper does."""

    def __init__(self, width):
        self.width, self.seed, self.t, self.idle = width, [0] * width, [0] * width, [True] * width
        self.simulated, self.calls = 0, 0

    def frames(self):
        return np.stack([np.full((96, 96, 3), (10 * s + t) % 256, np.uint8) for s, t in zip(self.seed, self.t)])

    def reset(self, seed=None, options=None):
        options = dict(options or {})
        mask = options.pop("reset_mask", np.ones(self.width, bool))
        for i in np.flatnonzero(mask):
            self.idle[i] = bool(options.get("idle"))
            if not self.idle[i]:
                self.seed[i], self.t[i] = seed[i], 0
        return self.frames(), {}

    def step(self, action):
        self.calls += 1
        reward, term = np.zeros(self.width), np.zeros(self.width, bool)
        for i in range(self.width):
            if not self.idle[i]:
                self.t[i] += 1
                self.simulated += 1
                reward[i], term[i] = 1 + self.seed[i], self.t[i] == self.seed[i] % 7 + 2
        return self.frames(), reward, term, np.zeros(self.width, bool), {}


def test_carracing_episodes_run_as_a_work_queue():
    """CarRacingHost.episodes on 3 processes, 8 episodes of 2-8 steps (cap 6):
    every episode is played whole on its own track, its controller told when
    it starts, each process takes the next episode as soon as its own ends,
    and no process simulates once no episode is left for it."""
    args = dataclasses.replace(cli.preset_args(wm.Args, "world_models", "carracing-small"), host_envs=3)
    host = object.__new__(wm.CarRacingHost)  # no box2d: the fake processes
    host.args, host.vector = args, FakeCarRacingProcesses(3)
    host.jitted_preprocess = jax.jit(host.crop_and_resize)
    seeds, cap = [3, 12, 0, 5, 11, 4, 6, 9], 6
    lengths = np.array([min(s % 7 + 2, cap) for s in seeds])
    starts = []

    def act(frames, episode, starting):
        starts.extend(episode[starting].tolist())
        return np.stack([np.full(3, e, np.float32) for e in episode])  # each action names its episode

    actions, rewards, terminated, valid, frames, _ = host.episodes(seeds, cap, act, keep_frames=True)
    assert sorted(starts) == list(range(8))  # each episode started once, and the controller was told
    np.testing.assert_array_equal(valid.sum(1), lengths)
    for i, (seed, length) in enumerate(zip(seeds, lengths)):
        np.testing.assert_array_equal(actions[i, :length, 0], i)
        np.testing.assert_array_equal(rewards[i, :length], 1 + seed)
        assert terminated[i, length - 1] == (seed % 7 + 2 <= cap) and not terminated[i, : length - 1].any()
        # frames 0..length are the episode's own, t = 0 .. length (10 s + t, resized): the last one included
        np.testing.assert_array_equal(frames[i, : length + 1, 0, 0, 0], (10 * seed + np.arange(length + 1)) % 256)
        assert not frames[i, length + 1 :].any()
    assert host.vector.simulated == lengths.sum()  # idle processes did not simulate
    assert host.vector.calls < 3 * lengths.max()  # rounds of 3 in lockstep would take 3 x their longest
    assert host.vector.calls <= -(-lengths.sum() // 3) + lengths.max()


@pytest.mark.skipif(importlib.util.find_spec("Box2D") is None,
                    reason="CarRacing-v3 needs box2d (pip install -e '.[carracing]'), not installed in this environment")
def test_carracing_process_idles_when_asked():
    env = wm.make_idle_when_asked()
    first, _ = env.reset(seed=3)
    for _ in range(5):
        obs, *_ = env.step(np.array([0.0, 1.0, 0.0], np.float32))
    position = tuple(env.unwrapped.car.hull.position)
    parked, _ = env.reset(options={"idle": True})
    np.testing.assert_array_equal(parked, obs)
    for _ in range(3):  # no simulation: the car stays, the frame and a zero reward come back
        frame, reward, terminated, truncated, _ = env.step(np.array([0.0, 1.0, 0.0], np.float32))
        np.testing.assert_array_equal(frame, obs)
        assert (reward, terminated, truncated) == (0.0, False, False)
    assert tuple(env.unwrapped.car.hull.position) == position
    again, _ = env.reset(seed=3)  # a reset with a seed plays again
    np.testing.assert_array_equal(again, first)
    env.close()


@pytest.mark.skipif(importlib.util.find_spec("Box2D") is None,
                    reason="CarRacing-v3 needs box2d (pip install -e '.[carracing]'), not installed in this environment")
def test_carracing_vectorized_road_draws_gymnasiums_pixels():
    """VectorizedRoad against gymnasium's own _render_road: every frame of an
    episode that steers over tiles (their color changes when first touched),
    and single road renders at exact quarter turns (deferred to gymnasium)
    and at other angles."""
    import gymnasium
    import pygame

    stock, fast = gymnasium.make("CarRacing-v3"), gymnasium.make("CarRacing-v3")
    road = wm.VectorizedRoad(fast.unwrapped)
    fast.unwrapped._render_road = road
    rng = np.random.default_rng(0)
    frame, _ = stock.reset(seed=7)
    np.testing.assert_array_equal(fast.reset(seed=7)[0], frame)
    for t in range(120):
        action = np.array([np.sin(t / 10), rng.uniform(0.2, 1.0), 0.0], np.float32)
        frame, reward, *_ = stock.step(action)
        fast_frame, fast_reward, *_ = fast.step(action)
        np.testing.assert_array_equal(fast_frame, frame, err_msg=f"step {t}")
        assert fast_reward == reward
    assert road.track_of is fast.unwrapped.road_poly
    for angle in (0.0, np.pi / 2, -np.pi, 1.234, -5.0):
        drawn = []
        for env, render in ((stock.unwrapped, stock.unwrapped._render_road), (fast.unwrapped, road)):
            env.surf = pygame.Surface((600, 400))
            render(2.7, (300.0, 100.0), float(angle))
            drawn.append(pygame.surfarray.array3d(env.surf))
        np.testing.assert_array_equal(drawn[1], drawn[0], err_msg=f"angle {angle}")
    stock.close(), fast.close()


def test_every_preset_is_valid():
    presets = cli.presets("world_models")
    assert {"pixel-cartpole", "pixel-cartpole-dream", "seed-notebook", "carracing-paper", "tiny"} <= set(presets)
    for name in presets:
        args = cli.preset_args(wm.Args, "world_models", name)  # validation in Args.__post_init__
        if args.env_id not in wm.HOST_ENVS:
            assert wm.make_train(args).num_params == 2 * (args.z_size + args.rnn_size) + 2, name


@pytest.mark.skipif(importlib.util.find_spec("Box2D") is None,
                    reason="CarRacing-v3 needs box2d (pip install -e '.[carracing]'), not installed in this environment")
def test_carracing_rounds_of_async_envs_match_one_env_stepped_by_hand(tmp_path):
    """3 controllers on host_envs = 2 processes (a full round, then a short one
    whose empty slot is padded): each return equals that controller's episode
    in one CarRacing-v3 stepped by hand from the same seed, V, M and C acting
    on the same preprocessed frames."""
    import gymnasium

    args = dataclasses.replace(cli.preset_args(wm.Args, "world_models", "carracing-small"), run_root=str(tmp_path))
    world = wm.make_train(args)
    params = wm.Params(*nnx.split(wm.Models(args, 3, nnx.Rngs(0)), wm.VAE_PART, ...)[1:])
    thetas = 0.5 * jax.random.normal(jax.random.key(1), (3, world.num_params))
    key, steps = jax.random.key(2), 6
    returns = np.asarray(world.real_returns(params, thetas, key, steps))
    host = wm.CarRacingHost(args)
    seed = int(jax.random.randint(key, (), 0, 2**31 - 1 - 3 - args.host_envs))  # as CarRacingHost.returns draws it
    models = world.merge(params)
    for i in range(3):
        env = gymnasium.make("CarRacing-v3")
        raw, _ = env.reset(seed=seed + i)
        carry, total = (jnp.zeros((1, args.rnn_size)), jnp.zeros((1, args.rnn_size))), 0.0
        for _ in range(steps):
            z, _ = models.vae.encode(wm.to_float(host.preprocess(raw[None])))
            steer, gas, brake = np.tanh(np.asarray(wm.controller_action(thetas[i : i + 1], z, carry[1], 3))[0])
            action = jnp.array([[steer, (gas + 1) / 2, max(brake, 0.0)]])  # the authors' model.py squashing
            carry, _ = models.mdn.step(carry, z, action)
            raw, reward, term, trunc, _ = env.step(np.asarray(action[0], np.float32))
            total += reward
            if term or trunc:
                break
        env.close()
        np.testing.assert_allclose(returns[i], total, rtol=1e-5, atol=1e-4)
