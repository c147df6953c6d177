"""Proximal Policy Optimization, the whole run in one `jax.jit`.

Papers: Schulman et al. 2017, "Proximal Policy Optimization Algorithms"
(arXiv:1707.06347); advantages by GAE, Schulman et al. 2016, "High-Dimensional
Continuous Control Using Generalized Advantage Estimation" (arXiv:1506.02438).

The idea: collect `num_steps` x `num_envs` transitions with the current policy,
estimate advantages with GAE, then take several epochs of minibatch gradient
steps on a surrogate objective whose probability ratio is clipped to
[1 - eps, 1 + eps], so each update stays close to the policy that collected the
data. Rollout, GAE, and every update run inside one compiled `lax.scan`,
vmapped over seeds (the PureJaxRL recipe); truncated episodes bootstrap from
the final observation instead of being treated as terminal.

    python algos/ppo.py                                   # CartPole-v1, 500k steps
    python algos/ppo.py --preset breakout-minatar --num-seeds 4
    python algos/ppo.py --preset pendulum                 # continuous actions
    python algos/ppo.py --preset atari                    # envpool:Breakout-v5 from pixels (atari extra)
    python algos/ppo.py --env-id gym:LunarLander-v3       # any gymnasium env, stepped on the host (docs/gym.md)
    python algos/ppo.py --preset pixel-cartpole           # CartPole-v1 from 64 x 64 images drawn in JAX

Details, logged metrics and measured results: docs/ppo.md.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, NamedTuple, TypeAlias

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct

from jaxzoo import atari, cli, envs, host, layers, parallel, pixels, runner
from jaxzoo.checks import AtLeastOne, Fraction, NonNegative, Positive, check_fields


# --------------------------------------------------------------------------- #
# Arguments
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class Args:
    """PPO (Schulman et al. 2017) on a gymnax environment, an envpool Atari game or a gymnasium env, jitted end to end."""

    exp_name: str = "ppo"
    """name of the experiment: part of the run directory and the plot label"""
    seed: Annotated[int, NonNegative] = 0
    """seed of the first run; seed index i uses seed + i"""
    num_seeds: Annotated[int, AtLeastOne] = 1
    """independent seeds trained at once with `jax.vmap`"""
    env_id: str = "CartPole-v1"
    """gymnax environment id; an Atari game stepped by envpool inside jit, 'envpool:<Game>-v5' (needs the `atari` extra; one seed per process; docs/ppo.md, Atari); a gymnax env drawn as images in JAX, 'pixels:<id>' (CartPole-v1, Pendulum-v1; common/pixels.py: image_size, grayscale, frame_stack); or any gymnasium id, 'gym:<id>', stepped on the host (one seed per process; docs/gym.md)"""
    total_timesteps: Annotated[int, AtLeastOne] = 500_000
    """environment steps per seed"""
    log_every: Annotated[int, AtLeastOne] = 10
    """updates per jitted chunk: metrics, progress and checkpoints happen between chunks"""
    track: bool = False
    """log to Weights & Biases (needs the `logging` extra)"""
    tensorboard: bool = False
    """write TensorBoard event files into the run directory (needs the `logging` extra)"""
    save_model: bool = True
    """write checkpoints of the whole runner state (needed for --resume)"""
    checkpoint_every: Annotated[int, AtLeastOne] = 100
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
    max_episode_steps: Annotated[int, NonNegative] = 0
    """time limit of an episode in env steps; 0 keeps the env's own (200 makes CartPole-v1 into CartPole-v0; Atari's is 27,000 agent steps, 108k frames)"""
    num_envs: Annotated[int, AtLeastOne] = 4
    """parallel environments per seed"""
    DATA_AXIS: ClassVar[str] = "num_envs"
    """the field --parallel data splits over the devices (the environments; runner.data_axis)"""
    num_steps: Annotated[int, AtLeastOne] = 128
    """env steps per environment per rollout"""
    learning_rate: Annotated[float, Positive] = 2.5e-4
    """Adam learning rate"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over the run"""
    adam_eps: Annotated[float, Positive] = 1e-5
    """Adam epsilon"""
    gamma: Annotated[float, Fraction] = 0.99
    """discount factor"""
    gae_lambda: Annotated[float, Fraction] = 0.95
    """GAE lambda"""
    num_minibatches: Annotated[int, AtLeastOne] = 4
    """minibatches per epoch; must divide num_envs * num_steps"""
    update_epochs: Annotated[int, AtLeastOne] = 4
    """epochs over each rollout"""
    norm_adv: bool = True
    """normalise advantages within each minibatch"""
    clip_coef: Annotated[float, Positive] = 0.2
    """surrogate clipping epsilon"""
    clip_vloss: bool = True
    """clip the value loss around the rollout's value predictions"""
    vf_clip_coef: Annotated[float, Positive] = 0.2
    """value clipping range (RLlib's vf_clip_param is 10)"""
    ent_coef: Annotated[float, NonNegative] = 0.01
    """entropy bonus coefficient"""
    vf_coef: Annotated[float, NonNegative] = 0.5
    """value loss coefficient"""
    max_grad_norm: Annotated[float, NonNegative] = 0.5
    """global gradient-norm clip (0 turns clipping off, as RLlib's default grad_clip=None)"""
    target_kl: Annotated[float, NonNegative] = 0.0
    """stop the epochs of an update once an epoch's mean approx-KL exceeds this (0: never)"""
    kl_coef: Annotated[float, NonNegative] = 0.0
    """initial adaptive KL-penalty coefficient as in RLlib (0: no penalty)"""
    kl_target: Annotated[float, Positive] = 0.01
    """KL target of the adaptive penalty: x1.5 above 2x target, x0.5 below half"""
    torso: Literal["auto", "mlp", "cnn", "nature"] = "auto"
    """network torso: cnn is the MinAtar network, nature the Nature DQN convolutions; auto picks nature for envpool ids, cnn for other image observations [H, W, C], mlp otherwise"""
    hidden_sizes: Annotated[tuple[int, ...], AtLeastOne] = (64, 64)
    """MLP layer widths (after the convolutions for the cnn and nature torsos; empty: none)"""
    conv_padding: Literal["valid", "same"] = "valid"
    """padding of the nature torso's convolutions: valid (Nature DQN, CleanRL) or same (RLlib's CNN encoder, out = ceil(in / stride))"""
    activation: Literal["tanh", "relu"] = "tanh"
    """hidden-layer activation"""
    shared_torso: bool = False
    """actor and critic share one torso (else two separate ones)"""
    normalize_obs: bool = False
    """running observation normalisation (continuous control)"""
    normalize_reward: bool = False
    """scale rewards by the running std of the discounted return (continuous control)"""
    # Atari preprocessing (DeepMind's, done by envpool; envpool ids only; common/atari.py)
    frame_skip: Annotated[int, AtLeastOne] = 4
    """Atari: emulator frames per agent step, the action repeated (the last two frames max-pooled)"""
    frame_stack: Annotated[int, AtLeastOne] = 4
    """Atari and pixels: ids: frames stacked on the channel axis of an observation"""
    noop_max: Annotated[int, AtLeastOne] = 30
    """Atari: up to this many no-op frames at every reset, drawn uniformly (1: no random no-op starts)"""
    episodic_life: bool = True
    """Atari: a lost life is `terminated` for the learner (the logged score stays the whole game's)"""
    fire_reset: bool = True
    """Atari: press FIRE after every reset in games that need it to start"""
    reward_clip: bool = True
    """Atari: the learner sees the sign of each reward (the logged score is unclipped)"""
    image_size: Annotated[int, AtLeastOne] = 84
    """Atari and pixels: ids: side of the square frames in pixels"""
    grayscale: bool = True
    """Atari and pixels: ids: one-channel frames instead of RGB"""
    cpu_threads: Annotated[int, NonNegative] = 0
    """XLA:CPU's intra-op threads in a one-device CPU run (0: one per core); 1 suits tiny networks such as CartPole's (jaxzoo.parallel.start_cpu_backend)"""

    def __post_init__(self):
        check_fields(self)  # the ranges beside the fields (jaxzoo.checks)
        if atari.is_envpool(self.env_id):  # what an envpool id cannot do (common/atari.py), normalisation too
            normalize = (
                self.normalize_obs or self.normalize_reward,
                "normalize_obs and normalize_reward are for continuous control",
            )
            atari.check_args(self, extra=[normalize])
        if host.is_gym(self.env_id):
            host.check_args(self)  # what a gym: id cannot do (common/host.py)
        if pixels.is_pixels(self.env_id) and (self.normalize_obs or self.torso == "mlp"):
            raise ValueError(
                f"env_id {self.env_id!r} has image observations: normalize_obs and torso='mlp' are for "
                "observation vectors; accepted: torso auto, cnn or nature, without normalize_obs"
            )
        if self.batch_size % self.num_minibatches:
            raise ValueError(
                f"the batch num_envs * num_steps = {self.num_envs} * {self.num_steps} = "
                f"{self.batch_size} does not divide into num_minibatches={self.num_minibatches} "
                f"minibatches; accepted: a divisor of {self.batch_size}"
            )
        if self.num_updates < 1:
            raise ValueError(
                f"total_timesteps={self.total_timesteps} is less than one batch "
                f"(num_envs * num_steps = {self.batch_size}); accepted: total_timesteps >= {self.batch_size}"
            )

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.batch_size


