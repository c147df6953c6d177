"""common/envs.py: make, wrappers, truncation, masked episode statistics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxzoo import envs


def test_unknown_env_id_lists_valid_ids():
    with pytest.raises(ValueError) as info:
        envs.make("CartPole-v9")
    message = str(info.value)
    assert "CartPole-v9" in message and "CartPole-v1" in message and "Breakout-MinAtar" in message


def test_dataset_env_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="downloads a dataset"):
        envs.make("MNISTBandit-bsuite")


def test_every_listed_env_builds_and_steps():
    # Shapes only (traced with eval_shape, not compiled): this covers every id in seconds.
    for env_id in envs.ENV_IDS:
        env, params = envs.make(env_id, 2, flatten_obs=True)
        obs, state = jax.eval_shape(env.reset, jax.random.key(0), params)
        spec = envs.spec(env, params)
        assert obs.shape == (2, *spec.obs_shape), env_id
        space = env.action_space(params)
        action = jax.eval_shape(jax.vmap(space.sample), jax.random.split(jax.random.key(1), 2))
        out = jax.eval_shape(env.step, jax.random.key(2), state, action, params)
        assert out[0].shape == obs.shape and out[2].shape == (2,), env_id
        assert out[5]["final_observation"].shape == obs.shape, env_id


def test_truncation_is_not_termination_and_keeps_the_final_observation():
    env, params = envs.make("CartPole-v1", max_episode_steps=3)
    obs, state = env.reset(jax.random.key(0), params)
    key = jax.random.key(1)
    for t in range(3):
        key, step_key = jax.random.split(key)
        previous = obs
        obs, state, reward, terminated, truncated, info = env.step(step_key, state, t % 2, params)
    assert bool(truncated) and not bool(terminated)
    assert bool(info["episode_done"]) and int(info["episode_length"]) == 3 and float(info["episode_return"]) == 3.0
    # The final observation continues the episode; the returned obs is a fresh reset.
    assert not np.allclose(info["final_observation"], obs)
    # Cart position and pole angle move by little in one step of 0.02 s.
    moved = np.abs(np.asarray(info["final_observation"]) - np.asarray(previous))[[0, 2]]
    assert moved.max() < 0.01
    # Episode counters restart after the reset.
    _, state, *_ , info = env.step(jax.random.key(9), state, 0, params)
    assert int(info["episode_length"]) == 1


def test_episode_metrics_are_masked_means_and_nan_without_episodes():
    info = {
        "episode_done": jnp.array([[False, True], [True, False]]),
        "episode_return": jnp.array([[100.0, 4.0], [6.0, 100.0]]),
        "episode_length": jnp.array([[9, 2], [3, 9]]),
    }
    metrics = envs.episode_metrics(info)
    assert float(metrics["episode_return"]) == 5.0
    assert float(metrics["episode_length"]) == 2.5
    assert float(metrics["episodes_finished"]) == 2.0
    none = envs.episode_metrics({**info, "episode_done": jnp.zeros((2, 2), bool)})
    assert np.isnan(none["episode_return"]) and float(none["episodes_finished"]) == 0.0


def test_running_mean_std_matches_numpy():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(16, 3)).astype(np.float32) for _ in range(10)]
    stats = envs.RunningMeanStd.zeros((3,))
    for b in batches:
        stats = stats.update(jnp.asarray(b))
    everything = np.concatenate(batches)
    np.testing.assert_allclose(stats.mean, everything.mean(0), rtol=1e-3)
    np.testing.assert_allclose(stats.var, everything.var(0), rtol=1e-2)


def test_observation_normalisation_covers_final_observation():
    env, params = envs.make("Pendulum-v1", 8, normalize_obs=True, max_episode_steps=4)
    obs, state = env.reset(jax.random.key(0), params)
    action = jnp.zeros((8, 1))
    key = jax.random.key(1)
    for _ in range(4):
        key, k = jax.random.split(key)
        obs, state, reward, terminated, truncated, info = env.step(k, state, action, params)
    assert bool(truncated.all())
    stats = envs.find_state(state, envs.NormalizeObservationState).obs_stats
    # final_observation is within the normalised range and normalised with the same statistics.
    assert np.abs(np.asarray(info["final_observation"])).max() <= 10.0
    raw_env, _ = envs.make("Pendulum-v1", 8, max_episode_steps=4)
    assert stats.count > 8


def test_reward_normalisation_scales_by_return_std():
    env, params = envs.make("Pendulum-v1", 16, normalize_reward=True, gamma=0.99)
    raw_env, _ = envs.make("Pendulum-v1", 16)
    obs, state = env.reset(jax.random.key(0), params)
    _, raw_state = raw_env.reset(jax.random.key(0), params)
    key = jax.random.key(1)
    for _ in range(50):
        key, k = jax.random.split(key)
        _, state, scaled, *_ = env.step(k, state, jnp.ones((16, 1)), params)
        _, raw_state, raw, *_ = raw_env.step(k, raw_state, jnp.ones((16, 1)), params)
    std = np.sqrt(np.asarray(state.return_stats.var) + 1e-8)
    np.testing.assert_allclose(scaled, np.clip(np.asarray(raw) / std, -10, 10), rtol=1e-4)
    assert np.abs(np.asarray(scaled)).mean() < np.abs(np.asarray(raw)).mean()


def test_continuous_actions_are_clipped_before_the_env():
    env, params = envs.make("Pendulum-v1")
    obs, state = env.reset(jax.random.key(0), params)
    out_big = env.step(jax.random.key(1), state, jnp.array([100.0]), params)
    out_max = env.step(jax.random.key(1), state, jnp.array([2.0]), params)
    np.testing.assert_allclose(out_big[0], out_max[0])


def test_spec_reports_action_spaces():
    cartpole = envs.spec(*envs.make("CartPole-v1"))
    assert cartpole.discrete and cartpole.num_actions == 2 and cartpole.obs_shape == (4,)
    pendulum = envs.spec(*envs.make("Pendulum-v1"))
    assert not pendulum.discrete and pendulum.num_actions == 1 and pendulum.action_high[0] == 2.0
    breakout = envs.spec(*envs.make("Breakout-MinAtar"))
    assert breakout.obs_shape == (10, 10, 4)


def test_a_time_limit_keeps_the_type_of_the_envs_own():
    """BernoulliBandit's limit is a float that its observation space selects
    against other floats: an int limit crashed it in a traced step."""
    env, params = envs.make("BernoulliBandit-misc", 2, max_episode_steps=12)
    assert isinstance(params.max_steps_in_episode, float) and params.max_steps_in_episode == 12
    obs, state = env.reset(jax.random.key(0), params)
    jax.jit(env.step)(jax.random.key(1), state, jnp.zeros(2, jnp.int32), params)
    assert isinstance(envs.make("CartPole-v1", max_episode_steps=200)[1].max_steps_in_episode, int)


def test_gymnax_import_defers_its_plotting_libraries():
    # In a fresh interpreter: building envs does not import matplotlib or seaborn
    # (gymnax imports them for rendering only); a render path still gets them.
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from jaxzoo import envs\n"
        "envs.make('Pong-misc', 2)\n"
        "assert not {'seaborn', 'matplotlib', 'matplotlib.pyplot', 'matplotlib.colors'} & set(sys.modules)\n"
        "import gymnax.environments.misc.pong as pong\n"
        "assert len(pong.sns.color_palette('cubehelix', 3)) == 3 and callable(pong.plt.subplots)\n"
        "assert pong.colors.ListedColormap(['red', 'blue']).N == 2\n"
        "assert {'seaborn', 'matplotlib', 'matplotlib.pyplot', 'matplotlib.colors'} <= set(sys.modules)\n"
        "import matplotlib.pyplot\n"
        "assert type(matplotlib.pyplot) is type(sys) and type(sys.modules['matplotlib']) is type(sys)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
