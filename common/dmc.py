"""DeepMind Control Suite tasks with pixel observations, stepped on the host
from inside `jax.jit` (optional extra: `pip install -e '.[dmc]'`).

    env, env_params = dmc.make("dmc:cartpole-swingup", num_envs=1, size=64, action_repeat=8, seed=0)
    obs, state = env.reset(key, env_params)                                  # obs [1, 64, 64, 3]
    obs, state, reward, terminated, truncated, info = env.step(key, state, action, env_params, active)

The env has the interface of a `common.pixels.make` VecEnv (images in [0, 1],
automatic reset, `info["final_observation"]`, `episode_done`,
`episode_return`, `episode_length`), so an algorithm's jitted loop runs it
unchanged, with three differences:

- each `reset` and `step` is a `jax.experimental.io_callback` into Python,
  which steps MuJoCo and renders with MuJoCo's OpenGL renderer (headless EGL by
  default; set MUJOCO_GL to change it). Ordered callbacks cannot be vmapped, so
  one seed per process;
- the action repeat happens on the host and renders once per agent step (as
  Kaixhin/PlaNet's ControlSuiteEnv does): in software rendering a 64x64 frame
  costs about 27 ms here against 0.2 ms for a physics step. `reward` is the sum
  over the repeat, `episode_length` counts environment steps;
- `step` takes `active` [N]: envs where it is False are not stepped, and their
  outputs are placeholders the caller must discard (a jitted loop computes
  every env every step; a simulator on the host must not advance).

Seeding and resuming: the device-side state is only `(episode, t)` per env.
Episode e of env i starts from `task.random` seeded with a hash of
`(seed, i, e)`, so a run is reproducible. When a call's state is not where the
host env is (a run resumed from a checkpoint in a new process) the host env is
rebuilt at the state's episode, which must be at its start (t = 0): PlaNet's
checkpoints fall between episodes.

Task ids are "dmc:<domain>-<task>", e.g. dmc:cartpole-swingup,
dmc:cheetah-run, dmc:walker-walk (`dm_control.suite.ALL_TASKS`).
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
from concurrent.futures import Future
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.experimental import io_callback

from jaxzoo import envs

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


class HostThread:
    """One thread that runs every host call. XLA runs callbacks on threads of its
    own, a different one from call to call, but an OpenGL context stays current
    on the thread that first used it. (A daemon thread, not a ThreadPoolExecutor:
    it still serves the exit hooks that free the contexts.)"""

    def __init__(self):
        self.requests: queue.Queue = queue.Queue()
        self.thread: threading.Thread | None = None  # started by the first call
        self.start_lock = threading.Lock()

    def serve(self):
        while True:
            fn, args, result = self.requests.get()
            try:
                result.set_result(fn(*args))
            except BaseException as error:  # handed to the caller
                result.set_exception(error)

    def call(self, fn, *args):
        with self.start_lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self.serve, name="dmc-host", daemon=True)
                self.thread.start()
        result = Future()
        self.requests.put((fn, args, result))
        return result.result()


HOST_THREAD = HostThread()


def on_host_thread(fn):
    """`fn`, run on HOST_THREAD (the caller waits for it)."""
    return lambda *args: HOST_THREAD.call(fn, *args)


@struct.dataclass
class HostEnvState:
    """Where each host env is: the device only carries these counters."""

    episode: jax.Array  # [N] int32: episodes started by this env (the seed of its current one)
    t: jax.Array  # [N] int32: agent steps taken in the current episode


class DMControlPixels:
    """`num_envs` DeepMind Control tasks with image observations (see the module
    docstring). `role` separates the seed streams of two sets of envs (training
    and evaluation) built from the same `seed`."""

    def __init__(
        self, env_id: str, num_envs: int, *, size: int, grayscale: bool, action_repeat: int, seed: int, role: int = 0
    ):
        self.domain, self.task = parse(env_id)
        self.num_envs, self.size, self.grayscale = num_envs, size, grayscale
        self.action_repeat, self.seed, self.role = action_repeat, seed, role
        self.envs = on_host_thread(
            lambda: [load(self.domain, self.task, self.episode_seed(i, 0)) for i in range(num_envs)]
        )()
        self.where = [(-1, 0)] * num_envs  # (episode, t) of each host env; -1: not reset yet
        self.returns = np.zeros(num_envs)  # undiscounted return of each running episode
        action_spec = self.envs[0].action_spec()
        self.image_shape = (size, size, 1 if grayscale else 3)
        self.spec = envs.EnvSpec(
            obs_shape=self.image_shape,
            discrete=False,
            num_actions=int(np.prod(action_spec.shape)),
            action_low=np.broadcast_to(action_spec.minimum, action_spec.shape).astype(np.float32).ravel(),
            action_high=np.broadcast_to(action_spec.maximum, action_spec.shape).astype(np.float32).ravel(),
            max_episode_steps=int(self.envs[0]._step_limit),  # dm_control: time limit / control timestep
        )

    # ----- host side (plain numpy) ------------------------------------------ #
    def episode_seed(self, index: int, episode: int) -> int:
        return int(np.random.SeedSequence([self.seed, self.role, index, episode]).generate_state(1)[0])

    def render(self, index: int) -> np.ndarray:
        """Camera 0 of env `index` -> [S, S, C] float32 in [0, 1]."""
        first_render = self.envs[index].physics._contexts is None
        image = self.envs[index].physics.render(height=self.size, width=self.size, camera_id=0)
        if first_render:  # registered after dm_control's own exit hook, so it runs first (LIFO)
            atexit.register(on_host_thread(self.envs[index].physics.free))
        image = image.astype(np.float32) / 255.0
        if self.grayscale:  # ITU-R 601 luma, as common/pixels.py
            image = image @ np.array([0.299, 0.587, 0.114], np.float32)[:, None]
        return image

    def start_episode(self, index: int, episode: int) -> np.ndarray:
        env = self.envs[index]
        env.task.random.seed(self.episode_seed(index, episode))
        env.reset()
        self.where[index] = (episode, 0)
        self.returns[index] = 0.0
        return self.render(index)

    def host_reset(self):
        frames = [self.start_episode(i, 0) for i in range(self.num_envs)]
        return np.stack(frames), np.zeros(self.num_envs, np.int32), np.zeros(self.num_envs, np.int32)

    def host_step(self, episode, t, action, active):
        n = self.num_envs
        obs, final_obs = np.zeros((n, *self.image_shape), np.float32), np.zeros((n, *self.image_shape), np.float32)
        reward, terminated, truncated = np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool)
        episode_return, episode_length = np.zeros(n, np.float32), np.zeros(n, np.int32)
        episode, t = np.array(episode, np.int32), np.array(t, np.int32)
        for i in np.flatnonzero(active):
            if self.where[i] != (int(episode[i]), int(t[i])):  # a new process (resumed run): rebuild the episode
                if t[i] != 0:
                    raise RuntimeError(
                        f"host env {i} is at (episode, step) {self.where[i]} but the device state is "
                        f"at {(int(episode[i]), int(t[i]))}; it can only be restored at an episode start"
                    )
                self.start_episode(i, int(episode[i]))
            steps = 0
            for _ in range(self.action_repeat):
                time_step = self.envs[i].step(action[i])
                reward[i] += time_step.reward or 0.0
                steps += 1
                if time_step.last():
                    break
            self.returns[i] += reward[i]
            final_obs[i] = self.render(i)
            if time_step.last():
                terminated[i] = time_step.discount == 0.0  # suite tasks only truncate (time limit)
                truncated[i] = not terminated[i]
                episode_return[i] = self.returns[i]
                episode_length[i] = t[i] * self.action_repeat + steps
                episode[i], t[i] = episode[i] + 1, 0
                obs[i] = self.start_episode(i, int(episode[i]))  # automatic reset, as gymnax
            else:
                t[i] += 1
                self.where[i] = (int(episode[i]), int(t[i]))
                obs[i] = final_obs[i]
        return obs, final_obs, reward, terminated, truncated, episode_return, episode_length, episode, t

    # ----- device side (the gymnax-style interface) -------------------------- #
    def _shapes(self, *fields: tuple[tuple[int, ...], Any]):
        return tuple(jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in fields)

    def reset(self, key: jax.Array, params=None):
        n, image = self.num_envs, (self.num_envs, *self.image_shape)
        obs, episode, t = io_callback(
            on_host_thread(self.host_reset),
            self._shapes((image, jnp.float32), ((n,), jnp.int32), ((n,), jnp.int32)),
            ordered=True,
        )
        return obs, HostEnvState(episode, t)

    def step(
        self, key: jax.Array, state: HostEnvState, action: jax.Array, params=None, active: jax.Array | None = None
    ):
        n, image = self.num_envs, (self.num_envs, *self.image_shape)
        active = jnp.ones(n, bool) if active is None else active
        shapes = self._shapes(
            (image, jnp.float32),
            (image, jnp.float32),
            ((n,), jnp.float32),
            ((n,), jnp.bool_),
            ((n,), jnp.bool_),
            ((n,), jnp.float32),
            ((n,), jnp.int32),
            ((n,), jnp.int32),
            ((n,), jnp.int32),
        )
        (obs, final_obs, reward, terminated, truncated, episode_return, episode_length, episode, t) = io_callback(
            on_host_thread(self.host_step), shapes, state.episode, state.t, action, active, ordered=True
        )
        info = {
            "final_observation": final_obs,
            "episode_done": terminated | truncated,
            "episode_return": episode_return,
            "episode_length": episode_length,
        }
        return obs, HostEnvState(episode, t), reward, terminated, truncated, info


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
