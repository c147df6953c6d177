"""Environments stepped on the host, in Python, from inside `jax.jit`: the one
bridge behind `gym:<id>` (any gymnasium environment) and `dmc:<domain>-<task>`
(DeepMind Control, common/dmc.py).

    env, env_params = envs.make("gym:CartPole-v1", num_envs=4)        # env_params is None
    obs, state = env.reset(key, env_params)                          # obs [4, 4]
    obs, state, reward, terminated, truncated, info = env.step(key, state, action, env_params)

A host env has the interface of a gymnax `envs.VecEnv` (gymnax's six-value
`step`, `[num_envs]` in front of everything), so an algorithm's jitted loop
runs it unchanged:

1. **The call.** `reset` and `step` are each one ordered
   `jax.experimental.io_callback` into Python, which steps the `num_envs`
   simulators one after another on one thread (`HOST_THREAD`: an OpenGL
   context, as DeepMind Control's renderer makes, stays current on the thread
   that made it). Ordered callbacks cannot be vmapped: one seed per process.
   Each step costs a device-to-host round trip and the simulator's own Python;
   docs/gym.md measures it.
2. **Episodes, as gymnax's.** `terminated` and `truncated` are the
   simulator's (a time limit is a truncation, never a termination). An env
   whose episode ended is reset within the same step: `obs` is the new
   episode's first observation and `info["final_observation"]` the ended
   episode's last one (otherwise the same as `obs`). `info` also holds
   `episode_done`, `episode_return` and `episode_length` (totals of the
   episode that ended, meaningful where `episode_done`), as
   `envs.EpisodeStatistics`.
3. **Seeds.** Episode e of env i starts from a seed hashed from
   `(stream, role, i, e)`: `episode_seed`. A `gym:` env draws `stream` from
   the key given to `reset` (so a run is reproducible from its seed and two
   resets with two keys play different episodes, as gymnax); DeepMind
   Control's is the seed it was built with.
4. **State and resuming.** The device-side state is only `stream`, the
   episode and step counters of each env and the last observation. A call
   whose state is not where its host env is (a run resumed from a checkpoint
   in a new process) rebuilds the env at the state's episode if that episode
   is at its start; in the middle of one, a `gym:` env ends it instead
   (`truncated`, reward 0, the checkpointed observation as
   `final_observation`, the action not executed, the episode not logged) and
   starts the next, as jaxzoo.atari does; a DeepMind Control env refuses.
5. **`active`.** `step` takes an optional `active` [N]: envs where it is
   False are not stepped and their outputs are placeholders the caller
   discards (PlaNet's action repeat: a jitted loop computes every env every
   step; a simulator on the host must not advance).

`gym:` ids are any id of gymnasium's registry: `gym:CartPole-v1`,
`gym:LunarLander-v3` (box2d), `gym:ALE/Pong-v5` (ale-py), or an env of the
user's own, `gym:my_package:MyEnv-v0` (gymnasium imports `my_package`, which
registers it). Observation spaces Box (float32, or uint8 images kept as bytes)
and Discrete (one-hot); action spaces Box (clipped to its bounds on the host)
and Discrete.
"""

from __future__ import annotations

import abc
import importlib
import queue
import re
import threading
from concurrent.futures import Future
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.experimental import io_callback

from jaxzoo import envs

PREFIX = "gym:"

# gymnasium's extras by the name its DependencyNotInstalled message gives, and
# the command that installs each: this project's extra where it has one.
EXTRA_COMMANDS = {"box2d": "pip install -e '.[carracing]'"}
# gymnasium namespaces registered by a package of their own when it is imported.
NAMESPACE_PACKAGES = {"ALE": ("ale_py", "pip install -e '.[atari]'")}


