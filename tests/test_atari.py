"""Atari through envpool (common/atari.py) on real frames, and ppo.py's Nature CNN and atari presets."""

import dataclasses
import importlib.util
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxzoo import atari, cli, envs
from jaxzoo.algos import ppo

needs_envpool = pytest.mark.skipif(
    importlib.util.find_spec("envpool") is None, reason='envpool is not installed (pip install -e ".[atari]")'
)


def rollout(env, actions: np.ndarray, state=None):
    """Step `env` with `actions` [T, N] in one jitted scan (from a fresh reset
    unless `state` is given) -> (first obs [N, ...], final state, dict of [T, N, ...] numpy arrays)."""

    @jax.jit
    def run(state, actions):
        def step(state, action):
            obs, state, reward, terminated, truncated, info = env.step(jax.random.key(0), state, action)
            return state, {"obs": obs, "reward": reward, "terminated": terminated, "truncated": truncated, **info}

        return jax.lax.scan(step, state, actions)

    obs = None
    if state is None:
        obs, state = jax.jit(env.reset)(jax.random.key(0))
    state, steps = run(state, jnp.asarray(actions, jnp.int32))
    return obs, state, jax.tree.map(np.asarray, steps)


def random_actions(steps: int, num_envs: int, num_actions: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, num_actions, (steps, num_envs))


@needs_envpool
def test_observations_are_stacked_84x84_grayscale_bytes():
    env, _ = atari.make("envpool:Breakout-v5", 2, seed=0)
    assert env.spec.obs_shape == (84, 84, 4) and env.spec.num_actions == 4 and env.spec.discrete
    assert env.spec == atari.spec("envpool:Breakout-v5")
    first, _, steps = rollout(env, np.ones((3, 2)))
    first = np.asarray(first)
    assert first.shape == (2, 84, 84, 4) and first.dtype == np.uint8
    assert steps["obs"].shape == (3, 2, 84, 84, 4) and steps["obs"].dtype == np.uint8
    assert 0 < first.mean() < 255  # a real screen: bricks, walls and a black background
    # A new game starts with its first frame in every slot of the stack ...
    assert all((first[..., k] == first[..., 0]).all() for k in range(4))
    # ... and each step shifts the stack by one frame: oldest first, newest last.
    previous = np.concatenate([first[None], steps["obs"][:-1]])
    np.testing.assert_array_equal(steps["obs"][..., :-1], previous[..., 1:])
    assert (steps["obs"][..., -1] != previous[..., -1]).any()  # the game moves (FIRE launched the ball)


@needs_envpool
def test_the_logged_episode_is_the_whole_game_scored_without_clipping():
    """SpaceInvaders (rewards of 5 to 30 points) with clipped rewards and
    episodic life, against the same seed and actions without clipping: the
    learner sees sign(reward) and a `terminated` at every lost life; the logged
    episode is the whole game, its return the unclipped score over all lives."""
    actions = random_actions(900, 2, 6)
    clipped, _ = atari.make("envpool:SpaceInvaders-v5", 2, seed=3, reward_clip=True)
    raw, _ = atari.make("envpool:SpaceInvaders-v5", 2, seed=3, reward_clip=False)
    _, _, learner = rollout(clipped, actions)
    _, _, game = rollout(raw, actions)
    np.testing.assert_array_equal(learner["reward"], np.sign(game["reward"]))
    assert game["reward"].max() > 1  # the clipping changed something
    # The two pools play the same games: the same frames and the same ends.
    np.testing.assert_array_equal(learner["obs"], game["obs"])
    np.testing.assert_array_equal(learner["episode_done"], game["episode_done"])
    for i in range(2):
        ends = np.flatnonzero(learner["episode_done"][:, i])
        assert len(ends) >= 1
        start = 0
        for end in ends:
            np.testing.assert_allclose(learner["episode_return"][end, i], game["reward"][start : end + 1, i].sum())
            assert learner["episode_length"][end, i] == end + 1 - start
            # Episodic life: a termination at every lost life (SpaceInvaders has 3), the last one the game over.
            lives_lost = np.flatnonzero(learner["terminated"][start : end + 1, i]) + start
            assert len(lives_lost) == 3 and lives_lost[-1] == end
            assert [learner["lives"][t, i] for t in lives_lost] == [2, 1, 0]
            start = end + 1


