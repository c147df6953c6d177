"""Atari 2600 games from pixels through envpool, stepped inside `jax.jit`
(optional extra: `pip install -e ".[atari]"`).

    env, env_params = atari.make("envpool:Breakout-v5", num_envs=8, seed=0)
    obs, state = env.reset(key, env_params)                 # obs [8, 84, 84, 4] uint8
    obs, state, reward, terminated, truncated, info = env.step(key, state, action, env_params)

Ids are "envpool:<Game>-v5" for any of envpool's Atari games (`game_ids()`).
The env has the project's interface (gymnax's six-value `step`, automatic
reset on the same step, `info["final_observation"]`, `episode_done`,
`episode_return`, `episode_length`), so an algorithm's jitted loop runs it
unchanged. What is different, and why:

1. **Preprocessing** is DeepMind's (Mnih et al. 2015; Machado et al. 2018 for
   the names), done by envpool in C++, each choice an argument of `make`:
   `frame_skip` 4 (envpool max-pools the last two frames of each skip),
   `frame_stack` 4, `image_size` 84 and `grayscale` (area-interpolated
   resize), `noop_max` 30 (1 to 30 no-op frames at every reset, 1 being the
   least envpool allows), `episodic_life`, `fire_reset` (FIRE after a reset
   in games that need it), `reward_clip` (the sign of the reward). No sticky
   actions (repeat probability 0) and the minimal action set, as envpool's
   "-v5" defaults.
2. **Observations** are `[N, H, W, C]` uint8, channels last (envpool's
   `[N, C, H, W]` transposed, the C = frame_stack grayscale frames oldest
   first), the layout of every image env in this project; networks scale them
   by 1/255 themselves, so rollouts store bytes, not floats.
3. **Stepping inside jit.** envpool's XLA interface: `send` and `recv` are XLA
   custom calls on a handle, a [8] uint8 array threaded through the state so
   the calls keep their order (its bytes are not read: the pool is named in
   the call itself). The pool runs with `batch_size=1`: a step sends each env
   its action, then receives the N results one at a time and puts each at its
   `env_id`. (A batch of N would force every call to carry all N envs; see 4.)
4. **Same-step autoreset.** envpool resets an env on the call *after* the one
   that reported it done, ignoring that call's action. Here, after the N
   results of a step are in, every env that reported done is sent once more
   (action 0, ignored) and its reset is received within the same `step`. So
   `obs` is the new episode's first observation and
   `info["final_observation"]` the ended episode's last one, as gymnax does;
   the reset never appears as a transition, and no algorithm needs a mask.
5. **Episodes: life versus game.** With `episodic_life`, `terminated` is True
   at every life loss (what the learner sees, as in DQN), and the game goes
   on from there (envpool's reset after a lost life does the no-ops and FIRE
   again, without resetting the game). `info["episode_done"]`,
   `info["episode_return"]` and `info["episode_length"]` are about the whole
   *game*: its unclipped score summed over all lives (envpool's
   `info["reward"]`, never the clipped reward), its agent steps, and its end
   (ALE's game over, or the time limit). The time limit is
   `max_episode_steps` agent steps (27,000 = 108k frames at frame skip 4),
   reported as `truncated`.
6. **Seeds and resuming.** Env i of a pool made with seed s is envpool's
   seed s' + i, where s' = s for the training pool (`role` 0) and a hash of
   (s, role) for others (the evaluation pool), so a run is reproducible. The
   device-side state cannot hold the emulators, so a checkpoint cannot either.
   Each pool draws a random `token` that its `reset` writes into the state;
   a `step` whose state carries another token (a run resumed in a new
   process) resets every env instead of stepping: that step reports
   `truncated`, reward 0 and the checkpointed observation as
   `final_observation` (so the interrupted episodes end there, bootstrapping
   from where they were; their games are not logged) and the action is not
   executed. A resumed run therefore restarts its games and is not
   bit-identical to an uninterrupted one.
7. **Stacking inside jit** (`stack_in_jit`, rainbow.py's choice). envpool
   stacks frames itself, and after a lost life its stack keeps older frames
   in some slots, so a stack cannot be rebuilt from the newest frames alone.
   With `stack_in_jit` envpool returns single frames and the step builds the
   stack: each step shifts it by one frame, and every episode (life, with
   `episodic_life`) starts with its first frame in all `frame_stack` slots.
   Every stack is then a function of the episode's frames, so a replay can
   store one frame per step and rebuild the stacks exactly (rainbow.py,
   `frame_stacks`), a quarter of the memory.
8. **One seed per process.** The custom calls have no batching rule, so the
   env cannot be vmapped: an algorithm trains one seed per process with it.
   The compiled programs name this process's pool, so JAX's persistent
   compilation cache cannot reuse them in another process (each run compiles).
"""

