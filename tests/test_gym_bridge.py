"""common/host.py: gym:<id> stepped on the host from inside jit, against gymnasium stepped by hand."""

import dataclasses
import importlib.util
import sys

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxzoo import cli, envs, host
from jaxzoo.algos import ppo


class Counter(gymnasium.Env):
    """The user's own env, registered below: the observation counts the steps
    taken, the reward is the action, the episode terminates at `length`."""

    observation_space = gymnasium.spaces.Box(0, 100, (1,), np.float64)

    def __init__(self, length=5, action_space=None):
        self.length, self.count = length, 0
        self.action_space = action_space or gymnasium.spaces.Discrete(3, start=-1)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count = int(self.np_random.integers(0, 3))
        return np.array([self.count], np.float64), {}

    def step(self, action):
        self.count += 1
        return np.array([self.count], np.float64), float(action), self.count >= self.length, False, {}


def needs_box2d(**kwargs):
    raise gymnasium.error.DependencyNotInstalled(  # gymnasium's own message when Box2D is missing
        'Box2D is not installed, you can install it by run `pip install swig` followed by `pip install "gymnasium[box2d]"`'
    )


gymnasium.register("jaxzoo-test/Counter-v0", entry_point=Counter, max_episode_steps=50)
gymnasium.register(
    "jaxzoo-test/MultiDiscreteCounter-v0",
    entry_point=lambda: Counter(action_space=gymnasium.spaces.MultiDiscrete([2, 2])),
    max_episode_steps=50,
)
gymnasium.register("jaxzoo-test/NeedsBox2D-v0", entry_point=needs_box2d, max_episode_steps=50)


def rollout(env, key, actions):
    """Reset with `key`, then one jitted scan over `actions` [T, N]: the first
    obs, the final state and every step's outputs [T, ...]."""

    def run(key, actions):
        obs, state = env.reset(key)

        def body(state, action):
            obs, state, reward, terminated, truncated, info = env.step(key, state, action)
            return state, (obs, reward, terminated, truncated, info)

        return (obs, *jax.lax.scan(body, state, actions))

    return jax.tree.map(np.asarray, jax.jit(run)(key, actions))


def test_cartpole_matches_gymnasium_step_by_step():
    """300 steps of 3 CartPole-v1 envs cut at 20 steps (so both terminations
    and truncations happen) against gymnasium's CartPole driven by hand with the
    same episode seeds and actions: observations, rewards, terminated,
    truncated, the final observation and the reset at every episode end."""
    num_envs, steps, limit = 3, 300, 20
    env, params = envs.make("gym:CartPole-v1", num_envs, max_episode_steps=limit)
    assert params is None and envs.spec(env, params) == envs.EnvSpec((4,), True, 2, None, None, limit)
    actions = np.random.default_rng(0).integers(0, 2, (steps, num_envs)).astype(np.int32)
    first_obs, state, (obs, reward, terminated, truncated, info) = rollout(env, jax.random.key(3), actions)
    stream = int(state.stream[0])
    assert stream == int(jax.random.bits(jax.random.key(3), (), jnp.uint32))  # the seeds come from the reset key
    assert terminated.any() and (truncated & ~terminated).any()
    for i in range(num_envs):
        by_hand, episode = gymnasium.make("CartPole-v1", max_episode_steps=limit), 0
        expected, _ = by_hand.reset(seed=host.episode_seed(stream, 0, i, episode))
        np.testing.assert_array_equal(first_obs[i], expected)
        episode_return, episode_length = 0.0, 0
        for t in range(steps):
            reached, r, term, trunc, _ = by_hand.step(int(actions[t, i]))
            episode_return, episode_length = episode_return + r, episode_length + 1
            np.testing.assert_array_equal(info["final_observation"][t, i], reached)
            assert (reward[t, i], terminated[t, i], truncated[t, i]) == (r, term, trunc), (i, t)
            assert info["episode_done"][t, i] == (term or trunc)
            if term or trunc:
                assert (info["episode_return"][t, i], info["episode_length"][t, i]) == (episode_return, episode_length)
                episode, episode_return, episode_length = episode + 1, 0.0, 0
                reached, _ = by_hand.reset(seed=host.episode_seed(stream, 0, i, episode))
            np.testing.assert_array_equal(obs[t, i], reached)  # the next episode's first obs after an end
        np.testing.assert_array_equal(state.episode[i], episode)
    # Another key, other episodes; the same key, the same ones.
    assert not np.array_equal(rollout(env, jax.random.key(4), actions[:1])[0], first_obs)
    np.testing.assert_array_equal(rollout(env, jax.random.key(3), actions[:1])[0], first_obs)


def test_a_state_from_another_process_ends_its_episode_or_rebuilds_its_start():
    """A resumed run's first step: a host env in the middle of an episode it
    does not have ends it (truncated, reward 0, the checkpointed obs as the
    final observation, not logged) and starts the next; one at an episode
    start is rebuilt there and steps as if never interrupted."""
    env, _ = envs.make("gym:jaxzoo-test/Counter-v0", 2)
    _, state, _ = rollout(env, jax.random.key(0), np.array([[1, 1]], np.int32))  # one step: t = 1
    state = state.replace(t=np.array([1, 0]), obs=np.array([[7.0], [0.0]], np.float32))
    fresh, _ = envs.make("gym:jaxzoo-test/Counter-v0", 2)  # a new process: its envs are nowhere yet
    obs, after, reward, terminated, truncated, info = jax.jit(fresh.step)(jax.random.key(0), state, jnp.array([2, 2]))
    assert (
        truncated.tolist() == [True, False] and not terminated.any() and info["episode_done"].tolist() == [False, False]
    )
    assert reward.tolist() == [0.0, 1.0] and float(info["final_observation"][0, 0]) == 7.0
    by_hand = Counter()
    start, _ = by_hand.reset(seed=host.episode_seed(int(state.stream[0]), 0, 0, 1))
    assert float(obs[0, 0]) == start[0] and after.episode.tolist() == [1, 0] and after.t.tolist() == [0, 1]
    by_hand.reset(seed=host.episode_seed(int(state.stream[1]), 0, 1, 0))
    assert float(obs[1, 0]) == by_hand.step(1)[0][0]  # env 1 rebuilt at its episode's start, then stepped


