"""Environments: `make(env_id)` for the gymnax ids, with the standard wrappers,
and for any gymnasium id as 'gym:<id>' (stepped on the host, common/host.py).

Every wrapper keeps the gymnax >= 1.0 step signature

    obs, state, reward, terminated, truncated, info = env.step(key, state, action, params)

where `info["final_observation"]` is the observation the step reached before
the automatic reset. Algorithms bootstrap truncated steps from it; only
`terminated` ends the value.

Wrapper order built by `make` (inner to outer):

    gymnax env -> ClipAction (Box actions) -> EpisodeStatistics -> FlattenObservation
               -> VecEnv(num_envs) -> NormalizeObservation -> NormalizeReward

Episode statistics sit inside the normalisers, so logged returns are the raw
environment returns. The two normalisers act on the whole batch of envs (one
running mean and variance shared by all of them), as in Stable-Baselines'
VecNormalize and PureJaxRL.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import importlib
import sys
import types
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

# MNISTBandit downloads MNIST when it is built; nothing here may download at run time.
_DOWNLOADS_DATA = ("MNISTBandit-bsuite",)
# gymnax is imported on first use, not with this module: importing it creates
# arrays, which starts JAX's backend, and a --distributed run must call
# jax.distributed.initialize before that (jaxzoo.parallel).
ENV_IDS: tuple[str, ...]  # every gymnax id that builds without a download (module __getattr__)


class _DeferredModule(types.ModuleType):
    """Stands in for a module while gymnax is imported; the first attribute
    read imports the real module and answers from it."""

    def __getattr__(self, attribute: str):
        # `import matplotlib.pyplot as plt` reads `pyplot` off the parent package:
        # while both stand in, answer with the child's stand-in, importing nothing.
        child = sys.modules.get(f"{self.__name__}.{attribute}")
        if isinstance(child, _DeferredModule):
            return child
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), attribute)


@contextlib.contextmanager
def _deferred(*names: str):
    """`names` import on first use inside this block (those not yet imported)."""
    stand_ins = {name: _DeferredModule(name) for name in names if name not in sys.modules}
    for name, stand_in in stand_ins.items():
        if any(other.startswith(f"{name}.") for other in stand_ins):
            # A package: `from matplotlib import colors` asks for __path__ before the child.
            stand_in.__path__ = []
    sys.modules.update(stand_ins)
    try:
        yield
    finally:
        for name, stand_in in stand_ins.items():
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]


@functools.cache
def import_gymnax() -> types.ModuleType:
    """gymnax, imported here and only here (ENV_IDS says why not at module level).

    gymnax 1.0.1's environment modules (bsuite/catch.py, misc/pong.py, rooms,
    point_robot, meta_maze) import matplotlib.pyplot and seaborn (with scipy and
    pandas behind it) at module level, for their `render` methods alone. That
    was 1.14 s of gymnax's 1.47 s import on the 2-core Xeon, idle: about a tenth
    of a whole `ppo.py --preset cartpole` process, paid by every run. Imported
    with those two deferred, gymnax takes 0.33 s; its modules keep a stand-in
    that imports the real library when a render method first touches it.
    matplotlib itself (the parent package of pyplot, and `colors`, which pong.py
    imports by name) waits too: about 0.12 s more on a slow 2-core AMD EPYC
    (docs/performance.md, "A second of every start").
    """
    with _deferred("matplotlib", "matplotlib.pyplot", "matplotlib.colors", "seaborn"):
        import gymnax
    return gymnax


@functools.cache
def env_ids() -> tuple[str, ...]:
    gymnax = import_gymnax()
    return tuple(e for e in gymnax.registered_envs if e not in _DOWNLOADS_DATA)


def __getattr__(name: str):
    if name == "ENV_IDS":
        return env_ids()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _spaces():
    """gymnax's spaces module (imported on first use, see ENV_IDS)."""
    import_gymnax()
    from gymnax.environments import spaces

    return spaces