from __future__ import annotations

import functools
import os
import secrets
from collections.abc import Iterable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.experimental import io_callback

from jaxzoo import envs

PREFIX = "envpool:"

EXTRA_HINT = 'install the optional extra: pip install -e ".[atari]"'

# envpool's "-v5" time limit: 27,000 agent steps = 108,000 frames at frame skip 4.
MAX_EPISODE_STEPS = 27_000


def is_envpool(env_id: str) -> bool:
    return env_id.startswith(PREFIX)


def import_envpool():
    """The envpool module, or a ValueError saying how to install it."""
    try:
        import envpool
    except ImportError as error:
        raise ValueError(f"envpool ids need envpool, which is not installed ({error}); {EXTRA_HINT}") from error
    return envpool


@functools.cache
def game_ids() -> tuple[str, ...]:
    """envpool's Atari task ids ('Breakout-v5', ...)."""
    import_envpool()  # registers the games
    from envpool.registration import registry

    return tuple(task for task, (module, *_) in registry.specs.items() if module == "envpool.atari")


def parse(env_id: str) -> str:
    """'envpool:Breakout-v5' -> 'Breakout-v5', with a clear error (and close
    ids) for anything that is not one of envpool's Atari games."""
    if not is_envpool(env_id):
        raise ValueError(f"env_id {env_id!r} is not an envpool id: expected '{PREFIX}<Game>-v5'")
    import_envpool()
    task = env_id[len(PREFIX) :]
    if task not in game_ids():
        known = [PREFIX + game for game in game_ids()]
        raise ValueError(
            f"unknown envpool Atari id {env_id!r}{envs.did_you_mean(env_id, known)}; valid ids: {', '.join(known)}"
        )
    return task


def check_args(args: Any, extra: Iterable[tuple[bool, str]] = ()) -> None:
    """Refuse what an algorithm's Args cannot do with an envpool id, before
    anything is built (the id itself is checked when the env is built): several
    seeds (module docstring, 8), --parallel data, a torso not for frames; then
    the algorithm's own `extra` (refused, message) pairs. Args without a
    `torso` field (unizero.py, whose encoder follows the env id) skip that check."""
    torso = getattr(args, "torso", "auto")
    refused = [
        (
            args.num_seeds != 1,
            f"num_seeds must be 1, got {args.num_seeds}: envpool's XLA calls cannot be vmapped "
            "over seeds (run each seed as its own process with --seed)",
        ),
        (args.parallel == "data", "--parallel data is not supported: the envs live in one envpool pool"),
        (
            torso not in ("auto", "nature"),
            f"torso={torso!r} is not for Atari frames; accepted: auto, nature",
        ),
        *extra,
    ]
    for bad, message in refused:
        if bad:
            raise ValueError(f"env_id {args.env_id!r}: {message}")


def preprocessing(args: Any) -> dict[str, Any]:
    """`make`'s preprocessing keywords from an algorithm's Args: its fields named
    as `Preprocessing`'s (one an Args lacks stays at the default: rainbow.py has
    no image_size or grayscale) and the time limit, `args.max_episode_steps` or
    envpool's when 0."""
    settings = {name: getattr(args, name) for name in Preprocessing._fields if hasattr(args, name)}
    settings["max_episode_steps"] = args.max_episode_steps or MAX_EPISODE_STEPS
    return settings


class Preprocessing(NamedTuple):
    """DeepMind's Atari preprocessing, each choice a value (module docstring, 1)."""

    frame_skip: int = 4
    frame_stack: int = 4
    noop_max: int = 30
    episodic_life: bool = True
    fire_reset: bool = True
    reward_clip: bool = True
    image_size: int = 84
    grayscale: bool = True
    max_episode_steps: int = MAX_EPISODE_STEPS
    stack_in_jit: bool = False  # build the frame stack on the device from single frames (module docstring, 7)

    def envpool_kwargs(self) -> dict[str, Any]:
        return {
            "frame_skip": self.frame_skip,
            "stack_num": 1 if self.stack_in_jit else self.frame_stack,
            "noop_max": self.noop_max,
            "episodic_life": self.episodic_life,
            "use_fire_reset": self.fire_reset,
            "reward_clip": self.reward_clip,
            "img_height": self.image_size,
            "img_width": self.image_size,
            "gray_scale": self.grayscale,
            "max_episode_steps": self.max_episode_steps,
            "repeat_action_probability": 0.0,
        }

    @property
    def obs_shape(self) -> tuple[int, int, int]:
        return (self.image_size, self.image_size, self.frame_stack * (1 if self.grayscale else 3))


