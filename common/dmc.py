"""DeepMind Control Suite tasks with pixel observations, stepped on the host
from inside `jax.jit` (optional extra: `pip install -e '.[dmc]'`).

    env, env_params = dmc.make("dmc:cartpole-swingup", num_envs=1, size=64, action_repeat=8, seed=0)
    obs, state = env.reset(key, env_params)                                  # obs [1, 64, 64, 3]
    obs, state, reward, terminated, truncated, info = env.step(key, state, action, env_params, active)

The env has the interface of a `common.pixels.make` VecEnv (images in [0, 1],
automatic reset, `info["final_observation"]`, `episode_done`,
`episode_return`, `episode_length`), so an algorithm's jitted loop runs it
unchanged. It is a host env of common/host.py (the bridge `gym:` ids use
too), with three differences from a gymnax env:

- each `reset` and `step` is a `jax.experimental.io_callback` into Python,
  which steps MuJoCo and renders with MuJoCo's OpenGL renderer (headless EGL by
  default; set MUJOCO_GL to change it) on the bridge's one host thread.
  Ordered callbacks cannot be vmapped, so one seed per process;
- the action repeat happens on the host and renders once per agent step (as
  Kaixhin/PlaNet's ControlSuiteEnv does): in software rendering a 64x64 frame
  costs about 27 ms here against 0.2 ms for a physics step. `reward` is the sum
  over the repeat, `episode_length` counts environment steps;
- `step` takes `active` [N]: envs where it is False are not stepped, and their
  outputs are placeholders the caller must discard (a jitted loop computes
  every env every step; a simulator on the host must not advance).

Seeding and resuming: the device-side state is only `(stream, episode, t)`
per env and the last frame (`host.HostEnvState`). Episode e of env i starts
from `task.random` seeded with a hash of `(seed, role, i, e)`
(`host.episode_seed`, stream = `seed`), so a run is reproducible. When a call's state is not where the
host env is (a run resumed from a checkpoint in a new process) the host env is
rebuilt at the state's episode, which must be at its start (t = 0): PlaNet's
checkpoints fall between episodes.

Task ids are "dmc:<domain>-<task>", e.g. dmc:cartpole-swingup,
dmc:cheetah-run, dmc:walker-walk (`dm_control.suite.ALL_TASKS`).
"""

from __future__ import annotations

import atexit
import os

import numpy as np

from jaxzoo import envs, host

PREFIX = "dmc:"

EXTRA_HINT = "install the optional extra: pip install -e '.[dmc]'"


def is_dmc(env_id: str) -> bool:
    return env_id.startswith(PREFIX)


def parse(env_id: str) -> tuple[str, str]:
    """'dmc:cartpole-swingup' -> ('cartpole', 'swingup'), with a clear error for a malformed id."""
    domain, _, task = env_id[len(PREFIX) :].partition("-")
    if not is_dmc(env_id) or not domain or not task:
        raise ValueError(
            f"env_id {env_id!r} is not a DeepMind Control id: expected '{PREFIX}<domain>-<task>', "
            "e.g. 'dmc:cartpole-swingup'"
        )
    return domain, task


def load(domain: str, task: str, seed: int):
    """`dm_control.suite.load` (the tests replace this function with a fake simulator)."""
    os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; must be set before dm_control is imported
    try:
        from dm_control import suite
    except ImportError as error:
        raise ValueError(
            f"env_id '{PREFIX}{domain}-{task}' needs dm_control, which is not installed ({error}); {EXTRA_HINT}"
        ) from error
    if (domain, task) not in suite.ALL_TASKS:
        known = [f"{PREFIX}{d}-{t}" for d, t in suite.ALL_TASKS]
        asked = f"{PREFIX}{domain}-{task}"
        raise ValueError(
            f"unknown DeepMind Control task '{asked}'{envs.did_you_mean(asked, known)}; valid ids: {', '.join(known)}"
        )
    return suite.load(domain, task, task_kwargs={"random": seed})


class DMControlPixels(host.HostEnv):
    """`num_envs` DeepMind Control tasks with image observations (see the module
    docstring), on the host-env bridge of common/host.py. `role` separates the
    seed streams of two sets of envs (training and evaluation) built from the
    same `seed`."""

    restart_mid_episode = False  # PlaNet's checkpoints fall between episodes; a cut episode is an error

    def __init__(
        self, env_id: str, num_envs: int, *, size: int, grayscale: bool, action_repeat: int, seed: int, role: int = 0
    ):
        self.domain, self.task = parse(env_id)
        self.num_envs, self.size, self.grayscale = num_envs, size, grayscale
        self.action_repeat, self.seed, self.role = action_repeat, seed, role
        self.envs = host.on_host_thread(
            lambda: [load(self.domain, self.task, host.episode_seed(seed, role, i, 0)) for i in range(num_envs)]
        )()
        action_spec = self.envs[0].action_spec()
        self.obs_dtype = np.float32
        self.spec = envs.EnvSpec(
            obs_shape=(size, size, 1 if grayscale else 3),
            discrete=False,
            num_actions=int(np.prod(action_spec.shape)),
            action_low=np.broadcast_to(action_spec.minimum, action_spec.shape).astype(np.float32).ravel(),
            action_high=np.broadcast_to(action_spec.maximum, action_spec.shape).astype(np.float32).ravel(),
            max_episode_steps=int(self.envs[0]._step_limit),  # dm_control: time limit / control timestep
        )
        super().__init__()

    # ----- host side (plain numpy, called by host.HostEnv) -------------------- #
    def render(self, index: int) -> np.ndarray:
        """Camera 0 of env `index` -> [S, S, C] float32 in [0, 1]."""
        first_render = self.envs[index].physics._contexts is None
        image = self.envs[index].physics.render(height=self.size, width=self.size, camera_id=0)
        if first_render:  # registered after dm_control's own exit hook, so it runs first (LIFO)
            atexit.register(host.on_host_thread(self.envs[index].physics.free))
        image = image.astype(np.float32) / 255.0
        if self.grayscale:  # ITU-R 601 luma, as common/pixels.py
            image = image @ np.array([0.299, 0.587, 0.114], np.float32)[:, None]
        return image

    def host_start(self, index: int, seed: int) -> np.ndarray:
        env = self.envs[index]
        env.task.random.seed(seed)
        env.reset()
        return self.render(index)

    def host_act(self, index: int, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, int]:
        """`action_repeat` physics steps (fewer if the episode ends), one render."""
        reward, steps = np.float32(0.0), 0
        for _ in range(self.action_repeat):
            time_step = self.envs[index].step(action)
            reward += time_step.reward or 0.0  # summed in float32
            steps += 1
            if time_step.last():
                break
        terminated = time_step.last() and time_step.discount == 0.0  # suite tasks only truncate (time limit)
        return self.render(index), float(reward), terminated, time_step.last() and not terminated, steps


def make(
    env_id: str, num_envs: int, *, size: int, grayscale: bool, action_repeat: int, seed: int, role: int = 0
) -> tuple[DMControlPixels, None]:
    """`(env, env_params)` like `common.pixels.make`; env_params is None."""
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    return DMControlPixels(
        env_id, num_envs, size=size, grayscale=grayscale, action_repeat=action_repeat, seed=seed, role=role
    ), None


def spec(env_id: str, size: int = 64, grayscale: bool = False) -> envs.EnvSpec:
    """The EnvSpec of a task (builds one env on the host)."""
    return DMControlPixels(env_id, 1, size=size, grayscale=grayscale, action_repeat=1, seed=0).spec