def did_you_mean(value: str, choices) -> str:
    """' (did you mean 'A' or 'B'?)' with the choices closest to `value`
    (case-insensitive), or '' if none is close."""
    by_lower = {c.lower(): c for c in choices}
    close = [by_lower[c] for c in difflib.get_close_matches(value.lower(), list(by_lower), n=3, cutoff=0.6)]
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


class EnvSpec(NamedTuple):
    """What an algorithm needs to know about an environment to build its networks."""

    obs_shape: tuple[int, ...]
    discrete: bool
    num_actions: int  # discrete: number of actions; continuous: action dimension
    action_low: np.ndarray | None  # continuous only, [A]
    action_high: np.ndarray | None
    max_episode_steps: int


class Wrapper:
    """Forwards every attribute it does not define to the wrapped env."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        return getattr(self._env, name)

    @property
    def unwrapped(self):
        return getattr(self._env, "unwrapped", self._env)


class ClipAction(Wrapper):
    """Clips continuous actions to the Box bounds before the env sees them, so a
    Gaussian policy may sample outside them (its log-prob stays that of the
    unclipped sample)."""

    @partial(jax.jit, static_argnames=("self",))
    def step(self, key, state, action, params=None):
        space = self._env.action_space(params)
        action = jnp.clip(action, space.low, space.high)
        return self._env.step(key, state, action, params)


@struct.dataclass
class EpisodeStatisticsState:
    env_state: Any
    episode_return: jax.Array  # [] undiscounted return of the running episode
    episode_length: jax.Array  # [] steps of the running episode


class EpisodeStatistics(Wrapper):
    """Adds to `info`, at every step:

    - `episode_done`: the step ended an episode (terminated or truncated),
    - `episode_return`, `episode_length`: that episode's totals, meaningful only
      where `episode_done` (use `episode_metrics` for masked means).
    """

    @partial(jax.jit, static_argnames=("self",))
    def reset(self, key, params=None):
        obs, env_state = self._env.reset(key, params)
        return obs, EpisodeStatisticsState(env_state, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))

    @partial(jax.jit, static_argnames=("self",))
    def step(self, key, state, action, params=None):
        obs, env_state, reward, terminated, truncated, info = self._env.step(key, state.env_state, action, params)
        done = jnp.logical_or(terminated, truncated)
        episode_return = state.episode_return + reward
        episode_length = state.episode_length + 1
        info = {
            **info,
            "episode_done": done,
            "episode_return": episode_return,
            "episode_length": episode_length,
        }
        state = EpisodeStatisticsState(
            env_state,
            jnp.where(done, 0.0, episode_return),
            jnp.where(done, 0, episode_length),
        )
        return obs, state, reward, terminated, truncated, info


class FlattenObservation(Wrapper):
    """Flattens observations (and `final_observation`) to one float32 vector."""

    def observation_space(self, params):
        space = self._env.observation_space(params)
        return _spaces().Box(-jnp.inf, jnp.inf, (int(np.prod(space.shape)),), jnp.float32)

    @partial(jax.jit, static_argnames=("self",))
    def reset(self, key, params=None):
        obs, state = self._env.reset(key, params)
        return jnp.reshape(obs, (-1,)).astype(jnp.float32), state

    @partial(jax.jit, static_argnames=("self",))
    def step(self, key, state, action, params=None):
        obs, state, reward, terminated, truncated, info = self._env.step(key, state, action, params)
        flat = lambda x: jnp.reshape(x, (-1,)).astype(jnp.float32)
        info = {**info, "final_observation": flat(info["final_observation"])}
        return flat(obs), state, reward, terminated, truncated, info


class VecEnv(Wrapper):
    """`num_envs` copies of an env, vmapped. Keys are split per env; observations,
    rewards and flags gain a leading `[num_envs]` axis."""

    def __init__(self, env, num_envs: int):
        super().__init__(env)
        self.num_envs = num_envs

    @partial(jax.jit, static_argnames=("self",))
    def reset(self, key, params=None):
        keys = jax.random.split(key, self.num_envs)
        return jax.vmap(self._env.reset, in_axes=(0, None))(keys, params)

    @partial(jax.jit, static_argnames=("self",))
    def step(self, key, state, action, params=None):
        keys = jax.random.split(key, self.num_envs)
        return jax.vmap(self._env.step, in_axes=(0, 0, 0, None))(keys, state, action, params)


@struct.dataclass
class RunningMeanStd:
    """Running mean and variance (Chan et al. parallel update) over a batch axis."""

    mean: jax.Array
    var: jax.Array
    count: jax.Array

    @classmethod
    def zeros(cls, shape):
        return cls(jnp.zeros(shape, jnp.float32), jnp.ones(shape, jnp.float32), jnp.asarray(1e-4, jnp.float32))

    def update(self, batch: jax.Array) -> RunningMeanStd:
        batch_mean, batch_var = batch.mean(0), batch.var(0)
        batch_count = batch.shape[0]
        delta = batch_mean - self.mean
        total = self.count + batch_count
        mean = self.mean + delta * batch_count / total
        m2 = self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total
        return RunningMeanStd(mean, m2 / total, total)


@struct.dataclass
class NormalizeObservationState:
    env_state: Any
    obs_stats: RunningMeanStd


def normalize(obs: jax.Array, stats: RunningMeanStd, clip: float = 10.0) -> jax.Array:
    """(obs - mean) / sqrt(var + 1e-8), clipped to +-clip."""
    return jnp.clip((obs - stats.mean) / jnp.sqrt(stats.var + 1e-8), -clip, clip)


class NormalizeObservation(Wrapper):
    """Normalises observations with running statistics updated from every batch.
    `final_observation` is normalised with the same statistics as `obs`. An
    evaluation env reuses the training statistics: read them with
    `find_state(train_state, NormalizeObservationState).obs_stats` and apply
    `normalize`."""

    @partial(jax.jit, static_argnames=("self",))
    def reset(self, key, params=None):
        obs, env_state = self._env.reset(key, params)
        stats = RunningMeanStd.zeros(obs.shape[1:]).update(obs)
        return normalize(obs, stats), NormalizeObservationState(env_state, stats)

    @partial(jax.jit, static_argnames=("self",))
    def step(self, key, state, action, params=None):
        obs, env_state, reward, terminated, truncated, info = self._env.step(key, state.env_state, action, params)
        stats = state.obs_stats.update(obs)
        info = {**info, "final_observation": normalize(info["final_observation"], stats)}
        return normalize(obs, stats), NormalizeObservationState(env_state, stats), reward, terminated, truncated, info


@struct.dataclass
class NormalizeRewardState:
    env_state: Any
    discounted_return: jax.Array  # [num_envs] running discounted return per env
    return_stats: RunningMeanStd


class NormalizeReward(Wrapper):
    """Scales rewards by 1 / std of the discounted return (Engstrom et al. 2020,
    "Implementation Matters", section 3), clipped to +-10. The running return is
    reset at every episode end."""

    def __init__(self, env, gamma: float, clip: float = 10.0):
        super().__init__(env)
        self.gamma = gamma
        self.clip = clip

    @partial(jax.jit, static_argnames=("self",))
    def reset(self, key, params=None):
        obs, env_state = self._env.reset(key, params)
        num_envs = obs.shape[0]
        return obs, NormalizeRewardState(env_state, jnp.zeros(num_envs), RunningMeanStd.zeros(()))

    @partial(jax.jit, static_argnames=("self",))
    def step(self, key, state, action, params=None):
        obs, env_state, reward, terminated, truncated, info = self._env.step(key, state.env_state, action, params)
        discounted_return = state.discounted_return * self.gamma + reward
        stats = state.return_stats.update(discounted_return)
        done = jnp.logical_or(terminated, truncated)
        scaled = jnp.clip(reward / jnp.sqrt(stats.var + 1e-8), -self.clip, self.clip)
        new_state = NormalizeRewardState(env_state, jnp.where(done, 0.0, discounted_return), stats)
        return obs, new_state, scaled, terminated, truncated, info


def make(
    env_id: str,
    num_envs: int | None = None,
    *,
    flatten_obs: bool = False,
    normalize_obs: bool = False,
    normalize_reward: bool = False,
    gamma: float = 0.99,
    max_episode_steps: int | None = None,
    **env_kwargs,
):
    """Build a gymnax env with the standard wrappers; returns `(env, env_params)`.

    env_id: a gymnax id (`ENV_IDS`), or any gymnasium id as 'gym:<id>', which
        runs on the host from inside jit (common/host.py; env_params is None).
    num_envs: vmapped copies (`None`: one env without a batch axis; the
        normalisers need a batch and so need `num_envs`, and so do gym: ids).
    max_episode_steps: override the env's time limit (e.g. 200 for CartPole-v0);
        reaching it is a truncation, never a termination.
    """
    from jaxzoo import host  # on first use: host imports this module

    if not host.is_gym(env_id) and env_id not in env_ids():
        hint = " (it downloads a dataset when built)" if env_id in _DOWNLOADS_DATA else did_you_mean(env_id, env_ids())
        raise ValueError(
            f"unknown env_id {env_id!r}{hint}{gymnasium_hint(env_id)}; valid ids: {', '.join(env_ids())}, "
            f"or any gymnasium id as '{host.PREFIX}<id>' (stepped on the host)"
        )
    if (normalize_obs or normalize_reward) and num_envs is None:
        raise ValueError("observation/reward normalisation works on a batch: pass num_envs")
    if num_envs is not None and num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if host.is_gym(env_id):
        if num_envs is None:
            raise ValueError(f"{env_id} is stepped on the host, in batches: pass num_envs")
        env, env_params = host.make(
            env_id, num_envs, flatten_obs=flatten_obs, max_episode_steps=max_episode_steps, **env_kwargs
        )
        return normalized(env, normalize_obs, normalize_reward, gamma), env_params
    env, env_params = import_gymnax().make(env_id, **env_kwargs)
    if max_episode_steps is not None:
        # Of the env's own type: BernoulliBandit's limit is a float, and its
        # observation space selects between the limit and other floats.
        own_type = type(env_params.max_steps_in_episode)
        env_params = env_params.replace(max_steps_in_episode=own_type(max_episode_steps))
    if isinstance(env.action_space(env_params), _spaces().Box):
        env = ClipAction(env)
    env = EpisodeStatistics(env)
    if flatten_obs:
        env = FlattenObservation(env)
    if num_envs is not None:
        env = VecEnv(env, num_envs)
    return normalized(env, normalize_obs, normalize_reward, gamma), env_params


def normalized(env, normalize_obs: bool, normalize_reward: bool, gamma: float):
    """`env` (batched) under the normalisers `make` was asked for."""
    if normalize_obs:
        env = NormalizeObservation(env)
    if normalize_reward:
        env = NormalizeReward(env, gamma)
    return env


def gymnasium_hint(env_id: str) -> str:
    """' (a gymnasium id: ...)' when `env_id` is in gymnasium's registry, else ''."""
    import gymnasium

    return f" (gymnasium's, stepped on the host: 'gym:{env_id}')" if env_id in gymnasium.registry else ""


