"""algos/planet.py end to end: smoke (two seeds, one trace), the CLI, replay layout
at episode ends, resume, bad input."""

import dataclasses
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_killed_run_resumes_exactly, assert_videos_show_first_episodes, run_copied_script
from flax import nnx

from jaxzoo import cli, dmc, logger
from jaxzoo.algos import planet


def tiny(tmp_path, **overrides) -> planet.Args:
    return dataclasses.replace(cli.preset_args(planet.Args, "planet", "tiny"), run_root=str(tmp_path), **overrides)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    args = tiny(tmp_path_factory.mktemp("runs"), num_seeds=2, eval_every=2, capture_video=True)
    return args, planet.main(args)


def test_smoke_two_seeds(tiny_run):
    args, result = tiny_run
    assert result.chunk_traces == 1
    for name in ("observation_loss", "reward_loss", "kl_loss", "kl_divergence", "model_loss", "grad_norm",
                 "predicted_return", "episode_return"):
        assert result.metrics[name].shape == (2, 4) and np.isfinite(result.metrics[name]).all(), name
    assert (result.metrics["kl_loss"] >= args.free_nats - 1e-6).all()
    assert (result.metrics["episodes_finished"] == 1).all() and (result.metrics["episode_length"] == 200).all()
    np.testing.assert_array_equal(result.metrics["model_updates"][0], [2, 4, 6, 8])
    assert not np.array_equal(result.metrics["episode_return"][0], result.metrics["episode_return"][1])  # two seeds
    assert result.eval_returns.shape == (2, args.eval_episodes) and np.isfinite(result.eval_returns).all()
    # --eval-every 2: an evaluation after updates 2 and 4, the last one the final evaluation
    evaluated = np.isfinite(result.metrics["eval_return"])
    np.testing.assert_array_equal(evaluated, [[False, True, False, True]] * 2)
    np.testing.assert_allclose(result.metrics["eval_return"][:, -1], result.eval_returns.mean(1), rtol=1e-6)
    saved = json.loads((Path(result.run_dir) / "eval.json").read_text())
    assert saved["chunk_traces"] == 1 and np.isfinite(saved["mean"])
    assert len(logger.read_metrics(result.run_dir)["update"]) == 2 * 4
    # --capture-video with --eval-every 2: each evaluation's videos, one per seed, every episode 200 steps
    videos = sorted(p.name for p in (Path(result.run_dir) / "videos").iterdir())
    assert videos == ["update2-seed0.mp4", "update2-seed1.mp4", "update4-seed0.mp4", "update4-seed1.mp4"]
    assert_videos_show_first_episodes(Path(result.run_dir), 2)


def test_replay_rows_keep_the_final_frame_and_mark_episode_starts(tiny_run):
    """An episode of L agent steps is L + 1 rows: a first frame, then the frames
    each step reached; at the truncation the reached (final) frame is stored, not
    the next episode's reset frame, and the stored rewards add up to the
    episode's return."""
    args, result = tiny_run
    buffer = result.state.buffer
    slots = 200 // args.action_repeat + 1
    episodes = 1 + 4  # the seed episode, then one per update
    assert int(buffer.size[0]) == episodes * slots
    first = np.asarray(buffer.data.first[0, : episodes * slots, 0])
    np.testing.assert_array_equal(np.flatnonzero(first), np.arange(episodes) * slots)
    reward = np.asarray(buffer.data.reward[0, : episodes * slots, 0])
    action = np.asarray(buffer.data.action[0, : episodes * slots, 0])
    assert (reward[first] == 0).all() and (action[first] == 0).all()
    assert np.abs(action[~first]).max() <= 1.0
    for update in range(4):
        rows = slice((update + 1) * slots + 1, (update + 2) * slots)
        np.testing.assert_allclose(reward[rows].sum(), result.metrics["episode_return"][0, update], rtol=1e-4)
    obs = np.asarray(buffer.data.obs[0, :, 0])
    for end in np.arange(1, episodes) * slots - 1:
        assert not np.array_equal(obs[end], obs[end + 1])  # final frame, then a different reset frame
    assert bool(result.state.agent.need_first.all())  # the next slot records the new episode's first frame