@needs_envpool
def test_the_time_limit_is_a_truncation():
    env, _ = atari.make("envpool:Breakout-v5", 2, seed=0, episodic_life=False, max_episode_steps=30)
    assert env.spec.max_episode_steps == 30
    _, _, steps = rollout(env, np.zeros((65, 2)))  # NOOP: the ball launched by FIRE takes a life or two, not five
    assert not steps["terminated"].any()
    truncated = [np.flatnonzero(steps["truncated"][:, i]).tolist() for i in range(2)]
    assert truncated == [[29, 59], [29, 59]]
    assert steps["episode_done"][[29, 59]].all() and steps["episode_done"].sum() == 4
    assert (steps["episode_length"][[29, 59]] == 30).all()


@needs_envpool
def test_autoreset_happens_within_the_step_that_ended_the_episode():
    """envpool resets an env on the call after the one that reported done;
    atari.py finishes that reset inside the same step. At a done step
    `final_observation` continues the ended episode's frames and `obs` is the
    next episode's first; elsewhere they are the same. The XLA path matches
    envpool's own host API driven by hand with the same seed and actions."""
    actions = random_actions(400, 2, 4, seed=1)
    env, _ = atari.make("envpool:Breakout-v5", 2, seed=5, episodic_life=False, max_episode_steps=150)
    first, _, steps = rollout(env, actions)
    done = steps["terminated"] | steps["truncated"]
    assert done[:, 0].sum() >= 2 and done[:, 1].sum() >= 2
    previous = np.concatenate([np.asarray(first)[None], steps["obs"][:-1]])
    # final_observation is one step on from the previous observation: the same episode's frames.
    np.testing.assert_array_equal(steps["final_observation"][..., :-1], previous[..., 1:])
    np.testing.assert_array_equal(steps["final_observation"][~done], steps["obs"][~done])
    for t, i in zip(*np.nonzero(done)):
        new = steps["obs"][t, i]
        assert all((new[..., k] == new[..., 0]).all() for k in range(4))  # a new game: one frame, stacked
        assert (steps["final_observation"][t, i] != new).any()

    # envpool's host API with its next-step resets, done by hand: the same trajectory.
    pool = env.pool.__class__(env.pool.spec)  # a second pool of the same spec (seed included)
    pool.async_reset()
    expected_obs = np.zeros_like(steps["obs"])
    expected_reward = np.zeros_like(steps["reward"])
    for _ in range(2):
        pool.recv()
    for t in range(len(actions)):
        for i in range(2):
            pool.send(actions[t, i : i + 1].astype(np.int32), np.array([i], np.int32))
            frames, reward, terminated, truncated, _ = pool.recv()
            if terminated[0] or truncated[0]:
                pool.send(np.zeros(1, np.int32), np.array([i], np.int32))  # the reset: its action is ignored
                frames, *_ = pool.recv()
            expected_obs[t, i] = frames[0].transpose(1, 2, 0)
            expected_reward[t, i] = reward[0]
    np.testing.assert_array_equal(steps["obs"], expected_obs)
    np.testing.assert_array_equal(steps["reward"], expected_reward)


