"""algos/planet.py end to end: smoke (two seeds, one trace), the CLI, replay layout
at episode ends, resume, bad input."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from algos import planet
from common import cli, logger
from conftest import ROOT, assert_killed_run_resumes_exactly


def tiny(tmp_path, **overrides) -> planet.Args:
    return dataclasses.replace(cli.preset_args(planet.Args, "planet", "tiny"), run_root=str(tmp_path), **overrides)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    args = tiny(tmp_path_factory.mktemp("runs"), num_seeds=2, eval_every=2)
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


def test_cli_runs_the_tiny_preset(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "algos/planet.py", "--preset", "tiny", "--num-seeds", "2", "--run-root", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    (run_dir,) = tmp_path.iterdir()
    assert (run_dir / "eval.json").exists() and (run_dir / "args.json").exists()
    assert json.loads((run_dir / "args.json").read_text())["image_size"] == 16


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
    with pytest.raises(ValueError, match="image_size must be one of"):
        tiny(tmp_path, image_size=48)
    with pytest.raises(ValueError, match="top_candidates=9 exceeds candidates=8"):
        tiny(tmp_path, top_candidates=9)
    with pytest.raises(ValueError, match="fewer than chunk_size"):
        planet.make_train(tiny(tmp_path, chunk_size=40))


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
    with pytest.raises(ValueError, match="reward_scale must be > 0"):
        tiny(tmp_path, reward_scale=0.0)