# --------------------------------------------------------------------------- #
# The host thread (module docstring, 1)
# --------------------------------------------------------------------------- #
class HostThread:
    """One thread that runs every host call. XLA runs callbacks on threads of its
    own, a different one from call to call, but an OpenGL context stays current
    on the thread that first used it. (A daemon thread, not a ThreadPoolExecutor:
    it still serves the exit hooks that free the contexts.)"""

    def __init__(self) -> None:
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

    def call(self, fn, *args) -> Any:
        with self.start_lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self.serve, name="jaxzoo-host", daemon=True)
                self.thread.start()
        result: Future = Future()
        self.requests.put((fn, args, result))
        return result.result()


HOST_THREAD = HostThread()


def on_host_thread(fn):
    """`fn`, run on HOST_THREAD (the caller waits for it)."""
    return lambda *args: HOST_THREAD.call(fn, *args)


# --------------------------------------------------------------------------- #
# The bridge
# --------------------------------------------------------------------------- #
def episode_seed(stream: int, role: int, index: int, episode: int) -> int:
    """The seed of episode `episode` of env `index` (module docstring, 3)."""
    return int(np.random.SeedSequence([int(stream), role, index, episode]).generate_state(1)[0])


@struct.dataclass
class HostEnvState:
    """Where each host env is: the device carries only these (module docstring, 4)."""

    stream: jax.Array  # [N] uint32: the seed stream of the episodes (the same in every env)
    episode: jax.Array  # [N] int32: episodes started by this env (part of the seed of its current one)
    t: jax.Array  # [N] int32: agent steps taken in the current episode
    obs: jax.Array  # [N, *obs_shape]: the last observation returned