# --------------------------------------------------------------------------- #
# Networks
# --------------------------------------------------------------------------- #
ACTIVATIONS = {"tanh": jnp.tanh, "relu": jax.nn.relu}


def dense(in_features: int, out_features: int, scale: float, rngs: nnx.Rngs) -> nnx.Linear:
    """Linear layer with orthogonal weights (gain `scale`) and zero bias, as in
    the PPO implementation details (Huang et al. 2022, detail 2)."""
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
    channels and no padding, then an MLP (the MinAtar network, Young & Tian 2019).

    The convolution is written as patches @ kernel: the 9 shifted [H-2, W-2, C]
    views are concatenated to [H-2, W-2, 9C] (`jaxzoo.layers.patches`, shared by
    every file with this network) and multiplied by a [9C, 16] kernel.
    Same function as `lax.conv`, but XLA:CPU runs the kernel gradient of a real
    convolution about 15x slower inside a `lax.scan` (measured in docs/ppo.md),
    and the whole update is a scan.
    """

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


# The policies: a categorical over logits for discrete actions, a diagonal
# Gaussian for continuous ones. Written out rather than taken from distrax (as
# PureJaxRL does): the four methods PPO needs are a few lines each, and
# importing distrax (TensorFlow Probability's JAX substrate) cost 0.5 s of a
# 10.8 s cold CartPole run (issue 27, docs/performance.md). The same draws
# and formulas as distrax's (tests/test_ppo_math.py checks them against it),
# equal to about the last bit: a run's numbers match an earlier version's for
# a few updates, then drift apart as any two compiled programs' rounding may
# (8 CartPole seeds: 500.0 on every one, before and after).
class Categorical(NamedTuple):
    """pi(a) = softmax(logits)_a; logits [B, A], actions [B] int."""

    logits: jax.Array

    def sample(self, seed: jax.Array) -> jax.Array:
        return jax.random.categorical(seed, self.logits)

    def log_prob(self, action: jax.Array) -> jax.Array:
        log_probs = jax.nn.log_softmax(self.logits)
        return jnp.take_along_axis(log_probs, action[..., None].astype(jnp.int32), axis=-1)[..., 0]

    def entropy(self) -> jax.Array:
        """-sum_a pi(a) log pi(a) [B]."""
        log_probs = jax.nn.log_softmax(self.logits)
        return -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)

    def mode(self) -> jax.Array:
        return jnp.argmax(self.logits, axis=-1)


class DiagonalGaussian(NamedTuple):
    """N(mean, diag(std^2)) over actions; mean, std [B, A]."""

    mean: jax.Array
    std: jax.Array

    def sample(self, seed: jax.Array) -> jax.Array:
        return self.mean + self.std * jax.random.normal(seed, self.mean.shape, self.mean.dtype)

    def log_prob(self, action: jax.Array) -> jax.Array:
        """sum_i -(a_i - mean_i)^2 / (2 std_i^2) - log std_i - log(2 pi) / 2  [B]."""
        z = (action - self.mean) / self.std
        return jnp.sum(-0.5 * jnp.square(z) - jnp.log(self.std) - 0.5 * jnp.log(2 * jnp.pi), axis=-1)

    def entropy(self) -> jax.Array:
        """sum_i log std_i + (1 + log(2 pi)) / 2  [B]."""
        return jnp.sum(jnp.log(self.std) + 0.5 * (1.0 + jnp.log(2 * jnp.pi)), axis=-1)

    def mode(self) -> jax.Array:
        return self.mean


Distribution: TypeAlias = Categorical | DiagonalGaussian


class ActorCritic(nnx.Module):
    """obs [B, *obs_shape] -> (policy parameters, value [B]).

    Discrete: logits [B, A]. Continuous: Gaussian mean [B, A] with a learned,
    state-independent log-std [A]. The policy head starts near uniform
    (orthogonal gain 0.01), the value head with gain 1.
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
            return Categorical(out)
        return DiagonalGaussian(out, jnp.exp(self.log_std[...]) * jnp.ones_like(out))

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
    gamma: jax.Array  # [] discount of GAE
    gae_lambda: jax.Array  # [] GAE lambda
    clip_coef: jax.Array  # [] surrogate clipping epsilon
    ent_coef: jax.Array  # [] weight of the entropy bonus
    vf_coef: jax.Array  # [] weight of the value loss

    @classmethod
    def from_args(cls, args: Args) -> Hyperparams:
        return cls(*(jnp.float32(getattr(args, f.name)) for f in dataclasses.fields(cls)))