@pytest.mark.slow
def test_train_is_vmappable_over_hyperparameters(tmp_path):
    """A sweep is `jax.vmap(train, in_axes=(None, 0))` over stacked Hyperparams,
    one compile: the member with the preset's free nats reproduces the unswept
    `train`, and without free nats the KL term has a gradient from the first
    model update, so the posterior is pulled towards the prior."""
    args = tiny(tmp_path)
    algo = planet.make_train(args)
    key = jax.random.key(args.seed)
    _, plain = jax.jit(algo.train)(key)
    base = planet.Hyperparams.from_args(args)
    free_nats = np.array([args.free_nats, 0.0], np.float32)
    sweep = jax.tree.map(lambda x: np.stack([x, x]), base).replace(free_nats=free_nats)
    _, swept = jax.jit(jax.vmap(algo.train, in_axes=(None, 0)))(key, sweep)
    assert swept["kl_divergence"].shape == (2, args.num_updates)
    for name in plain:
        np.testing.assert_allclose(swept[name][0], plain[name], rtol=1e-6, atol=1e-6, err_msg=name)
    assert (swept["kl_loss"][0] >= args.free_nats - 1e-6).all()
    np.testing.assert_allclose(swept["kl_loss"][1], swept["kl_divergence"][1], rtol=1e-6)  # max(KL, 0) = KL
    # kl_divergence [2, 4]: with free nats 3 it grows from 1.0 to 2.2 over the 8 model updates; the gradient
    # of the KL keeps it lower at every update (1.8 at the end).
    kl = np.asarray(swept["kl_divergence"])
    assert (kl[1] < kl[0]).all() and kl[1, -1] < 0.9 * kl[0, -1], kl


