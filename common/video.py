"""Videos of evaluation episodes: `--capture-video` on every algorithm file.

The jitted evaluation records env 0's first episode per seed
(`jaxzoo.envs.RecordEpisode`: the gymnax env state at each step, a few
scalars, or the image a host-stepped env returned); after the rollout is back
on the host, this module renders those entries to RGB frames and writes one
file per seed. Nothing here runs, or is even imported, without the flag.

Rendering, by what the env is:

- classic control (CartPole, Pendulum, Acrobot, MountainCar, continuous
  MountainCar): the pure-JAX renderers of `jaxzoo.pixels` drawn from the
  observation at `SIZE` x `SIZE`;
- MinAtar and every other gymnax env with a grid observation [H, W, C]: each
  cell coloured by its highest set channel (MinAtar's own display: a cubehelix
  palette over the channels, black background), cells enlarged;
- gymnax envs with a vector observation (bandits, chains, PointRobot, ...): one
  bar per observation entry, scaled by the episode's largest magnitude;
- image observations (DeepMind Control, CarRacing, any host env): the frames
  themselves, enlarged.

Files: MP4 (H.264 through imageio-ffmpeg) or GIF (Pillow), by the suffix.
`python -m jaxzoo.video IN.mp4 OUT.gif --every 2 --width 160` makes the short
GIFs the docs pages show.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxzoo import envs, pixels

SIZE = 256  # frame side in pixels for the drawn renderers
INSTALL = 'pip install -e ".[video]"'  # the extra that installs the writer

# The classic-control renderers: obs [O] -> image [SIZE, SIZE, 3] in [0, 1].
CLASSIC_CONTROL: dict[str, Callable[..., jax.Array]] = {
    **pixels.RENDERERS,
    "Acrobot-v1": pixels.render_acrobot,
    "MountainCar-v0": pixels.render_mountain_car,
    "MountainCarContinuous-v0": partial(pixels.render_mountain_car, goal=0.45),
}
# Frames per second: gym's render_fps for classic control, slower for grid games.
FPS = {"CartPole-v1": 50, "Pendulum-v1": 30, "Acrobot-v1": 15, "MountainCar-v0": 30, "MountainCarContinuous-v0": 30}
GRID_FPS, DEFAULT_FPS = 12, 30


def fps_of(env_id: str, grid: bool = False) -> int:
    return FPS.get(env_id, GRID_FPS if grid else DEFAULT_FPS)


# --------------------------------------------------------------------------- #
# Entries -> frames
# --------------------------------------------------------------------------- #
def gymnax_observations(env_id: str, states) -> np.ndarray:
    """The raw gymnax observations [T, ...] of recorded env states (leaves
    [T, ...]); for an env without `get_obs` (FrozenLake), the state's own
    numbers, flattened [T, D]."""
    env, params = envs.import_gymnax().make(env_id)
    length = jax.tree.leaves(states)[0].shape[0]
    try:
        try:
            return np.asarray(jax.jit(jax.vmap(lambda s: env.get_obs(s, params)))(states))
        except TypeError:  # UmbrellaChain's get_obs(state, key, params)
            keys = jax.random.split(jax.random.key(0), length)
            return np.asarray(jax.jit(jax.vmap(lambda s, k: env.get_obs(s, k, params)))(states, keys))
    except NotImplementedError:
        return np.concatenate([np.asarray(x, np.float32).reshape(length, -1) for x in jax.tree.leaves(states)], 1)


def enlarge(images: np.ndarray, target: int = SIZE) -> np.ndarray:
    """[T, H, W, 3] uint8, each pixel repeated so the longer side is about `target`."""
    factor = max(1, int(round(target / max(images.shape[1:3]))))
    return images.repeat(factor, axis=1).repeat(factor, axis=2)


def to_uint8(images: np.ndarray) -> np.ndarray:
    """Float images in [0, 1] (or uint8) [T, H, W, C] -> uint8 RGB [T, H, W, 3]:
    C = 3 is RGB, C = 1 grayscale; any other C is a stack of grayscale frames
    (Atari's 4), shown by its newest, the last channel."""
    images = np.asarray(images)
    if images.dtype != np.uint8:
        images = (np.clip(images.astype(np.float32), 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    if images.shape[-1] != 3:
        images = images[..., -1:]
    return np.repeat(images, 3, axis=-1) if images.shape[-1] == 1 else images


def grid_frames(grids: np.ndarray) -> np.ndarray:
    """Grid observations [T, H, W, C] (MinAtar's channels) -> uint8 [T, H', W', 3]:
    each cell takes the colour of its highest nonzero channel, black if none."""
    import matplotlib

    channels = grids.shape[-1]
    palette = matplotlib.colormaps["cubehelix"](np.linspace(0.15, 0.85, channels))[:, :3]
    palette = np.concatenate([np.zeros((1, 3)), palette])  # index 0: empty cell
    top = np.max((grids > 0) * np.arange(1, channels + 1), axis=-1)  # [T, H, W]
    return enlarge(to_uint8(palette[top]))


def vector_frames(vectors: np.ndarray, size: int = SIZE) -> np.ndarray:
    """Vector observations [T, O] -> uint8 [T, size, size, 3]: one bar per entry,
    up from the middle line for positive values, scaled by the largest |value|."""
    vectors = vectors.reshape(vectors.shape[0], -1).astype(np.float32)
    count = vectors.shape[1]
    scale = max(float(np.abs(vectors).max()), 1e-6)
    frames = np.full((vectors.shape[0], size, size, 3), 255, np.uint8)
    frames[:, size // 2, :] = 128
    width = max(1, size // max(count, 1))
    for t, vector in enumerate(vectors):
        for i, value in enumerate(vector[: size // width]):
            height = int(round(abs(value) / scale * (size // 2 - 4)))
            rows = slice(size // 2 - height, size // 2) if value > 0 else slice(size // 2, size // 2 + height)
            frames[t, rows, i * width + 1 : (i + 1) * width - 1] = (40, 90, 200)
    return frames


def frames(env_id: str, entries, length: int) -> tuple[np.ndarray, int]:
    """One recorded episode (entries with leaves [max_frames, ...], `length`
    of them valid) -> (uint8 frames [length, H, W, 3], frames per second)."""
    entries = jax.tree.map(lambda x: np.asarray(x)[:length], entries)
    if isinstance(entries, np.ndarray) and entries.ndim == 4:  # image observations of a host env
        return enlarge(to_uint8(entries)), fps_of(env_id)
    if isinstance(entries, np.ndarray) and entries.ndim == 2:  # vector observations of a host env (gym:<id>)
        name = env_id.removeprefix("gym:")  # gymnasium's classic control observations are gymnax's
        if name in CLASSIC_CONTROL:
            render = jax.jit(jax.vmap(partial(CLASSIC_CONTROL[name], size=SIZE)))
            return to_uint8(np.asarray(render(jnp.asarray(entries, jnp.float32)))), fps_of(name)
        return vector_frames(entries), fps_of(name)
    env_id = pixels.base_id(env_id)  # a pixels: id records its gymnax states, drawn here at SIZE
    observations = gymnax_observations(env_id, entries)
    if env_id in CLASSIC_CONTROL:
        render = jax.jit(jax.vmap(partial(CLASSIC_CONTROL[env_id], size=SIZE)))
        return to_uint8(np.asarray(render(jnp.asarray(observations, jnp.float32)))), fps_of(env_id)
    if observations.ndim == 4:
        return grid_frames(observations), fps_of(env_id, grid=True)
    if observations.ndim == 3:  # a 2-D grid without channels
        return grid_frames(observations[..., None]), fps_of(env_id, grid=True)
    return vector_frames(observations), fps_of(env_id)


# --------------------------------------------------------------------------- #
# Writing
# --------------------------------------------------------------------------- #
def _imageio():
    try:
        import imageio.v3 as iio
    except ImportError as error:
        raise ImportError(f"--capture-video needs imageio and imageio-ffmpeg: {INSTALL}") from error
    return iio


def pad_to_block(images: np.ndarray, block: int = 16) -> np.ndarray:
    """Pad [T, H, W, 3] with white to multiples of `block` (H.264's macroblocks)."""
    pad_h, pad_w = -images.shape[1] % block, -images.shape[2] % block
    return np.pad(images, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), constant_values=255)


def write(path: str | Path, images: np.ndarray, fps: int) -> Path:
    """Write uint8 frames [T, H, W, 3] as an MP4 or a GIF (by `path`'s suffix)."""
    path = Path(path)
    iio = _imageio()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gif":
        iio.imwrite(path, images, duration=1000.0 / fps, loop=0)
    elif path.suffix == ".mp4":
        try:
            iio.imwrite(path, pad_to_block(images), fps=fps, codec="libx264")
        except (ImportError, RuntimeError) as error:  # imageio without its ffmpeg plugin
            raise ImportError(f"writing MP4 needs imageio-ffmpeg: {INSTALL}") from error
    else:
        raise ValueError(f"video file {str(path)!r}: the suffix must be .mp4 or .gif")
    return path


def write_recordings(directory: str | Path, env_id: str, recording, seeds: Sequence[int], label: str) -> list[Path]:
    """One MP4 per seed, `<directory>/<label>-seed<seed>.mp4`, from a
    `jaxzoo.envs.Recording` on the host with a leading seed axis."""
    paths = []
    for index, seed in enumerate(seeds):
        entries = jax.tree.map(lambda x: x[index], recording.frames)
        images, fps = frames(env_id, entries, int(recording.length[index]))
        paths.append(write(Path(directory) / f"{label}-seed{int(seed)}.mp4", images, fps))
    return paths


def check_writer() -> None:
    """Fail at startup, not after training, when the video writer is missing."""
    _imageio()
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError as error:
        raise ImportError(f"--capture-video writes MP4 through imageio-ffmpeg: {INSTALL}") from error


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m jaxzoo.video IN OUT.gif`: a shorter, smaller GIF of a video."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--every", type=int, default=1, help="keep every n-th frame")
    parser.add_argument("--width", type=int, default=160, help="output width in pixels (nearest-neighbour)")
    parser.add_argument("--max-frames", type=int, default=300)
    parser.add_argument("--fps", type=float, default=None, help="default: the source's fps / every")
    options = parser.parse_args(argv)
    iio = _imageio()
    images = np.asarray(iio.imread(options.source))[:: options.every][: options.max_frames]
    step = max(1, images.shape[2] // options.width)
    images = images[:, ::step, ::step]
    fps = options.fps or iio.immeta(options.source).get("fps", DEFAULT_FPS) / options.every
    write(options.target, images, int(round(fps)))
    print(f"{options.target}: {images.shape[0]} frames of {images.shape[2]}x{images.shape[1]} at {fps:.0f} fps")


if __name__ == "__main__":
    main()