class Transition(NamedTuple):
    """One rollout step; under the rollout scan every field gains `[T, N]` in front."""

    obs: jax.Array  # [N, *obs_shape]
    action: jax.Array  # [N] (discrete) or [N, A]
    log_prob: jax.Array  # [N] log-prob of `action` under the collecting policy
    reward: jax.Array  # [N]
    terminated: jax.Array  # [N] bool: the episode really ended, V(next) = 0
    truncated: jax.Array  # [N] bool: time limit; bootstrap from final_obs
    final_obs: jax.Array  # [N, *obs_shape] info["final_observation"]: the true next state, before any reset
    episode_done: jax.Array  # [N] bool, from jaxzoo.envs.EpisodeStatistics
    episode_return: jax.Array  # [N]
    episode_length: jax.Array  # [N]
    value: jax.Array | None = None  # [N] V(obs) from the acting pass with a shared torso, else None


class Batch(NamedTuple):
    """What a minibatch gradient step needs; leading axis [B] (or [minibatch])."""

    obs: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    advantage: jax.Array
    target_return: jax.Array


class RunnerState(struct.PyTreeNode):
    """Everything a run carries from one update to the next (and checkpoints)."""

    params: nnx.State
    opt_state: optax.OptState
    env_state: Any  # wrapped gymnax state, leaves [num_envs, ...]
    obs: jax.Array  # [num_envs, *obs_shape]
    key: jax.Array  # typed PRNG key
    update_step: jax.Array  # [] updates completed
    kl_coef: jax.Array  # [] adaptive KL-penalty coefficient (0 when off)
    hparams: Hyperparams