def spec(env, env_params) -> EnvSpec:
    """Observation shape and action space of a (possibly wrapped) env."""
    from jaxzoo import host

    if isinstance(env.unwrapped, host.HostEnv):
        return env.unwrapped.spec
    obs_space = env.observation_space(env_params)
    action_space = env.action_space(env_params)
    discrete = isinstance(action_space, _spaces().Discrete)
    if discrete:
        num_actions, low, high = int(action_space.n), None, None
    else:
        num_actions = int(np.prod(action_space.shape))
        low = np.broadcast_to(np.asarray(action_space.low, np.float32), (num_actions,))
        high = np.broadcast_to(np.asarray(action_space.high, np.float32), (num_actions,))
    return EnvSpec(
        obs_shape=tuple(int(d) for d in obs_space.shape),
        discrete=discrete,
        num_actions=num_actions,
        action_low=low,
        action_high=high,
        max_episode_steps=int(env_params.max_steps_in_episode),
    )


def episode_metrics(info: dict) -> dict[str, jax.Array]:
    """Masked means over the episodes that finished in a batch of steps.

    `info` leaves have any shape (e.g. `[T, N]`). Returns `episode_return` and
    `episode_length` averaged over finished episodes only (NaN when none
    finished: an honest gap, not a stale value) and `episodes_finished`.
    """
    done = info["episode_done"]
    count = done.sum()
    mean = lambda x: jnp.where(count > 0, jnp.sum(jnp.where(done, x, 0.0)) / jnp.maximum(count, 1), jnp.nan)
    return {
        "episode_return": mean(info["episode_return"]),
        "episode_length": mean(info["episode_length"].astype(jnp.float32)),
        "episodes_finished": count.astype(jnp.float32),
    }