class HostEnv(abc.ABC):
    """`num_envs` simulators stepped on the host (module docstring). A subclass
    sets `num_envs`, `spec` (its `obs_shape` is the observation's), `obs_dtype`,
    `role`, `seed` (None: the stream comes from `reset`'s key) and
    `restart_mid_episode`, and defines the two host methods `host_start` and
    `host_act`."""

    num_envs: int
    spec: envs.EnvSpec
    obs_dtype: Any
    role: int = 0  # separates the seed streams of two sets of envs (training, evaluation)
    seed: int | None = None
    restart_mid_episode: bool = True  # module docstring, 4: end the episode (True) or refuse (False)

    def __init__(self) -> None:
        self.where = [(-1, -1, 0)] * self.num_envs  # (stream, episode, t) of each host env; -1: not reset yet
        self.returns = np.zeros(self.num_envs)  # undiscounted return of each running episode
        self.lengths = np.zeros(self.num_envs, np.int64)  # environment steps of each running episode

    @property
    def unwrapped(self) -> HostEnv:
        return self

    # ----- what a simulator defines ------------------------------------------ #
    @abc.abstractmethod
    def host_start(self, index: int, seed: int) -> np.ndarray:
        """Start a new episode of env `index` from `seed` -> its first observation."""

    @abc.abstractmethod
    def host_act(self, index: int, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, int]:
        """One agent step of env `index` -> (observation, reward, terminated,
        truncated, environment steps taken)."""

    # ----- host side (plain numpy) ------------------------------------------- #
    def start_episode(self, index: int, stream: int, episode: int) -> np.ndarray:
        obs = self.host_start(index, episode_seed(stream, self.role, index, episode))
        self.where[index] = (int(stream), int(episode), 0)
        self.returns[index], self.lengths[index] = 0.0, 0
        return obs

    def host_reset(self, stream):
        stream = np.asarray(stream)
        obs = np.stack([self.start_episode(i, int(stream[i]), 0) for i in range(self.num_envs)])
        return obs.astype(self.obs_dtype), np.zeros(self.num_envs, np.int32), np.zeros(self.num_envs, np.int32)

    def host_step(self, stream, episode, t, action, active):
        n, shape = self.num_envs, (self.num_envs, *self.spec.obs_shape)
        obs, final_obs = np.zeros(shape, self.obs_dtype), np.zeros(shape, self.obs_dtype)
        reward, terminated, truncated = np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool)
        restarted, episode_return, episode_length = np.zeros(n, bool), np.zeros(n, np.float32), np.zeros(n, np.int32)
        episode, t = np.array(episode, np.int32), np.array(t, np.int32)  # copies: updated below
        stream, action = np.asarray(stream), np.asarray(action)  # numpy: indexing a jax.Array costs a dispatch
        for i in np.flatnonzero(np.asarray(active)):
            here = (int(stream[i]), int(episode[i]), int(t[i]))
            if self.where[i] != here:  # a new process (a resumed run): rebuild the episode, or end it
                if t[i] != 0 and not self.restart_mid_episode:
                    raise RuntimeError(
                        f"host env {i} is at (episode, step) {self.where[i][1:]} but the device state is "
                        f"at {here[1:]}; it can only be restored at an episode start"
                    )
                if t[i] != 0:  # truncated where the checkpoint cut it; the device fills in final_observation
                    episode[i], t[i] = episode[i] + 1, 0
                    obs[i] = self.start_episode(i, here[0], int(episode[i]))
                    truncated[i] = restarted[i] = True
                    continue
                self.start_episode(i, here[0], int(episode[i]))
            final_obs[i], reward[i], terminated[i], truncated[i], steps = self.host_act(i, action[i])
            self.returns[i] += reward[i]
            self.lengths[i] += steps
            if terminated[i] or truncated[i]:
                episode_return[i], episode_length[i] = self.returns[i], self.lengths[i]
                episode[i], t[i] = episode[i] + 1, 0
                obs[i] = self.start_episode(i, here[0], int(episode[i]))  # automatic reset, as gymnax
            else:
                t[i] += 1
                self.where[i] = (here[0], int(episode[i]), int(t[i]))
                obs[i] = final_obs[i]
        return obs, final_obs, reward, terminated, truncated, restarted, episode_return, episode_length, episode, t

    # ----- device side (the gymnax-style interface) --------------------------- #
    def _shapes(self, *fields: tuple[tuple[int, ...], Any]):
        return tuple(jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in fields)

    def reset(self, key: jax.Array, params=None) -> tuple[jax.Array, HostEnvState]:
        n, obs_shape = self.num_envs, (self.num_envs, *self.spec.obs_shape)
        if self.seed is None:
            stream = jnp.full(n, jax.random.bits(key, (), jnp.uint32))
        else:
            stream = jnp.full(n, self.seed, jnp.uint32)
        obs, episode, t = io_callback(
            on_host_thread(self.host_reset),
            self._shapes((obs_shape, self.obs_dtype), ((n,), jnp.int32), ((n,), jnp.int32)),
            stream,
            ordered=True,
        )
        return obs, HostEnvState(stream, episode, t, obs)

    def step(
        self, key: jax.Array, state: HostEnvState, action: jax.Array, params=None, active: jax.Array | None = None
    ):
        n, obs_shape = self.num_envs, (self.num_envs, *self.spec.obs_shape)
        active = jnp.ones(n, bool) if active is None else active
        shapes = self._shapes(
            (obs_shape, self.obs_dtype),
            (obs_shape, self.obs_dtype),
            ((n,), jnp.float32),
            ((n,), jnp.bool_),
            ((n,), jnp.bool_),
            ((n,), jnp.bool_),
            ((n,), jnp.float32),
            ((n,), jnp.int32),
            ((n,), jnp.int32),
            ((n,), jnp.int32),
        )
        (obs, final_obs, reward, terminated, truncated, restarted, episode_return, episode_length, episode, t) = (
            io_callback(
                on_host_thread(self.host_step),
                shapes,
                state.stream,
                state.episode,
                state.t,
                action,
                active,
                ordered=True,
            )
        )
        per_env = lambda mask: mask.reshape((n,) + (1,) * len(self.spec.obs_shape))
        final_obs = jnp.where(per_env(restarted), state.obs, final_obs)  # module docstring, 4
        info = {
            "final_observation": final_obs,
            "episode_done": (terminated | truncated) & ~restarted,
            "episode_return": episode_return,
            "episode_length": episode_length,
        }
        kept_obs = jnp.where(per_env(active), obs, state.obs)
        return obs, HostEnvState(state.stream, episode, t, kept_obs), reward, terminated, truncated, info