# --------------------------------------------------------------------------- #
# Algorithm logic (pure functions; the unit tests import these)
# --------------------------------------------------------------------------- #
def compute_gae(
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    gamma: float | jax.Array,
    gae_lambda: float | jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 16) with a
    reverse `lax.scan`, all inputs [T, N].

    `next_values[t]` is V of the state step t reached: V(info["final_observation"]),
    which on a truncated step is the state before the automatic reset. Then

        delta_t = r_t + gamma * (1 - terminated_t) * next_values_t - values_t
        A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}

    with done = terminated or truncated: a time limit keeps its bootstrap but
    still cuts the trace, because A_{t+1} belongs to the next episode.
    Returns (advantages, returns = advantages + values), both [T, N].
    """
    chex.assert_equal_shape([rewards, values, next_values, terminated, truncated])
    not_terminated = 1.0 - terminated.astype(jnp.float32)
    episode_continues = 1.0 - jnp.logical_or(terminated, truncated).astype(jnp.float32)
    deltas = rewards + gamma * not_terminated * next_values - values

    def backward(next_advantage, step):
        delta, continues = step
        advantage = delta + gamma * gae_lambda * continues * next_advantage
        return advantage, advantage

    _, advantages = jax.lax.scan(
        backward, jnp.zeros_like(deltas[0]), (deltas, episode_continues), reverse=True, unroll=16
    )
    return advantages, advantages + values


def clipped_surrogate(
    new_log_prob: jax.Array, old_log_prob: jax.Array, advantage: jax.Array, clip_coef: float | jax.Array
) -> tuple[jax.Array, jax.Array]:
    """PPO's clipped surrogate (Schulman et al. 2017, eq. 7) as a loss per sample,

        -min(r A, clip(r, 1 - eps, 1 + eps) A),  r = exp(new_log_prob - old_log_prob),

    all inputs of one shape [...]. Returns (losses [...], ratios r [...])."""
    ratio = jnp.exp(new_log_prob - old_log_prob)
    clipped_ratio = jnp.clip(ratio, 1 - clip_coef, 1 + clip_coef)
    return -jnp.minimum(ratio * advantage, clipped_ratio * advantage), ratio


def ppo_loss(
    new_log_prob: jax.Array,
    entropy: jax.Array,
    new_value: jax.Array,
    batch: Batch,
    hparams: Hyperparams,
    kl_coef: jax.Array,
    *,
    norm_adv: bool,
    clip_vloss: bool,
    vf_clip_coef: float,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Clipped-surrogate PPO loss on a minibatch (Schulman et al. 2017, eq. 7 and 9).

    new_log_prob, entropy, new_value: [M] from the current parameters; `batch`
    holds the rollout's log-probs, values, advantages and returns, [M].
    loss = -L^CLIP + vf_coef * L^VF - ent_coef * H + kl_coef * KL
    """
    advantage = batch.advantage
    if norm_adv:
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
    surrogate, ratio = clipped_surrogate(new_log_prob, batch.log_prob, advantage, hparams.clip_coef)
    policy_loss = surrogate.mean()

    value_error = jnp.square(new_value - batch.target_return)
    if clip_vloss:
        clipped_value = batch.value + jnp.clip(new_value - batch.value, -vf_clip_coef, vf_clip_coef)
        value_error = jnp.maximum(value_error, jnp.square(clipped_value - batch.target_return))
    value_loss = 0.5 * value_error.mean()

    # KL(old || new) estimated without bias by (ratio - 1) - log ratio (Schulman, "Approximating KL").
    log_ratio = new_log_prob - batch.log_prob
    approx_kl = ((ratio - 1.0) - log_ratio).mean()
    entropy = entropy.mean()
    loss = policy_loss + hparams.vf_coef * value_loss - hparams.ent_coef * entropy + kl_coef * approx_kl
    return loss, {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "approx_kl": approx_kl,
        "clip_fraction": (jnp.abs(ratio - 1.0) > hparams.clip_coef).mean(),
    }


