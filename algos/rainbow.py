"""Rainbow and the DQN family, the whole run in one `jax.jit`.

Papers: Mnih et al. 2015 (DQN, Nature 518); van Hasselt et al. 2016 (double
Q-learning, arXiv:1509.06461); Wang et al. 2016 (dueling networks,
arXiv:1511.06581); Schaul et al. 2016 (prioritized replay, arXiv:1511.05952);
Fortunato et al. 2018 (noisy nets, arXiv:1706.10295); Bellemare et al. 2017
(distributional C51, arXiv:1707.06887); Hessel et al. 2018 (Rainbow,
arXiv:1710.02298).

The idea: learn Q(s, a) from replayed transitions by regressing on a bootstrapped
target computed with a slowly updated target network, and act greedily with
respect to it (plus exploration). Each Rainbow component is a flag: double Q
(the online network picks the next action, the target network scores it),
dueling heads (Q = V + A - mean A), prioritized replay (sample by TD error,
correct with importance weights), noisy layers (learned exploration instead of
epsilon), a categorical return distribution on `num_atoms` atoms (`num_atoms 1`
is expected-value DQN) and n-step returns. Acting, replay, learning and target
updates all run inside one compiled `lax.scan`, vmapped over seeds. Truncated
episodes bootstrap from the final observation; n-step returns stop at episode
ends.

    python algos/rainbow.py                         # DQN on CartPole-v1 (= --preset dqn)
    python algos/rainbow.py --preset rainbow        # every component on
    python algos/rainbow.py --preset breakout-minatar --num-seeds 4
    python algos/rainbow.py --preset atari          # envpool:Breakout-v5 from pixels (atari extra)

Details, logged metrics and measured results: docs/rainbow.md.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated, Any, ClassVar, Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct

from jaxzoo import atari, buffers, cli, envs, layers, parallel, runner
from jaxzoo.checks import AtLeastOne, Fraction, NonNegative, OpenFraction, Positive, check_fields


# --------------------------------------------------------------------------- #
# Arguments
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class Args:
    """Rainbow / DQN family (Hessel et al. 2018) on a gymnax environment or an envpool Atari game, jitted end to end."""

    exp_name: str = "rainbow"
    """name of the experiment: part of the run directory and the plot label"""
    seed: Annotated[int, NonNegative] = 0
    """seed of the first run; seed index i uses seed + i"""
    num_seeds: Annotated[int, AtLeastOne] = 1
    """independent seeds trained at once with `jax.vmap`"""
    env_id: str = "CartPole-v1"
    """gymnax environment id (discrete actions only), or an Atari game stepped by envpool inside jit, 'envpool:<Game>-v5' (needs the `atari` extra; one seed per process; docs/rainbow.md, Atari)"""
    total_timesteps: Annotated[int, AtLeastOne] = 500_000
    """environment steps per seed"""
    log_every: Annotated[int, AtLeastOne] = 10
    """updates per jitted chunk: metrics, progress and checkpoints happen between chunks"""
    track: bool = False
    """log to Weights & Biases (needs the `logging` extra)"""
    tensorboard: bool = False
    """write TensorBoard event files into the run directory (needs the `logging` extra)"""
    save_model: bool = True
    """write checkpoints of the whole runner state, replay included (needed for --resume)"""
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
    """time limit of an episode in env steps; 0 keeps the env's own (Atari's is 27,000 agent steps, 108k frames)"""
    num_envs: Annotated[int, AtLeastOne] = 10
    """parallel environments per seed"""
    DATA_AXIS: ClassVar[str] = "num_envs"
    """the field --parallel data splits over the devices (the environments; runner.data_axis)"""
    steps_per_update: Annotated[int, AtLeastOne] = 1000
    """env steps per seed in one `update` (one row of metrics.csv)"""
    train_frequency: Annotated[int, AtLeastOne] = 10
    """env steps per seed between gradient phases (a multiple of num_envs)"""
    gradient_steps: Annotated[int, AtLeastOne] = 1
    """gradient steps per gradient phase: replay ratio = gradient_steps * batch_size / train_frequency"""
    buffer_size: Annotated[int, AtLeastOne] = 10_000
    """replay capacity in transitions per seed"""
    batch_size: Annotated[int, AtLeastOne] = 128
    """transitions per gradient step"""
    learning_starts: Annotated[int, NonNegative] = 10_000
    """env steps per seed before the first gradient step"""
    learning_rate: Annotated[float, Positive] = 2.5e-4
    """Adam learning rate"""
    anneal_lr: bool = False
    """decay the learning rate linearly to 0 over the run's gradient steps"""
    adam_eps: Annotated[float, Positive] = 1e-8
    """Adam epsilon"""
    max_grad_norm: Annotated[float, NonNegative] = 0.0
    """global gradient-norm clip (0: none)"""
    gamma: Annotated[float, Fraction] = 0.99
    """discount factor"""
    target_update_period: Annotated[int, AtLeastOne] = 500
    """env steps per seed between target-network updates"""
    tau: Annotated[float, OpenFraction] = 1.0
    """target update: target <- tau * online + (1 - tau) * target (1: hard copy)"""
    start_e: Annotated[float, Fraction] = 1.0
    """initial epsilon of epsilon-greedy exploration (ignored with noisy nets)"""
    end_e: Annotated[float, Fraction] = 0.05
    """final epsilon"""
    exploration_fraction: Annotated[float, Fraction] = 0.5
    """fraction of total_timesteps over which epsilon decays linearly"""
    loss: Literal["mse", "huber"] = "mse"
    """TD loss for expected-value DQN (num_atoms 1): squared error or Huber (delta 1)"""
    double_q: bool = False
    """double Q-learning: the online network selects the next action, the target network scores it"""
    dueling: bool = False
    """dueling heads: Q = V + A - mean_a A"""
    noisy: bool = False
    """factorised Gaussian noisy layers instead of epsilon-greedy"""
    sigma0: Annotated[float, NonNegative] = 0.5
    """initial noise scale of noisy layers (sigma = sigma0 / sqrt(fan_in))"""
    num_atoms: Annotated[int, AtLeastOne] = 1
    """atoms of the categorical return distribution (1: expected-value DQN)"""
    v_min: float = -100.0
    """lowest atom of the support"""
    v_max: float = 100.0
    """highest atom of the support"""
    n_step: Annotated[int, AtLeastOne] = 1
    """length of the n-step returns in env steps (cut at episode ends)"""
    prioritized: bool = False
    """proportional prioritized replay"""
    per_alpha: Annotated[float, NonNegative] = 0.6
    """priority exponent alpha"""
    per_beta0: Annotated[float, Fraction] = 0.4
    """importance-sampling exponent at the start, annealed linearly to per_beta1 over the run"""
    per_beta1: Annotated[float, Fraction] = 1.0
    """importance-sampling exponent at the end (RLlib keeps beta fixed: per_beta1 = per_beta0)"""
    per_eps: Annotated[float, Positive] = 1e-6
    """added to |TD error| (or the C51 loss) to form a priority"""
    torso: Literal["auto", "mlp", "cnn", "nature"] = "auto"
    """network torso: cnn is the MinAtar network, nature the Nature DQN convolutions; auto picks nature for envpool ids, cnn for other image observations [H, W, C], mlp otherwise"""
    hidden_sizes: Annotated[tuple[int, ...], AtLeastOne] = (120, 84)
    """hidden layer widths (after the convolutions for the cnn and nature torsos; empty: the heads read the torso's features)"""
    conv_padding: Literal["valid", "same"] = "valid"
    """padding of the nature torso's convolutions: valid (Nature DQN, CleanRL) or same (RLlib's CNN encoder, out = ceil(in / stride))"""
    activation: Literal["relu", "tanh"] = "relu"
    """hidden-layer activation"""
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

    def __post_init__(self):
        check_fields(self)  # the ranges beside the fields (jaxzoo.checks)
        if atari.is_envpool(self.env_id):
            atari.check_args(self)  # what an envpool id cannot do (common/atari.py)
        if self.train_frequency % self.num_envs:
            raise ValueError(
                f"train_frequency={self.train_frequency} must be a multiple of num_envs={self.num_envs} "
                "(each env steps train_frequency / num_envs times between gradient phases); accepted: "
                f"a multiple of {self.num_envs}"
            )
        if self.steps_per_update % self.train_frequency:
            raise ValueError(
                f"steps_per_update={self.steps_per_update} must be a multiple of train_frequency={self.train_frequency}; "
                f"accepted: a multiple of {self.train_frequency}"
            )
        if self.num_atoms == 2 or (self.num_atoms > 1 and not self.v_min < self.v_max):
            raise ValueError(
                f"a categorical distribution needs num_atoms >= 3 and v_min < v_max, got num_atoms={self.num_atoms}, "
                f"v_min={self.v_min}, v_max={self.v_max}; accepted: num_atoms 1 (expected-value DQN), or "
                "num_atoms >= 3 with v_min < v_max"
            )
        history = replay_history(self)  # Atari: a window also needs the frame_stack - 1 rows before it
        rows = self.n_step + 1 + history
        if self.buffer_size // self.num_envs < rows:
            formula, named = (
                ("n_step + frame_stack", f", frame_stack={self.frame_stack}") if history else ("n_step + 1", "")
            )
            raise ValueError(
                f"buffer_size={self.buffer_size} is too small for num_envs={self.num_envs}, n_step={self.n_step}"
                f"{named}; accepted: buffer_size >= num_envs * ({formula}) = {self.num_envs * rows}"
            )
        if self.num_updates < 1:
            raise ValueError(
                f"total_timesteps={self.total_timesteps} is less than steps_per_update="
                f"{self.steps_per_update}; accepted: total_timesteps >= {self.steps_per_update}"
            )
        run_steps = self.num_updates * self.steps_per_update  # env steps per seed the run takes
        if self.learning_starts >= run_steps:
            budget = (
                f"total_timesteps={self.total_timesteps}"
                if run_steps == self.total_timesteps
                else f"the {run_steps} env steps per seed the run takes (total_timesteps={self.total_timesteps} in "
                f"whole updates of steps_per_update={self.steps_per_update})"
            )
            raise ValueError(
                f"learning_starts={self.learning_starts} is not below {budget}: no gradient step would be "
                f"taken; accepted: learning_starts < {run_steps}"
            )

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.steps_per_update

    @property
    def phases_per_update(self) -> int:
        return self.steps_per_update // self.train_frequency

    @property
    def num_gradient_steps(self) -> int:
        """Gradient steps of the whole run: one phase per train_frequency env steps learns
        once its env steps have reached learning_starts."""
        phases = self.num_updates * self.phases_per_update
        first_learning_phase = max(1, -(-self.learning_starts // self.train_frequency))
        return max(0, phases - first_learning_phase + 1) * self.gradient_steps


# --------------------------------------------------------------------------- #
# Networks
# --------------------------------------------------------------------------- #
ACTIVATIONS = {"tanh": jnp.tanh, "relu": jax.nn.relu}


class Linear(nnx.Module):
    """Plain linear layer with the same call signature as NoisyLinear (the key is ignored)."""

    def __init__(self, in_features: int, out_features: int, rngs: nnx.Rngs, **_):
        self.layer = nnx.Linear(in_features, out_features, rngs=rngs)

    def __call__(self, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
        return self.layer(x)


class NoisyLinear(nnx.Module):
    """Factorised Gaussian noisy linear layer (Fortunato et al. 2018, section 3.2).

    y = (mu_w + sigma_w * f(e_in) f(e_out)^T) x + mu_b + sigma_b * f(e_out),
    f(e) = sign(e) sqrt|e|, e ~ N(0, 1), one noise draw per call (shared by the
    batch). Init: mu ~ U[-1/sqrt(p), 1/sqrt(p)], sigma = sigma0 / sqrt(p), p = fan-in.
    `key=None` uses the mean weights (greedy evaluation).
    """

    def __init__(self, in_features: int, out_features: int, rngs: nnx.Rngs, sigma0: float = 0.5):
        bound = 1.0 / np.sqrt(in_features)
        uniform = nnx.initializers.uniform(2 * bound)
        self.w_mu = nnx.Param(uniform(rngs.params(), (in_features, out_features)) - bound)
        self.b_mu = nnx.Param(uniform(rngs.params(), (out_features,)) - bound)
        self.w_sigma = nnx.Param(jnp.full((in_features, out_features), sigma0 * bound))
        self.b_sigma = nnx.Param(jnp.full((out_features,), sigma0 * bound))

    def __call__(self, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
        if key is None:
            return x @ self.w_mu[...] + self.b_mu[...]
        in_key, out_key = jax.random.split(key)
        f = lambda e: jnp.sign(e) * jnp.sqrt(jnp.abs(e))
        eps_in = f(jax.random.normal(in_key, (self.w_mu.shape[0],)))
        eps_out = f(jax.random.normal(out_key, (self.w_mu.shape[1],)))
        weight = self.w_mu[...] + self.w_sigma[...] * jnp.outer(eps_in, eps_out)
        return x @ weight + self.b_mu[...] + self.b_sigma[...] * eps_out

    def noise_scale(self) -> jax.Array:
        """mean |sigma_w| sqrt(fan_in): sigma0 at initialisation, comparable across layers."""
        return jnp.abs(self.w_sigma[...]).mean() * np.sqrt(self.w_mu.shape[0])


class MinAtarConv(nnx.Module):
    """[..., H, W, C] -> [..., (H-2)(W-2)16]: the MinAtar 3x3 convolution (16
    channels, no padding) + ReLU, written as patches @ kernel because XLA:CPU
    runs the kernel gradient of `lax.conv` about 15x slower inside a `lax.scan`
    (docs/ppo.md, implementation detail 13)."""

    def __init__(self, channels: int, rngs: nnx.Rngs):
        self.kernel = nnx.Linear(9 * channels, 16, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jax.nn.relu(self.kernel(layers.patches(x, 3)))  # [..., H-2, W-2, 16]
        return x.reshape(x.shape[:-3] + (-1,))


def same_padding(size: int, kernel_size: int, stride: int) -> tuple[int, int]:
    """Zero padding (before, after) that makes a convolution's output
    ceil(size / stride) long, as RLlib's `same_padding` (the extra pixel after)."""
    total = max((-(-size // stride) - 1) * stride + kernel_size - size, 0)
    return total // 2, total - total // 2


class NatureConv(nnx.Module):
    """[..., H, W, C] frames (uint8 or float in [0, 255]) -> [..., out_features]:
    the Nature DQN convolutions (Mnih et al. 2015; Hessel et al. 2018 kept
    them): 32 8x8 filters stride 4, 64 4x4 stride 2, 64 3x3 stride 1, each + ReLU.
    `padding` "valid" is the Nature network's (84 -> 20 -> 9 -> 7, so 7 x 7 x 64
    = 3136 features); "same" is RLlib's CNN encoder's (zeros around each input,
    84 -> 21 -> 11 -> 11, so 11 x 11 x 64 = 7744 features). The frames
    are scaled to [0, 1] here, after cutting the first windows, so replay keeps
    bytes. Each convolution is patches @ kernel like MinAtarConv (a `lax.conv`
    kernel gradient inside the training scan was about 40x slower on XLA:CPU,
    docs/ppo.md, Atari); the kernels are nnx.Linear with this file's default
    initialisation, as MinAtarConv's."""

    FILTERS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))  # (channels, kernel size, stride)

    def __init__(self, obs_shape: tuple[int, ...], padding: str, rngs: nnx.Rngs):
        height, width, channels = obs_shape
        pads, kernels = [], []
        for out_channels, kernel_size, stride in self.FILTERS:
            pad_h, pad_w = (
                (same_padding(height, kernel_size, stride), same_padding(width, kernel_size, stride))
                if padding == "same"
                else ((0, 0), (0, 0))
            )
            pads.append((pad_h, pad_w))
            kernels.append(nnx.Linear(kernel_size * kernel_size * channels, out_channels, rngs=rngs))
            height = (height + sum(pad_h) - kernel_size) // stride + 1
            width = (width + sum(pad_w) - kernel_size) // stride + 1
            channels = out_channels
        self.kernels = nnx.List(kernels)
        self.pads = tuple(pads)  # static: ((top, bottom), (left, right)) per convolution
        self.out_features = height * width * channels

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer, (kernel, (pad_h, pad_w), (_, kernel_size, stride)) in enumerate(
            zip(self.kernels, self.pads, self.FILTERS)
        ):
            x = jnp.pad(x, [(0, 0)] * (x.ndim - 3) + [pad_h, pad_w, (0, 0)])
            windows = layers.patches(x, kernel_size, stride)  # [..., out_h, out_w, k*k*C]
            if layer == 0:  # bytes -> [0, 1] (the patches of a uint8 frame stay uint8: 4x less to copy)
                windows = windows.astype(jnp.float32) / 255.0
            x = jax.nn.relu(kernel(windows))
        return x.reshape(x.shape[:-3] + (-1,))


def dueling_aggregate(value: jax.Array, advantage: jax.Array) -> jax.Array:
    """Q = V + A - mean_a A (Wang et al. 2016, eq. 9), per atom:
    value [..., 1, atoms], advantage [..., A, atoms] -> [..., A, atoms]."""
    return value + advantage - advantage.mean(axis=-2, keepdims=True)


class QNetwork(nnx.Module):
    """obs [..., *obs_shape] -> out [..., A, atoms]: Q-values (atoms = 1) or
    logits of the return distribution over the support (atoms > 1).

    Torso: the MinAtar conv (`cnn`) or the Nature DQN convolutions (`nature`,
    Atari; padded as `conv_padding` says) for images, then `hidden_sizes` layers; every linear layer after the
    convolutions is noisy when `noisy` (Hessel et al. 2018). `key` draws the
    noise (one key per layer); `None` uses the mean weights.
    """

    def __init__(self, spec: envs.EnvSpec, args: Args, torso: str, rngs: nnx.Rngs):
        layer = NoisyLinear if args.noisy else Linear
        conv: MinAtarConv | NatureConv | None = None
        if torso == "cnn":
            conv = MinAtarConv(spec.obs_shape[-1], rngs)
            height, width, _ = spec.obs_shape
            features = (height - 2) * (width - 2) * 16
        elif torso == "nature":
            conv = NatureConv(spec.obs_shape, args.conv_padding, rngs)
            features = conv.out_features
        else:
            features = int(np.prod(spec.obs_shape))
        self.conv = conv
        sizes = (features, *args.hidden_sizes)
        self.hidden = nnx.List([layer(a, b, rngs, sigma0=args.sigma0) for a, b in zip(sizes[:-1], sizes[1:])])
        self.advantage = layer(sizes[-1], spec.num_actions * args.num_atoms, rngs, sigma0=args.sigma0)
        self.value = layer(sizes[-1], args.num_atoms, rngs, sigma0=args.sigma0) if args.dueling else None
        self.activation = ACTIVATIONS[args.activation]
        self.num_actions, self.num_atoms = spec.num_actions, args.num_atoms

    def noise_scale(self) -> jax.Array:
        """[]: the noisy layers' mean noise_scale (NaN without noisy layers)."""
        noisy = [m for m in (*self.hidden, self.advantage, self.value) if isinstance(m, NoisyLinear)]
        return jnp.mean(jnp.stack([m.noise_scale() for m in noisy])) if noisy else jnp.float32(jnp.nan)

    def __call__(self, obs: jax.Array, key: jax.Array | None = None) -> jax.Array:
        keys = [None] * (len(self.hidden) + 2) if key is None else list(jax.random.split(key, len(self.hidden) + 2))
        x = obs if self.conv is None else self.conv(obs)
        for layer, layer_key in zip(self.hidden, keys):
            x = self.activation(layer(x, layer_key))
        shape = x.shape[:-1] + (self.num_actions, self.num_atoms)
        advantage = self.advantage(x, keys[-2]).reshape(shape)
        if self.value is None:
            return advantage
        return dueling_aggregate(self.value(x, keys[-1])[..., None, :], advantage)


# --------------------------------------------------------------------------- #
# Pytrees
# --------------------------------------------------------------------------- #
class Hyperparams(struct.PyTreeNode):
    """The float hyperparameters the jitted update reads (same meaning as the
    `Args` fields of the same names). They live in the runner state, so
    `jax.vmap(train, in_axes=(None, 0))` over a stacked Hyperparams is a sweep
    in one compile. per_alpha stays a static `Args` value: XLA computes
    p ** 0.5 with a constant exponent as sqrt(p), which a traced exponent would
    change in the last bit, and with it every run of the alpha-0.5 presets."""

    learning_rate: jax.Array  # [] Adam step size (the start of the linear decay with anneal_lr)
    gamma: jax.Array  # [] discount per env step
    tau: jax.Array  # [] target <- tau * online + (1 - tau) * target (1: hard copy)
    start_e: jax.Array  # [] initial epsilon of epsilon-greedy (unused with noisy nets)
    end_e: jax.Array  # [] final epsilon
    exploration_fraction: jax.Array  # [] fraction of total_timesteps over which epsilon decays
    per_beta0: jax.Array  # [] importance-sampling exponent at the start of the run
    per_beta1: jax.Array  # [] importance-sampling exponent at the end of the run
    per_eps: jax.Array  # [] added to |TD error| (or the C51 loss) to form a priority

    @classmethod
    def from_args(cls, args: Args) -> Hyperparams:
        return cls(*(jnp.float32(getattr(args, f.name)) for f in fields(cls)))


class Transition(NamedTuple):
    """One env step as stored in replay (leaves [num_envs, ...] when added)."""

    obs: jax.Array  # [*obs_shape] (Atari: its newest frame [H, W, c] only; frame_stacks rebuilds the stack)
    action: jax.Array  # [] int32
    reward: jax.Array  # []
    terminated: jax.Array  # [] bool: V(next) = 0
    truncated: jax.Array  # [] bool: time limit, bootstrap from final_obs
    final_obs: (
        jax.Array
    )  # [*obs_shape] info["final_observation"]: the true next state, before any reset (Atari: newest frame)


class RunnerState(struct.PyTreeNode):
    params: nnx.State
    target_params: nnx.State
    opt_state: optax.OptState
    buffer: buffers.Buffer  # leaves [rows, num_envs, ...]
    env_state: Any  # leaves [num_envs, ...]
    obs: jax.Array  # [num_envs, *obs_shape]
    key: jax.Array
    env_steps: jax.Array  # [] env steps per seed so far
    gradient_steps: jax.Array  # [] gradient steps taken
    hparams: Hyperparams


class Learner(NamedTuple):
    """What one gradient step changes (the replay data and the target network are only read)."""

    params: nnx.State
    opt_state: optax.OptState
    key: jax.Array
    gradient_steps: jax.Array  # []
    priority: jax.Array | None  # [rows, num_envs] replay priorities (prioritized replay only)
    max_priority: jax.Array | None  # []


# --------------------------------------------------------------------------- #
# Algorithm logic (pure functions; the unit tests import these)
# --------------------------------------------------------------------------- #
def linear_schedule(
    start: float | jax.Array, end: float | jax.Array, duration: float | jax.Array, t: jax.Array
) -> jax.Array:
    """start -> end linearly over `duration`, then constant."""
    fraction = jnp.clip(t / jnp.maximum(duration, 1.0), 0.0, 1.0)
    return start + fraction * (end - start)


def n_step_targets(
    rewards: jax.Array, terminated: jax.Array, truncated: jax.Array, gamma: float | jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """n-step returns of windows that may cross episode ends (Hessel et al. 2018, eq. 2).

    rewards, terminated, truncated: [B, n], step k of window b is t + k.
    The sum stops at the first step k* that ends an episode (terminated or
    truncated); without one, k* = n - 1. Returns
      returns [B]: sum_{k <= k*} gamma^k r_{t+k},
      discount [B]: gamma^(k* + 1), or 0 if step k* terminated,
      last [B]: k*, whose stored final_obs (the final observation when the
        episode ended there) is the bootstrap state.
    """
    chex.assert_equal_shape([rewards, terminated, truncated])
    n = rewards.shape[1]
    done = (terminated | truncated).astype(jnp.float32)
    # alive[k] = 1 while no step before k ended the episode.
    alive = jnp.cumprod(jnp.concatenate([jnp.ones_like(done[:, :1]), 1.0 - done[:, :-1]], axis=1), axis=1)
    powers = gamma ** jnp.arange(n, dtype=jnp.float32)
    returns = jnp.sum(powers * rewards * alive, axis=1)
    last = jnp.where(done.any(axis=1), jnp.argmax(done, axis=1), n - 1)
    terminated_last = jnp.take_along_axis(terminated, last[:, None], axis=1)[:, 0]
    discount = gamma ** (last + 1.0) * (1.0 - terminated_last.astype(jnp.float32))
    return returns, discount, last


def categorical_projection(
    next_probs: jax.Array, returns: jax.Array, discounts: jax.Array, support: jax.Array
) -> jax.Array:
    """Project the distribution of R + discount * Z onto the fixed support
    (Bellemare et al. 2017, Algorithm 1). next_probs [B, N], returns and
    discounts [B], support [N] evenly spaced -> target probabilities [B, N].

    Each shifted atom Tz_j = clip(R + discount z_j, v_min, v_max) splits its mass
    between the neighbouring atoms l = floor(b_j), u = ceil(b_j), b_j = (Tz_j - v_min) / dz,
    in proportion to closeness; when b_j falls exactly on an atom, all of it goes there.
    """
    num_atoms = support.shape[0]
    v_min, v_max = support[0], support[-1]
    delta = (v_max - v_min) / (num_atoms - 1)
    shifted = jnp.clip(returns[:, None] + discounts[:, None] * support[None, :], v_min, v_max)
    b = (shifted - v_min) / delta
    lower, upper = jnp.floor(b), jnp.ceil(b)
    lower_mass = next_probs * (upper - b + (lower == upper))
    upper_mass = next_probs * (b - lower)
    rows = jnp.broadcast_to(jnp.arange(b.shape[0])[:, None], b.shape)
    target = jnp.zeros_like(next_probs).at[rows, lower.astype(jnp.int32)].add(lower_mass)
    return target.at[rows, upper.astype(jnp.int32)].add(upper_mass)


def replay_history(args: Args) -> int:
    """Rows of history each replayed window needs before its first step: on Atari
    the replay stores one frame per step (`frame_stacks`), so a stack of
    frame_stack frames needs the frame_stack - 1 rows before it; else none."""
    return args.frame_stack - 1 if atari.is_envpool(args.env_id) else 0


def newest_frame(obs: jax.Array, frame_stack: int) -> jax.Array:
    """[..., H, W, K c] stacked observation -> [..., H, W, c], its newest frame."""
    return obs[..., -(obs.shape[-1] // frame_stack) :]


def frame_stacks(windows: Transition, frame_stack: int) -> Transition:
    """Rebuild the stacked observations of replayed windows stored one frame per
    step, as DQN's replay memory stored single frames and stacked them when
    sampling (Mnih et al. 2015, Methods): a quarter of the memory at 4 frames.
    The Atari envs here stack frames on the device and start every episode (a
    life, with episodic_life) with its first frame in all slots
    (common/atari.py, 7), so an observation is its episode's last frame_stack
    frames, the first frame repeated where the episode has had fewer.

    windows: leaves [B, h + n, ...], the h = frame_stack - 1 rows before each
    window first (buffers.sample's `history`); obs and final_obs hold the newest
    frame [B, h + n, H, W, c] of the observation and of the final observation.
    Returns the n window steps, leaves [B, n, ...], with obs and final_obs
    [B, n, H, W, frame_stack * c], oldest frame first, as the env produced them.
    (The one exception is the restart step of a resumed run, common/atari.py, 6,
    whose final observation is the unchanged checkpointed one; rebuilt, it is
    that observation moved on by one frame with its newest frame repeated.)
    """
    history = frame_stack - 1
    length = windows.reward.shape[1] - history  # n
    row = jnp.arange(length + history)
    done = windows.terminated | windows.truncated  # [B, h + n]: the next row starts an episode
    # The first row of each row's episode (row 0: as far back as the window reaches). [B, h + n]
    begins = jnp.concatenate([jnp.ones_like(done[:, :1]), done[:, :-1]], axis=1)
    episode_start = jax.lax.cummax(jnp.where(begins, row, 0), axis=1)
    steps = history + jnp.arange(length)  # [n]: the window's rows
    # Slot k of step t's stack holds the frame of row t - h + k, or of the episode's first row if that is later.
    source = jnp.maximum(steps[:, None] - history + jnp.arange(frame_stack), episode_start[:, steps, None])  # [B, n, K]
    frames = jax.vmap(lambda frames, source: frames[source])(windows.obs, source)  # [B, n, K, H, W, c]
    obs = jnp.moveaxis(frames, 2, -2).reshape(*frames.shape[:2], *frames.shape[3:5], -1)  # [B, n, H, W, K c]
    channels = windows.obs.shape[-1]
    # The final observation is the step's stack moved on by one frame: the final frame appended.
    final_obs = jnp.concatenate([obs[..., channels:], windows.final_obs[:, history:]], axis=-1)
    window = lambda x: x[:, history:]
    return Transition(
        obs,
        window(windows.action),
        window(windows.reward),
        window(windows.terminated),
        window(windows.truncated),
        final_obs,
    )


def importance_weights(probability: jax.Array, num_valid: jax.Array, beta: jax.Array) -> jax.Array:
    """Prioritized-replay correction w_i = (N P(i))^-beta, divided by the largest
    weight in the batch so updates are only ever scaled down (Schaul et al. 2016, section 3.4)."""
    weights = (num_valid * probability) ** -beta
    return weights / weights.max()


def mean_return(out: jax.Array, support: jax.Array) -> jax.Array:
    """[..., atoms] -> [...]: the expected return a network output stands for:
    the output itself for expected-value DQN (one atom), else the mean
    sum_i softmax(logits)_i z_i of the categorical return distribution on the
    support z [atoms]. That distribution stays hand-written (softmax, the
    projection above, a cross-entropy) rather than a distrax.Categorical: those
    steps on a fixed support are what C51 teaches."""
    if support.shape[0] == 1:
        return out[..., 0]
    return jnp.sum(jax.nn.softmax(out, axis=-1) * support, axis=-1)


def greedy_actions(q_values: jax.Array) -> jax.Array:
    return jnp.argmax(q_values, axis=-1)


def bootstrap_outputs(target_out: jax.Array, target_q: jax.Array, online_q: jax.Array | None) -> jax.Array:
    """[B, atoms]: the target network's output [B, A, atoms] at the next action.
    DQN picks that action by the target network's own Q [B, A]; double Q
    (van Hasselt et al. 2016) picks it by the online network's Q and scores it
    with the target network, which removes the max's upward bias."""
    next_action = greedy_actions(target_q if online_q is None else online_q)
    return jnp.take_along_axis(target_out, next_action[:, None, None], axis=1)[:, 0]


# --------------------------------------------------------------------------- #
# Training
# --------------------------------------------------------------------------- #
class Rainbow(NamedTuple):
    init: Any  # (key, hparams=None) -> RunnerState
    update: Any  # RunnerState -> (RunnerState, metrics)
    train: Any  # (key, hparams=None) -> (RunnerState, metrics [num_updates])
    evaluate: Any  # (RunnerState, key) -> returns [eval_episodes]; with --capture-video also an envs.Recording
    q_values: Any  # (params, obs, key | None) -> Q [..., A]
    spec: envs.EnvSpec


def make_optimizer(args: Args) -> optax.GradientTransformation:
    """Adam (optionally after a global-norm clip) with the learning rate as an
    injected hyperparameter, so `learner_step` can set it from `Hyperparams`."""

    def adam(learning_rate):
        clip = [optax.clip_by_global_norm(args.max_grad_norm)] if args.max_grad_norm > 0 else []
        return optax.chain(*clip, optax.adam(learning_rate, eps=args.adam_eps))

    return optax.inject_hyperparams(adam)(learning_rate=args.learning_rate)


def td_loss(
    args: Args,
    graphdef: nnx.GraphDef,
    support: jax.Array,
    params: nnx.State,
    target_params: nnx.State,
    sample: buffers.Sample,
    hparams: Hyperparams,
    beta: jax.Array,
    key: jax.Array,
) -> tuple[jax.Array, tuple[jax.Array, dict[str, jax.Array]]]:
    """Mean importance-weighted TD loss of a batch of n-step windows [B, n].

    Distributional (num_atoms > 1): cross-entropy between the projected target
    distribution and the online one (Bellemare et al. 2017, eq. 7); else squared
    error or Huber on the TD error. Returns (loss, (priority [B], stats)).
    """
    network = lambda p, obs, k: nnx.merge(graphdef, p)(obs, k)  # [B, A, atoms]
    distributional = args.num_atoms > 1
    w = sample.windows
    returns, discount, last = n_step_targets(w.reward, w.terminated, w.truncated, hparams.gamma)
    bootstrap_obs = jnp.take_along_axis(w.final_obs, last.reshape((-1,) + (1,) * (w.final_obs.ndim - 1)), axis=1)[:, 0]
    obs, action = w.obs[:, 0], w.action[:, 0]
    online_key, next_key, target_key = jax.random.split(key, 3) if args.noisy else (None, None, None)

    target_out = network(target_params, bootstrap_obs, target_key)  # [B, A, atoms]
    target_q = mean_return(target_out, support)
    online_q = mean_return(network(params, bootstrap_obs, next_key), support) if args.double_q else None
    target_next = bootstrap_outputs(target_out, target_q, online_q)  # [B, atoms]
    online = jnp.take_along_axis(network(params, obs, online_key), action[:, None, None], axis=1)[:, 0]

    if distributional:
        target_probs = jax.lax.stop_gradient(
            categorical_projection(jax.nn.softmax(target_next), returns, discount, support)
        )
        per_sample = -jnp.sum(target_probs * jax.nn.log_softmax(online), axis=-1)  # cross-entropy
        priority = per_sample
    else:
        target = jax.lax.stop_gradient(returns + discount * target_next[:, 0])
        td_error = online[:, 0] - target
        per_sample = jnp.square(td_error) if args.loss == "mse" else optax.huber_loss(td_error, delta=1.0)
        priority = jnp.abs(td_error)
    weights = importance_weights(sample.probability, sample.num_valid, beta) if args.prioritized else 1.0
    loss = jnp.mean(weights * per_sample)
    q_taken = mean_return(online, support)
    return loss, (priority, {"loss": loss, "q_value": q_taken.mean(), "priority_max": priority.max()})


def learner_step(
    args: Args,
    graphdef: nnx.GraphDef,
    support: jax.Array,
    optimizer: optax.GradientTransformation,
    learner: Learner,
    buffer: buffers.Buffer,
    target_params: nnx.State,
    hparams: Hyperparams,
    beta: jax.Array,
) -> tuple[Learner, dict[str, jax.Array]]:
    """One gradient step on a batch of `batch_size` windows [B, n_step] drawn from
    `buffer` (whose priorities are the learner's), then the new priorities."""
    key, sample_key, noise_key = jax.random.split(learner.key, 3)
    if args.prioritized:
        buffer = buffer.replace(priority=learner.priority, max_priority=learner.max_priority)
    alpha = args.per_alpha if args.prioritized else None
    history = replay_history(args)
    sample = buffers.sample(buffer, sample_key, args.batch_size, args.n_step, alpha, history)
    if history:  # Atari: the replay holds single frames; the windows get their stacks back
        sample = sample._replace(windows=frame_stacks(sample.windows, args.frame_stack))
    # --parallel data: the sampled windows and their probabilities are split over devices.
    sample = sample._replace(**parallel.constrain_data({"windows": sample.windows, "probability": sample.probability}))
    grads, (priority, stats) = jax.grad(td_loss, argnums=3, has_aux=True)(
        args, graphdef, support, learner.params, target_params, sample, hparams, beta, noise_key
    )
    learning_rate = hparams.learning_rate
    if args.anneal_lr:  # linearly to 0 over the run's gradient steps
        learning_rate = optax.linear_schedule(learning_rate, 0.0, max(1, args.num_gradient_steps))(
            learner.gradient_steps
        )
    opt_state = learner.opt_state._replace(
        hyperparams={**learner.opt_state.hyperparams, "learning_rate": learning_rate}
    )
    updates, opt_state = optimizer.update(grads, opt_state, learner.params)
    learner = learner._replace(
        params=optax.apply_updates(learner.params, updates),
        opt_state=opt_state,
        key=key,
        gradient_steps=learner.gradient_steps + 1,
    )
    if args.prioritized:
        buffer = buffers.set_priorities(
            buffer, sample.rows, sample.envs, jax.lax.stop_gradient(priority) + hparams.per_eps
        )
        learner = learner._replace(priority=buffer.priority, max_priority=buffer.max_priority)
    return learner, stats


def update_target(target: nnx.State, online: nnx.State, tau: jax.Array, due: jax.Array) -> nnx.State:
    """target <- tau * online + (1 - tau) * target where `due` ([] bool); tau = 1 is
    a hard copy (1 * p + 0 * t is p exactly)."""
    return jax.tree.map(lambda t, p: jnp.where(due, tau * p + (1.0 - tau) * t, t), target, online)


def make_envs(args: Args):
    """(env, env_params, eval_env, spec, torso): the training envs (num_envs),
    the greedy evaluation's (eval_episodes) and the torso for their observations."""
    if atari.is_envpool(args.env_id):
        # DeepMind's preprocessing by envpool, stepped inside jit (common/atari.py), 84x84 grayscale
        # frames as uint8; the logged episode is the whole game, unclipped.
        # The Args' Atari flags as atari.make's keywords; the stacks built in jit, so the replay
        # can store single frames and rebuild them (frame_stacks).
        preprocessing = atari.preprocessing(args) | {"stack_in_jit": True}
        env, env_params = atari.make(args.env_id, args.num_envs, seed=args.seed, **preprocessing)
        eval_env, _ = atari.make(args.env_id, args.eval_episodes, seed=args.seed, role=1, **preprocessing)
        if args.capture_video:  # the newest frame at each step of env 0's first game (jaxzoo.video)
            eval_env = envs.RecordEpisode(eval_env, env.spec.max_episode_steps + 1)
        return env, env_params, eval_env, env.spec, "nature"
    max_steps = {"max_episode_steps": args.max_episode_steps} if args.max_episode_steps else {}
    probe_spec = envs.spec(*envs.make(args.env_id))
    if not probe_spec.discrete:
        raise ValueError(
            f"{args.env_id} has a continuous action space; Q-learning here needs discrete actions "
            "(use algos/ppo.py or algos/mpo.py for continuous control)"
        )
    image_obs = len(probe_spec.obs_shape) == 3
    torso = args.torso if args.torso != "auto" else ("cnn" if image_obs else "mlp")
    if torso in ("cnn", "nature") and not image_obs:
        raise ValueError(
            f"torso={torso!r} needs image observations [H, W, C]; {args.env_id} has {probe_spec.obs_shape}"
        )
    if torso == "nature" and min(probe_spec.obs_shape[:2]) < 36:
        raise ValueError(
            f"torso='nature' needs images of at least 36 x 36 pixels; {args.env_id} observations have shape "
            f"{probe_spec.obs_shape} (MinAtar's 10 x 10: torso='cnn')"
        )
    env, env_params = envs.make(args.env_id, args.num_envs, flatten_obs=torso == "mlp", **max_steps)
    eval_env, _ = envs.make(args.env_id, args.eval_episodes, flatten_obs=torso == "mlp", **max_steps)
    spec = envs.spec(env, env_params)  # --capture-video: record each seed's first evaluation episode (jaxzoo.video)
    eval_env = envs.RecordEpisode(eval_env, spec.max_episode_steps + 1) if args.capture_video else eval_env
    return env, env_params, eval_env, spec, torso


def make_train(args: Args) -> Rainbow:
    env, env_params, eval_env, spec, torso = make_envs(args)
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: QNetwork(spec, args, torso, nnx.Rngs(0))))
    support = jnp.linspace(args.v_min, args.v_max, args.num_atoms)
    vector_steps = args.train_frequency // args.num_envs
    total = float(args.total_timesteps)
    optimizer = make_optimizer(args)

    def q_values(params, obs, key=None):
        """[..., A]: expected return of each action."""
        return mean_return(nnx.merge(graphdef, params)(obs, key), support)

    def store(obs: jax.Array) -> jax.Array:
        """What the replay keeps of an observation: on Atari its newest frame (`frame_stacks`)."""
        return newest_frame(obs, args.frame_stack) if replay_history(args) else obs

    def epsilon(hp: Hyperparams, env_steps: jax.Array) -> jax.Array:
        return linear_schedule(hp.start_e, hp.end_e, hp.exploration_fraction * total, env_steps)

    def init(key: jax.Array, hparams: Hyperparams | None = None) -> RunnerState:
        hparams = Hyperparams.from_args(args) if hparams is None else hparams
        key, model_key, env_key = jax.random.split(key, 3)
        params = nnx.split(QNetwork(spec, args, torso, nnx.Rngs(model_key)))[1]
        obs, env_state = env.reset(env_key, env_params)
        stored = store(obs[0])
        example = Transition(stored, jnp.int32(0), jnp.float32(0), jnp.bool_(False), jnp.bool_(False), stored)
        return RunnerState(
            params=params,
            target_params=params,
            opt_state=optimizer.init(params),
            buffer=buffers.init(example, args.buffer_size, args.num_envs),
            env_state=env_state,
            obs=obs,
            key=key,
            env_steps=jnp.int32(0),
            gradient_steps=jnp.int32(0),
            hparams=hparams,
        )

    def act(state: RunnerState, _):
        """One step of every env: epsilon-greedy (or noisy-greedy) actions [num_envs], replay insertion."""
        key, noise_key, explore_key, action_key, step_key = jax.random.split(state.key, 5)
        greedy = greedy_actions(q_values(state.params, state.obs, noise_key if args.noisy else None))
        if args.noisy:
            action = greedy  # the noise explores (Fortunato et al. 2018)
        else:
            random_action = jax.random.randint(action_key, greedy.shape, 0, spec.num_actions)
            explore = jax.random.uniform(explore_key, greedy.shape) < epsilon(state.hparams, state.env_steps)
            action = jnp.where(explore, random_action, greedy)
        next_obs, env_state, reward, terminated, truncated, info = env.step(
            step_key, state.env_state, action, env_params
        )
        transition = Transition(
            store(state.obs), action, reward, terminated, truncated, store(info["final_observation"])
        )
        state = state.replace(
            buffer=buffers.add(state.buffer, transition),
            env_state=env_state,
            obs=next_obs,
            key=key,
            env_steps=state.env_steps + args.num_envs,
        )
        return state, {k: info[k] for k in ("episode_done", "episode_return", "episode_length")}

    def phase(state: RunnerState, _):
        """train_frequency env steps, then gradient_steps updates once learning has started,
        then the target update if its period ended during this phase."""
        state, episode_info = jax.lax.scan(act, state, None, vector_steps)
        learning = (state.env_steps >= args.learning_starts) & buffers.can_sample(
            state.buffer, args.n_step, replay_history(args)
        )
        beta = linear_schedule(state.hparams.per_beta0, state.hparams.per_beta1, total, state.env_steps)
        # The lax.cond carries only what learning changes, never the replay data or the
        # target network: under vmap (several seeds) the cond becomes a select of both
        # branches' outputs, which would otherwise copy the whole buffer every phase.
        learner = Learner(
            state.params,
            state.opt_state,
            state.key,
            state.gradient_steps,
            state.buffer.priority if args.prioritized else None,
            state.buffer.max_priority if args.prioritized else None,
        )
        step = lambda learner, _: learner_step(
            args, graphdef, support, optimizer, learner, state.buffer, state.target_params, state.hparams, beta
        )
        do_learn = lambda learner: jax.lax.scan(step, learner, None, args.gradient_steps)

        def skip(learner):
            shapes = jax.eval_shape(do_learn, learner)[1]
            return learner, jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype), shapes)

        learner, stats = jax.lax.cond(learning, do_learn, skip, learner)
        buffer = state.buffer
        if args.prioritized:
            buffer = buffer.replace(priority=learner.priority, max_priority=learner.max_priority)
        period_ended = (
            state.env_steps // args.target_update_period
            > (state.env_steps - args.train_frequency) // args.target_update_period
        )
        target = update_target(state.target_params, learner.params, state.hparams.tau, learning & period_ended)
        state = state.replace(
            params=learner.params,
            target_params=target,
            opt_state=learner.opt_state,
            key=learner.key,
            gradient_steps=learner.gradient_steps,
            buffer=buffer,
        )
        return state, (episode_info, stats)

    def update(state: RunnerState):
        """`steps_per_update` env steps per seed with the learning they trigger; metrics are
        means over that stretch (NaN loss while learning has not started)."""
        state, (episode_info, stats) = jax.lax.scan(phase, state, None, args.phases_per_update)
        metrics = {
            **envs.episode_metrics(episode_info),
            **jax.tree.map(jnp.nanmean, stats),
            "epsilon": jnp.float32(0.0 if args.noisy else epsilon(state.hparams, state.env_steps)),
            "gradient_steps": state.gradient_steps.astype(jnp.float32),
            "buffer_size": (state.buffer.size * args.num_envs).astype(jnp.float32),
        }
        if atari.is_envpool(args.env_id):
            # An Atari "episode" is the whole game: the unclipped score over all its lives (common/atari.py, 5).
            metrics["game_score"], metrics["game_length"] = metrics["episode_return"], metrics["episode_length"]
        if args.noisy:  # how much the learned noise still explores (it replaces epsilon)
            metrics["noise_scale"] = nnx.merge(graphdef, state.params).noise_scale()
            # Fraction of 16 noise draws x num_envs current observations whose noisy greedy
            # action differs from the mean network's: the noise's effective epsilon. Its key
            # is folded off the state key, which it does not advance.
            draws = jax.random.split(jax.random.fold_in(state.key, 1), 16)
            noisy_actions = jax.vmap(lambda k: greedy_actions(q_values(state.params, state.obs, k)))(draws)
            metrics["noisy_action_changes"] = jnp.mean(
                noisy_actions != greedy_actions(q_values(state.params, state.obs))
            )
        return state, metrics

    def train(key: jax.Array, hparams: Hyperparams | None = None):
        """The whole run as one `lax.scan` over updates: jit it, vmap it over
        seeds (keys) and hyperparameters."""
        return jax.lax.scan(lambda s, _: update(s), init(key, hparams), None, args.num_updates)

    def evaluate(state: RunnerState, key: jax.Array) -> jax.Array:
        """Greedy with respect to the mean network (no epsilon, no noise); one
        episode in each of `eval_episodes` envs."""
        greedy = lambda obs: greedy_actions(q_values(state.params, obs))
        return envs.evaluate_episodes(eval_env, env_params, greedy, key, spec.max_episode_steps + 1)

    return Rainbow(init, update, train, evaluate, q_values, spec)


# --------------------------------------------------------------------------- #
# Host loop
# --------------------------------------------------------------------------- #
def main(args: Args) -> runner.RunResult:
    """Train `num_seeds` seeds in chunks of `log_every` updates (common/runner.py:
    run directory, metrics.csv, progress, checkpoints with replay, resume), then evaluate greedily."""
    # Resume, run-root and cache checks, before anything is built; the CPU devices of --parallel (Args.DATA_AXIS).
    args = runner.prepare(args, "rainbow")
    algo = make_train(args)
    return runner.run(
        args,
        "rainbow",
        algo.init,
        algo.update,
        algo.evaluate,
        num_updates=args.num_updates,
        steps_per_update=args.steps_per_update,
        eval_every=args.eval_every,
        # --parallel data: the environments (axis 0 of env_state and obs) and the replay columns they
        # fill (axis 1 of the buffer's data and priorities, [rows, num_envs]) are split over devices.
        data_axes=lambda state: jax.tree.map(lambda _: None, state).replace(
            env_state=0, obs=0, buffer=jax.tree.map(lambda _: None, state.buffer).replace(data=1, priority=1)
        ),
    )


if __name__ == "__main__":
    with cli.user_errors():
        main(cli.parse(Args, "rainbow"))