# --------------------------------------------------------------------------- #
# gymnasium: gym:<id>
# --------------------------------------------------------------------------- #
def is_gym(env_id: str) -> bool:
    return env_id.startswith(PREFIX)


def check_args(args: Any) -> None:
    """Refuse what an algorithm's Args cannot do with a gym: id, before anything
    is built (the id itself is checked when the env is built): several seeds
    (the ordered io_callback cannot be vmapped) and --parallel data."""
    if args.num_seeds != 1:
        raise ValueError(
            f"env_id {args.env_id!r}: num_seeds must be 1, got {args.num_seeds}: a gym: env is stepped on "
            "the host by an ordered io_callback, which cannot be vmapped over seeds (run each seed as its "
            "own process with --seed)"
        )
    if args.parallel == "data":
        raise ValueError(f"env_id {args.env_id!r}: --parallel data is not supported: the envs live on the host")


def parse(env_id: str) -> str:
    """'gym:CartPole-v1' -> 'CartPole-v1' once it is in gymnasium's registry
    (importing the package of a namespace or of a 'module:Id' first), with a
    clear error naming the install command or close ids otherwise."""
    import gymnasium

    if not is_gym(env_id) or len(env_id) == len(PREFIX):
        raise ValueError(f"env_id {env_id!r} is not a gymnasium id: expected '{PREFIX}<id>', e.g. 'gym:CartPole-v1'")
    name = env_id[len(PREFIX) :]
    module, _, registered = name.rpartition(":")
    if module:  # gymnasium's 'module:Id': the module registers the env when imported
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ValueError(
                f"env_id {env_id!r}: cannot import {module!r}, which should register {registered!r} ({error})"
            ) from error
    namespace = registered.split("/")[0] if "/" in registered else None
    if namespace in NAMESPACE_PACKAGES and registered not in gymnasium.registry:
        package, command = NAMESPACE_PACKAGES[namespace]
        try:
            gymnasium.register_envs(importlib.import_module(package))
        except ImportError as error:
            raise ValueError(
                f"env_id {env_id!r} needs {package}, which is not installed ({error}); install it: {command}"
            ) from error
    if registered not in gymnasium.registry:
        known = [PREFIX + known_id for known_id in gymnasium.registry]
        raise ValueError(
            f"unknown gymnasium id {env_id!r}{envs.did_you_mean(env_id, known)}; registered ids: {', '.join(known)}"
        )
    return name


def make_gymnasium(env_id: str, **kwargs):
    """`gymnasium.make` of a `gym:` id, a missing dependency turned into the
    command that installs it."""
    import gymnasium

    name = parse(env_id)
    try:
        return gymnasium.make(name, **kwargs)
    except (gymnasium.error.DependencyNotInstalled, ImportError) as error:
        extra = re.search(r"gymnasium\[(\w+)\]", str(error))
        if extra is None:
            command = "see the error above"
        else:
            command = EXTRA_COMMANDS.get(extra.group(1), f'pip install "gymnasium[{extra.group(1)}]"')
        raise ValueError(
            f"env_id {env_id!r} needs a package that is not installed ({error}); install it: {command}"
        ) from error