@needs_envpool
def test_a_state_from_another_process_restarts_every_game():
    """A resumed run's state carries the token of the pool that wrote its
    checkpoint: the first step resets every env instead of stepping, reports a
    truncation bootstrapping from the checkpointed observation, logs no game,
    and the next steps run normally."""
    env, _ = atari.make("envpool:Breakout-v5", 2, seed=0)
    _, state, _ = rollout(env, np.ones((20, 2)))
    checkpointed = state.replace(token=jnp.int32(env.token + 1))
    _, state, steps = rollout(env, np.ones((3, 2)), checkpointed)
    assert steps["truncated"][0].all() and not steps["terminated"][0].any() and not steps["episode_done"][0].any()
    assert (steps["reward"][0] == 0).all()
    np.testing.assert_array_equal(steps["final_observation"][0], np.asarray(checkpointed.obs))
    restarted = steps["obs"][0]
    assert all((restarted[..., k] == restarted[..., 0]).all() for k in range(4))
    assert not steps["truncated"][1:].any() and int(state.token) == env.token
    np.testing.assert_array_equal(steps["obs"][1, ..., :-1], restarted[..., 1:])


def nature_parameter_count(num_actions: int, padding: str, hidden: int | None) -> tuple[int, int]:
    """(torso, heads) of the Nature network by hand: conv 4->32 8x8, 32->64
    4x4, 64->64 3x3, then (valid: 7x7x64 = 3136 features, same: 11x11x64 =
    7744) a dense layer of `hidden` units (or none); the policy and value heads."""
    convs = (4 * 32 * 8 * 8 + 32) + (32 * 64 * 4 * 4 + 64) + (64 * 64 * 3 * 3 + 64)
    features = {"valid": 7 * 7 * 64, "same": 11 * 11 * 64}[padding]
    dense = features * hidden + hidden if hidden else 0
    width = hidden or features
    return convs + dense, (width * num_actions + num_actions) + (width + 1)


@pytest.mark.parametrize(
    "padding, hidden_sizes, shared, total",
    [("valid", (512,), True, 1_686_693), ("same", (), False, 2 * 77_984 + 38_725)],
    ids=["cleanrl", "rllib"],
)
def test_nature_cnn_output_shape_and_parameter_count(padding, hidden_sizes, shared, total):
    spec = envs.EnvSpec((84, 84, 4), True, 4, None, None, 27_000)
    build = lambda: ppo.ActorCritic(spec, "nature", hidden_sizes, "relu", shared, nnx.Rngs(0), padding)
    graphdef, params = nnx.split(nnx.eval_shape(build))  # shapes only: no weights computed
    torso, heads = nature_parameter_count(4, padding, hidden_sizes[0] if hidden_sizes else None)
    count = sum(x.size for x in jax.tree.leaves(params))
    assert count == torso * (1 if shared else 2) + heads == total
    policy = lambda params, obs: nnx.merge(graphdef, params)(obs)
    frames = jax.random.randint(jax.random.key(0), (3, 84, 84, 4), 0, 256).astype(jnp.uint8)
    dist, value = jax.eval_shape(policy, params, frames)
    assert dist.logits.shape == (3, 4) and value.shape == (3,)
    if padding == "same":  # computed once, on the smaller network
        params = nnx.split(build())[1]
        # Inputs are scaled by 1/255 inside: bytes and their float copy give the same outputs.
        forward = jax.jit(policy)
        np.testing.assert_allclose(forward(params, frames.astype(jnp.float32))[1], forward(params, frames)[1], rtol=1e-6)


def test_same_padding_matches_rllib():
    """RLlib's encoder pads (2, 2), (1, 2), (1, 1) for the Nature filters on 84 x 84 (the notebook's print-out)."""
    assert [ppo.same_padding(size, k, s) for size, k, s in [(84, 8, 4), (21, 4, 2), (11, 3, 1)]] == [
        (2, 2),
        (1, 2),
        (1, 1),
    ]


def test_missing_envpool_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "envpool", None)
    with pytest.raises(ValueError, match=r'envpool ids need envpool, which is not installed .*pip install -e "\.\[atari\]"'):
        atari.make("envpool:Breakout-v5", 2, seed=0)
    args = cli.preset_args(ppo.Args, "ppo", "tiny-atari")
    with pytest.raises(ValueError, match=r"pip install -e"):
        ppo.make_train(args)