def find_state(state, state_type):
    """The first wrapper state of `state_type` found by following `.env_state`."""
    while not isinstance(state, state_type):
        if not hasattr(state, "env_state"):
            raise ValueError(f"no {state_type.__name__} in this env state")
        state = state.env_state
    return state


def evaluate_episodes(env, env_params, act, key: jax.Array, max_steps: int):
    """Play one episode in each env of a VecEnv and return their undiscounted
    returns [num_envs]. `act(obs [num_envs, ...]) -> actions` is the (greedy)
    policy; the loop (`lax.while_loop`) stops once every env has finished an
    episode or after `max_steps` steps. Jittable and vmappable. With `env` a
    `RecordEpisode`, returns `(returns, Recording)` (`with_recording`)."""
    reset_key, key = jax.random.split(key)
    obs, env_state = env.reset(reset_key, env_params)
    num = obs.shape[0]

    def body(carry):
        obs, env_state, key, finished, returns, t = carry
        key, step_key = jax.random.split(key)
        obs, env_state, _, _, _, info = env.step(step_key, env_state, act(obs), env_params)
        newly = info["episode_done"] & ~finished
        returns = jnp.where(newly, info["episode_return"], returns)
        return obs, env_state, key, finished | newly, returns, t + 1

    def keep_going(carry):
        return ~jnp.all(carry[3]) & (carry[5] < max_steps)

    carry = (obs, env_state, key, jnp.zeros(num, bool), jnp.zeros(num), 0)
    final = jax.lax.while_loop(keep_going, body, carry)
    return with_recording(final[4], env, final[1])