class GymnasiumEnv(HostEnv):
    """`num_envs` gymnasium envs of one id (see the module docstring).
    `flatten_obs` flattens Box observations to one float32 vector;
    `max_episode_steps` replaces the id's time limit; `kwargs` go to
    `gymnasium.make`."""

    def __init__(
        self, env_id: str, num_envs: int, *, flatten_obs: bool = False, max_episode_steps: int | None = None, **kwargs
    ):
        from gymnasium import spaces

        self.env_id, self.num_envs, self.flatten_obs = env_id, num_envs, flatten_obs
        time_limit = {"max_episode_steps": max_episode_steps} if max_episode_steps else {}
        self.envs = on_host_thread(lambda: [make_gymnasium(env_id, **time_limit, **kwargs) for _ in range(num_envs)])()
        observation_space, action_space = self.envs[0].observation_space, self.envs[0].action_space
        spec = self.envs[0].spec
        limit = spec.max_episode_steps if spec is not None else None
        if not limit and spec is not None and isinstance(spec.kwargs.get("frameskip"), int):
            # ALE's v5 ids end an episode themselves (truncated=True) after
            # max_num_frames_per_episode frames (108,000 = 30 minutes): steps = frames / frameskip.
            frames = spec.kwargs.get("max_num_frames_per_episode")
            limit = -(-frames // spec.kwargs["frameskip"]) if frames else None
        if not limit:
            raise ValueError(
                f"env_id {env_id!r} has no time limit (its spec's max_episode_steps is None); "
                "pass max_episode_steps (--max-episode-steps), which the evaluation needs"
            )
        accepted = "accepted: Box, Discrete"
        if isinstance(observation_space, spaces.Box):
            keep_bytes = observation_space.dtype == np.uint8 and not flatten_obs
            self.obs_dtype = np.uint8 if keep_bytes else np.float32
            obs_shape = (int(np.prod(observation_space.shape)),) if flatten_obs else observation_space.shape
            self.to_obs = lambda obs: np.asarray(obs, self.obs_dtype).reshape(obs_shape)
        elif isinstance(observation_space, spaces.Discrete):  # one-hot, a vector a network reads
            self.obs_dtype, obs_shape = np.float32, (int(observation_space.n),)
            one_hot, first_obs = np.eye(int(observation_space.n), dtype=np.float32), int(observation_space.start)
            self.to_obs = lambda obs: one_hot[int(obs) - first_obs]
        else:
            raise ValueError(
                f"env_id {env_id!r} has the observation space {observation_space}, of type "
                f"{type(observation_space).__name__}, which the host bridge does not map; {accepted}"
            )
        if isinstance(action_space, spaces.Discrete):
            first_action = int(action_space.start)
            self.to_action = lambda action: int(action) + first_action
            discrete, num_actions, low, high = True, int(action_space.n), None, None
        elif isinstance(action_space, spaces.Box):
            shape, dtype = action_space.shape, action_space.dtype
            self.to_action = lambda action: np.clip(action.reshape(shape), action_space.low, action_space.high).astype(
                dtype
            )
            discrete, num_actions = False, int(np.prod(shape))
            low = np.asarray(action_space.low, np.float32).ravel()
            high = np.asarray(action_space.high, np.float32).ravel()
        else:
            raise ValueError(
                f"env_id {env_id!r} has the action space {action_space}, of type "
                f"{type(action_space).__name__}, which the host bridge does not map; {accepted}"
            )
        self.spec = envs.EnvSpec(tuple(int(d) for d in obs_shape), discrete, num_actions, low, high, int(limit))
        super().__init__()

    def host_start(self, index: int, seed: int) -> np.ndarray:
        obs, _ = self.envs[index].reset(seed=seed)
        return self.to_obs(obs)

    def host_act(self, index: int, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, int]:
        obs, reward, terminated, truncated, _ = self.envs[index].step(self.to_action(action))
        return self.to_obs(obs), float(reward), bool(terminated), bool(truncated), 1


def make(env_id: str, num_envs: int, **kwargs) -> tuple[GymnasiumEnv, None]:
    """`(env, env_params)` of a `gym:` id, like `envs.make`; env_params is None.
    (`envs.make` calls this and adds the normalisers.)"""
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    return GymnasiumEnv(env_id, num_envs, **kwargs), None


def spec(env_id: str, **kwargs) -> envs.EnvSpec:
    """The EnvSpec of a `gym:` id (builds one env on the host)."""
    return GymnasiumEnv(env_id, 1, **kwargs).spec