@needs_envpool
def test_an_unknown_game_suggests_close_ids():
    with pytest.raises(ValueError, match=r"unknown envpool Atari id 'envpool:Breakot-v5' \(did you mean 'envpool:Breakout-v5'"):
        atari.make("envpool:Breakot-v5", 2, seed=0)
    assert "Breakout-v5" in atari.game_ids() and "SpaceInvaders-v5" in atari.game_ids()


def test_args_refuse_what_an_envpool_id_cannot_do():
    for overrides, message in [
        (dict(num_seeds=2), r"num_seeds must be 1, got 2: envpool's XLA calls cannot be vmapped"),
        (dict(parallel="data"), r"--parallel data is not supported"),
        (dict(torso="cnn"), r"torso='cnn' is not for Atari frames; accepted: auto, nature"),
        (dict(normalize_obs=True), r"normalize_obs and normalize_reward are for continuous control"),
        (dict(normalize_reward=True), r"normalize_obs and normalize_reward are for continuous control"),
    ]:
        with pytest.raises(ValueError, match=message):
            dataclasses.replace(cli.preset_args(ppo.Args, "ppo", "tiny-atari"), **overrides)
    with pytest.raises(ValueError, match=r"noop_max=0 is out of range; accepted: >= 1"):
        ppo.Args(noop_max=0)
    with pytest.raises(ValueError, match=r"torso='nature' needs images of at least 36 x 36 pixels"):
        ppo.make_train(ppo.Args(env_id="Breakout-MinAtar", torso="nature"))


@needs_envpool
def test_a_recorded_episode_is_the_whole_first_game_by_its_newest_frames():
    """--capture-video on Atari (envs.RecordEpisode): env 0's first game, every
    life of it (episodic life ends a learner episode at each lost life, the
    video goes on), one 84 x 84 frame per agent step, the newest of the stack."""
    fire = lambda obs: jnp.ones(obs.shape[0], jnp.int32)  # the paddle stays: lives go fast
    env, _ = atari.make("envpool:Breakout-v5", 2, seed=5, max_episode_steps=800)
    _, _, steps = rollout(env, np.ones((800, 2)))
    game_end = int(np.flatnonzero(steps["episode_done"][:, 0])[0])
    assert steps["terminated"][:game_end, 0].sum() >= 1  # lives were lost before the game ended
    recorded = envs.RecordEpisode(atari.make("envpool:Breakout-v5", 2, seed=5, max_episode_steps=800)[0], 801)
    returns, recording = jax.jit(lambda key: envs.evaluate_episodes(recorded, None, fire, key, 801))(
        jax.random.key(0)
    )
    assert int(recording.length) == steps["episode_length"][game_end, 0] == game_end + 1
    assert returns[0] == steps["episode_return"][game_end, 0]
    frames = np.asarray(recording.frames)
    assert frames.shape == (801, 84, 84, 1)
    np.testing.assert_array_equal(frames[1 : game_end + 1, ..., 0], steps["obs"][:game_end, 0, ..., -1])


@needs_envpool
def test_tiny_atari_preset_runs_end_to_end(tmp_path):
    args = dataclasses.replace(cli.preset_args(ppo.Args, "ppo", "tiny-atari"), run_root=str(tmp_path))
    result = ppo.main(args)
    assert result.chunk_traces == 1
    assert np.isfinite(result.metrics["policy_loss"]).all() and np.isfinite(result.metrics["value_loss"]).all()
    # The game score is logged under a name that says so (and as episode_return, which the tools read).
    scores = result.metrics["game_score"]
    np.testing.assert_array_equal(scores, result.metrics["episode_return"])
    assert np.isfinite(scores).any()
    evaluation = json.loads(open(f"{result.run_dir}/eval.json").read())
    assert len(evaluation["returns"][0]) == args.eval_episodes and np.isfinite(evaluation["mean"])