@struct.dataclass
class AtariState:
    """The device side of a pool: the call-ordering handle and the counters of
    the running games. Leaves have no seed axis (one seed per process)."""

    handle: jax.Array  # [8] uint8: envpool's XLA handle, threaded to order the calls
    token: jax.Array  # [] int32: the pool whose reset made this state (module docstring, 6)
    obs: jax.Array  # [N, H, W, C] uint8: the observation the last call returned
    game_return: jax.Array  # [N] float32: unclipped score of the running game so far
    game_length: jax.Array  # [N] int32: agent steps of the running game so far


class Received(NamedTuple):
    """One `recv` per env, gathered at each env's index: leaves [N, ...]."""

    obs: jax.Array  # [N, C, H, W] uint8, envpool's layout
    reward: jax.Array  # [N] float32, clipped with reward_clip
    terminated: jax.Array  # [N] bool: life lost (episodic_life) or game over
    truncated: jax.Array  # [N] bool: time limit
    game_over: jax.Array  # [N] bool: ALE's game over (envpool's info["terminated"])
    score: jax.Array  # [N] float32: the unclipped reward (envpool's info["reward"])
    lives: jax.Array  # [N] int32


class EnvpoolAtari:
    """`num_envs` Atari games of one envpool pool (see the module docstring).
    `role` separates the seed streams of two pools built from the same `seed`
    (training and evaluation)."""

    def __init__(self, env_id: str, num_envs: int, *, seed: int, role: int = 0, preprocessing: Preprocessing):
        envpool = import_envpool()
        self.env_id, self.num_envs, self.preprocessing = env_id, num_envs, preprocessing
        self.task = parse(env_id)
        self.pool = envpool.make(
            self.task,
            env_type="gymnasium",
            num_envs=num_envs,
            batch_size=1,  # results one env at a time (module docstring, 3)
            num_threads=min(num_envs, os.cpu_count() or 1),
            seed=pool_seed(seed, role, num_envs),
            **preprocessing.envpool_kwargs(),
        )
        self.handle, self._recv, self._send, _ = self.pool.xla()
        self.token = np.int32(secrets.randbits(31))
        self.spec = envs.EnvSpec(
            obs_shape=preprocessing.obs_shape,
            discrete=True,
            num_actions=int(self.pool.action_space.n),
            action_low=None,
            action_high=None,
            max_episode_steps=preprocessing.max_episode_steps,
        )

    # ----- host side ----------------------------------------------------------- #
    def host_reset(self, handle: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Reset every env (a new game each) -> (handle, the pool's frames [N, H, W, c] uint8)."""
        self.pool.async_reset()
        obs = np.zeros((self.num_envs, *self.pool.observation_space.shape), np.uint8)
        for _ in range(self.num_envs):
            frames, *_, info = self.pool.recv()
            obs[int(info["env_id"][0])] = frames[0]
        return np.asarray(handle), obs.transpose(0, 2, 3, 1)

    # ----- device side (the gymnax-style interface) ----------------------------- #
    def _stacked(self, frames: jax.Array, previous: jax.Array | None = None) -> jax.Array:
        """The observation [N, H, W, C] from the pool's `frames` [N, H, W, c]:
        envpool's own stack as it is, or with `stack_in_jit` (module docstring, 7)
        the single frame in every slot (`previous` None: a new episode) or appended
        to `previous` [N, H, W, C] without its oldest frame."""
        if not self.preprocessing.stack_in_jit:
            return frames
        if previous is None:
            return jnp.tile(frames, (1, 1, 1, self.preprocessing.frame_stack))
        return envs.push_frame(previous, frames)

    def _reset_pool(self, handle: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(handle, the pool's frames [N, H, W, c]) of a new game in every env."""
        c, h, w = self.pool.observation_space.shape
        shapes = (
            jax.ShapeDtypeStruct(handle.shape, handle.dtype),
            jax.ShapeDtypeStruct((self.num_envs, h, w, c), jnp.uint8),
        )
        return io_callback(self.host_reset, shapes, handle, ordered=True)

    def reset(self, key: jax.Array, params=None) -> tuple[jax.Array, AtariState]:
        handle, frames = self._reset_pool(jnp.asarray(self.handle))
        obs = self._stacked(frames)
        zeros = jnp.zeros(self.num_envs)
        return obs, AtariState(handle, jnp.int32(self.token), obs, zeros, zeros.astype(jnp.int32))

    def _send_to(self, handle: jax.Array, index: jax.Array, action: jax.Array) -> jax.Array:
        return self._send(
            handle, jnp.reshape(action, (1,)).astype(jnp.int32), jnp.reshape(index, (1,)).astype(jnp.int32)
        )

    def _receive(self, handle: jax.Array, count: int | jax.Array) -> tuple[jax.Array, Received]:
        """`count` results (one env each), every one put at its env's index; the
        entries of envs not received stay zero."""
        n, (c, h, w) = self.num_envs, self.pool.observation_space.shape
        empty = Received(
            jnp.zeros((n, c, h, w), jnp.uint8),
            jnp.zeros(n, jnp.float32),
            jnp.zeros(n, bool),
            jnp.zeros(n, bool),
            jnp.zeros(n, bool),
            jnp.zeros(n, jnp.float32),
            jnp.zeros(n, jnp.int32),
        )

        def receive_one(carry):
            received, handle, into = carry
            handle, (obs, reward, terminated, truncated, info) = self._recv(handle)
            one = Received(
                obs[0],
                reward[0].astype(jnp.float32),
                terminated[0].astype(bool),
                truncated[0].astype(bool),
                info["terminated"][0].astype(bool),
                info["reward"][0].astype(jnp.float32),
                info["lives"][0].astype(jnp.int32),
            )
            index = info["env_id"][0]
            into = jax.tree.map(lambda buffer, x: buffer.at[index].set(x), into, one)
            return received + 1, handle, into

        _, handle, received = jax.lax.while_loop(lambda c: c[0] < count, receive_one, (0, handle, empty))
        return handle, received

    def _pool_step(self, state: AtariState, action: jax.Array):
        """One step of every env, then the resets of those that ended (module docstring, 4)."""
        n = self.num_envs
        handle = jax.lax.fori_loop(0, n, lambda i, h: self._send_to(h, i, action[i]), state.handle)
        handle, stepped = self._receive(handle, n)
        done = stepped.terminated | stepped.truncated

        def send_reset(i, handle):
            return jax.lax.cond(done[i], lambda h: self._send_to(h, i, jnp.int32(0)), lambda h: h, handle)

        handle = jax.lax.fori_loop(0, n, send_reset, handle)
        handle, restarted = self._receive(handle, done.sum())
        final_obs = self._stacked(stepped.obs.transpose(0, 2, 3, 1), state.obs)
        obs = jnp.where(done[:, None, None, None], self._stacked(restarted.obs.transpose(0, 2, 3, 1)), final_obs)

        game_return = state.game_return + stepped.score
        game_length = state.game_length + 1
        game_done = stepped.game_over | stepped.truncated
        info = {
            "final_observation": final_obs,
            "episode_done": game_done,
            "episode_return": game_return,
            "episode_length": game_length,
            "lives": stepped.lives,
        }
        state = AtariState(
            handle,
            state.token,
            obs,
            jnp.where(game_done, 0.0, game_return),
            jnp.where(game_done, 0, game_length),
        )
        return obs, state, stepped.reward, stepped.terminated, stepped.truncated, info

    def _restart_step(self, state: AtariState, action: jax.Array):
        """The first step with a state from another pool (a resumed run): every
        env starts a new game; the action is not executed (module docstring, 6)."""
        n = self.num_envs
        handle, frames = self._reset_pool(state.handle)
        obs = self._stacked(frames)
        no = jnp.zeros(n, bool)
        info = {
            "final_observation": state.obs,
            "episode_done": no,
            "episode_return": jnp.zeros(n),
            "episode_length": jnp.zeros(n, jnp.int32),
            "lives": jnp.zeros(n, jnp.int32),
        }
        zeros = jnp.zeros(n)
        state = AtariState(handle, jnp.int32(self.token), obs, zeros, zeros.astype(jnp.int32))
        return obs, state, zeros, no, jnp.ones(n, bool), info

    def step(self, key: jax.Array, state: AtariState, action: jax.Array, params=None):
        return jax.lax.cond(state.token == self.token, self._pool_step, self._restart_step, state, action)


def pool_seed(seed: int, role: int, num_envs: int) -> int:
    """envpool's seed of a pool (env i gets it + i, an int32): `seed` for the
    training pool (role 0), a hash of (seed, role) for the others."""
    if role == 0:
        return seed
    return int(np.random.SeedSequence([seed, role]).generate_state(1)[0]) % (2**31 - num_envs)


def make(env_id: str, num_envs: int, *, seed: int, role: int = 0, **preprocessing) -> tuple[EnvpoolAtari, None]:
    """`(env, env_params)` like `jaxzoo.envs.make`; env_params is None.
    `preprocessing`: the fields of `Preprocessing` (module docstring, 1)."""
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    return EnvpoolAtari(env_id, num_envs, seed=seed, role=role, preprocessing=Preprocessing(**preprocessing)), None


def spec(env_id: str, **preprocessing) -> envs.EnvSpec:
    """The EnvSpec of a game under `preprocessing` (reads envpool's spec; builds no env)."""
    task = parse(env_id)
    settings = Preprocessing(**preprocessing)
    num_actions = int(import_envpool().make_spec(task, **settings.envpool_kwargs()).action_space.n)
    return envs.EnvSpec(settings.obs_shape, True, num_actions, None, None, settings.max_episode_steps)
