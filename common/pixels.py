"""Pixel observations in pure JAX: renderers and a wrapper that swaps an env's
observation vector for an image, so a pixel-based agent stays inside `jax.jit`.

A renderer maps one observation vector to an image, `render(obs [O]) ->
[size, size, C]` floats in [0, 1], drawn with anti-aliased signed distance
fields (every pixel's coverage of a shape is `clip(0.5 - distance, 0, 1)`, the
distance in pixels): no host code, so it jits, vmaps and runs inside
`lax.scan`. Rendering from the observation rather than the env state means
`info["final_observation"]` (the vector the step reached before an automatic
reset) renders exactly like `obs`.

    env, env_params = pixels.make("Pendulum-v1", num_envs=8, size=64)   # or "CartPole-v1"
    obs, state = env.reset(key, env_params)                 # obs [8, 64, 64, 3]

`make` builds `common.envs.make(env_id, num_envs)` and wraps it in
`PixelObservation` (and `FrameStack` with `frame_stack` > 1: one frame has no
velocities); the env ids that have a renderer are the keys of `RENDERERS`.
Another renderer is a function of `(obs, size, grayscale)` added to that
table. A model-free file names these envs `pixels:<id>` (`is_pixels`,
`base_id`), as `envpool:` and `gym:` name the other families.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from jaxzoo import envs

PREFIX = "pixels:"


def is_pixels(env_id: str) -> bool:
    """Whether `env_id` names a gymnax env drawn as images: 'pixels:<id>'."""
    return env_id.startswith(PREFIX)


def base_id(env_id: str) -> str:
    """'pixels:CartPole-v1' -> 'CartPole-v1'."""
    return env_id.removeprefix(PREFIX)


# --------------------------------------------------------------------------- #
# Drawing primitives: distances in pixels, coverage in [0, 1]
# --------------------------------------------------------------------------- #


def pixel_grid(size: int) -> tuple[jax.Array, jax.Array]:
    """Pixel-centre coordinates `(x [size, size], y [size, size])` in pixel
    units, x to the right and y downwards (image convention)."""
    centres = jnp.arange(size, dtype=jnp.float32) + 0.5
    x, y = jnp.meshgrid(centres, centres, indexing="xy")
    return x, y


def coverage(distance: jax.Array) -> jax.Array:
    """Anti-aliased coverage of a shape from the signed distance (pixels,
    negative inside) of each pixel centre: a one-pixel linear ramp."""
    return jnp.clip(0.5 - distance, 0.0, 1.0)


def disk_distance(x, y, cx, cy, radius) -> jax.Array:
    """Signed distance to a disk of centre (cx, cy)."""
    return jnp.hypot(x - cx, y - cy) - radius


def capsule_distance(x, y, ax, ay, bx, by, radius) -> jax.Array:
    """Signed distance to a capsule: the segment a-b thickened by `radius`."""
    px, py, dx, dy = x - ax, y - ay, bx - ax, by - ay
    along = jnp.clip((px * dx + py * dy) / jnp.maximum(dx * dx + dy * dy, 1e-9), 0.0, 1.0)
    return jnp.hypot(px - along * dx, py - along * dy) - radius


def box_distance(x, y, cx, cy, half_width, half_height) -> jax.Array:
    """Signed distance to an axis-aligned box of centre (cx, cy)."""
    qx, qy = jnp.abs(x - cx) - half_width, jnp.abs(y - cy) - half_height
    outside = jnp.hypot(jnp.maximum(qx, 0.0), jnp.maximum(qy, 0.0))
    return outside + jnp.minimum(jnp.maximum(qx, qy), 0.0)


def paint(image: jax.Array, alpha: jax.Array, colour) -> jax.Array:
    """Alpha-blend a colour [C] over `image` [H, W, C] with coverage [H, W]."""
    return image * (1.0 - alpha[..., None]) + jnp.asarray(colour, jnp.float32) * alpha[..., None]


def to_grayscale(image: jax.Array) -> jax.Array:
    """[H, W, 3] -> [H, W, 1], ITU-R 601 luma."""
    return jnp.tensordot(image, jnp.array([0.299, 0.587, 0.114], jnp.float32), axes=1)[..., None]


# --------------------------------------------------------------------------- #
# Renderers: obs [O] -> image [size, size, C]
# --------------------------------------------------------------------------- #


def render_pendulum(obs: jax.Array, size: int = 64, grayscale: bool = False) -> jax.Array:
    """gymnax Pendulum-v1 observation [cos theta, sin theta, theta_dot] -> image.

    theta = 0 is upright (the swing-up goal) and the rod points up; the rod is
    a red capsule of length 0.4 * size from a dark pivot at the centre, on a
    white background, as in gym's rendering. The angular velocity is not drawn:
    as in the paper's tasks, it must be inferred from consecutive frames.
    """
    x, y = pixel_grid(size)
    cos_theta, sin_theta = obs[0], obs[1]
    centre, length = size / 2.0, 0.4 * size
    tip_x, tip_y = centre + length * sin_theta, centre - length * cos_theta
    image = jnp.ones((size, size, 3), jnp.float32)
    rod = coverage(capsule_distance(x, y, centre, centre, tip_x, tip_y, 0.06 * size))
    image = paint(image, rod, (0.8, 0.3, 0.3))
    image = paint(image, coverage(disk_distance(x, y, centre, centre, 0.03 * size + 0.5)), (0.1, 0.1, 0.1))
    return to_grayscale(image) if grayscale else image


def render_cartpole(obs: jax.Array, size: int = 64, grayscale: bool = False) -> jax.Array:
    """gymnax CartPole-v1 observation [x, x_dot, theta, theta_dot] -> image.

    The track's [-2.4, 2.4] (the termination bounds) spans the image width; a
    dark cart on a grey track line at 3/4 of the height, a brown pole hinged
    on its top, theta = 0 upright and positive to the right, as in gym's
    rendering. The pole is drawn 0.55 * size long and about 0.07 * size thick,
    darker than gym's tan (longer, thicker and of more contrast than gym's
    proportions): the angles that matter, within the 12 degree termination
    bound, move its tip by a few pixels at 64 x 64, and a VAE trained on
    squared error encodes the angle much better when the pole weighs more in
    the image (docs/world_models.md). Velocities are not drawn: they must be
    inferred from consecutive frames.
    """
    x, y = pixel_grid(size)
    cart_x = size / 2.0 + obs[0] * size / 4.8
    track_y = 0.75 * size
    cart_half_width, cart_half_height = 0.09 * size, 0.05 * size
    pole_length, theta = 0.55 * size, obs[2]
    hinge_y = track_y - cart_half_height
    tip_x, tip_y = cart_x + pole_length * jnp.sin(theta), hinge_y - pole_length * jnp.cos(theta)
    image = jnp.ones((size, size, 3), jnp.float32)
    track = coverage(jnp.abs(y - track_y) - 0.5)  # a one-pixel line
    image = paint(image, track, (0.5, 0.5, 0.5))
    cart = coverage(box_distance(x, y, cart_x, track_y, cart_half_width, cart_half_height))
    image = paint(image, cart, (0.1, 0.1, 0.1))
    pole = coverage(capsule_distance(x, y, cart_x, hinge_y, tip_x, tip_y, 0.035 * size + 0.5))
    image = paint(image, pole, (0.7, 0.4, 0.15))
    image = paint(image, coverage(disk_distance(x, y, cart_x, hinge_y, 0.02 * size + 0.5)), (0.5, 0.5, 0.8))
    return to_grayscale(image) if grayscale else image


def render_acrobot(obs: jax.Array, size: int = 64, grayscale: bool = False) -> jax.Array:
    """gymnax Acrobot-v1 observation [cos t1, sin t1, cos t2, sin t2, t1_dot,
    t2_dot] -> image: two blue links of equal length from a pivot at the centre,
    t1 = 0 hanging down, t2 relative to the first link, as in gym's rendering;
    the grey line is the goal height (one link above the pivot)."""
    x, y = pixel_grid(size)
    theta1 = jnp.arctan2(obs[1], obs[0])
    theta2 = theta1 + jnp.arctan2(obs[3], obs[2])
    centre, length = size / 2.0, 0.22 * size
    elbow_x, elbow_y = centre + length * jnp.sin(theta1), centre + length * jnp.cos(theta1)
    tip_x, tip_y = elbow_x + length * jnp.sin(theta2), elbow_y + length * jnp.cos(theta2)
    image = jnp.ones((size, size, 3), jnp.float32)
    image = paint(image, coverage(jnp.abs(y - (centre - length)) - 0.5), (0.5, 0.5, 0.5))
    for ax, ay, bx, by in ((centre, centre, elbow_x, elbow_y), (elbow_x, elbow_y, tip_x, tip_y)):
        image = paint(image, coverage(capsule_distance(x, y, ax, ay, bx, by, 0.03 * size + 0.5)), (0.0, 0.4, 0.8))
    for cx, cy in ((centre, centre), (elbow_x, elbow_y)):
        image = paint(image, coverage(disk_distance(x, y, cx, cy, 0.025 * size + 0.5)), (0.8, 0.8, 0.0))
    return to_grayscale(image) if grayscale else image


def render_mountain_car(obs: jax.Array, size: int = 64, grayscale: bool = False, goal: float = 0.5) -> jax.Array:
    """gymnax MountainCar observation [position, velocity] -> image: the hill
    height(p) = 0.45 sin(3p) + 0.55 over p in [-1.2, 0.6] (gym's), a dark car
    on it, a yellow flag at the goal position `goal`."""
    x, y = pixel_grid(size)
    to_x = lambda p: (p + 1.2) / 1.8 * size
    to_y = lambda p: size * (0.95 - 0.8 * (0.45 * jnp.sin(3.0 * p) + 0.55))
    hill_at_pixel = to_y(x / size * 1.8 - 1.2)
    image = jnp.ones((size, size, 3), jnp.float32)
    image = paint(image, coverage(jnp.abs(y - hill_at_pixel) - 0.6), (0.3, 0.3, 0.3))
    flag_x, flag_y = to_x(goal), to_y(goal)
    pole = coverage(box_distance(x, y, flag_x, flag_y - 0.06 * size, 0.5, 0.06 * size))
    image = paint(image, pole, (0.2, 0.2, 0.2))
    flag = box_distance(x, y, flag_x + 0.03 * size, flag_y - 0.1 * size, 0.03 * size, 0.02 * size)
    image = paint(image, coverage(flag), (0.9, 0.8, 0.0))
    car_x, car_y = to_x(obs[0]), to_y(obs[0]) - 0.04 * size
    image = paint(image, coverage(disk_distance(x, y, car_x, car_y, 0.04 * size + 0.5)), (0.1, 0.1, 0.1))
    return to_grayscale(image) if grayscale else image


RENDERERS: dict[str, Callable[..., jax.Array]] = {
    "Pendulum-v1": render_pendulum,
    "CartPole-v1": render_cartpole,
}


# --------------------------------------------------------------------------- #
# Wrapper
# --------------------------------------------------------------------------- #
class PixelObservation(envs.Wrapper):
    """Replaces observations, and `info["final_observation"]`, by
    `render(obs)`. The renderer takes one observation vector; leading batch
    axes (a VecEnv's `[num_envs]`) are mapped over, so this may wrap a single
    env or a VecEnv. `as_bytes`: images as uint8 in [0, 255] (rounded), as
    Atari's frames, for a torso that scales bytes itself and rollouts a
    quarter the size; else float32 in [0, 1]."""

    def __init__(
        self,
        env,
        render: Callable[[jax.Array], jax.Array],
        image_shape: tuple[int, int, int],
        as_bytes: bool = False,
    ):
        super().__init__(env)
        draw = render
        if as_bytes:

            def draw(obs: jax.Array) -> jax.Array:
                return jnp.round(render(obs) * 255.0).astype(jnp.uint8)

        self.render = jnp.vectorize(draw, signature="(o)->(h,w,c)")
        self.image_shape = image_shape
        self.as_bytes = as_bytes

    def observation_space(self, params):
        envs.import_gymnax()
        from gymnax.environments import spaces  # on first use (jaxzoo.envs.ENV_IDS says why)

        if self.as_bytes:
            return spaces.Box(0, 255, self.image_shape, jnp.uint8)
        return spaces.Box(0.0, 1.0, self.image_shape, jnp.float32)

    @partial(jax.jit, static_argnames=("self",))
    def reset(self, key, params=None):
        obs, state = self._env.reset(key, params)
        return self.render(obs), state

    @partial(jax.jit, static_argnames=("self",))
    def step(self, key, state, action, params=None):
        obs, state, reward, terminated, truncated, info = self._env.step(key, state, action, params)
        info = {**info, "final_observation": self.render(info["final_observation"])}
        return self.render(obs), state, reward, terminated, truncated, info


@struct.dataclass
class FrameStackState:
    env_state: Any
    frames: jax.Array  # [N, H, W, C * k]: the newest k frames, oldest first on the channel axis


class FrameStack(envs.Wrapper):
    """The last `k` image observations of each env of a VecEnv, concatenated on
    the channel axis ([N, H, W, C] -> [N, H, W, C * k], oldest first), as DQN's
    Atari agent stacks its frames (Mnih et al. 2015). A new episode (the
    VecEnv's automatic reset after a step that ended one) starts with its first
    frame in all k slots; `info["final_observation"]` is the ended episode's
    stack with its final frame newest, so a truncated episode bootstraps from
    what the agent would have seen."""

    def __init__(self, env, k: int):
        super().__init__(env)
        self.k = k

    def observation_space(self, params):
        envs.import_gymnax()
        from gymnax.environments import spaces  # on first use (jaxzoo.envs.ENV_IDS says why)

        space = self._env.observation_space(params)
        return spaces.Box(space.low, space.high, (*space.shape[:-1], space.shape[-1] * self.k), space.dtype)

    @partial(jax.jit, static_argnames=("self",))
    def reset(self, key, params=None):
        obs, state = self._env.reset(key, params)
        frames = jnp.concatenate([obs] * self.k, axis=-1)
        return frames, FrameStackState(state, frames)

    @partial(jax.jit, static_argnames=("self",))
    def step(self, key, state, action, params=None):
        obs, env_state, reward, terminated, truncated, info = self._env.step(key, state.env_state, action, params)
        final = envs.push_frame(state.frames, info["final_observation"])
        ended = (terminated | truncated).reshape(obs.shape[:1] + (1,) * (obs.ndim - 1))
        frames = jnp.where(ended, jnp.concatenate([obs] * self.k, axis=-1), envs.push_frame(state.frames, obs))
        info = {**info, "final_observation": final}
        return frames, FrameStackState(env_state, frames), reward, terminated, truncated, info


def make(
    env_id: str,
    num_envs: int | None = None,
    *,
    size: int = 64,
    grayscale: bool = False,
    frame_stack: int = 1,
    as_bytes: bool = False,
    **make_kwargs,
):
    """`common.envs.make(env_id, num_envs, **make_kwargs)` with image
    observations [(num_envs,) size, size, C x frame_stack], C 1 (grayscale) or
    3, float32 in [0, 1] or with `as_bytes` uint8 in [0, 255]; returns
    `(env, env_params)`. `env_id` may carry the `pixels:` prefix."""
    env_id = base_id(env_id)
    if env_id not in RENDERERS:
        raise ValueError(f"no pixel renderer for env_id {env_id!r}; envs with one: {', '.join(RENDERERS)}")
    if size < 8:
        raise ValueError(f"image size must be >= 8 pixels, got {size}")
    if frame_stack < 1:
        raise ValueError(f"frame_stack must be >= 1, got {frame_stack}")
    if frame_stack > 1 and num_envs is None:
        raise ValueError("frame stacking works on a VecEnv: pass num_envs")
    if make_kwargs.get("normalize_obs") or make_kwargs.get("flatten_obs"):
        raise ValueError(
            "normalize_obs and flatten_obs act on the observation vectors, before they are drawn: not for pixel envs"
        )
    env, env_params = envs.make(env_id, num_envs, **make_kwargs)
    render = partial(RENDERERS[env_id], size=size, grayscale=grayscale)
    env = PixelObservation(env, render, (size, size, 1 if grayscale else 3), as_bytes)
    return (FrameStack(env, frame_stack) if frame_stack > 1 else env), env_params