def adapt_kl_coef(kl_coef: jax.Array, mean_kl: jax.Array, kl_target: float) -> jax.Array:
    """RLlib's adaptive KL coefficient: x1.5 when the update's KL exceeds twice
    the target, x0.5 when it is under half of it."""
    return jnp.where(
        mean_kl > 2.0 * kl_target, kl_coef * 1.5, jnp.where(mean_kl < 0.5 * kl_target, kl_coef * 0.5, kl_coef)
    )


def explained_variance(prediction: jax.Array, target: jax.Array) -> jax.Array:
    """1 - Var[target - prediction] / Var[target] (1 is perfect, <= 0 is useless)."""
    return 1.0 - jnp.var(target - prediction) / (jnp.var(target) + 1e-8)


def collect_rollout(env, env_params, graphdef: nnx.GraphDef, state: RunnerState, num_steps: int):
    """`num_steps` steps of the N envs with the current policy. Acting needs no
    critic; with a shared torso the value head on the acting pass's features
    costs one small matmul, so the transitions carry V(obs) too.
    Returns ((env_state, obs [N, *obs_shape], key), Transition [T, N])."""
    model = nnx.merge(graphdef, state.params)
    shared_torso = model.critic_torso is None

    def env_step(carry, _):
        env_state, obs, key = carry
        key, action_key, step_key = jax.random.split(key, 3)
        dist, value = model(obs) if shared_torso else (model.act(obs), None)
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
            value,
        )
        return (env_state, next_obs, key), transition

    return jax.lax.scan(env_step, (state.env_state, state.obs, state.key), None, num_steps)


