"""IMPALA with V-trace, and APPO as a flag: the whole run in one `jax.jit`, or actor threads and a learner.

Papers: Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with
Importance Weighted Actor-Learner Architectures" (arXiv:1802.01561); APPO as
RLlib implements it, after Luo et al. 2020, "IMPACT: Importance Weighted
Asynchronous Architectures with Clipped Target Networks" (arXiv:1912.00167).

The idea: actors act with a copy of the parameters that lags the learner's, so
the data is off-policy by the time the learner uses it. V-trace (eq. 1)
corrects for that with truncated importance weights rho = min(rho_bar, pi/mu)
and trace coefficients c = lambda min(c_bar, pi/mu): its targets train the
value function, and its advantages weight the policy gradient (eq. 4). APPO
(`--appo`) replaces that policy gradient with PPO's clipped surrogate on
the V-trace advantages, measured against a target network, with an optional
KL penalty. Two forms of the same learner (Hessel et al. 2021, "Podracer
architectures", arXiv:2104.06272): the in-jit ("Anakin") form, the default,
rollout and learning in one compiled `lax.scan`, vmapped over seeds, the lag
made explicit: the actors use the learner's parameters of `policy_lag`
updates ago, kept in a ring in the runner state; and the actor-learner
("Sebulba") form, `--architecture sebulba`: actor threads on their devices
feed a bounded queue of trajectories to a learner on its devices, which
publishes new parameters, and the lag is whatever that makes it (measured).

    python algos/impala.py                                  # CartPole-v1, 1M steps
    python algos/impala.py --appo --policy-lag 4
    python algos/impala.py --preset rllib-appo --num-seeds 4
    python algos/impala.py --architecture sebulba --num-actor-threads 4
    python algos/impala.py --preset atari                   # envpool:Breakout-v5 from pixels (atari extra)
    python algos/impala.py --env-id gym:LunarLander-v3      # any gymnasium env, stepped on the host (docs/gym.md)

Details, logged metrics and measured results: docs/impala.md.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import queue
import signal
import threading
import time
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, NamedTuple, TypeAlias

import chex
import distrax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxzoo import atari, checkpoint, cli, envs, host, layers, logger, parallel, runner
from jaxzoo.checks import AtLeastOne, Fraction, NonNegative, Positive, check_fields


# --------------------------------------------------------------------------- #
# Arguments
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class Args:
    """IMPALA (Espeholt et al. 2018) or APPO on a gymnax environment, an envpool Atari game or a gymnasium env, jitted end to end."""

    exp_name: str = "impala"
    """name of the experiment: part of the run directory and the plot label"""
    seed: Annotated[int, NonNegative] = 0
    """seed of the first run; seed index i uses seed + i"""
    num_seeds: Annotated[int, AtLeastOne] = 1
    """independent seeds trained at once with `jax.vmap`"""
    env_id: str = "CartPole-v1"
    """gymnax environment id; an Atari game stepped by envpool inside jit, 'envpool:<Game>-v5' (needs the `atari` extra; one seed per process; docs/impala.md, Atari); or any gymnasium id, 'gym:<id>', stepped on the host (one seed per process; docs/gym.md)"""
    total_timesteps: Annotated[int, AtLeastOne] = 1_000_000
    """environment steps per seed"""
    log_every: Annotated[int, AtLeastOne] = 20
    """updates per jitted chunk: metrics, progress and checkpoints happen between chunks"""
    track: bool = False
    """log to Weights & Biases (needs the `logging` extra)"""
    tensorboard: bool = False
    """write TensorBoard event files into the run directory (needs the `logging` extra)"""
    save_model: bool = True
    """write checkpoints of the whole runner state (needed for --resume)"""
    checkpoint_every: Annotated[int, AtLeastOne] = 200
    """updates between checkpoints (rounded up to a chunk boundary); one is also written at the end"""
    resume: str | None = None
    """run directory to resume: the run continues with its saved args.json; a flag that differs from it is refused, except total_timesteps and the reporting flags (docs/reliability.md)"""
    run_root: str = "runs"
    """directory under which run directories are created"""
    eval_episodes: Annotated[int, AtLeastOne] = 10
    """greedy evaluation episodes per seed at the end of training"""
    compile_cache: bool = True
    """JAX persistent compilation cache: a second run of the same command skips compiling"""
    parallel: Literal["auto", "seeds", "data", "off"] = "auto"
    """devices: seeds shards the seed axis, data shards one run's data and averages gradients (off: one device; auto: seeds over the devices that divide num_seeds, on a CPU one device per core; docs/scaling.md)"""
    distributed: bool = False
    """join a multi-process run with jax.distributed (SLURM, Open MPI, TPU pods detected; else pass the next three)"""
    coordinator_address: str | None = None
    """host:port of process 0 for --distributed (None: detected on SLURM, Open MPI, TPU pods)"""
    num_processes: Annotated[int | None, AtLeastOne] = None
    """processes in the --distributed run (None: detected on SLURM, Open MPI, TPU pods)"""
    process_id: Annotated[int | None, NonNegative] = None
    """this process's index in the --distributed run, 0 ... num_processes - 1 (None: detected)"""
    distributed_timeout: Annotated[int, AtLeastOne] = 120
    """seconds --distributed waits for every process to join before failing"""
    capture_video: bool = False
    """write an MP4 of each seed's first greedy-evaluation episode into the run directory's videos/ (needs the `video` extra; docs/video.md)"""

    # algorithm-specific
    eval_every: Annotated[int, NonNegative] = 0
    """updates between greedy evaluations during training, logged as eval_return (0: only at the end)"""
    appo: bool = False
    """APPO: PPO's clipped surrogate on the V-trace advantages against a target network (RLlib's APPO); else IMPALA's V-trace policy gradient (eq. 4)"""
    policy_lag: Annotated[int, NonNegative] = 2
    """updates by which the actors' parameters lag the learner's: actors act with the parameters of policy_lag updates ago (0: on-policy); --architecture anakin only, sebulba's lag comes from its threads and queue and is logged"""
    max_episode_steps: Annotated[int, NonNegative] = 0
    """time limit of an episode in env steps; 0 keeps the env's own (200 makes CartPole-v1 into CartPole-v0; Atari's is 27,000 agent steps, 108k frames)"""
    num_envs: Annotated[int, AtLeastOne] = 16
    """parallel environments per seed (actors)"""
    DATA_AXIS: ClassVar[str] = "num_envs"
    """the field --parallel data splits over the devices (the environments; runner.data_axis)"""
    num_steps: Annotated[int, AtLeastOne] = 32
    """env steps per environment per rollout: the length T of the V-trace unroll"""
    learning_rate: Annotated[float, Positive] = 2e-3
    """Adam learning rate"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over the run"""
    adam_eps: Annotated[float, Positive] = 1e-5
    """Adam epsilon"""
    gamma: Annotated[float, Fraction] = 0.99
    """discount factor"""
    vtrace_lambda: Annotated[float, Fraction] = 1.0
    """lambda of the V-trace traces c_i = lambda min(c_bar, pi/mu) (the paper's Remark 3; 1: plain V-trace)"""
    rho_bar: Annotated[float, Positive] = 1.0
    """truncation level of the importance weights rho_t = min(rho_bar, pi/mu) in the targets and the policy gradient (eq. 1, 4)"""
    c_bar: Annotated[float, Positive] = 1.0
    """truncation level of the trace coefficients c_i = lambda min(c_bar, pi/mu) (eq. 1)"""
    num_minibatches: Annotated[int, AtLeastOne] = 1
    """minibatches per epoch, cut along the environments so each keeps its whole trajectories; must divide num_envs"""
    update_epochs: Annotated[int, AtLeastOne] = 1
    """epochs over each rollout (IMPALA: 1, one gradient step per batch)"""
    ent_coef: Annotated[float, NonNegative] = 0.01
    """entropy bonus coefficient"""
    value_coef: Annotated[float, NonNegative] = 0.5
    """weight of the value loss 0.5 (v_s - V(x_s))^2 (the baseline loss)"""
    max_grad_norm: Annotated[float, NonNegative] = 0.5
    """global gradient-norm clip (0 turns clipping off)"""
    clip_coef: Annotated[float, Positive] = 0.4
    """APPO: surrogate clipping epsilon (RLlib's clip_param)"""
    target_worker_clipping: Annotated[float, Positive] = 2.0
    """APPO: the ratio mu / pi_target entering the surrogate ratio is clipped to at most this (IMPACT, RLlib's target_worker_clipping)"""
    target_update_rate: Annotated[float, Fraction] = 0.0
    """APPO: EMA rate of the target network, applied after every gradient step (0: hard copies every target_copy_period instead)"""
    target_copy_period: Annotated[int, AtLeastOne] = 1
    """APPO: gradient steps between hard copies of the learner's parameters into the target network (when target_update_rate is 0)"""
    kl_coef: Annotated[float, NonNegative] = 0.0
    """APPO: initial adaptive coefficient of the KL(target || current) penalty, as RLlib's kl_coeff with use_kl_loss (0: no penalty)"""
    kl_target: Annotated[float, Positive] = 0.01
    """KL target of the adaptive penalty: x1.5 above 2x target, x0.5 below half"""
    torso: Literal["auto", "mlp", "cnn", "nature"] = "auto"
    """network torso: cnn is the MinAtar network, nature the Nature DQN convolutions; auto picks nature for envpool ids, cnn for other image observations [H, W, C], mlp otherwise"""
    hidden_sizes: Annotated[tuple[int, ...], AtLeastOne] = (64, 64)
    """MLP layer widths (after the convolutions for the cnn and nature torsos)"""
    conv_padding: Literal["valid", "same"] = "valid"
    """padding of the nature torso's convolutions: valid (Nature DQN, CleanRL) or same (RLlib's CNN encoder, out = ceil(in / stride))"""
    activation: Literal["tanh", "relu"] = "tanh"
    """hidden-layer activation"""
    shared_torso: bool = False
    """actor and critic share one torso (else two separate ones)"""
    # Atari preprocessing (DeepMind's, done by envpool; envpool ids only; common/atari.py)
    frame_skip: Annotated[int, AtLeastOne] = 4
    """Atari: emulator frames per agent step, the action repeated (the last two frames max-pooled)"""
    frame_stack: Annotated[int, AtLeastOne] = 4
    """Atari: frames stacked on the channel axis of an observation"""
    noop_max: Annotated[int, AtLeastOne] = 30
    """Atari: up to this many no-op frames at every reset, drawn uniformly (1: no random no-op starts)"""
    episodic_life: bool = True
    """Atari: a lost life is `terminated` for the learner (the logged score stays the whole game's)"""
    fire_reset: bool = True
    """Atari: press FIRE after every reset in games that need it to start"""
    reward_clip: bool = True
    """Atari: the learner sees the sign of each reward (the logged score is unclipped)"""
    image_size: Annotated[int, AtLeastOne] = 84
    """Atari: side of the square frames in pixels"""
    grayscale: bool = True
    """Atari: one-channel frames instead of RGB"""

    # actor-learner (--architecture sebulba; docs/impala.md, Actor-learner)
    architecture: Literal["anakin", "sebulba"] = "anakin"
    """anakin: rollout and learning in one jitted program, the lag set by policy_lag; sebulba: actor threads step their envs with their own parameter copy and feed a bounded queue, a learner takes batches from it and publishes new parameters, the lag is measured (one seed, one process)"""
    num_actor_threads: Annotated[int, AtLeastOne] = 2
    """sebulba: actor threads; they share the num_envs environments evenly (must divide num_envs), and an update takes num_actor_threads trajectory blocks from the queue"""
    queue_size: Annotated[int, AtLeastOne] = 4
    """sebulba: trajectory blocks (num_steps x num_envs / num_actor_threads env steps each) the queue holds; a full queue blocks the actors"""
    actor_device_ids: Annotated[tuple[int, ...], NonNegative] = (0,)
    """sebulba: indices into jax.devices() of the devices the actor threads act on, assigned round-robin (actor i on actor_device_ids[i % len])"""
    learner_device_ids: Annotated[tuple[int, ...], NonNegative] = (0,)
    """sebulba: indices into jax.devices() of the learner's devices; with several, each batch is split over them along the environment axis and the gradients averaged (as --parallel data)"""

    def __post_init__(self):
        check_fields(self)  # the ranges beside the fields (jaxzoo.checks)
        if atari.is_envpool(self.env_id):
            atari.check_args(self)  # what an envpool id cannot do (common/atari.py)
        if host.is_gym(self.env_id):
            host.check_args(self)  # what a gym: id cannot do (common/host.py)
        if self.num_envs % self.num_minibatches:
            raise ValueError(
                f"num_envs={self.num_envs} does not divide into num_minibatches={self.num_minibatches} "
                f"minibatches of whole trajectories; accepted: a divisor of {self.num_envs}"
            )
        if self.num_updates < 1:
            raise ValueError(
                f"total_timesteps={self.total_timesteps} is less than one batch "
                f"(num_envs * num_steps = {self.batch_size}); accepted: total_timesteps >= {self.batch_size}"
            )
        if not self.appo and self.kl_coef > 0:
            raise ValueError(
                f"kl_coef={self.kl_coef} is a penalty towards APPO's target network, which IMPALA does not "
                "have; accepted: kl_coef=0 without --appo, or --appo"
            )
        if self.architecture == "sebulba":
            self._check_sebulba()

    def _check_sebulba(self) -> None:
        """What --architecture sebulba needs, before anything is built (the
        device ids are checked against the visible devices when the run starts)."""
        for name, refused, accepted in [
            ("distributed", self.distributed, "one process: --distributed needs --architecture anakin"),
            ("num_seeds", self.num_seeds != 1, "num_seeds=1 (one learner); several seeds need --architecture anakin"),
            (
                "parallel",
                self.parallel not in ("auto", "off"),
                "auto or off; sebulba places its work with --actor-device-ids and --learner-device-ids",
            ),
        ]:
            if refused:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is not accepted with architecture='sebulba'; accepted: {accepted}"
                )
        if self.num_envs % self.num_actor_threads:
            raise ValueError(
                f"num_envs={self.num_envs} does not split evenly over num_actor_threads={self.num_actor_threads}; "
                f"accepted: num_actor_threads a divisor of {self.num_envs}"
            )
        for name, ids in [("actor_device_ids", self.actor_device_ids), ("learner_device_ids", self.learner_device_ids)]:
            if not ids or len(set(ids)) != len(ids):
                raise ValueError(
                    f"{name}={ids!r} must name at least one device, each once; accepted: e.g. (0,) or (0, 1)"
                )
        learners = len(self.learner_device_ids)
        for name, size in [
            ("num_envs / num_actor_threads", self.envs_per_actor),
            ("num_envs / num_minibatches", self.num_envs // self.num_minibatches),
        ]:
            if size % learners:
                raise ValueError(
                    f"{name} = {size} trajectories do not split over the {learners} learner devices "
                    f"learner_device_ids={self.learner_device_ids!r}; accepted: a multiple of {learners}"
                )

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.batch_size

    @property
    def envs_per_actor(self) -> int:
        """sebulba: environments each actor thread steps."""
        return self.num_envs // self.num_actor_threads


# --------------------------------------------------------------------------- #
# Networks
# --------------------------------------------------------------------------- #
ACTIVATIONS = {"tanh": jnp.tanh, "relu": jax.nn.relu}


def dense(in_features: int, out_features: int, scale: float, rngs: nnx.Rngs) -> nnx.Linear:
    """Linear layer with orthogonal weights (gain `scale`) and zero bias."""
    return nnx.Linear(
        in_features,
        out_features,
        kernel_init=nnx.initializers.orthogonal(scale),
        bias_init=nnx.initializers.zeros_init(),
        rngs=rngs,
    )


class MLP(nnx.Module):
    """[..., D] -> [..., hidden_sizes[-1]]."""

    def __init__(self, in_features: int, hidden_sizes: tuple[int, ...], activation: str, rngs: nnx.Rngs):
        sizes = (in_features, *hidden_sizes)
        self.layers = nnx.List([dense(a, b, np.sqrt(2), rngs) for a, b in zip(sizes[:-1], sizes[1:])])
        self.activation = ACTIVATIONS[activation]
        self.out_features = sizes[-1]

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = self.activation(layer(x))
        return x


class MinAtarCNN(nnx.Module):
    """[..., H, W, C] -> [..., hidden_sizes[-1]]: one 3x3 convolution with 16
    channels and no padding (as patches @ kernel, `jaxzoo.layers.patches`),
    then an MLP: the MinAtar network (Young & Tian 2019)."""

    def __init__(self, obs_shape: tuple[int, ...], hidden_sizes: tuple[int, ...], activation: str, rngs: nnx.Rngs):
        height, width, channels = obs_shape
        self.conv = dense(9 * channels, 16, np.sqrt(2), rngs)
        self.mlp = MLP((height - 2) * (width - 2) * 16, hidden_sizes, activation, rngs)
        self.out_features = self.mlp.out_features

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jax.nn.relu(self.conv(layers.patches(x, 3)))  # [..., H-2, W-2, 16]
        return self.mlp(x.reshape(x.shape[:-3] + (-1,)))


def same_padding(size: int, kernel_size: int, stride: int) -> tuple[int, int]:
    """Zero padding (before, after) that makes a convolution's output
    ceil(size / stride) long, as RLlib's `same_padding` (the extra pixel after)."""
    total = max((-(-size // stride) - 1) * stride + kernel_size - size, 0)
    return total // 2, total - total // 2


class NatureCNN(nnx.Module):
    """[..., H, W, C] uint8 frames -> [..., hidden_sizes[-1]]: the Nature DQN
    convolutions (Mnih et al. 2015: 32 8x8 filters stride 4, 64 4x4 stride 2,
    64 3x3 stride 1, each followed by a ReLU), then an MLP (512 units in the
    atari preset). Inputs are scaled to [0, 1] here, so rollouts keep bytes.
    Orthogonal weights with gain sqrt(2) and zero biases, as CleanRL's
    ppo_atari_envpool_xla_jax.py. Each convolution is patches @ kernel like
    MinAtarCNN's: a `lax.conv` kernel gradient inside the update's scan was
    about 40x slower here (docs/ppo.md, Atari). `padding` "valid" is the
    Nature network's (84 -> 20 -> 9 -> 7); "same" is RLlib's CNN encoder's
    (84 -> 21 -> 11 -> 11)."""

    FILTERS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))  # (channels, kernel size, stride)

    def __init__(self, obs_shape, hidden_sizes, activation: str, padding: str, rngs: nnx.Rngs):
        height, width, channels = obs_shape
        pads, convs = [], []
        for out_channels, kernel_size, stride in self.FILTERS:
            pad_h, pad_w = (
                (same_padding(height, kernel_size, stride), same_padding(width, kernel_size, stride))
                if padding == "same"
                else ((0, 0), (0, 0))
            )
            pads.append((pad_h, pad_w))
            convs.append(dense(kernel_size * kernel_size * channels, out_channels, np.sqrt(2), rngs))
            height = (height + sum(pad_h) - kernel_size) // stride + 1
            width = (width + sum(pad_w) - kernel_size) // stride + 1
            channels = out_channels
        self.convs = nnx.List(convs)
        self.pads = tuple(pads)  # static: ((top, bottom), (left, right)) per convolution
        self.mlp = MLP(height * width * channels, hidden_sizes, activation, rngs)
        self.out_features = self.mlp.out_features

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer, (conv, (pad_h, pad_w), (_, kernel_size, stride)) in enumerate(
            zip(self.convs, self.pads, self.FILTERS)
        ):
            x = jnp.pad(x, [(0, 0)] * (x.ndim - 3) + [pad_h, pad_w, (0, 0)])
            windows = layers.patches(x, kernel_size, stride)
            if layer == 0:  # frames in [0, 255] (bytes or floats), scaled after cutting the windows
                windows = windows.astype(jnp.float32) / 255.0
            x = jax.nn.relu(conv(windows))
        return self.mlp(x.reshape(x.shape[:-3] + (-1,)))


# A categorical over logits for discrete actions, a diagonal Gaussian for continuous ones.
Distribution: TypeAlias = "distrax.Categorical | distrax.MultivariateNormalDiag"


class ActorCritic(nnx.Module):
    """obs [..., *obs_shape] -> (policy, value [...]); the leading axes are
    free, so the learner evaluates a whole [T, N] trajectory batch at once.

    Discrete: logits [..., A]. Continuous: Gaussian mean [..., A] with a
    learned, state-independent log-std [A]. The policy head starts near
    uniform (orthogonal gain 0.01), the value head with gain 1. Torsos: mlp,
    cnn (MinAtar) or nature (Atari frames, `conv_padding` valid or same).
    """

    def __init__(
        self,
        spec: envs.EnvSpec,
        torso: str,
        hidden_sizes,
        activation,
        shared_torso,
        rngs: nnx.Rngs,
        conv_padding: str = "valid",
    ):
        def make_torso():
            if torso == "cnn":
                return MinAtarCNN(spec.obs_shape, hidden_sizes, activation, rngs)
            if torso == "nature":
                return NatureCNN(spec.obs_shape, hidden_sizes, activation, conv_padding, rngs)
            return MLP(int(np.prod(spec.obs_shape)), hidden_sizes, activation, rngs)

        self.actor_torso = make_torso()
        self.critic_torso = None if shared_torso else make_torso()
        features = self.actor_torso.out_features
        self.policy_head = dense(features, spec.num_actions, 0.01, rngs)
        self.value_head = dense(features, 1, 1.0, rngs)
        self.discrete = spec.discrete
        if not spec.discrete:
            self.log_std = nnx.Param(jnp.zeros(spec.num_actions))

    def distribution(self, actor_features: jax.Array) -> Distribution:
        out = self.policy_head(actor_features)
        if self.discrete:
            return distrax.Categorical(logits=out)
        return distrax.MultivariateNormalDiag(out, jnp.exp(self.log_std[...]) * jnp.ones_like(out))

    def act(self, obs: jax.Array) -> Distribution:
        """The policy alone: acting needs no critic."""
        return self.distribution(self.actor_torso(obs))

    def value(self, obs: jax.Array) -> jax.Array:
        torso = self.critic_torso or self.actor_torso
        return self.value_head(torso(obs))[..., 0]

    def __call__(self, obs: jax.Array) -> tuple[Distribution, jax.Array]:
        actor_features = self.actor_torso(obs)
        critic_features = actor_features if self.critic_torso is None else self.critic_torso(obs)
        return self.distribution(actor_features), self.value_head(critic_features)[..., 0]


# --------------------------------------------------------------------------- #
# Pytrees
# --------------------------------------------------------------------------- #
class Hyperparams(struct.PyTreeNode):
    """Hyperparameters read inside the jitted update. They live in the runner
    state, so `train` can be vmapped over them (a sweep in one compile)."""

    learning_rate: jax.Array  # [] Adam step size (before --anneal-lr's decay)
    gamma: jax.Array  # [] discount
    vtrace_lambda: jax.Array  # [] lambda of the trace coefficients c
    rho_bar: jax.Array  # [] truncation of the importance weights rho
    c_bar: jax.Array  # [] truncation of the trace coefficients c
    clip_coef: jax.Array  # [] APPO surrogate clipping epsilon
    ent_coef: jax.Array  # [] weight of the entropy bonus
    value_coef: jax.Array  # [] weight of the value loss

    @classmethod
    def from_args(cls, args: Args) -> Hyperparams:
        return cls(*(jnp.float32(getattr(args, f.name)) for f in dataclasses.fields(cls)))


class Transition(NamedTuple):
    """One rollout step; under the rollout scan every field gains `[T, N]` in front."""

    obs: jax.Array  # [N, *obs_shape]
    action: jax.Array  # [N] (discrete) or [N, A]
    behaviour_log_prob: jax.Array  # [N] log mu(a|x): the lagged actor policy that acted
    reward: jax.Array  # [N]
    terminated: jax.Array  # [N] bool: the episode really ended, V(next) = 0
    truncated: jax.Array  # [N] bool: time limit; bootstrap from final_obs
    final_obs: jax.Array  # [N, *obs_shape] info["final_observation"]: the true next state, before any reset
    episode_done: jax.Array  # [N] bool, from jaxzoo.envs.EpisodeStatistics
    episode_return: jax.Array  # [N]
    episode_length: jax.Array  # [N]


class Batch(NamedTuple):
    """What the learner needs, time-major: leaves [T, N, ...] (or [T, minibatch, ...])."""

    obs: jax.Array
    action: jax.Array
    behaviour_log_prob: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_obs: jax.Array


class VTrace(NamedTuple):
    """The outputs of `vtrace`, each [T, N]."""

    targets: jax.Array  # v_s, the value targets of eq. 1
    pg_advantages: jax.Array  # rho_s (r_s + gamma v_{s+1} - V(x_s)), the advantages of eq. 4
    rhos: jax.Array  # min(rho_bar, pi/mu)


class RunnerState(struct.PyTreeNode):
    """Everything a run carries from one update to the next (and checkpoints)."""

    params: nnx.State  # the learner's parameters
    target_params: nnx.State | None  # APPO's target network (None for IMPALA)
    actor_params: (
        nnx.State | None
    )  # ring of the last policy_lag learner parameters, leaves [policy_lag, ...] (None at lag 0)
    actor_slot: jax.Array  # [] int32: ring index of the oldest copy, the one the actors use
    opt_state: optax.OptState
    env_state: Any  # wrapped gymnax state, leaves [num_envs, ...]
    obs: jax.Array  # [num_envs, *obs_shape]
    key: jax.Array  # typed PRNG key
    update_step: jax.Array  # [] updates completed
    gradient_steps: jax.Array  # [] optimiser steps taken
    kl_coef: jax.Array  # [] APPO's adaptive KL-penalty coefficient (0 when off)
    hparams: Hyperparams


class LearnerState(struct.PyTreeNode):
    """The learner's state in --architecture sebulba (and its checkpoints): the
    RunnerState without the environments and the actors' ring, which live in
    the actor threads."""

    params: nnx.State
    target_params: nnx.State | None
    opt_state: optax.OptState
    key: jax.Array  # typed PRNG key of the learner (minibatch permutations)
    update_step: jax.Array  # [] updates completed: the version of `params`
    gradient_steps: jax.Array  # [] optimiser steps taken
    kl_coef: jax.Array  # [] APPO's adaptive KL-penalty coefficient (0 when off)
    hparams: Hyperparams


class TrajectoryBlock(NamedTuple):
    """What an actor thread puts in the queue (--architecture sebulba)."""

    rollout: jax.Array  # [T, envs_per_actor, F]: the Transitions, packed (`pack`), on the actor's device
    actor_id: int  # which actor thread acted
    sequence: int  # that thread's count of blocks put in the queue before this one
    params_version: int  # the learner update count of the parameters it acted with


# --------------------------------------------------------------------------- #
# Algorithm logic (pure functions; the unit tests import these)
# --------------------------------------------------------------------------- #
def vtrace(
    behaviour_log_prob: jax.Array,
    target_log_prob: jax.Array,
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    gamma: float | jax.Array,
    vtrace_lambda: float | jax.Array,
    rho_bar: float | jax.Array,
    c_bar: float | jax.Array,
) -> VTrace:
    """V-trace targets and policy-gradient advantages (Espeholt et al. 2018,
    eq. 1 and 4, with Remark 3's lambda), a reverse `lax.scan`, all inputs [T, N].

    `behaviour_log_prob` is log mu(a_t|x_t) of the policy that acted,
    `target_log_prob` log pi(a_t|x_t) of the policy being evaluated;
    `next_values[t]` is V(info["final_observation"]) of step t, the state the
    step reached (before any automatic reset). With ratio_t = pi / mu,

        rho_t   = min(rho_bar, ratio_t),   c_t = lambda min(c_bar, ratio_t)
        delta_t = rho_t (r_t + gamma (1 - terminated_t) V(x'_t) - V(x_t))
        v_t - V(x_t) = delta_t + gamma c_t (1 - done_t) (v_{t+1} - V(x_{t+1}))

    (eq. 1 written recursively, as below it in the paper), done = terminated
    or truncated: a termination has no bootstrap, a time limit bootstraps from
    V(final obs), and either cuts the trace because step t+1 is another
    episode. The policy-gradient advantage of eq. 4 is

        A_t = rho_t (r_t + gamma (1 - terminated_t) v'_{t+1} - V(x_t)),

    v'_{t+1} = v_{t+1} inside an episode and V(x'_t) where the episode or the
    rollout ends. Returns VTrace(targets v_t, pg_advantages A_t, rhos), [T, N].
    """
    chex.assert_equal_shape([behaviour_log_prob, target_log_prob, rewards, values, next_values, terminated, truncated])
    ratios = jnp.exp(target_log_prob - behaviour_log_prob)
    rhos = jnp.minimum(rho_bar, ratios)
    cs = vtrace_lambda * jnp.minimum(c_bar, ratios)
    not_terminated = 1.0 - terminated.astype(jnp.float32)
    episode_continues = 1.0 - jnp.logical_or(terminated, truncated).astype(jnp.float32)
    deltas = rhos * (rewards + gamma * not_terminated * next_values - values)

    def backward(next_correction, step):
        # next_correction = v_{t+1} - V(x_{t+1}), 0 past the rollout's end.
        delta, c, continues = step
        correction = delta + gamma * c * continues * next_correction
        return correction, correction

    _, corrections = jax.lax.scan(
        backward, jnp.zeros_like(deltas[0]), (deltas, cs, episode_continues), reverse=True, unroll=16
    )
    targets = values + corrections
    # v'_{t+1}: the next step's target inside an episode; V(x'_t) where the episode
    # ends (a truncation) and after the rollout's last step.
    following_targets = jnp.concatenate([targets[1:], next_values[-1:]])
    next_targets = jnp.where(episode_continues > 0, following_targets, next_values)
    pg_advantages = rhos * (rewards + gamma * not_terminated * next_targets - values)
    return VTrace(targets, pg_advantages, rhos)


def clipped_surrogate(
    new_log_prob: jax.Array, old_log_prob: jax.Array, advantage: jax.Array, clip_coef: float | jax.Array
) -> tuple[jax.Array, jax.Array]:
    """PPO's clipped surrogate (Schulman et al. 2017, eq. 7) as a loss per sample,

        -min(r A, clip(r, 1 - eps, 1 + eps) A),  r = exp(new_log_prob - old_log_prob),

    all inputs of one shape [...]. Returns (losses [...], ratios r [...])."""
    ratio = jnp.exp(new_log_prob - old_log_prob)
    clipped_ratio = jnp.clip(ratio, 1 - clip_coef, 1 + clip_coef)
    return -jnp.minimum(ratio * advantage, clipped_ratio * advantage), ratio


def appo_surrogate(
    new_log_prob: jax.Array,
    behaviour_log_prob: jax.Array,
    target_log_prob: jax.Array,
    advantage: jax.Array,
    clip_coef: float | jax.Array,
    target_worker_clipping: float,
) -> tuple[jax.Array, jax.Array]:
    """APPO's policy loss per sample, all inputs [...] (RLlib's APPO learner,
    after IMPACT, Luo et al. 2020, eq. 5): the clipped surrogate with the ratio

        r = min(mu / pi_target, target_worker_clipping) * pi / mu

    which is pi / pi_target unless the behaviour policy mu is far from the
    target network's pi_target. As a log-ratio, r = exp(new - old) with
    old = max(log pi_target, log mu - log target_worker_clipping), so this is
    `clipped_surrogate` with that `old`; with a target equal to the behaviour
    policy (no lag, a fresh target) it is PPO's surrogate exactly.
    Returns (losses [...], ratios r [...])."""
    old_log_prob = jnp.maximum(target_log_prob, behaviour_log_prob - np.log(target_worker_clipping))
    return clipped_surrogate(new_log_prob, old_log_prob, advantage, clip_coef)


def adapt_kl_coef(kl_coef: jax.Array, mean_kl: jax.Array, kl_target: float) -> jax.Array:
    """RLlib's adaptive KL coefficient: x1.5 when the update's KL exceeds twice
    the target, x0.5 when it is under half of it."""
    return jnp.where(
        mean_kl > 2.0 * kl_target, kl_coef * 1.5, jnp.where(mean_kl < 0.5 * kl_target, kl_coef * 0.5, kl_coef)
    )


def explained_variance(prediction: jax.Array, target: jax.Array) -> jax.Array:
    """1 - Var[target - prediction] / Var[target] (1 is perfect, <= 0 is useless)."""
    return 1.0 - jnp.var(target - prediction) / (jnp.var(target) + 1e-8)


def learner_loss(
    params: nnx.State,
    target_params: nnx.State | None,
    batch: Batch,
    hparams: Hyperparams,
    kl_coef: jax.Array,
    *,
    graphdef: nnx.GraphDef,
    appo: bool,
    target_worker_clipping: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The IMPALA or APPO loss of a time-major batch [T, M] (M trajectories).

    V-trace runs inside the loss on the current parameters, as in the paper's
    learner: V(x) and pi from the learner's network, mu from the batch (IMPALA),
    or pi_target from the target network (APPO, as RLlib), all held constant
    (stop_gradient): targets and advantages are not differentiated.

        impala: -A_t log pi(a_t|x_t)  (eq. 4)
        appo:   appo_surrogate(A_t) + kl_coef KL(pi_target || pi)
        both:   + value_coef 0.5 (v_t - V(x_t))^2 - ent_coef H[pi]  (means over [T, M])
    """
    model = nnx.merge(graphdef, params)
    dist, values = model(batch.obs)  # [T, M]
    next_values = model.value(batch.final_obs)  # V(x'_t) [T, M]
    log_prob = dist.log_prob(batch.action)
    if appo:
        target_dist = nnx.merge(graphdef, target_params).act(batch.obs)
        evaluated_log_prob = target_dist.log_prob(batch.action)
    else:
        evaluated_log_prob = log_prob
    hp = hparams
    trace = jax.tree.map(
        jax.lax.stop_gradient,
        vtrace(
            batch.behaviour_log_prob,
            evaluated_log_prob,
            batch.reward,
            values,
            next_values,
            batch.terminated,
            batch.truncated,
            hp.gamma,
            hp.vtrace_lambda,
            hp.rho_bar,
            hp.c_bar,
        ),
    )
    stats: dict[str, jax.Array] = {}
    if appo:
        surrogate, ratio = appo_surrogate(
            log_prob,
            batch.behaviour_log_prob,
            jax.lax.stop_gradient(evaluated_log_prob),
            trace.pg_advantages,
            hp.clip_coef,
            target_worker_clipping,
        )
        policy_loss = surrogate.mean()
        target_kl = target_dist.kl_divergence(dist).mean()
        stats |= {"clip_fraction": (jnp.abs(ratio - 1.0) > hp.clip_coef).mean(), "target_kl": target_kl}
    else:
        policy_loss = -(trace.pg_advantages * log_prob).mean()
        target_kl = jnp.float32(0.0)
    value_loss = 0.5 * jnp.square(values - trace.targets).mean()
    entropy = dist.entropy().mean()
    total = policy_loss + hp.value_coef * value_loss - hp.ent_coef * entropy + kl_coef * target_kl
    # KL(mu || pi) estimated by (ratio - 1) - log ratio: how off-policy the lag made the data.
    log_ratio = jax.lax.stop_gradient(log_prob) - batch.behaviour_log_prob
    vtrace_ratio = jnp.exp(jax.lax.stop_gradient(evaluated_log_prob) - batch.behaviour_log_prob)
    return total, stats | {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "behaviour_kl": (jnp.exp(log_ratio) - 1.0 - log_ratio).mean(),
        "rho_mean": trace.rhos.mean(),
        "rho_clip_fraction": (vtrace_ratio > hp.rho_bar).mean(),
        "vtrace_target_mean": trace.targets.mean(),
        "explained_variance": explained_variance(jax.lax.stop_gradient(values), trace.targets),
    }


def collect_rollout(env, env_params, graphdef: nnx.GraphDef, actor_params: nnx.State, env_state, obs, key, num_steps):
    """`num_steps` steps of the N envs with the actors' (lagged) policy mu,
    whose log-probs are stored for V-trace. Returns ((env_state, obs
    [N, *obs_shape], key), Transition [T, N])."""
    actor = nnx.merge(graphdef, actor_params).act

    def env_step(carry, _):
        env_state, obs, key = carry
        key, action_key, step_key = jax.random.split(key, 3)
        dist = actor(obs)
        action = dist.sample(seed=action_key)
        next_obs, env_state, reward, terminated, truncated, info = env.step(step_key, env_state, action, env_params)
        transition = Transition(
            obs,
            action,
            dist.log_prob(action),
            reward,
            terminated,
            truncated,
            info["final_observation"],
            info["episode_done"],
            info["episode_return"],
            info["episode_length"],
        )
        return (env_state, next_obs, key), transition

    return jax.lax.scan(env_step, (env_state, obs, key), None, num_steps)


def batch_of(traj: Transition) -> Batch:
    """The learner's fields of a rollout [T, N]."""
    return Batch(
        traj.obs, traj.action, traj.behaviour_log_prob, traj.reward, traj.terminated, traj.truncated, traj.final_obs
    )


def episode_metrics_of(traj: Transition, env_id: str) -> dict[str, jax.Array]:
    """Masked means over the episodes that finished in a rollout [T, N] (jaxzoo.envs.episode_metrics);
    on Atari also as game_score and game_length, as ppo.py logs them."""
    metrics = envs.episode_metrics(
        {
            "episode_done": traj.episode_done,
            "episode_return": traj.episode_return,
            "episode_length": traj.episode_length,
        }
    )
    if atari.is_envpool(env_id):
        # An Atari "episode" is the whole game: the unclipped score over all its lives (common/atari.py, 5).
        metrics["game_score"], metrics["game_length"] = metrics["episode_return"], metrics["episode_length"]
    return metrics


def pack(tree, batch_dims: int) -> jax.Array:
    """The leaves of `tree`, each flattened after its first `batch_dims` axes
    and cast to float32, side by side: one array [*batch, F]. What crosses
    between the actor and learner threads and devices (a rollout [T, N, F],
    the parameters [P]) is one array, so each copy is one transfer and one
    Python call, not one per leaf (the learner's bottleneck, docs/impala.md).
    float32 holds the rollouts' ints and bools exactly (below 2**24)."""
    return jnp.concatenate(
        [x.reshape(x.shape[:batch_dims] + (-1,)).astype(jnp.float32) for x in jax.tree.leaves(tree)], axis=-1
    )


def unpack(packed: jax.Array, like, batch_dims: int):
    """`pack`'s inverse: `like` (arrays or shape structs) gives the tree and
    each leaf's dtype and shape after its first `batch_dims` axes, which take
    the leading axes of `packed` [*batch, F] (so a concatenation of packed
    blocks unpacks whole)."""
    leaves, treedef = jax.tree.flatten(like)
    sizes = [int(np.prod(x.shape[batch_dims:])) for x in leaves]
    parts = jnp.split(packed, np.cumsum(sizes)[:-1], axis=-1)
    batch = packed.shape[:-1]
    return jax.tree.unflatten(
        treedef, [part.reshape(batch + x.shape[batch_dims:]).astype(x.dtype) for part, x in zip(parts, leaves)]
    )


def update_target(args: Args, target_params, params, gradient_steps: jax.Array):
    """APPO's target network after a gradient step: an EMA with rate
    target_update_rate, or (rate 0) a hard copy every target_copy_period
    gradient steps (RLlib's tau = 1 and target_network_update_freq)."""
    if args.target_update_rate > 0:
        rate = args.target_update_rate
        return jax.tree.map(lambda t, p: (1 - rate) * t + rate * p, target_params, params)
    copy = gradient_steps % args.target_copy_period == 0
    return jax.tree.map(lambda t, p: jnp.where(copy, p, t), target_params, params)


def minibatch_step(args: Args, graphdef: nnx.GraphDef, optimizer, hparams: Hyperparams, kl_coef, carry, minibatch):
    """One gradient step of `learner_loss` on a minibatch [T, M]; carry =
    (params, target_params, opt_state, gradient_steps). Returns (carry, stats)."""
    params, target_params, opt_state, gradient_steps = carry
    minibatch = parallel.constrain_data(minibatch, axis=1)  # --parallel data: trajectories split over devices
    loss_fn = functools.partial(
        learner_loss,
        graphdef=graphdef,
        appo=args.appo,
        target_worker_clipping=args.target_worker_clipping,
    )
    grads, stats = jax.grad(loss_fn, has_aux=True)(params, target_params, minibatch, hparams, kl_coef)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    gradient_steps = gradient_steps + 1
    if target_params is not None:
        target_params = update_target(args, target_params, params, gradient_steps)
    return (params, target_params, opt_state, gradient_steps), stats


def learn(args: Args, graphdef: nnx.GraphDef, optimizer, batch: Batch, carry, hparams: Hyperparams, kl_coef, key):
    """`update_epochs` epochs over the rollout [T, N], each a fresh permutation
    of the N trajectories cut into `num_minibatches` minibatches [T, N / nmb]
    (V-trace needs whole time sequences, so only the env axis is shuffled).
    carry = (params, target_params, opt_state, gradient_steps). Returns
    (carry, stats [epochs, minibatches] per metric)."""
    nmb = args.num_minibatches
    step = functools.partial(minibatch_step, args, graphdef, optimizer, hparams, kl_coef)

    def epoch(carry, epoch_key):
        permutation = jax.random.permutation(epoch_key, args.num_envs)

        def split(x):  # [T, N, ...] -> [nmb, T, N / nmb, ...]
            x = x[:, permutation].reshape((x.shape[0], nmb, -1) + x.shape[2:])
            return jnp.swapaxes(x, 0, 1)

        return jax.lax.scan(step, carry, jax.tree.map(split, batch))

    return jax.lax.scan(epoch, carry, jax.random.split(key, args.update_epochs))


# --------------------------------------------------------------------------- #
# Training
# --------------------------------------------------------------------------- #
class IMPALA(NamedTuple):
    """What `make_train` returns: pure functions closed over the static config."""

    init: Any  # (key, hparams=None) -> RunnerState
    update: Any  # RunnerState -> (RunnerState, metrics: dict of [] arrays)
    train: Any  # (key, hparams=None) -> (RunnerState, metrics: dict of [num_updates] arrays)
    evaluate: Any  # (RunnerState, key) -> episode returns [eval_episodes]; with --capture-video also an envs.Recording
    policy: Any  # (params, obs [B, *obs_shape]) -> (distribution, value [B])
    spec: envs.EnvSpec
    # --architecture sebulba: the same learner, and the actor threads' environments
    learner_init: Any  # (key, hparams=None) -> LearnerState
    learner_update: Any  # (RunnerState | LearnerState, Batch [T, num_envs], key) -> (state, metrics)
    actor_reset: Any  # key -> (obs [envs_per_actor, *obs_shape], env_state); actor 0's
    actor_rollout: (
        Any  # (params packed [P], env_state, obs, key) -> ((env_state, obs, key), packed [T, envs_per_actor, F])
    )
    unpack_rollout: Any  # packed rollouts [T, N, F] -> Transition [T, N]
    actors: Any  # actor id -> ActorFunctions of that actor thread's environments


class ActorFunctions(NamedTuple):
    """One sebulba actor thread's functions (`actor_functions`) and the environments they step."""

    reset: Any  # key -> (obs [envs_per_actor, *obs_shape], env_state)
    rollout: Any  # (params packed [P], env_state, obs, key) -> ((env_state, obs, key), packed [T, envs_per_actor, F])
    unpack_rollout: Any  # packed rollouts [T, N, F] -> Transition [T, N]
    env: Any  # the envs_per_actor environments (an envpool pool or host envs are this thread's alone)


def actor_functions(args: Args, actor_env, env_params, graphdef: nnx.GraphDef, params_like) -> ActorFunctions:
    """--architecture sebulba: the ActorFunctions (reset, rollout,
    unpack_rollout) of one actor thread's environments `actor_env`
    (envs_per_actor of them). The parameters and the rollouts travel between
    threads and devices packed (`pack`); `params_like` is the parameters'
    structure (shape structs)."""

    def actor_reset(key: jax.Array):
        return actor_env.reset(key, env_params)

    def rollout(params: nnx.State, env_state, obs: jax.Array, key: jax.Array):
        return collect_rollout(actor_env, env_params, graphdef, params, env_state, obs, key, args.num_steps)

    def actor_rollout(packed_params: jax.Array, env_state, obs: jax.Array, key: jax.Array):
        """((env_state, obs, key), the rollout [T, envs_per_actor] packed [T, envs_per_actor, F])
        with the parameters packed [P]."""
        carry, traj = rollout(unpack(packed_params, params_like, 0), env_state, obs, key)
        return carry, pack(traj, 2)

    def unpack_rollout(packed: jax.Array) -> Transition:
        """Packed rollouts [T, N, F] -> Transition [T, N]."""

        def one(params, key):
            obs, env_state = actor_reset(key)
            return rollout(params, env_state, obs, key)[1]

        return unpack(packed, jax.eval_shape(one, params_like, jax.random.key(0)), 2)

    return ActorFunctions(actor_reset, actor_rollout, unpack_rollout, actor_env)


def make_envs(args: Args):
    """(env, env_params, eval_env, spec, torso, make_actor_env): the training
    envs (num_envs), the greedy evaluation's (eval_episodes), the torso for
    their observations, and `make_actor_env(actor_id)`, the envs_per_actor
    environments of a sebulba actor thread. An envpool pool is a stateful
    emulator pool, so each actor thread gets one of its own (role 2 + actor_id:
    its own seeds, common/atari.py 6); so are a `gym:` id's gymnasium envs
    (each call makes new ones, common/host.py; their seeds come from the
    thread's reset key). With --architecture sebulba and either, no num_envs
    envs are made (`env` is None: the actors own them)."""
    if atari.is_envpool(args.env_id):
        # DeepMind's preprocessing by envpool, stepped inside jit (common/atari.py), as ppo.py.
        preprocessing = atari.preprocessing(args)  # the Args' Atari flags as atari.make's keywords
        pool = lambda num, role: atari.make(args.env_id, num, seed=args.seed, role=role, **preprocessing)[0]
        env = pool(args.num_envs, 0) if args.architecture == "anakin" else None
        eval_env = pool(args.eval_episodes, 1)
        spec = eval_env.spec
        if args.capture_video:  # the newest frame at each step of env 0's first game (jaxzoo.video)
            eval_env = envs.RecordEpisode(eval_env, spec.max_episode_steps + 1)
        return env, None, eval_env, spec, "nature", lambda actor_id: pool(args.envs_per_actor, 2 + actor_id)
    max_steps = {"max_episode_steps": args.max_episode_steps} if args.max_episode_steps else {}
    gym = host.is_gym(args.env_id)
    if gym:  # a gymnasium env stepped on the host from inside jit (common/host.py), as ppo.py
        probe_spec = host.spec(args.env_id, **max_steps)
    else:
        probe_spec = envs.spec(*envs.make(args.env_id))
    image_obs = len(probe_spec.obs_shape) == 3
    torso = args.torso if args.torso != "auto" else ("cnn" if image_obs else "mlp")
    if torso in ("cnn", "nature") and not image_obs:
        raise ValueError(
            f"torso={torso!r} needs image observations [H, W, C]; {args.env_id} observations "
            f"have shape {probe_spec.obs_shape} (use torso='mlp' or 'auto')"
        )
    if torso == "nature" and min(probe_spec.obs_shape[:2]) < 36:
        raise ValueError(
            f"torso='nature' needs images of at least 36 x 36 pixels; {args.env_id} observations have shape "
            f"{probe_spec.obs_shape} (MinAtar's 10 x 10: torso='cnn')"
        )
    make_env = lambda num: envs.make(args.env_id, num, flatten_obs=torso == "mlp", **max_steps)[0]
    if gym and args.architecture == "sebulba":  # the actor threads own the host envs (no num_envs of them)
        env, env_params = None, None
    else:
        env, env_params = envs.make(args.env_id, args.num_envs, flatten_obs=torso == "mlp", **max_steps)
    eval_env = make_env(args.eval_episodes)
    spec = envs.spec(eval_env, env_params)
    if args.capture_video:  # record each seed's first evaluation episode for a video (jaxzoo.video)
        eval_env = envs.RecordEpisode(eval_env, spec.max_episode_steps + 1)
    return env, env_params, eval_env, spec, torso, lambda actor_id: make_env(args.envs_per_actor)


def make_train(args: Args) -> IMPALA:
    env, env_params, eval_env, spec, torso, make_actor_env = make_envs(args)
    build = lambda key: ActorCritic(
        spec, torso, args.hidden_sizes, args.activation, args.shared_torso, nnx.Rngs(key), args.conv_padding
    )
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: build(0)))
    num_updates, lag = args.num_updates, args.policy_lag

    def policy(params: nnx.State, obs: jax.Array):
        return nnx.merge(graphdef, params)(obs)

    def make_optimizer(learning_rate):
        adam = optax.adam(learning_rate, eps=args.adam_eps)
        return optax.chain(optax.clip_by_global_norm(args.max_grad_norm), adam) if args.max_grad_norm > 0 else adam

    optimizer = optax.inject_hyperparams(make_optimizer)(learning_rate=args.learning_rate)

    def learner_init(key: jax.Array, hparams: Hyperparams | None = None) -> LearnerState:
        """The learner's half of `init` (the same parameters for the same key),
        all of --architecture sebulba's state: the environments live in the actor threads."""
        hparams = Hyperparams.from_args(args) if hparams is None else hparams
        key, model_key, _ = jax.random.split(key, 3)
        params = nnx.split(build(model_key))[1]
        return LearnerState(
            params=params,
            target_params=params if args.appo else None,
            opt_state=optimizer.init(params),
            key=key,
            update_step=jnp.zeros((), jnp.int32),
            gradient_steps=jnp.zeros((), jnp.int32),
            kl_coef=jnp.float32(args.kl_coef),
            hparams=hparams,
        )

    def init(key: jax.Array, hparams: Hyperparams | None = None) -> RunnerState:
        learner = learner_init(key, hparams)
        env_key = jax.random.split(key, 3)[2]
        obs, env_state = env.reset(env_key, env_params)
        return RunnerState(
            **{f.name: getattr(learner, f.name) for f in dataclasses.fields(LearnerState)},
            # Until policy_lag updates have happened, the actors use the initial parameters.
            actor_params=jax.tree.map(lambda p: jnp.stack([p] * lag), learner.params) if lag else None,
            actor_slot=jnp.zeros((), jnp.int32),
            env_state=env_state,
            obs=obs,
        )

    def learner_update(state, batch: Batch, key: jax.Array):
        """The learner's half of an update, the same in both architectures:
        update_epochs x num_minibatches gradient steps on `batch` [T, num_envs]
        at the annealed learning rate, then APPO's KL coefficient. `state` is a
        RunnerState or a LearnerState (both hold params, target_params,
        opt_state, update_step, gradient_steps, kl_coef, hparams); returns it
        with those advanced, and the learner's metrics."""
        hp = state.hparams
        # Linear annealing as in PureJaxRL: lr_k = lr * (1 - k / num_updates).
        fraction_left = 1.0 - state.update_step / num_updates if args.anneal_lr else 1.0
        learning_rate = hp.learning_rate * fraction_left
        opt_state = state.opt_state._replace(
            hyperparams={**state.opt_state.hyperparams, "learning_rate": learning_rate}
        )
        carry = (state.params, state.target_params, opt_state, state.gradient_steps)
        (params, target_params, opt_state, gradient_steps), stats = learn(
            args, graphdef, optimizer, batch, carry, hp, state.kl_coef, key
        )
        stats = jax.tree.map(jnp.mean, stats)  # means over the update's gradient steps [epochs, minibatches]
        kl_coef = state.kl_coef
        if args.kl_coef > 0:  # RLlib adapts it after each training step
            kl_coef = adapt_kl_coef(kl_coef, stats["target_kl"], args.kl_target)
        new_state = state.replace(
            params=params,
            target_params=target_params,
            opt_state=opt_state,
            update_step=state.update_step + 1,
            gradient_steps=gradient_steps,
            kl_coef=kl_coef,
        )
        return new_state, {**stats, "learning_rate": learning_rate, "kl_coef": state.kl_coef}

    def update(state: RunnerState) -> tuple[RunnerState, dict[str, jax.Array]]:
        """One iteration: the actors roll out with parameters `policy_lag`
        updates old, the learner takes update_epochs x num_minibatches
        gradient steps on it, and its new parameters enter the actors' ring."""
        slot = state.actor_slot
        behaviour_params = state.params if lag == 0 else jax.tree.map(lambda ring: ring[slot], state.actor_params)
        key, rollout_key, learn_key = jax.random.split(state.key, 3)
        (env_state, obs, _), traj = collect_rollout(
            env, env_params, graphdef, behaviour_params, state.env_state, state.obs, rollout_key, args.num_steps
        )
        new_state, learner_metrics = learner_update(state, batch_of(traj), learn_key)
        actor_params = state.actor_params
        if lag:
            # The parameters this update started from replace the oldest copy: the ring
            # now holds the learner's last `lag` parameter versions, oldest at slot + 1.
            actor_params = jax.tree.map(lambda ring, p: ring.at[slot].set(p), actor_params, state.params)
        new_state = new_state.replace(
            actor_params=actor_params,
            actor_slot=(slot + 1) % max(lag, 1),
            env_state=env_state,
            obs=obs,
            key=key,
        )
        return new_state, {**episode_metrics_of(traj, args.env_id), **learner_metrics}

    def train(key: jax.Array, hparams: Hyperparams | None = None):
        """The whole run as one `lax.scan` over updates: jit it, vmap it over
        seeds (keys) and hyperparameters."""
        return jax.lax.scan(lambda s, _: update(s), init(key, hparams), None, num_updates)

    def evaluate(state: RunnerState, key: jax.Array) -> jax.Array:
        """The learner's greedy policy (argmax / Gaussian mean), one episode in
        each of `eval_episodes` envs; returns their undiscounted returns [eval_episodes]."""
        actor = nnx.merge(graphdef, state.params).act
        return envs.evaluate_episodes(
            eval_env, env_params, lambda obs: actor(obs).mode(), key, spec.max_episode_steps + 1
        )

    params_like = jax.eval_shape(lambda: nnx.split(build(jax.random.key(0)))[1])

    @functools.cache
    def actors(actor_id: int):
        """--architecture sebulba: actor thread `actor_id`'s functions on its
        envs_per_actor environments (envpool: a pool of its own; gym: gymnasium
        envs of its own; both made on first call. gymnax envs are pure, so every
        thread shares actor 0's functions)."""
        if actor_id and not (atari.is_envpool(args.env_id) or host.is_gym(args.env_id)):
            return actors(0)
        actor_env = make_actor_env(actor_id) if args.architecture == "sebulba" else env
        return actor_functions(args, actor_env, env_params, graphdef, params_like)

    actor_reset, actor_rollout, unpack_rollout, _ = actors(0)
    return IMPALA(
        init,
        update,
        train,
        evaluate,
        policy,
        spec,
        learner_init,
        learner_update,
        actor_reset,
        actor_rollout,
        unpack_rollout,
        actors,
    )


# --------------------------------------------------------------------------- #
# Actor-learner (--architecture sebulba): Python threads on JAX devices
# --------------------------------------------------------------------------- #
class ParameterSlot:
    """The learner's newest parameters, packed into one array [P] (`pack`),
    and their version (the updates they have seen), behind a lock. The learner publishes after every update: it
    copies the parameters to every actor device (`jax.device_put`, dispatched
    asynchronously) and swaps them in; every actor thread reads its device's
    copy before each rollout. The copies are made on the learner's thread
    because jax 0.10.2's `device_put` of one multi-device array from several
    threads at once can corrupt the array's list of buffers (seen here with a
    learner on two devices)."""

    def __init__(self, version: int, params: jax.Array, devices: list):
        self._lock = threading.Lock()
        self._devices = list(dict.fromkeys(devices))  # each actor device once
        self.publish(version, params)

    def publish(self, version: int, params: jax.Array) -> None:
        copies = {device: jax.device_put(params, device) for device in self._devices}
        with self._lock:
            self._version, self._copies = version, copies

    def read(self, device) -> tuple[int, jax.Array]:
        """(version, the parameters on `device`)."""
        with self._lock:
            return self._version, self._copies[device]


class ActorThreads:
    """`num_actor_threads` Python threads. Actor i steps its own envs_per_actor
    environments on `devices[i % len(devices)]` with a jitted rollout
    (`collect_rollout`, the in-jit mode's) and the parameters the learner last
    copied to that device (`ParameterSlot`), and puts each rollout [T, envs_per_actor], with its log mu and the
    parameter version it acted with, into the bounded queue (blocking while it
    is full). Together they make exactly `blocks` blocks (what the learner's
    remaining updates take), so a finished run leaves the queue empty; `halt`
    stops them after their current rollout. An exception in a thread halts
    all of them and is kept in `errors` for the learner to raise."""

    def __init__(
        self, args: Args, algo: IMPALA, devices, slot: ParameterSlot, trajectories: queue.Queue, blocks: int, key
    ):
        self.slot, self.queue = slot, trajectories
        self.halt = threading.Event()
        self.errors: list[BaseException] = []
        self.produced: list[list[int]] = []  # [actor id, sequence] of every block put in the queue
        self._blocks_left, self._lock = blocks, threading.Lock()
        # Each thread's jitted reset and rollout; threads with the same functions (gymnax
        # envs) share them, an envpool or gym: thread has its own (its pool, or its host
        # envs' callbacks, are named in its programs).
        # The env state and observations are the thread's own: updated in place.
        jitted: dict[Any, tuple[Any, Any]] = {}
        self._programs = []
        for actor_id in range(args.num_actor_threads):
            reset, rollout, _, _ = algo.actors(actor_id)
            if reset not in jitted:
                jitted[reset] = (
                    jax.jit(reset, compiler_options=runner.RUN_ONCE),
                    jax.jit(rollout, donate_argnums=(1, 2)),
                )
            self._programs.append(jitted[reset])
        self._ready = [threading.Event() for _ in range(args.num_actor_threads)]  # rollout compiled
        self.threads = [
            threading.Thread(
                target=self._run,
                args=(i, devices[i % len(devices)], jax.random.fold_in(key, i)),
                name=f"impala-actor-{i}",
                daemon=True,  # a second Ctrl-C ends the process even if one is stuck
            )
            for i in range(args.num_actor_threads)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def wait_ready(self, stopped) -> None:
        """Wait until every actor has compiled its rollout for its device, or
        `stopped()` is true, or an actor failed: the learner's clock starts after."""
        while not all(event.wait(0.05) for event in self._ready) and not stopped() and not self.errors:
            pass

    def stop(self, timeout: float) -> list[str]:
        """Halt the threads and join them; returns the names of any still alive after `timeout` seconds."""
        self.halt.set()
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        return [thread.name for thread in self.threads if thread.is_alive()]

    def _take_block(self) -> bool:
        with self._lock:
            if self._blocks_left == 0 or self.halt.is_set():
                return False
            self._blocks_left -= 1
            return True

    def _run(self, actor_id: int, device, key: jax.Array) -> None:
        try:
            self._act(actor_id, device, key)
        except BaseException as error:  # handed to the learner, which raises it
            self.errors.append(error)
            self.halt.set()

    def _act(self, actor_id: int, device, key: jax.Array) -> None:
        reset, jitted_rollout = self._programs[actor_id]
        key, reset_key = jax.random.split(jax.device_put(key, device))
        obs, env_state = reset(reset_key)
        version, params = self.slot.read(device)
        rollout = jitted_rollout.lower(params, env_state, obs, key).compile()  # for this device
        self._ready[actor_id].set()
        sequence = 0
        while self._take_block():
            version, params = self.slot.read(device)  # the learner's newest, already on this device
            (env_state, obs, key), packed = rollout(params, env_state, obs, key)
            block = TrajectoryBlock(jax.block_until_ready(packed), actor_id, sequence, version)
            while not self.halt.is_set():
                try:
                    self.queue.put(block, timeout=0.05)
                except queue.Full:
                    continue
                self.produced.append([actor_id, sequence])
                sequence += 1
                break


@dataclass
class SebulbaResult(runner.RunResult):
    """What `main` returns with --architecture sebulba: runner.RunResult
    (`state` is the final LearnerState, without a seed axis; metrics and
    eval_returns have the seed axis of size 1; `chunk_traces` counts the
    traces of the learner's step) and the queue's `ledger` of this process."""

    ledger: dict[str, Any] = dataclasses.field(default_factory=dict)


def sebulba_devices(args: Args) -> tuple[list, list]:
    """(actor devices, learner devices) from the device ids, refusing ids
    outside jax.devices()."""
    devices = jax.devices()
    for name in ("actor_device_ids", "learner_device_ids"):
        ids = getattr(args, name)
        if max(ids) >= len(devices):
            raise ValueError(
                f"{name}={ids!r} names a device that does not exist: {len(devices)} visible "
                f"({devices[0].platform}); accepted: ids in 0 ... {len(devices) - 1} (on a CPU, "
                "XLA_FLAGS=--xla_force_host_platform_device_count=N makes N devices)"
            )
    return [devices[i] for i in args.actor_device_ids], [devices[i] for i in args.learner_device_ids]


class SebulbaLearner:
    """The learner of --architecture sebulba, on the main thread (where the
    signals arrive): it takes num_actor_threads trajectory blocks from the
    queue per update, places them on the learner devices (split along the
    environment axis when there are several), runs the in-jit mode's learner
    update on them (`learner_update`: V-trace, the IMPALA or APPO loss, the
    optimiser), publishes the new parameters, and logs, checkpoints and
    evaluates like jaxzoo.runner. Its bookkeeping of the blocks (`consumed`,
    `unused`) and the actors' `produced` form the run's ledger."""

    def __init__(self, args: Args, algo: IMPALA, learner_devices: list, run_dir):
        self.args, self.algo, self.run_dir = args, algo, run_dir
        mesh = Mesh(np.asarray(learner_devices), (parallel.DATA_AXIS,))
        # Several learner devices: the data mode of jaxzoo.parallel (`constrain_data` in minibatch_step).
        self.layout = parallel.Layout("data", mesh) if len(learner_devices) > 1 else parallel.Layout("off", None)
        self.replicated = NamedSharding(mesh, P())
        self.block_sharding = NamedSharding(mesh, P(None, parallel.DATA_AXIS))  # [T, envs_per_actor, ...]
        self.abstract_state = jax.eval_shape(algo.learner_init, jax.random.key(0))
        self.consumed: list[list[int]] = []  # [actor id, sequence, update] of every block learned from
        self.unused: list[list[int]] = []  # [actor id, sequence] of blocks left when a signal stopped the run
        self.pending: list[dict[str, Any]] = []  # updates not yet written to metrics.csv
        self.history: dict[str, list[np.ndarray]] = {}
        self.traces = 0
        # The training loop's clock: its start, the seconds a resumed run had already spent, the last flush.
        self.start = self.last_flush = time.perf_counter()
        self.clock_before_resume = 0.0

    def compile(self):
        """The learner's step, lowered for the placed state and blocks and compiled once."""
        algo, k = self.algo, self.args.num_actor_threads

        def step(state: LearnerState, blocks: tuple[jax.Array, ...]):
            """(state, packed blocks [T, envs_per_actor, F] x k) -> (state, metrics,
            first non-finite leaf of the state or -1, the new parameters packed [P])."""
            self.traces += 1
            traj = algo.unpack_rollout(jnp.concatenate(blocks, axis=1))  # Transition [T, num_envs]
            key, learn_key = jax.random.split(state.key)
            state, metrics = algo.learner_update(state.replace(key=key), batch_of(traj), learn_key)
            metrics = {**episode_metrics_of(traj, self.args.env_id), **metrics}
            return state, metrics, runner.first_nonfinite_leaf(state), pack(state.params, 0)

        def one_block(state, key):
            obs, env_state = algo.actor_reset(key)
            return algo.actor_rollout(pack(state.params, 0), env_state, obs, key)[1]

        placed = lambda tree, sharding: jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree
        )
        block = placed(jax.eval_shape(one_block, self.abstract_state, jax.random.key(0)), self.block_sharding)
        with self.layout.tracing():
            lowered = jax.jit(step, out_shardings=self.replicated).lower(
                placed(self.abstract_state, self.replicated), (block,) * k
            )
        return lowered.compile()

    def initial_state(self) -> tuple[LearnerState, int]:
        """(the learner state on the learner devices, updates done): fresh, or from the newest checkpoint."""
        args = self.args
        if args.resume is None:
            init = jax.jit(self.algo.learner_init, out_shardings=self.replicated, compiler_options=runner.RUN_ONCE)
            return init(jax.random.key(args.seed)), 0
        state, updates_done = checkpoint.restore(self.run_dir, self.abstract_state)
        if updates_done > args.num_updates:
            raise ValueError(
                f"--resume {self.run_dir}: its checkpoint is at update {updates_done}, past this run's "
                f"{args.num_updates} updates (total_timesteps={args.total_timesteps}); give a larger "
                "--total-timesteps to continue it"
            )
        return jax.device_put(state, self.replicated), updates_done

    def take(self, actors: ActorThreads, trajectories: queue.Queue, stop: runner.StopRequest):
        """num_actor_threads blocks from the queue, whichever actors made them,
        or None if a signal or a failed actor stops the run first (blocks
        already taken are then `unused`)."""
        blocks: list[TrajectoryBlock] = []
        while len(blocks) < self.args.num_actor_threads:
            if stop.signum is not None or actors.errors:
                self.unused.extend([b.actor_id, b.sequence] for b in blocks)
                return None
            try:
                blocks.append(trajectories.get(timeout=0.05))
            except queue.Empty:
                continue
        return blocks

    def record(self, update: int, blocks: list[TrajectoryBlock], metrics, bad_leaf, fill: float, waited: float):
        """Keep one update's metrics (device arrays, copied at the next flush) and ledger entries."""
        self.consumed.extend([b.actor_id, b.sequence, update] for b in blocks)
        lags = np.array([update - 1 - b.params_version for b in blocks])  # learner updates since the acting parameters
        host = {
            "policy_lag_mean": lags.mean(),
            "policy_lag_max": lags.max(),
            "queue_fill": fill,
            "learner_wait_seconds": waited,
        }
        self.pending.append({"update": update, "metrics": metrics, "bad_leaf": bad_leaf, "host": host})

    def flush(self, run_log, evaluation: float | None = None) -> None:
        """Write the pending updates to metrics.csv (one row each) and stop
        the run (`cli.Diverged`) if the learner's state became non-finite."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        device = jax.device_get([(p["metrics"], p["bad_leaf"]) for p in pending])
        now = time.perf_counter()
        count, steps = len(pending), self.args.batch_size
        update = np.array([p["update"] for p in pending])
        metrics = {name: np.array([[m[name] for m, _ in device]], np.float64) for name in device[0][0]}
        for name in pending[0]["host"]:
            metrics[name] = np.array([[p["host"][name] for p in pending]], np.float64)
        # Env steps the learner consumed per second since the last flush (the actors make no more).
        metrics["steps_per_second"] = np.full((1, count), count * steps / max(now - self.last_flush, 1e-9))
        metrics["wall_seconds"] = np.full((1, count), self.clock_before_resume + now - self.start)
        self.last_flush = now
        if self.args.eval_every:
            metrics["eval_return"] = np.full((1, count), np.nan)
            if evaluation is not None:
                metrics["eval_return"][0, -1] = evaluation
        run_log.log(update, update * steps, metrics)
        for name, values in metrics.items():
            self.history.setdefault(name, []).append(values)
        bad = [(u, int(leaf)) for u, (_, leaf) in zip(update, device) if leaf >= 0]
        health = np.array([bad[0] if bad else (-1, -1)])
        runner.check_health(health, self.abstract_state, metrics, int(update[0]) - 1, self.args, self.run_dir)

    def train(self, step, evaluate, state: LearnerState, updates_done: int, run_log, actors, trajectories, stop):
        """Updates updates_done + 1 ... num_updates, or until a signal or a
        failed actor stops them. Returns (state, updates done, last
        checkpoint, final evaluation [1, eval_episodes] or None)."""
        args, num_updates = self.args, self.args.num_updates
        kept = logger.read_metrics(run_log.dir) if args.resume and (run_log.dir / "metrics.csv").exists() else {}
        if "wall_seconds" in kept and (kept["update"] == updates_done).any():  # the clock continues on resume
            self.clock_before_resume = float(kept["wall_seconds"][kept["update"] == updates_done].max())
        self.start = self.last_flush = time.perf_counter()
        done = last_checkpoint = updates_done
        eval_returns = None
        for update in range(updates_done + 1, num_updates + 1):
            fill, wait_start = trajectories.qsize() / args.queue_size, time.perf_counter()
            blocks = self.take(actors, trajectories, stop)
            if blocks is None:
                break
            waited = time.perf_counter() - wait_start
            placed = tuple(jax.device_put(b.rollout, self.block_sharding) for b in blocks)
            state, metrics, bad_leaf, packed_params = step(state, placed)
            actors.slot.publish(update, packed_params)
            self.record(update, blocks, metrics, bad_leaf, fill, waited)
            done, evaluation = update, None
            if args.eval_every and (update % args.eval_every == 0 or update == num_updates):
                eval_returns = np.asarray(evaluate(state))[None]
                evaluation = float(eval_returns.mean())
            if update % args.log_every == 0 or update == num_updates or evaluation is not None:
                self.flush(run_log, evaluation)
            if args.save_model and (update - last_checkpoint >= args.checkpoint_every or update == num_updates):
                self.flush(run_log)  # metrics.csv never lacks rows a resumed run would not redo
                checkpoint.save(run_log.dir, update, state)
                last_checkpoint = update
        self.flush(run_log)
        return state, done, last_checkpoint, eval_returns


def train_sebulba(args: Args, run_dir, stop: runner.StopRequest, actor_devices, learner_devices) -> SebulbaResult:
    """--architecture sebulba inside its locked run directory (`main_sebulba`):
    start the actors, run the learner, stop and join everything (after a
    signal: checkpoint and exit 128 + signum), evaluate greedily."""
    algo = make_train(args)
    learner = SebulbaLearner(args, algo, learner_devices, run_dir)
    compile_start = time.perf_counter()
    state, updates_done = learner.initial_state()
    run_log = logger.Run(
        args,
        run_dir,
        total_steps=args.num_updates * args.batch_size,
        tensorboard=args.tensorboard,
        track=args.track,
        resume_from_update=updates_done if args.resume else None,
        meta={"algorithm": "impala", "jaxzoo_version": runner.package_version()},
    )
    trajectories: queue.Queue[TrajectoryBlock] = queue.Queue(maxsize=args.queue_size)
    # A resumed run's actors start fresh episodes, from keys of their own.
    actor_key = jax.random.fold_in(jax.random.fold_in(jax.random.key(args.seed), 2), updates_done)
    blocks = (args.num_updates - updates_done) * args.num_actor_threads
    slot = ParameterSlot(updates_done, jax.jit(functools.partial(pack, batch_dims=0))(state.params), actor_devices)
    actors = ActorThreads(args, algo, actor_devices, slot, trajectories, blocks, actor_key)
    eval_key = jax.random.fold_in(jax.random.key(args.seed), 1)  # as jaxzoo.runner's evaluation
    compiled_eval = jax.jit(algo.evaluate, compiler_options=None if args.eval_every else runner.RUN_ONCE)
    evaluate = lambda state: compiled_eval(state, eval_key)
    try:
        actors.start()  # they compile their rollouts while the learner compiles its step
        step = learner.compile()
        actors.wait_ready(lambda: stop.signum is not None)
        compile_seconds = time.perf_counter() - compile_start  # the learner's and the actors' programs
        run_log.print(
            f"{args.env_id}: sebulba, {args.num_actor_threads} actor thread(s) on "
            f"{', '.join(str(d) for d in actor_devices)}, learner on {', '.join(str(d) for d in learner_devices)} "
            f"({learner.layout.describe()}), {args.num_updates} updates x {args.batch_size} steps, queue of "
            f"{args.queue_size} -> {run_log.dir}" + (f" (resumed at update {updates_done})" if args.resume else "")
        )
        state, done, last_checkpoint, eval_returns = learner.train(
            step, evaluate, state, updates_done, run_log, actors, trajectories, stop
        )
        train_seconds = time.perf_counter() - learner.start
        alive = actors.stop(timeout=60.0)
        if actors.errors:
            raise actors.errors[0]
        if alive:
            raise RuntimeError(f"actor threads {alive} did not stop within 60 s of the learner's end")
        while not trajectories.empty():  # blocks made before a signal stopped the run, never learned from
            block = trajectories.get_nowait()
            learner.unused.append([block.actor_id, block.sequence])
        ledger = {"resumed_at_update": updates_done, "produced": actors.produced, "consumed": learner.consumed}
        ledger["unused"] = learner.unused
        with open(run_log.dir / "queue_ledger.jsonl", "a") as f:  # one line per process of the run
            f.write(json.dumps(ledger) + "\n")
        run_log.progress(done * args.batch_size, final=True)
        if stop.signum is not None and done < args.num_updates:
            _stop_sebulba(args, run_log, stop.signum, state, done, last_checkpoint)
        if eval_returns is None:
            eval_returns = np.asarray(evaluate(state))[None]  # [1 seed, eval_episodes]
        metrics = {name: np.concatenate(values, axis=1) for name, values in learner.history.items()}
        lags = metrics.get("policy_lag_mean", np.zeros((1, 0)))
        steps_per_second = metrics.get("steps_per_second", np.zeros((1, 0)))
        runner.write_evaluation(  # eval.json, summary.json, run_info.json as jaxzoo.runner writes them
            args,
            run_log,
            eval_returns,
            chunk_traces=learner.traces,
            compile_seconds=compile_seconds,
            train_seconds=train_seconds,
            per_seed=False,
            note=f", {np.median(steps_per_second):,.0f} env steps/s (median over logged updates), "
            f"policy lag {lags.mean():.2f} updates on average"
            if lags.size
            else "",
        )
        return SebulbaResult(
            str(run_log.dir), state, metrics, eval_returns, learner.traces, compile_seconds, train_seconds, ledger
        )
    finally:
        actors.stop(timeout=60.0)  # on every way out (an error, a second Ctrl-C): no thread outlives the run
        run_log.close()


def _stop_sebulba(args: Args, run_log, signum: int, state: LearnerState, done: int, last_checkpoint: int):
    """After SIGINT / SIGTERM: a checkpoint of the learner at the update it
    stopped after, the resume command, exit 128 + signum (as jaxzoo.runner)."""
    if args.save_model and done > last_checkpoint:
        checkpoint.save(run_log.dir, done, state)
        last_checkpoint = done
    kept = checkpoint.latest_update(run_log.dir)
    saved = (
        "no checkpoint (--no-save-model)"
        if not args.save_model
        else f"checkpoint at update {kept} written"
        if kept is not None
        else "no checkpoint yet (stopped before the first update): start it again instead"
    )
    run_log.print(
        f"stopped by {signal.Signals(signum).name} after update {done} of {args.num_updates}; "
        f"{saved}. Resume with:\n  {runner.resume_command(run_log.dir)}"
    )
    raise SystemExit(128 + signum)


def main_sebulba(args: Args) -> SebulbaResult:
    """--architecture sebulba (after `runner.prepare`): the devices and flags
    checked before a run directory is made, then `train_sebulba` in it."""
    if args.capture_video:
        raise ValueError(
            "capture_video=True is not accepted with architecture='sebulba' yet; accepted: --architecture anakin"
        )
    actor_devices, learner_devices = sebulba_devices(args)
    with runner.open_run_dir(args, "impala") as run_dir, runner.StopRequest() as stop:
        return train_sebulba(args, run_dir, stop, actor_devices, learner_devices)


# --------------------------------------------------------------------------- #
# Host loop
# --------------------------------------------------------------------------- #
def main(args: Args) -> runner.RunResult:
    """Train `num_seeds` seeds in chunks of `log_every` updates (common/runner.py:
    run directory, metrics.csv, progress, checkpoints, resume), then evaluate greedily."""
    # Resume, run-root and cache checks, before anything is built; the CPU devices of --parallel (Args.DATA_AXIS).
    args = runner.prepare(args, "impala")
    if args.architecture == "sebulba":  # actor threads and a learner on the host (docs/impala.md, Actor-learner)
        return main_sebulba(args)
    impala = make_train(args)
    return runner.run(
        args,
        "impala",
        impala.init,
        impala.update,
        impala.evaluate,
        num_updates=args.num_updates,
        steps_per_update=args.batch_size,
        eval_every=args.eval_every,
        # --parallel data: the environments (axis 0 of env_state and obs) are split over devices.
        data_axes=lambda state: jax.tree.map(lambda _: None, state).replace(env_state=0, obs=0),
    )


if __name__ == "__main__":
    with cli.user_errors():
        main(cli.parse(Args, "impala"))
