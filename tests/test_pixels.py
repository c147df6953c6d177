"""common/pixels.py: pure-JAX renderers and the PixelObservation wrapper."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxzoo import envs, pixels


def pendulum_obs(theta: float) -> jax.Array:
    return jnp.array([np.cos(theta), np.sin(theta), 0.0], jnp.float32)


@pytest.mark.parametrize("size, grayscale, channels", [(64, False, 3), (32, True, 1)])
def test_render_shape_and_range(size, grayscale, channels):
    image = np.asarray(pixels.render_pendulum(pendulum_obs(0.3), size, grayscale))
    assert image.shape == (size, size, channels) and image.dtype == np.float32
    assert image.min() >= 0.0 and image.max() <= 1.0
    assert image.max() == 1.0 and image.min() < 0.5  # white background, a dark shape
    # Anti-aliased: edge pixels are partly covered, not only background or shape.
    gray = image.mean(-1)
    assert ((gray > 0.05) & (gray < 0.95) & ~np.isclose(gray, gray.min()) & ~np.isclose(gray, 1.0)).any()


def test_the_rod_points_where_the_angle_says():
    size = 64
    up, down = (np.asarray(pixels.render_pendulum(pendulum_obs(t), size, True))[..., 0] for t in (0.0, np.pi))
    above, below = (size // 2 - int(0.3 * size), size // 2), (size // 2 + int(0.3 * size), size // 2)
    assert up[above] < 0.8 and up[below] == 1.0  # theta = 0 is upright
    assert down[below] < 0.8 and down[above] == 1.0
    quarter = np.asarray(pixels.render_pendulum(pendulum_obs(0.1), size, True))[..., 0]
    assert 0.0 < np.abs(quarter - up).mean() < np.abs(down - up).mean()  # small turn, small change


def test_render_jits_and_vmaps():
    thetas = jnp.linspace(-3.0, 3.0, 5)
    obs = jnp.stack([jnp.cos(thetas), jnp.sin(thetas), jnp.zeros(5)], -1)
    batch = jax.jit(jax.vmap(lambda o: pixels.render_pendulum(o, 32)))(obs)
    assert batch.shape == (5, 32, 32, 3)
    np.testing.assert_allclose(batch[2], pixels.render_pendulum(obs[2], 32), atol=1e-6)
    flat = np.asarray(batch).reshape(5, -1)
    distances = np.abs(flat[:, None] - flat[None]).mean(-1)
    assert (distances + np.eye(5) > 1e-3).all()  # every angle its own image


def test_pixel_env_renders_obs_and_final_observation_on_truncation():
    env, params = pixels.make("Pendulum-v1", 3, size=16, max_episode_steps=2)
    raw_env, _ = envs.make("Pendulum-v1", 3, max_episode_steps=2)
    assert envs.spec(env, params).obs_shape == (16, 16, 3)
    obs, state = env.reset(jax.random.key(0), params)
    raw_obs, raw_state = raw_env.reset(jax.random.key(0), params)
    assert obs.shape == (3, 16, 16, 3)
    render = jax.jit(jax.vmap(lambda o: pixels.render_pendulum(o, 16)))
    np.testing.assert_allclose(obs, render(raw_obs), atol=1e-6)
    step, raw_step = jax.jit(env.step), jax.jit(raw_env.step)
    for t in range(2):
        action = jnp.ones((3, 1))
        obs, state, reward, terminated, truncated, info = step(jax.random.key(t + 1), state, action, params)
        raw_obs, raw_state, raw_reward, _, _, raw_info = raw_step(jax.random.key(t + 1), raw_state, action, params)
    assert bool(truncated.all()) and not bool(terminated.any())
    np.testing.assert_allclose(reward, raw_reward)
    np.testing.assert_allclose(info["final_observation"], render(raw_info["final_observation"]), atol=1e-6)
    np.testing.assert_allclose(obs, render(raw_obs), atol=1e-6)  # the reset frame
    assert not np.allclose(info["final_observation"], obs)
    assert bool(info["episode_done"].all()) and (np.asarray(info["episode_length"]) == 2).all()


def test_env_without_renderer_is_refused():
    with pytest.raises(ValueError, match="no pixel renderer for env_id 'Acrobot-v1'.*Pendulum-v1, CartPole-v1"):
        pixels.make("Acrobot-v1")


def cartpole_obs(x: float = 0.0, theta: float = 0.0) -> jax.Array:
    return jnp.array([x, 0.3, theta, -0.2], jnp.float32)


@pytest.mark.parametrize("size, grayscale, channels", [(64, False, 3), (32, True, 1)])
def test_cartpole_render_shape_and_range(size, grayscale, channels):
    image = np.asarray(pixels.render_cartpole(cartpole_obs(0.5, 0.1), size, grayscale))
    assert image.shape == (size, size, channels) and image.dtype == np.float32
    assert image.min() >= 0.0 and image.max() <= 1.0
    assert image.max() == 1.0 and image.min() < 0.3  # white background, a dark cart


def test_cartpole_states_render_differently_and_velocities_do_not():
    size = 64
    render = lambda obs: np.asarray(pixels.render_cartpole(obs, size, True))[..., 0]
    centre, right = render(cartpole_obs(0.0)), render(cartpole_obs(1.2))
    # The cart's dark body moves right by 1.2 / 4.8 of the width.
    dark_columns = lambda image: np.flatnonzero((image < 0.3).any(0))
    assert abs(dark_columns(right).mean() - dark_columns(centre).mean() - 1.2 / 4.8 * size) < 1.5
    # A pole tilted right by the 12 degree termination bound darkens pixels right of the upright one.
    tilted = render(cartpole_obs(0.0, 0.2))
    top = slice(0, size // 2)
    columns = np.arange(size)
    mass = lambda image: ((1.0 - image[top]) * columns).sum() / (1.0 - image[top]).sum()
    assert mass(tilted) > mass(centre) + 2.0
    small = render(cartpole_obs(0.0, 0.02))  # about one degree still changes the image
    assert 0.0 < np.abs(small - centre).mean() < np.abs(tilted - centre).mean()
    # Velocities (obs[1], obs[3]) are not drawn.
    np.testing.assert_array_equal(centre, render(jnp.array([0.0, -2.0, 0.0, 3.0])))


def test_cartpole_pixel_env_has_image_observations():
    env, params = pixels.make("CartPole-v1", 4, size=32, grayscale=True)
    obs, _ = jax.eval_shape(env.reset, jax.random.key(1), params)
    assert obs.shape == (4, 32, 32, 1) and envs.spec(env, params).obs_shape == (32, 32, 1)


def test_frame_stack_shifts_frames_and_restarts_the_stack_at_each_new_episode():
    """FrameStack: k frames oldest first on the channel axis; a new episode
    starts with its first frame in every slot; the ended episode's
    final_observation is its stack with the final frame newest."""
    k, limit = 3, 4
    env, params = pixels.make("pixels:Pendulum-v1", 2, size=12, grayscale=True, frame_stack=k, max_episode_steps=limit)
    single, _ = pixels.make("Pendulum-v1", 2, size=12, grayscale=True, max_episode_steps=limit)
    assert envs.spec(env, params).obs_shape == (12, 12, k)
    stack, state = env.reset(jax.random.key(0), params)
    frame, single_state = single.reset(jax.random.key(0), params)
    np.testing.assert_array_equal(stack, jnp.concatenate([frame] * k, -1))  # the first frame in every slot
    history = [frame] * k
    step, single_step = jax.jit(env.step), jax.jit(single.step)
    for t in range(limit + 2):
        action = jnp.full((2, 1), 1.5)
        stack, state, _, terminated, truncated, info = step(jax.random.key(t + 1), state, action, params)
        frame, single_state, _, _, single_truncated, single_info = single_step(
            jax.random.key(t + 1), single_state, action, params
        )
        np.testing.assert_array_equal(truncated, single_truncated)
        final_expected = jnp.concatenate([*history[1:], single_info["final_observation"]], -1)
        np.testing.assert_array_equal(info["final_observation"], final_expected)
        if bool(truncated[0]):  # step `limit`: the next episode's first frame fills the stack
            assert t + 1 == limit and not bool(terminated.any())
            history = [frame] * k
            assert not np.array_equal(final_expected, jnp.concatenate(history, -1))
        else:
            history = [*history[1:], frame]
        np.testing.assert_array_equal(stack, jnp.concatenate(history, -1))


def test_as_bytes_rounds_the_float_images():
    floats, params = pixels.make("CartPole-v1", 3, size=20)
    as_bytes, _ = pixels.make("pixels:CartPole-v1", 3, size=20, as_bytes=True, frame_stack=2)
    image, _ = floats.reset(jax.random.key(4), params)
    stacked, _ = as_bytes.reset(jax.random.key(4), params)
    assert stacked.dtype == jnp.uint8 and envs.spec(as_bytes, params).obs_shape == (20, 20, 6)
    np.testing.assert_array_equal(stacked[..., 3:], np.round(np.asarray(image) * 255).astype(np.uint8))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"frame_stack": 0}, "frame_stack must be >= 1, got 0"),
        ({"normalize_obs": True}, "normalize_obs and flatten_obs act on the observation vectors"),
    ],
)
def test_pixel_env_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pixels.make("pixels:CartPole-v1", 2, **kwargs)