def rollout_values(model: ActorCritic, traj: Transition, last_obs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(V(s_t), V(s'_t)) for GAE, both [T, N]: s'_t is the state step t reached,
    `traj.final_obs` (before any reset); `last_obs` [N, *obs_shape] is s_T."""
    if traj.value is None:
        # Separate torsos: acting ran no critic, so the critic runs once over the
        # whole rollout, V(s_t) and V(s'_t) in one batched pass [2, T, N] instead
        # of 2 x T small passes inside the sequential loop.
        values, next_values = model.value(jnp.stack([traj.obs, traj.final_obs]))
        return values, next_values
    # Shared torso: the acting pass gave V(s_t). Inside an episode s'_t = s_{t+1},
    # so V(s'_t) is the next step's value; after a termination GAE multiplies it by
    # 0; only a time-limit truncation needs V(final_obs), and that pass runs only in
    # rollouts that hold one (with one seed lax.cond skips it; vmapped over seeds it
    # becomes a select and always runs). On Atari this removes the pass over all
    # 2 x T x N frames after the rollout: 16-30% of an update (docs/ppo.md, Atari).
    following = jnp.concatenate([traj.value[1:], model.value(last_obs)[None]])  # V(s_{t+1}) [T, N]
    at_truncation = jax.lax.cond(jnp.any(traj.truncated), lambda: model.value(traj.final_obs), lambda: following)
    return traj.value, jnp.where(traj.truncated, at_truncation, following)


def minibatch_step(args: Args, graphdef: nnx.GraphDef, optimizer, carry, minibatch: Batch):
    """One gradient step of `ppo_loss` on a minibatch [M].
    carry = (params, opt_state, hparams, kl_coef []); returns (carry, loss metrics of [] arrays)."""
    params, opt_state, hparams, kl_coef = carry
    minibatch = parallel.constrain_data(minibatch)  # --parallel data: the minibatch is split over devices

    def loss_fn(params):
        dist, new_value = nnx.merge(graphdef, params)(minibatch.obs)
        return ppo_loss(
            dist.log_prob(minibatch.action),
            dist.entropy(),
            new_value,
            minibatch,
            hparams,
            kl_coef,
            norm_adv=args.norm_adv,
            clip_vloss=args.clip_vloss,
            vf_clip_coef=args.vf_clip_coef,
        )

    grads, stats = jax.grad(loss_fn, has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state, hparams, kl_coef), stats


def learn(args: Args, graphdef: nnx.GraphDef, optimizer, batch: Batch, carry, hparams: Hyperparams, kl_coef):
    """`update_epochs` epochs over the rollout's batch [B], each a fresh
    permutation cut into `num_minibatches` minibatches. carry = (params,
    opt_state, key). With target_kl > 0, epochs after the first whose mean
    approx-KL passes it change nothing. Returns (carry, stats [epochs,
    minibatches] per metric, executed [epochs] bool)."""
    nmb, mbs = args.num_minibatches, args.minibatch_size
    step = functools.partial(minibatch_step, args, graphdef, optimizer)

    def epoch(carry, _):
        params, opt_state, key, stopped = carry
        key, permutation_key = jax.random.split(key)
        permutation = jax.random.permutation(permutation_key, args.batch_size)
        minibatches = jax.tree.map(lambda x: x[permutation].reshape((nmb, mbs) + x.shape[1:]), batch)
        (new_params, new_opt_state, _, _), stats = jax.lax.scan(
            step, (params, opt_state, hparams, kl_coef), minibatches
        )
        if args.target_kl == 0:
            return (new_params, new_opt_state, key, stopped), (stats, jnp.bool_(True))
        # Target-KL early stop: once an epoch's mean KL passes target_kl, later epochs change nothing.
        params, opt_state = jax.tree.map(
            lambda new, old: jnp.where(stopped, old, new), (new_params, new_opt_state), (params, opt_state)
        )
        executed = ~stopped
        stopped = stopped | (stats["approx_kl"].mean() > args.target_kl)
        return (params, opt_state, key, stopped), (stats, executed)

    (params, opt_state, key, _), (stats, executed) = jax.lax.scan(
        epoch, (*carry, jnp.bool_(False)), None, args.update_epochs
    )
    return (params, opt_state, key), stats, executed


# --------------------------------------------------------------------------- #
# Training
# --------------------------------------------------------------------------- #
class PPO(NamedTuple):
    """What `make_train` returns: pure functions closed over the static config."""

    init: Any  # (key, hparams=None) -> RunnerState
    update: Any  # RunnerState -> (RunnerState, metrics: dict of [] arrays)
    train: Any  # (key, hparams=None) -> (RunnerState, metrics: dict of [num_updates] arrays)
    evaluate: Any  # (RunnerState, key) -> episode returns [eval_episodes]; with --capture-video also an envs.Recording
    policy: Any  # (params, obs [B, *obs_shape]) -> (distribution, value [B])
    spec: envs.EnvSpec


def make_envs(args: Args):
    """(env, env_params, eval_env, spec, torso): the training envs (num_envs),
    the greedy evaluation's (eval_episodes) and the torso for their observations."""
    if atari.is_envpool(args.env_id):
        # DeepMind's preprocessing by envpool, stepped inside jit (common/atari.py).
        preprocessing = atari.preprocessing(args)  # the Args' Atari flags as atari.make's keywords
        env, env_params = atari.make(args.env_id, args.num_envs, seed=args.seed, **preprocessing)
        eval_env, _ = atari.make(args.env_id, args.eval_episodes, seed=args.seed, role=1, **preprocessing)
        if args.capture_video:  # the newest frame at each step of env 0's first game (jaxzoo.video)
            eval_env = envs.RecordEpisode(eval_env, env.spec.max_episode_steps + 1)
        return env, env_params, eval_env, env.spec, "nature"
    max_steps = {"max_episode_steps": args.max_episode_steps} if args.max_episode_steps else {}
    if pixels.is_pixels(args.env_id):
        return make_pixel_envs(args, max_steps)
    if host.is_gym(args.env_id):  # a gymnasium env stepped on the host from inside jit (common/host.py)
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
    env, env_params = envs.make(
        args.env_id,
        args.num_envs,
        flatten_obs=torso == "mlp",
        normalize_obs=args.normalize_obs,
        normalize_reward=args.normalize_reward,
        gamma=args.gamma,
        **max_steps,
    )
    eval_env, _ = envs.make(args.env_id, args.eval_episodes, flatten_obs=torso == "mlp", **max_steps)
    spec = envs.spec(env, env_params)
    if args.capture_video:  # record each seed's first evaluation episode for a video (jaxzoo.video)
        eval_env = envs.RecordEpisode(eval_env, spec.max_episode_steps + 1)
    return env, env_params, eval_env, spec, torso


def make_pixel_envs(args: Args, max_steps: dict):
    """`make_envs` for 'pixels:<id>': the gymnax env drawn by common/pixels.py,
    `frame_stack` frames of `image_size` on the channel axis (one frame holds
    no velocities). The torso: nature from 36 x 36 pixels up, else cnn; the
    nature torso takes bytes (it scales them by 1/255, as Atari's frames), the
    cnn floats in [0, 1] (as MinAtar's 0/1 channels)."""
    torso = args.torso if args.torso != "auto" else ("nature" if args.image_size >= 36 else "cnn")
    if torso == "nature" and args.image_size < 36:
        raise ValueError(f"torso='nature' needs images of at least 36 x 36 pixels, got image_size={args.image_size}")
    drawn = dict(size=args.image_size, grayscale=args.grayscale, frame_stack=args.frame_stack, **max_steps)
    drawn["as_bytes"] = torso == "nature"
    env, env_params = pixels.make(
        args.env_id, args.num_envs, normalize_reward=args.normalize_reward, gamma=args.gamma, **drawn
    )
    eval_env, _ = pixels.make(args.env_id, args.eval_episodes, **drawn)
    spec = envs.spec(env, env_params)
    if args.capture_video:
        eval_env = envs.RecordEpisode(eval_env, spec.max_episode_steps + 1)
    return env, env_params, eval_env, spec, torso


def make_train(args: Args) -> PPO:
    env, env_params, eval_env, spec, torso = make_envs(args)
    # The module structure, without computing any weights (they are made per seed in `init`).
    graphdef = nnx.graphdef(
        nnx.eval_shape(
            lambda: ActorCritic(
                spec, torso, args.hidden_sizes, args.activation, args.shared_torso, nnx.Rngs(0), args.conv_padding
            )
        )
    )
    num_updates = args.num_updates
    use_kl_penalty = args.kl_coef > 0

    def policy(params: nnx.State, obs: jax.Array):
        return nnx.merge(graphdef, params)(obs)

    def make_optimizer(learning_rate):
        adam = optax.adam(learning_rate, eps=args.adam_eps)
        clip_then_adam = (
            optax.chain(optax.clip_by_global_norm(args.max_grad_norm), adam) if args.max_grad_norm > 0 else adam
        )
        # The optimizer sees all parameters as one vector (optax.flatten): Adam is elementwise and the
        # global norm one sum, so this is the same update (up to that sum's order) in a few kernels
        # instead of a few per parameter array: a CartPole learn phase 6.0-6.4 -> 5.5 ms, a cold
        # run 5-7% shorter (docs/ppo.md, detail 21).
        return optax.flatten(clip_then_adam)

    optimizer = optax.inject_hyperparams(make_optimizer)(learning_rate=args.learning_rate)

    def init(key: jax.Array, hparams: Hyperparams | None = None) -> RunnerState:
        hparams = Hyperparams.from_args(args) if hparams is None else hparams
        key, model_key, env_key = jax.random.split(key, 3)
        params = nnx.split(
            ActorCritic(
                spec,
                torso,
                args.hidden_sizes,
                args.activation,
                args.shared_torso,
                nnx.Rngs(model_key),
                args.conv_padding,
            )
        )[1]
        obs, env_state = env.reset(env_key, env_params)
        return RunnerState(
            params=params,
            opt_state=optimizer.init(params),
            env_state=env_state,
            obs=obs,
            key=key,
            update_step=jnp.zeros((), jnp.int32),
            kl_coef=jnp.float32(args.kl_coef),
            hparams=hparams,
        )

    def update(state: RunnerState) -> tuple[RunnerState, dict[str, jax.Array]]:
        """One PPO iteration: rollout, GAE, `update_epochs` x `num_minibatches` steps."""
        hp = state.hparams
        (env_state, obs, key), traj = collect_rollout(env, env_params, graphdef, state, args.num_steps)

        values, next_values = rollout_values(nnx.merge(graphdef, state.params), traj, obs)
        advantages, returns = compute_gae(
            traj.reward, values, next_values, traj.terminated, traj.truncated, hp.gamma, hp.gae_lambda
        )
        batch = Batch(traj.obs, traj.action, traj.log_prob, values, advantages, returns)
        batch = jax.tree.map(lambda x: x.reshape((args.batch_size,) + x.shape[2:]), batch)

        # Linear annealing as in PureJaxRL: lr_k = lr * (1 - k / num_updates).
        fraction_left = 1.0 - state.update_step / num_updates if args.anneal_lr else 1.0
        learning_rate = hp.learning_rate * fraction_left
        opt_state = state.opt_state._replace(
            hyperparams={**state.opt_state.hyperparams, "learning_rate": learning_rate}
        )
        (params, opt_state, key), stats, executed = learn(
            args, graphdef, optimizer, batch, (state.params, opt_state, key), hp, state.kl_coef
        )
        # Means over the minibatch steps of the epochs that ran: stats [epochs, minibatches].
        weights = jnp.broadcast_to(executed.astype(jnp.float32)[:, None], stats["approx_kl"].shape)
        stats = jax.tree.map(lambda x: (x * weights).sum() / weights.sum(), stats)

        kl_coef = adapt_kl_coef(state.kl_coef, stats["approx_kl"], args.kl_target) if use_kl_penalty else state.kl_coef
        new_state = RunnerState(params, opt_state, env_state, obs, key, state.update_step + 1, kl_coef, hp)
        episodes = {"episode_done": traj.episode_done, "episode_return": traj.episode_return}
        metrics = {
            **envs.episode_metrics({**episodes, "episode_length": traj.episode_length}),
            **stats,
            "explained_variance": explained_variance(batch.value, batch.target_return),
            "learning_rate": learning_rate,
            "kl_coef": state.kl_coef,
            "epochs_completed": executed.sum().astype(jnp.float32),
            "advantage_mean": advantages.mean(),
            "return_mean": returns.mean(),
        }
        if atari.is_envpool(args.env_id):
            # An Atari "episode" is the whole game: the unclipped score over all its lives (common/atari.py, 5).
            metrics["game_score"], metrics["game_length"] = metrics["episode_return"], metrics["episode_length"]
        return new_state, metrics

    def train(key: jax.Array, hparams: Hyperparams | None = None):
        """The whole run as one `lax.scan` over updates: jit it, vmap it over
        seeds (keys) and hyperparameters."""
        return jax.lax.scan(lambda s, _: update(s), init(key, hparams), None, num_updates)

    def evaluate(state: RunnerState, key: jax.Array) -> jax.Array:
        """Greedy policy (argmax / Gaussian mean), one episode in each of
        `eval_episodes` envs; returns their undiscounted returns [eval_episodes]."""
        normaliser = (
            envs.find_state(state.env_state, envs.NormalizeObservationState).obs_stats if args.normalize_obs else None
        )
        actor = nnx.merge(graphdef, state.params).act

        def greedy(obs):
            if normaliser is not None:
                obs = envs.normalize(obs, normaliser)
            return actor(obs).mode()

        return envs.evaluate_episodes(eval_env, env_params, greedy, key, spec.max_episode_steps + 1)

    return PPO(init, update, train, evaluate, policy, spec)


# --------------------------------------------------------------------------- #
# Host loop
# --------------------------------------------------------------------------- #
def main(args: Args) -> runner.RunResult:
    """Train `num_seeds` seeds in chunks of `log_every` updates (common/runner.py:
    run directory, metrics.csv, progress, checkpoints, resume), then evaluate greedily."""
    # Resume, run-root and cache checks, before anything is built; the CPU devices of --parallel (Args.DATA_AXIS).
    args = runner.prepare(args, "ppo")
    parallel.start_cpu_backend(args.cpu_threads)  # before JAX starts; a no-op unless asked for and useful
    ppo = make_train(args)
    return runner.run(
        args,
        "ppo",
        ppo.init,
        ppo.update,
        ppo.evaluate,
        num_updates=args.num_updates,
        steps_per_update=args.batch_size,
        eval_every=args.eval_every,
        # --parallel data: the environments (axis 0 of env_state and obs) are split over devices.
        data_axes=lambda state: jax.tree.map(lambda _: None, state).replace(env_state=0, obs=0),
    )


if __name__ == "__main__":
    with cli.user_errors():
        main(cli.parse(Args, "ppo"))