def test_spaces_are_mapped_and_others_are_refused_by_name():
    # The user's own env: Discrete(3, start=-1) actions 0, 1, 2 are -1, 0, 1; float64 observations become float32.
    env, _ = envs.make("gym:jaxzoo-test/Counter-v0", 1)
    _, _, (obs, reward, *_) = rollout(env, jax.random.key(0), np.array([[0], [2]], np.int32))
    assert reward[:, 0].tolist() == [-1.0, 1.0] and obs.dtype == np.float32
    # Box actions are clipped to the bounds on the host.
    pendulum, _ = envs.make("gym:Pendulum-v1", 1)
    assert envs.spec(pendulum, None).action_high.tolist() == [2.0]
    _, _, (big, *_) = rollout(pendulum, jax.random.key(1), np.full((1, 1, 1), 100.0, np.float32))
    _, _, (bound, *_) = rollout(pendulum, jax.random.key(1), np.full((1, 1, 1), 2.0, np.float32))
    np.testing.assert_array_equal(big, bound)
    # Discrete observations are one-hot.
    lake, _ = envs.make("gym:FrozenLake-v1", 2)
    assert envs.spec(lake, None).obs_shape == (16,)
    first_obs, *_ = rollout(lake, jax.random.key(0), np.zeros((1, 2), np.int32))
    np.testing.assert_array_equal(first_obs, np.eye(16)[[0, 0]])
    with pytest.raises(
        ValueError, match=r"action space MultiDiscrete\(\[2 2\]\), of type MultiDiscrete.*accepted: Box, Discrete"
    ):
        envs.make("gym:jaxzoo-test/MultiDiscreteCounter-v0", 1)


def test_bad_ids_say_what_is_close_and_what_to_install(monkeypatch):
    with pytest.raises(ValueError, match=r"unknown gymnasium id 'gym:CartPol-v1' \(did you mean 'gym:CartPole-v1'"):
        envs.make("gym:CartPol-v1", 1)
    with pytest.raises(
        ValueError, match=r"'LunarLander-v3' \(gymnasium's, stepped on the host: 'gym:LunarLander-v3'\)"
    ):
        envs.make("LunarLander-v3", 1)
    with pytest.raises(ValueError, match=r"stepped on the host, in batches: pass num_envs"):
        envs.make("gym:CartPole-v1")
    with pytest.raises(
        ValueError, match=r"needs a package that is not installed .*install it: pip install -e '\.\[carracing\]'"
    ):
        envs.make("gym:jaxzoo-test/NeedsBox2D-v0", 1)
    monkeypatch.setitem(sys.modules, "ale_py", None)  # import ale_py now raises ImportError
    with pytest.raises(
        ValueError, match=r"'gym:ALE/Pong-v5' needs ale_py, which is not installed .*pip install -e '\.\[atari\]'"
    ):
        envs.make("gym:ALE/Pong-v5", 1)


def test_ppo_runs_a_gym_id_end_to_end(tmp_path):
    args = dataclasses.replace(
        cli.preset_args(ppo.Args, "ppo", "tiny"),
        env_id="gym:CartPole-v1",
        total_timesteps=512,
        run_root=str(tmp_path),
        capture_video=True,
    )
    result = ppo.main(args)
    assert result.chunk_traces == 1 and np.isfinite(result.metrics["policy_loss"]).all()
    assert np.isfinite(result.metrics["episode_return"]).any() and np.isfinite(result.eval_returns).all()
    # --capture-video on vector observations: env 0's first greedy episode, one frame a step, drawn by
    # jaxzoo.video's CartPole renderer (gymnasium's observation is gymnax's), not bars of 4 numbers.
    import imageio.v3 as iio

    (video,) = tmp_path.glob("*/videos/*-seed0.mp4")
    frames = iio.imread(video)
    assert frames.shape[0] == round(float(np.asarray(result.eval_returns).reshape(-1)[0]))
    assert frames.shape[1] > 100 and (frames[0] < 128).any()  # a drawn cart and pole, not a blank page
    for overrides, message in [
        (dict(num_seeds=2), r"num_seeds must be 1, got 2: a gym: env is stepped on the host"),
        (dict(parallel="data"), r"--parallel data is not supported"),
    ]:
        with pytest.raises(ValueError, match=message):
            dataclasses.replace(args, **overrides)


@pytest.mark.skipif(
    importlib.util.find_spec("ale_py") is None,
    reason="ALE through gymnasium needs ale-py (pip install -e '.[atari]'), not installed here",
)
def test_ale_pong_steps_on_the_host():
    env, _ = envs.make("gym:ALE/Pong-v5", 2)
    assert envs.spec(env, None).obs_shape == (210, 160, 3)
    first_obs, _, (obs, reward, *_) = rollout(env, jax.random.key(0), np.zeros((5, 2), np.int32))
    assert first_obs.dtype == np.uint8 and obs.shape == (5, 2, 210, 160, 3)
