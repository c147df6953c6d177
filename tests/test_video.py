"""Videos of the greedy evaluation (`--capture-video`, jaxzoo.video): the
recording wrapper, the renderer of every registry env, the writer, and one
tiny run of every algorithm file whose video has as many frames as the
episode it shows."""

import dataclasses
import importlib

import imageio.v3 as iio
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_videos_show_first_episodes, slow_except

from jaxzoo import cli, envs, video


def random_policy(spec, key):
    def act(obs):
        if spec.discrete:
            return jax.random.randint(key, (obs.shape[0],), 0, spec.num_actions)
        return jax.random.uniform(key, (obs.shape[0], spec.num_actions), minval=-1.0, maxval=1.0)

    return act


def first_episode_length(env, env_params, act, key, max_steps):
    """Env 0's first episode length by a plain loop over the unrecorded env
    (the same keys as envs.evaluate_episodes), or max_steps if it never ends."""
    reset_key, key = jax.random.split(key)
    obs, state = env.reset(reset_key, env_params)
    for _ in range(max_steps):
        key, step_key = jax.random.split(key)
        obs, state, _, _, _, info = env.step(step_key, state, act(obs), env_params)
        if info["episode_done"][0]:
            return int(info["episode_length"][0])
    return max_steps


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Breakout-MinAtar", "Catch-bsuite"])
def test_the_recording_holds_env_0s_first_episode_and_changes_nothing(env_id):
    env, env_params = envs.make(env_id, 3)
    recorded = envs.RecordEpisode(env, 101)
    act = random_policy(envs.spec(env, env_params), jax.random.key(7))
    key = jax.random.key(3)
    plain = jax.jit(lambda k: envs.evaluate_episodes(env, env_params, act, k, 100))(key)
    returns, recording = jax.jit(lambda k: envs.evaluate_episodes(recorded, env_params, act, k, 100))(key)
    np.testing.assert_array_equal(plain, returns)  # recording does not change the episodes
    length = first_episode_length(env, env_params, act, key, 100)
    assert int(recording.length) == length
    # Entry 0 is the reset state: the one env 0 started from.
    _, state = env.reset(jax.random.split(key)[0], env_params)
    for leaf, recorded_leaf in zip(jax.tree.leaves(envs.innermost_state(state)), jax.tree.leaves(recording.frames)):
        np.testing.assert_array_equal(leaf[0], recorded_leaf[0])


@pytest.mark.parametrize("env_id", envs.env_ids())
def test_every_registry_env_renders_to_frames(env_id):
    """Every gymnax env a file accepts has a renderer: five states of it -> five RGB frames."""
    import gymnax

    env, env_params = gymnax.make(env_id)
    _, states = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(jax.random.key(0), 5), env_params)
    frames, fps = video.frames(env_id, states, 5)
    assert frames.dtype == np.uint8 and frames.ndim == 4 and frames.shape[0] == 5 and frames.shape[-1] == 3
    assert min(frames.shape[1:3]) >= 64 and fps > 0
    assert frames.std() > 0  # something is drawn


def test_classic_control_frames_follow_the_state():
    """CartPole's cart moves right in the picture when x grows."""
    import gymnax

    env, _ = gymnax.make("CartPole-v1")
    _, state = env.reset(jax.random.key(0))
    states = jax.tree.map(lambda x: jnp.stack([x, x]), state)
    states = states.replace(x=jnp.array([-1.0, 1.0]), theta=jnp.zeros(2))
    frames, _ = video.frames("CartPole-v1", states, 2)
    dark_columns = [np.flatnonzero((f.mean(-1) < 60).any(0)).mean() for f in frames]  # the cart
    assert dark_columns[1] - dark_columns[0] > 0.3 * video.SIZE


def test_host_env_images_are_written_as_they_are(tmp_path):
    images = np.random.default_rng(0).random((7, 32, 32, 3)).astype(np.float32)
    recording = envs.Recording(images[None], np.array([7]))
    (path,) = video.write_recordings(tmp_path, "walker-walk", recording, [5], "final")
    assert path.name == "final-seed5.mp4"
    assert iio.imread(path).shape[0] == 7


def test_image_observations_of_any_channel_count_become_rgb():
    gray = np.linspace(0, 1, 2 * 4 * 4).reshape(2, 4, 4, 1).astype(np.float32)
    np.testing.assert_array_equal(video.to_uint8(gray)[..., 0], video.to_uint8(gray)[..., 2])
    stack = np.random.default_rng(0).integers(0, 256, (2, 4, 4, 4), dtype=np.uint8)  # Atari's 4 stacked frames
    np.testing.assert_array_equal(video.to_uint8(stack), np.repeat(stack[..., -1:], 3, axis=-1))  # the newest


def test_write_mp4_and_gif_and_the_gif_command(tmp_path):
    frames = np.zeros((12, 40, 50, 3), np.uint8)
    frames[:, :, :, 0] = np.arange(12)[:, None, None] * 20
    mp4 = video.write(tmp_path / "a.mp4", frames, 10)
    assert iio.imread(mp4).shape[:3] == (12, 48, 64)  # padded to H.264 macroblocks
    gif = video.write(tmp_path / "a.gif", frames, 10)
    assert iio.imread(gif).shape[0] == 12
    video.main([str(mp4), str(tmp_path / "b.gif"), "--every", "3", "--width", "32"])
    assert iio.imread(tmp_path / "b.gif").shape[0] == 4
    with pytest.raises(ValueError, match="suffix must be .mp4 or .gif"):
        video.write(tmp_path / "a.avi", frames, 10)


def test_a_missing_writer_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "imageio", None)
    monkeypatch.setitem(sys.modules, "imageio.v3", None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[video\]"'):
        video.check_writer()


# The other files' CLI tests (tests/test_<algo>.py) run their tiny preset with
# --capture-video and check their videos the same way.
@pytest.mark.parametrize("algo", slow_except(("mpo",), ["mpo", "world_models"]))
def test_capture_video_writes_one_video_per_seed_with_the_episode_s_frames(algo, tmp_path):
    module = importlib.import_module(f"jaxzoo.algos.{algo}")
    args = cli.preset_args(module.Args, algo, "tiny")
    args = dataclasses.replace(args, run_root=str(tmp_path), num_seeds=2, capture_video=True, save_model=False)
    if algo == "world_models":
        args = dataclasses.replace(args, controller_max_steps=0)  # the env's own limit
    module.main(args)
    (run_dir,) = tmp_path.iterdir()
    assert_videos_show_first_episodes(run_dir, 2)