# --------------------------------------------------------------------------- #
# Recording an evaluation episode for a video (jaxzoo.video renders it)
# --------------------------------------------------------------------------- #
class Recording(NamedTuple):
    """What a video of one episode is rendered from, recorded inside the jitted
    evaluation: `frames` leaves [max_frames, ...] hold, for step t < `length`,
    either the gymnax env state (rendered on the host by jaxzoo.video) or, for
    an env stepped on the host, its image observation [H, W, C]; `length` []
    is the episode's number of steps (= frames)."""

    frames: Any
    length: jax.Array


@struct.dataclass
class RecordEpisodeState:
    env_state: Any
    frames: Any  # leaves [max_frames, ...]: env 0's first episode, one entry per step taken
    length: jax.Array  # [] int32: entries recorded so far
    recording: jax.Array  # [] bool: env 0's first episode has not ended yet


def innermost_state(state):
    """The env state at the bottom of a wrapper chain (following `.env_state`)."""
    while hasattr(state, "env_state"):
        state = state.env_state
    return state


class RecordEpisode(Wrapper):
    """Records the first episode of env 0 of a batched env (a VecEnv, a pixel
    or host env with a `[num_envs]` axis) for a video, without changing what
    the env does: the state it starts each step from (the gymnax env state, a
    few scalars; or, for a host-stepped env, the observation image), until
    that episode ends. Outermost wrapper; the evaluation loop hands its final
    state to `with_recording`. Costs nothing when not used: files wrap their
    evaluation env only with `--capture-video`."""

    def __init__(self, env, max_frames: int):
        super().__init__(env)
        self.max_frames = max_frames

    def source(self, env_state, obs):
        """One step's entry: env 0's gymnax state, or its observation [H, W, C]
        (of a stack of grayscale frames, as Atari's, only the newest: [H, W, 1]),
        or env 0's observation vector [D] (a `gym:` id with vector observations)."""
        import_gymnax()
        from gymnax.environments.environment import Environment  # on first use (ENV_IDS says why)

        if isinstance(self.unwrapped, Environment):
            return jax.tree.map(lambda x: x[0], innermost_state(env_state))
        if obs.ndim == 2:  # [num_envs, D]: a host env's vectors (gym:CartPole-v1), drawn by jaxzoo.video
            return obs[0]
        return obs[0] if obs.shape[-1] in (1, 3) else obs[0][..., -1:]

    @partial(jax.jit, static_argnames=("self",))
    def reset(self, key, params=None):
        obs, env_state = self._env.reset(key, params)
        first = self.source(env_state, obs)
        frames = jax.tree.map(lambda x: jnp.zeros((self.max_frames, *x.shape), x.dtype).at[0].set(x), first)
        return obs, RecordEpisodeState(env_state, frames, jnp.int32(1), jnp.bool_(True))

    @partial(jax.jit, static_argnames=("self",))
    def step(self, key, state, action, params=None, **kwargs):
        obs, env_state, reward, terminated, truncated, info = self._env.step(
            key, state.env_state, action, params, **kwargs
        )
        # After env 0's last step the state is the next episode's reset state: not recorded. The
        # episode is the one the evaluation scores (`episode_done`: an Atari game, not one of its lives).
        recording = state.recording & ~info.get("episode_done", terminated | truncated)[0]
        keep = recording & (state.length < self.max_frames)
        entry = self.source(env_state, obs)
        index = jnp.minimum(state.length, self.max_frames - 1)
        # One row written in place (a no-op write of the old row when not keeping).
        frames = jax.tree.map(
            lambda buffer, x: buffer.at[index].set(jnp.where(keep, x, buffer[index])), state.frames, entry
        )
        length = state.length + keep.astype(jnp.int32)
        return obs, RecordEpisodeState(env_state, frames, length, recording), reward, terminated, truncated, info