def test_cli_runs_the_tiny_preset(tmp_path):
    out = run_copied_script("planet", ["--preset", "tiny", "--num-seeds", "2", "--run-root", str(tmp_path),
                                          "--capture-video"], timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    (run_dir,) = tmp_path.iterdir()
    assert (run_dir / "eval.json").exists() and (run_dir / "args.json").exists()
    assert json.loads((run_dir / "args.json").read_text())["image_size"] == 16
    assert_videos_show_first_episodes(run_dir, 2)


def test_killed_and_resumed_run_matches_uninterrupted(tiny_run, tmp_path, monkeypatch):
    # 4 updates, chunks of 2, a checkpoint every 2: killed after update 4, before its checkpoint
    args, full = tiny_run
    assert_killed_run_resumes_exactly(planet, dataclasses.replace(args, run_root=str(tmp_path)), 4, 2, monkeypatch,
                                      full)


def test_discrete_action_space_is_refused(tmp_path):
    with pytest.raises(ValueError, match="CartPole-v1 has a discrete action space.*continuous"):
        planet.make_train(tiny(tmp_path, env_id="CartPole-v1"))


def test_bad_input_names_the_value(tmp_path):
    with pytest.raises(ValueError, match="no pixel renderer for env_id 'MountainCarContinuous-v0'"):
        planet.make_train(tiny(tmp_path, env_id="MountainCarContinuous-v0"))
    with pytest.raises(ValueError, match="image_size=48 is not supported; accepted: one of"):
        tiny(tmp_path, image_size=48)
    with pytest.raises(ValueError, match="top_candidates=9 exceeds candidates=8"):
        tiny(tmp_path, top_candidates=9)
    with pytest.raises(ValueError, match="fewer than chunk_size"):
        planet.make_train(tiny(tmp_path, chunk_size=40))
    with pytest.raises(ValueError, match=r"unknown env_id 'Pendulum-v2' \(did you mean 'Pendulum-v1'\?\); accepted"):
        planet.make_train(tiny(tmp_path, env_id="Pendulum-v2"))
    with pytest.raises(ValueError, match=r"chunk_size=1 is out of range; accepted: >= 2"):
        tiny(tmp_path, chunk_size=1)
    with pytest.raises(ValueError, match=r"bit_depth=9 is out of range; accepted: in \[1, 8\]"):
        tiny(tmp_path, bit_depth=9)


def test_paper_preset_traces_at_the_papers_sizes():
    # Shapes only (jax.eval_shape, nothing compiled or allocated): the paper's
    # 64 x 64 x 3 encoder gives 2 x 2 x 256 = 1024 features with no projection.
    args = cli.preset_args(planet.Args, "planet", "paper")
    algo = planet.make_train(args)
    state = jax.eval_shape(algo.init, jax.random.key(0))
    assert state.buffer.data.obs.shape == (args.buffer_size, 1, 64, 64, 3)
    encoder = nnx.eval_shape(lambda: planet.Encoder(args.image_shape, 32, 1024, nnx.Rngs(0)))
    assert encoder.project is None
    _, metrics = jax.eval_shape(algo.update, state)
    assert metrics["observation_loss"].shape == ()
    action, predicted = jax.eval_shape(algo.plan, state.params, planet.Latent(jnp.zeros(200), jnp.zeros(30)),
                                       jax.random.key(0))
    assert action.shape == (1,) and predicted.shape == ()


def test_reward_scale_scales_the_reward_target_and_not_the_logged_return(tmp_path):
    # The reward model learns reward_scale x reward: its loss on rewards r with
    # scale c equals the loss on rewards c r with scale 1. The planner's actions
    # do not depend on the scale (CEM ranks), and its predicted return is
    # divided back to environment units.
    scaled, plain = (planet.make_train(tiny(tmp_path, reward_scale=c)) for c in (10.0, 1.0))
    state = plain.init(jax.random.key(0))
    batch = planet.buffers.sample(state.buffer, jax.random.key(1), 4, 8).windows
    assert float(jnp.abs(batch.reward).max()) > 0
    key = jax.random.key(2)
    _, _, m_scaled = scaled.model_step(state.params, state.opt_state, batch, key)
    _, _, m_plain = plain.model_step(state.params, state.opt_state, batch._replace(reward=10.0 * batch.reward), key)
    np.testing.assert_allclose(m_scaled["reward_loss"], m_plain["reward_loss"], rtol=1e-5)
    _, _, m_unscaled = plain.model_step(state.params, state.opt_state, batch, key)
    assert not np.isclose(m_scaled["reward_loss"], m_unscaled["reward_loss"], rtol=1e-3)
    latent = planet.Latent(jnp.zeros(16), jnp.ones(4))
    action_scaled, predicted_scaled = scaled.plan(state.params, latent, key)
    action_plain, predicted_plain = plain.plan(state.params, latent, key)
    np.testing.assert_allclose(action_scaled, action_plain, rtol=1e-5)
    np.testing.assert_allclose(predicted_scaled, predicted_plain / 10.0, rtol=1e-5)
    with pytest.raises(ValueError, match="reward_scale=0.0 is out of range; accepted: > 0"):
        tiny(tmp_path, reward_scale=0.0)


# --------------------------------------------------------------------------- #
# DeepMind Control through the host-side path (common/dmc.py)
# --------------------------------------------------------------------------- #
class FakeControlTask:
    """A stand-in for a dm_control suite env, in numpy, so the host path runs
    without MuJoCo: a point on a line pushed by the action, reward 1 - |x|,
    a 30-step time limit (truncation, discount 1), rendered as a bright column."""

    class TimeStep(NamedTuple):
        reward: float | None
        discount: float
        is_last: bool

        def last(self):
            return self.is_last

    class Physics:
        _contexts = "fake"  # dmc.DMControlPixels registers an exit hook on a first render otherwise

        def __init__(self, task):
            self.task = task

        def render(self, height, width, camera_id):
            image = np.zeros((height, width, 3), np.uint8)
            image[:, int(np.clip((self.task.x + 1) / 2 * (width - 1), 0, width - 1))] = 255
            return image

    def __init__(self, seed):
        self.task = types.SimpleNamespace(random=np.random.RandomState(seed), x=0.0)
        self.physics = self.Physics(self.task)
        self._step_limit = 30.0
        self.steps = 0

    def action_spec(self):
        return types.SimpleNamespace(shape=(1,), minimum=np.array([-1.0]), maximum=np.array([1.0]))

    def reset(self):
        self.task.x, self.steps = float(self.task.random.uniform(-1, 1)), 0
        return self.TimeStep(None, 1.0, False)

    def step(self, action):
        self.task.x = float(np.clip(self.task.x + 0.2 * float(action[0]), -1, 1))
        self.steps += 1
        return self.TimeStep(1.0 - abs(self.task.x), 1.0, self.steps >= self._step_limit)


@pytest.fixture
def fake_dmc(monkeypatch):
    monkeypatch.setattr(dmc, "load", lambda domain, task, seed: FakeControlTask(seed))


def test_host_env_steps_only_active_envs_and_resets_itself(fake_dmc):
    env, _ = dmc.make("dmc:fake-point", 2, size=8, grayscale=True, action_repeat=4, seed=0)
    assert env.spec.max_episode_steps == 30 and env.spec.obs_shape == (8, 8, 1) and env.spec.num_actions == 1
    step = jax.jit(lambda state, action, active: env.step(jax.random.key(0), state, action, None, active))
    obs, state = jax.jit(lambda: env.reset(jax.random.key(0)))()
    assert obs.shape == (2, 8, 8, 1)
    before = [task.task.x for task in env.envs]
    _, state, reward, *_ = step(state, jnp.ones((2, 1)), jnp.array([True, False]))
    assert env.envs[0].task.x != before[0] and env.envs[1].task.x == before[1]  # the inactive env did not move
    np.testing.assert_array_equal(state.t, [1, 0])
    assert reward[0] > 0 and reward[1] == 0
    # 30 env steps at action repeat 4: 8 agent steps, the last one 2 env steps long, a truncation
    for _ in range(7):
        obs, state, reward, terminated, truncated, info = step(state, jnp.zeros((2, 1)), jnp.array([True, False]))
    assert bool(truncated[0]) and not bool(terminated[0]) and int(info["episode_length"][0]) == 30
    np.testing.assert_array_equal(state.episode, [1, 0])
    np.testing.assert_array_equal(state.t, [0, 0])
    assert not np.array_equal(obs[0], info["final_observation"][0])  # automatic reset, the final frame kept in info
    # a new process can rebuild an episode start, never the middle of one
    fresh, _ = dmc.make("dmc:fake-point", 2, size=8, grayscale=True, action_repeat=4, seed=0)
    fresh_step = jax.jit(lambda state, action, active: fresh.step(jax.random.key(0), state, action, None, active))
    fresh_step(state, jnp.zeros((2, 1)), jnp.array([True, False]))  # a zero action leaves the point in place
    assert fresh.envs[0].task.x == env.envs[0].task.x  # rebuilt at the start of episode 1, from its seed
    with pytest.raises(Exception, match=r"can only be restored at an episode start"):
        fresh_step(state.replace(t=jnp.array([3, 0])), jnp.zeros((2, 1)), jnp.array([True, False]))


@pytest.mark.slow
def test_planet_on_a_host_env_trains_and_resumes_exactly(fake_dmc, tmp_path, monkeypatch):
    """The whole PlaNet loop on a host-stepped task (fake simulator): one trace,
    30-step episodes as 8 agent steps, and a killed run resumed from its
    checkpoint rebuilds the host env and ends bit-identical."""
    args = tiny(tmp_path, env_id="dmc:fake-point", action_repeat=4, total_timesteps=4 * 32, chunk_size=6,
                checkpoint_every=2)
    full = planet.main(args)
    assert full.chunk_traces == 1
    np.testing.assert_array_equal(full.metrics["episode_length"], [[30] * 4])
    assert (full.metrics["episode_return"] > 0).all() and np.isfinite(full.eval_returns).all()
    assert_killed_run_resumes_exactly(planet, args, 4, 2, monkeypatch, full)


def test_dmc_input_is_checked(tmp_path, monkeypatch):
    presets = cli.presets("planet")
    assert {"paper-cartpole-swingup", "cpu-cartpole-swingup"} <= set(presets)
    for name in presets:
        cli.preset_args(planet.Args, "planet", name)  # validation in Args.__post_init__
    with pytest.raises(ValueError, match=r"'dmc:cartpole' is not a DeepMind Control id.*'dmc:<domain>-<task>'"):
        tiny(tmp_path, env_id="dmc:cartpole")
    with pytest.raises(ValueError, match="stepped on the host, one seed per process: num_seeds must be 1, got 2"):
        tiny(tmp_path, env_id="dmc:cartpole-swingup", num_seeds=2)
    monkeypatch.setitem(sys.modules, "dm_control", None)  # import dm_control now raises ImportError
    with pytest.raises(ValueError, match=r"'dmc:cartpole-swingup' needs dm_control.*pip install -e '\.\[dmc\]'"):
        planet.make_train(tiny(tmp_path, env_id="dmc:cartpole-swingup"))


@pytest.mark.skipif(importlib.util.find_spec("dm_control") is None,
                    reason="DeepMind Control needs dm_control (pip install -e '.[dmc]'), not installed here")
def test_dmc_cartpole_swingup_runs_on_the_host(tmp_path):
    with pytest.raises(ValueError, match="unknown DeepMind Control task 'dmc:cartpole-flip'; valid ids: .*dmc:cheetah-run"):
        planet.make_train(tiny(tmp_path, env_id="dmc:cartpole-flip"))
    result = planet.main(tiny(tmp_path, env_id="dmc:cartpole-swingup", total_timesteps=1000, image_size=32,
                              grayscale=False))
    assert result.chunk_traces == 1 and result.eval_returns.shape == (1, 2) and np.isfinite(result.eval_returns).all()
    np.testing.assert_array_equal(result.metrics["episode_length"], [[1000]])  # the suite's time limit
    assert result.state.buffer.data.obs.shape[-3:] == (32, 32, 3)


def test_max_grad_norm_zero_turns_clipping_off(tmp_path):
    """0 is no clipping (the same update as an unreachable clip), not a clip to 0."""
    after = {}
    for max_grad_norm in (0.0, 1e9):
        algo = planet.make_train(tiny(tmp_path, max_grad_norm=max_grad_norm))
        state = algo.init(jax.random.key(0))
        after[max_grad_norm] = (state.params, jax.jit(algo.update)(state)[0].params)
    before, unclipped = after[0.0]
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(unclipped)))
    for a, b in zip(jax.tree.leaves(unclipped), jax.tree.leaves(after[1e9][1])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