def push_frame(frames: jax.Array, frame: jax.Array) -> jax.Array:
    """A frame stack [..., c * k] (oldest first on the channel axis) without its
    oldest frame and with `frame` [..., c] appended: DQN's stack, as Atari's
    (common/atari.py) and the pixel envs' (common/pixels.py) build it."""
    return jnp.concatenate([frames[..., frame.shape[-1] :], frame], axis=-1)


def where_envs(mask: jax.Array, new_state, old_state):
    """Per env, `new_state` where `mask` [N] else `old_state` (an env frozen
    after its episode ended, as PlaNet's action repeat does). A RecordEpisode
    state follows env 0: frozen with it, its count of frames does not advance
    (a frame written past that count is overwritten later, never shown)."""
    if isinstance(new_state, RecordEpisodeState):
        keep = lambda new, old: jnp.where(mask[0], new, old)
        return RecordEpisodeState(
            where_envs(mask, new_state.env_state, old_state.env_state),
            new_state.frames,
            keep(new_state.length, old_state.length),
            keep(new_state.recording, old_state.recording),
        )
    select = lambda new, old: jnp.where(mask.reshape(mask.shape + (1,) * (new.ndim - 1)), new, old)
    return jax.tree.map(select, new_state, old_state)


def with_recording(returns: jax.Array, env, final_env_state):
    """`returns` [num_envs] of an evaluation loop, or `(returns, Recording)`
    when its env is a `RecordEpisode` (the loop's final env state holds it)."""
    if not isinstance(env, RecordEpisode):
        return returns
    return returns, Recording(final_env_state.frames, final_env_state.length)
