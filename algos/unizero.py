"""UniZero: MuZero-style planning with mctx on a transformer world model, the
whole run in one `jax.jit`.

Paper: Pu et al. 2024, "UniZero: Generalized and Efficient Planning with
Scalable Latent World Models" (arXiv:2406.10667), built on MuZero (Schrittwieser
et al. 2020, arXiv:1911.08265) and Gumbel MuZero (Danihelka et al. 2022,
"Policy improvement by planning with Gumbel", ICLR); search by mctx
(github.com/google-deepmind/mctx).

The idea: one causal transformer over interleaved (observation-latent, action)
tokens is the whole model. Heads read the next latent and the reward at action
tokens, the policy and the value at latent tokens. Acting runs a tree search
in that model: the root is the transformer over the recent real history, every
simulation appends an imagined action token and the predicted latent token to
the node's bounded token window. The search's improved policy picks the action
and becomes the policy target; replayed windows of `num_unroll_steps` steps
train all heads at once against observed rewards, n-step value targets from an
EMA target model, and the target encoder's latent of the next observation:

    loss = 10 latent MSE + 1 reward CE + 1 policy CE(search weights)
           + 0.5 value CE(two-hot h(n-step return)).

    python algos/unizero.py                          # CartPole-v1 (= --preset cartpole)
    python algos/unizero.py --preset cartpole-v0     # LightZero's CartPole config (200-step episodes)
    python algos/unizero.py --search-policy puct     # MuZero's PUCT search with Dirichlet noise
    python algos/unizero.py --preset atari-100k      # envpool:Breakout-v5 from 64x64 RGB frames (atari extra)

Details, logged metrics and measured results: docs/unizero.md.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
import mctx
import numpy as np
import optax
from flax import nnx, struct

from jaxzoo import atari, buffers, cli, envs, layers, parallel, runner
from jaxzoo.checks import AtLeastOne, Fraction, NonNegative, OpenFraction, Positive, Range, check_fields

# --------------------------------------------------------------------------- #
# Arguments
# --------------------------------------------------------------------------- #
# MuZero's visit temperature schedule halves and quarters the temperature at these fractions of the run
# (Schrittwieser et al. 2020, pseudocode: 500k and 750k of 1M training steps).
MUZERO_TEMPERATURE_STEPS = (0.5, 0.75)


@dataclass(frozen=True)
class Args:
    """UniZero: a transformer world model planned with mctx (Gumbel MuZero or PUCT)."""

    exp_name: str = "unizero"
    """name of the experiment: part of the run directory and the plot label"""
    seed: Annotated[int, NonNegative] = 0
    """seed of the first run; seed index i uses seed + i"""
    num_seeds: Annotated[int, AtLeastOne] = 1
    """independent seeds trained at once with `jax.vmap`"""
    env_id: str = "CartPole-v1"
    """gymnax environment id (discrete actions only), or an Atari game stepped by envpool inside jit, 'envpool:<Game>-v5' (needs the `atari` extra; one seed per process; docs/unizero.md, Atari)"""
    total_timesteps: Annotated[int, AtLeastOne] = 50_000
    """environment steps per seed"""
    log_every: Annotated[int, AtLeastOne] = 5
    """updates per jitted chunk: metrics, progress and checkpoints happen between chunks"""
    track: bool = False
    """log to Weights & Biases (needs the `logging` extra)"""
    tensorboard: bool = False
    """write TensorBoard event files into the run directory (needs the `logging` extra)"""
    save_model: bool = True
    """write checkpoints of the whole runner state, replay included (needed for --resume)"""
    checkpoint_every: Annotated[int, AtLeastOne] = 50
    """updates between checkpoints (rounded up to a chunk boundary); one is also written at the end"""
    resume: str | None = None
    """run directory to resume: the run continues with its saved args.json; a flag that differs from it is refused, except total_timesteps and the reporting flags (docs/reliability.md)"""
    run_root: str = "runs"
    """directory under which run directories are created"""
    eval_episodes: Annotated[int, AtLeastOne] = 10
    """greedy evaluation episodes per seed at the end of training (with search, no noise)"""
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
    """updates between greedy evaluations during training (search, no noise), logged as eval_return; 0: only at the end"""
    max_episode_steps: Annotated[int, NonNegative] = 0
    """time limit of an episode in env steps; 0 keeps the env's own (200 for LightZero's CartPole-v0; envpool: 27,000 agent steps)"""
    num_envs: Annotated[int, AtLeastOne] = 8
    """parallel environments per seed (LightZero: 8 collector envs)"""
    DATA_AXIS: ClassVar[str] = "num_envs"
    """the field --parallel data splits over the devices (the environments; runner.data_axis)"""
    num_steps: Annotated[int, AtLeastOne] = 25
    """env steps per env in one update: collect num_envs x num_steps transitions, then train"""
    replay_ratio: Annotated[float, Positive] = 0.25
    """gradient steps per new env step (LightZero: 0.25); each update runs replay_ratio x num_envs x num_steps"""
    buffer_size: Annotated[int, AtLeastOne] = 100_000
    """replay capacity in transitions per seed"""
    priority_exponent: Annotated[float, NonNegative] = 0.0
    """prioritised replay (MuZero, Schrittwieser et al. 2020, Appendix G): windows are drawn with probability proportional to p^this, p = |search value - n-step value target| of the window's first step, new steps at the largest p seen; MuZero's Atari runs: 1; 0: uniform (LightZero's UniZero: use_priority False)"""
    priority_correction: Annotated[float, Fraction] = 1.0
    """prioritised replay: beta of the importance weights (N P)^-beta / max that scale each window's loss (Schaul et al. 2016; MuZero: 1); read only with priority_exponent > 0"""
    learning_starts: Annotated[int, NonNegative] = 256
    """env steps per seed before the first gradient step"""
    batch_size: Annotated[int, AtLeastOne] = 256
    """replayed windows per gradient step"""
    num_unroll_steps: Annotated[int, AtLeastOne] = 5
    """env steps per training window (LightZero: 5); also the longest context the model is shown"""
    td_steps: Annotated[int, AtLeastOne] = 5
    """n of the n-step value targets"""
    td_steps_age: Annotated[int, NonNegative] = 0
    """off-policy correction of the value targets (EfficientZero, Ye et al. 2021, section 4.3): a window whose first step is a env steps old sums only max(1, td_steps - a // td_steps_age) real rewards before it bootstraps from the target model, since old steps follow an older policy (EfficientZero: 0.3 x its run, 30,000 of 100k); 0: off, every window td_steps"""
    gamma: Annotated[float, Fraction] = 0.997
    """discount of the value targets and of the search"""
    context_steps: Annotated[int, AtLeastOne] = 4
    """real steps (the current one included) the search root sees, at most num_unroll_steps (LightZero: 8 tokens)"""
    search_policy: Literal["gumbel", "puct"] = "gumbel"
    """mctx search: Gumbel MuZero (acts with its Gumbel action) or MuZero's PUCT (acts on visit counts)"""
    num_simulations: Annotated[int, AtLeastOne] = 16
    """simulations per search (LightZero's CartPole: 25 with PUCT)"""
    search_kv_cache: bool = False
    """the search keeps each node's keys and values and runs only its new tokens (LightZero's KV cache) instead of recomputing the node's whole window: 2.8-3.2x faster per search, but another search once a real token leaves the window, and on CartPole-v0 it needed more env steps (docs/unizero.md, "A cached search")"""
    max_num_considered_actions: Annotated[int, AtLeastOne] = 16
    """Gumbel MuZero: actions sampled without replacement at the root (sequential halving)"""
    dirichlet_alpha: Annotated[float, Positive] = 0.3
    """PUCT: Dirichlet noise concentration at the root during collection"""
    dirichlet_fraction: Annotated[float, Fraction] = 0.25
    """PUCT: weight of the Dirichlet noise in the root prior during collection"""
    visit_temperature: Annotated[float, Positive] = 0.25
    """PUCT: collection samples actions from visit counts ^ (1 / visit_temperature)"""
    visit_temperature_decay: bool = False
    """PUCT: collection's visit temperature is visit_temperature x 1, 0.5 and 0.25 in the run's first half, third quarter and last quarter (the steps move with --visit-temperature-decay-at; MuZero's Atari schedule, the visit_softmax_temperature of Schrittwieser et al. 2020's pseudocode: 1.0, 0.5, 0.25 below 500k, 750k and 1M training steps); off: constant"""
    visit_temperature_decay_at: tuple[float, float] = MUZERO_TEMPERATURE_STEPS
    """with --visit-temperature-decay: the fractions of total_timesteps done at which the visit temperature halves and quarters (MuZero's: 0.5 0.75)"""
    explore_epsilon: Annotated[float, Fraction] = 0.0
    """probability that a collection step takes a uniformly random action instead of the search's (epsilon-greedy on top of the search, LightZero's eps_greedy_exploration_in_collect; the policy target stays the search's); 0: none"""
    q_rescale_min_gap: Annotated[float, Positive] = 1e-8
    """the search rescales a node's Q-values to [0, 1] by (q - min) / max(max - min, this) (mctx's epsilon, 1e-8; LightZero's value_delta_max is 0.01): gaps smaller than it stay small instead of becoming 0 and 1"""
    latent_coef: Annotated[float, NonNegative] = 10.0
    """weight of the latent-consistency MSE"""
    reward_coef: Annotated[float, NonNegative] = 1.0
    """weight of the reward cross-entropy"""
    policy_coef: Annotated[float, NonNegative] = 1.0
    """weight of the policy cross-entropy against the search's action weights"""
    value_coef: Annotated[float, NonNegative] = 0.5
    """weight of the value cross-entropy"""
    policy_entropy_coef: Annotated[float, NonNegative] = 0.0
    """weight of a bonus on the policy head's entropy, subtracted from the loss (LightZero's policy_entropy_weight: 1e-4 to 5e-3 in its UniZero configs); 0: none"""
    terminal_value_coef: Annotated[float, NonNegative] = 0.0
    """weight of a value cross-entropy toward 0 on the frame after each termination (MuZero's absorbing state: nothing follows an episode's end), each frame read alone as the truncation bootstrap reads one; without it the value head never sees those frames and the search may value an imagined loss like a catch (docs/unizero.md, Breakout); 0: none (at 0 the loss compiles without the term)"""
    advantage_coef: Annotated[float, NonNegative] = 0.0
    """weight of an advantage-weighted regression of the prior onto the replayed actions (AWR: weights exp(advantage), advantage = n-step real return - V normalised per batch, at most 20): real returns move the prior where the search's Q-values differ too little (docs/unizero.md, Breakout); 0: none (not a Hyperparams field: at 0 the loss compiles without the term)"""
    learning_rate: Annotated[float, Positive] = 1e-4
    """AdamW learning rate"""
    anneal_lr: bool = False
    """decay the learning rate linearly to 0 over the run's updates, as PPO's --anneal-lr (off: LightZero's constant rate)"""
    weight_decay: Annotated[float, NonNegative] = 1e-4
    """AdamW weight decay (on matrices only)"""
    max_grad_norm: Annotated[float, NonNegative] = 5.0
    """global gradient-norm clip (0 turns clipping off)"""
    target_update_rate: Annotated[float, OpenFraction] = 0.05
    """EMA rate of the target model (latent and value targets), per gradient step"""
    embed_dim: Annotated[int, AtLeastOne] = 64
    """latent and token width"""
    num_layers: Annotated[int, AtLeastOne] = 2
    """transformer layers"""
    num_heads: Annotated[int, AtLeastOne] = 2
    """attention heads"""
    dropout: Annotated[float, Range(ge=0, lt=1)] = 0.1
    """dropout in the transformer during training (LightZero: 0.1); acting and targets run without it"""
    support_size: Annotated[int, Range(ge=3)] = 101
    """bins of the categorical reward and value heads, on [-(n-1)/2, (n-1)/2] in h-space"""
    conv_channels: Annotated[int, Range(ge=2)] = 64
    """envpool ids: channels of the downsampling ResNet encoder (its first stage has half; LightZero's num_channels: 64)"""
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

    def __post_init__(self):
        check_fields(self)  # the ranges beside the fields (jaxzoo.checks)
        if atari.is_envpool(self.env_id):
            atari.check_args(self)  # what an envpool id cannot do (common/atari.py): several seeds, --parallel data
        if self.context_steps > self.num_unroll_steps:
            raise ValueError(
                f"context_steps={self.context_steps} exceeds num_unroll_steps={self.num_unroll_steps} (the root would "
                f"see a longer history than any training window); accepted: context_steps <= {self.num_unroll_steps}"
            )
        if self.embed_dim % (2 * self.num_heads):
            raise ValueError(
                f"embed_dim={self.embed_dim} does not split into num_heads={self.num_heads} heads of even "
                f"size; accepted: a multiple of 2 * num_heads = {2 * self.num_heads}"
            )
        if self.support_size % 2 == 0:
            raise ValueError(
                f"support_size={self.support_size} is even; accepted: an odd number >= 3 (the support is centred on 0)"
            )
        if self.buffer_size // self.num_envs < self.window_length + 1:
            raise ValueError(
                f"buffer_size={self.buffer_size} holds fewer than window_length + 1 = {self.window_length + 1} rows of "
                f"num_envs={self.num_envs} transitions; accepted: buffer_size >= "
                f"{(self.window_length + 1) * self.num_envs}"
            )
        if self.priority_correction != 1.0 and self.priority_exponent == 0:
            raise ValueError(
                f"priority_correction={self.priority_correction} with priority_exponent=0: importance weights "
                "correct prioritised sampling only; accepted: --priority-exponent > 0, or no --priority-correction"
            )
        if self.visit_temperature_decay and self.search_policy != "puct":
            raise ValueError(
                f"visit_temperature_decay=True with search_policy={self.search_policy!r}: only PUCT samples actions "
                "from visit counts; accepted: --search-policy puct, or no --visit-temperature-decay"
            )
        halve_at, quarter_at = self.visit_temperature_decay_at
        if not 0.0 <= halve_at <= quarter_at <= 1.0:
            raise ValueError(
                f"visit_temperature_decay_at={self.visit_temperature_decay_at} are not two fractions of the run in "
                "order; accepted: 0 <= halve <= quarter <= 1, e.g. 0.5 0.75"
            )
        if self.visit_temperature_decay_at != MUZERO_TEMPERATURE_STEPS and not self.visit_temperature_decay:
            raise ValueError(
                f"visit_temperature_decay_at={self.visit_temperature_decay_at} without --visit-temperature-decay: the "
                "temperature is constant; accepted: --visit-temperature-decay with it, or no --visit-temperature-decay-at"
            )
        if self.num_updates < 1:
            raise ValueError(
                f"total_timesteps={self.total_timesteps} is less than one update (num_envs * num_steps = "
                f"{self.steps_per_update} steps); accepted: total_timesteps >= {self.steps_per_update}"
            )

    @property
    def steps_per_update(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.steps_per_update

    @property
    def gradient_steps(self) -> int:
        return max(1, round(self.replay_ratio * self.steps_per_update))

    @property
    def window_length(self) -> int:
        """Rows of a replayed window: num_unroll_steps trained steps, then td_steps
        more whose rewards and observations the n-step targets read."""
        return self.num_unroll_steps + self.td_steps


# --------------------------------------------------------------------------- #
# Networks
# --------------------------------------------------------------------------- #
def h_transform(x: jax.Array, eps: float = 1e-3) -> jax.Array:
    """h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x (Pohlen et al. 2018), which
    squashes returns so one categorical support covers them."""
    return jnp.sign(x) * (jnp.sqrt(jnp.abs(x) + 1.0) - 1.0) + eps * x


def h_inverse(y: jax.Array, eps: float = 1e-3) -> jax.Array:
    """The exact inverse of `h_transform`."""
    return jnp.sign(y) * (jnp.square((jnp.sqrt(1.0 + 4.0 * eps * (jnp.abs(y) + 1.0 + eps)) - 1.0) / (2.0 * eps)) - 1.0)


def two_hot(y: jax.Array, support_size: int) -> jax.Array:
    """[...] values in h-space -> [..., support_size] probabilities on the integer
    support [-(n-1)/2, (n-1)/2]: the mass is split between the two nearest bins
    so the expectation is y (clipped to the support)."""
    half = (support_size - 1) // 2
    y = jnp.clip(y, -half, half)
    low = jnp.floor(y)
    upper_weight = y - low
    index = (low + half).astype(jnp.int32)
    return (
        jax.nn.one_hot(index, support_size) * (1.0 - upper_weight)[..., None]
        + jax.nn.one_hot(jnp.minimum(index + 1, support_size - 1), support_size) * upper_weight[..., None]
    )


def scalar_to_probs(x: jax.Array, support_size: int) -> jax.Array:
    return two_hot(h_transform(x), support_size)


def logits_to_scalar(logits: jax.Array) -> jax.Array:
    """[..., n] categorical logits -> [...] scalars: expectation on the support, then h^-1."""
    half = (logits.shape[-1] - 1) // 2
    support = jnp.arange(-half, half + 1, dtype=jnp.float32)
    return h_inverse(jnp.sum(jax.nn.softmax(logits, axis=-1) * support, axis=-1))


def rope(x: jax.Array, positions: jax.Array, theta: float = 1e4) -> jax.Array:
    """Rotary position embedding (Su et al. 2021): x [B, T, H, Dh], positions [B, T]."""
    half = x.shape[-1] // 2
    freqs = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions[..., None, None].astype(jnp.float32) * freqs  # [B, T, 1, half]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate(
        [x1 * jnp.cos(angles) - x2 * jnp.sin(angles), x1 * jnp.sin(angles) + x2 * jnp.cos(angles)], -1
    )


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """Inverted dropout; identity without a key (acting, evaluation) or at rate 0."""
    if key is None or rate == 0.0:
        return x
    # Drawn as one flat vector, then reshaped: the same bits (threefry's counter is each
    # element's flat index), but XLA:CPU compiles a draw of a 4-D shape such as the
    # attention weights' [B, H, T, T] slowly: 2.0-3.4 s for [256, 2, 10, 10] against 0.2 s
    # flat, about 3 s off the CartPole learn phase's compile (docs/performance.md, "Random draws").
    keep = jax.random.bernoulli(key, 1.0 - rate, (x.size,)).reshape(x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


class Block(nnx.Module):
    """Pre-LayerNorm transformer block: x += attn(ln(x)); x += mlp(ln(x))."""

    def __init__(self, dim: int, heads: int, dropout_rate: float, rngs: nnx.Rngs):
        self.norm1, self.norm2 = nnx.LayerNorm(dim, rngs=rngs), nnx.LayerNorm(dim, rngs=rngs)
        self.qkv = nnx.Linear(dim, 3 * dim, rngs=rngs)
        self.proj = nnx.Linear(dim, dim, rngs=rngs)
        self.mlp_in, self.mlp_out = nnx.Linear(dim, 4 * dim, rngs=rngs), nnx.Linear(4 * dim, dim, rngs=rngs)
        self.heads, self.dropout_rate = heads, dropout_rate

    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array, key: jax.Array | None = None) -> jax.Array:
        """x [B, T, D], positions [B, T], mask [B, T, T] (True: query may attend to key);
        `key` turns dropout on (training)."""
        q, k, v = self.heads_of(x, positions)
        return self.mix(x, q, k, v, mask, key)

    def heads_of(self, x: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Queries, keys and values [B, T, H, Dh] of x [B, T, D] at positions [B, T], RoPE on q and k."""
        batch, length, dim = x.shape
        q, k, v = jnp.split(
            self.qkv(self.norm1(x)).reshape(batch, length, 3 * self.heads, dim // self.heads), 3, axis=2
        )
        return rope(q, positions), rope(k, positions), v

    def mix(self, x, q, k, v, mask: jax.Array, key: jax.Array | None = None) -> jax.Array:
        """x [B, T, D] plus the attention of its queries q [B, T, H, Dh] over keys and
        values [B, S, H, Dh] (mask [B, T, S]), then plus the MLP: the block's output [B, T, D]."""
        keys = [None] * 3 if key is None else list(jax.random.split(key, 3))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
        scores = jnp.where(mask[:, None], scores, -1e30)
        attention = dropout(jax.nn.softmax(scores, axis=-1), self.dropout_rate, keys[0])
        out = jnp.einsum("bhqk,bkhd->bqhd", attention, v).reshape(x.shape)
        x = x + dropout(self.proj(out), self.dropout_rate, keys[1])
        return x + dropout(self.mlp_out(jax.nn.gelu(self.mlp_in(self.norm2(x)))), self.dropout_rate, keys[2])


def head(dim: int, out: int, rngs: nnx.Rngs) -> nnx.Sequential:
    """Linear -> GELU -> Linear with a zero-initialised output layer (LightZero's heads)."""
    return nnx.Sequential(
        nnx.Linear(dim, dim, rngs=rngs),
        jax.nn.gelu,
        nnx.Linear(dim, out, kernel_init=nnx.initializers.zeros_init(), rngs=rngs),
    )


class Encoder(nnx.Module):
    """obs [..., *obs_shape] -> latent [..., D]: MLP (Linear -> LayerNorm -> GELU, twice)
    and a final LayerNorm, for vector observations; for images (MinAtar) a 3x3
    convolution written as patches @ kernel first (docs/ppo.md, detail 13).
    LightZero uses BatchNorm inside the MLP; LayerNorm avoids batch statistics."""

    def __init__(self, obs_shape: tuple[int, ...], dim: int, rngs: nnx.Rngs):
        self.image = len(obs_shape) == 3
        if self.image:
            height, width, channels = obs_shape
            self.conv = nnx.Linear(9 * channels, 16, rngs=rngs)
            features = (height - 2) * (width - 2) * 16
        else:
            features = int(np.prod(obs_shape))
        self.linear1, self.norm1 = nnx.Linear(features, dim, rngs=rngs), nnx.LayerNorm(dim, rngs=rngs)
        self.linear2, self.norm2 = nnx.Linear(dim, dim, rngs=rngs), nnx.LayerNorm(dim, rngs=rngs)
        self.out_norm = nnx.LayerNorm(dim, rngs=rngs)

    def __call__(self, obs: jax.Array) -> jax.Array:
        if self.image:
            x = jax.nn.relu(self.conv(layers.patches(obs, 3)))  # [..., H-2, W-2, 16]
            x = x.reshape(x.shape[:-3] + (-1,))
        else:
            x = obs
        x = jax.nn.gelu(self.norm1(self.linear1(x)))
        x = jax.nn.gelu(self.norm2(self.linear2(x)))
        return self.out_norm(x)


def conv3x3(x: jax.Array, kernel: nnx.Linear, stride: int = 1) -> jax.Array:
    """[..., H, W, C] -> [..., ceil(H / stride), ceil(W / stride), C_out]: a 3x3
    convolution over one pixel of zero padding, written as patches @ kernel
    (`kernel` is an nnx.Linear from 9 C to C_out; docs/ppo.md, detail 13)."""
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 3) + [(1, 1), (1, 1), (0, 0)])
    return kernel(layers.patches(x, 3, stride))


def average_pool(x: jax.Array) -> jax.Array:
    """[..., H, W, C] -> [..., ceil(H / 2), ceil(W / 2), C]: 3x3 average pooling
    with stride 2 over one pixel of zero padding, the zeros counted in the mean
    (PyTorch's AvgPool2d(3, 2, 1), which LightZero's encoder uses)."""
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 3) + [(1, 1), (1, 1), (0, 0)])
    windows = layers.patches(x, 3, 2)  # [..., h, w, 9 C], tap-major
    return windows.reshape(windows.shape[:-1] + (9, x.shape[-1])).mean(-2)


def feature_map_norm(channels: int, rngs: nnx.Rngs) -> nnx.LayerNorm:
    """LayerNorm over a whole feature map [..., H, W, C] with a scale and a bias
    per channel (LightZero's norm_type 'LN'): no batch statistics, unlike
    BatchNorm. Not per pixel: Atari frames have uniform regions (Breakout's
    black background), where a per-pixel norm would divide ~0 by ~0 and its
    gradient would explode."""
    return nnx.LayerNorm(channels, epsilon=1e-5, reduction_axes=(-3, -2, -1), feature_axes=-1, rngs=rngs)


class ResidualBlock(nnx.Module):
    """[..., H, W, C] -> [..., H, W, C]: GELU(x + LN(conv(GELU(LN(conv(x)))))),
    the "basic" residual block of MuZero's Atari encoder, with
    `feature_map_norm` in place of BatchNorm."""

    def __init__(self, channels: int, rngs: nnx.Rngs):
        self.conv1, self.norm1 = nnx.Linear(9 * channels, channels, rngs=rngs), feature_map_norm(channels, rngs)
        self.conv2, self.norm2 = nnx.Linear(9 * channels, channels, rngs=rngs), feature_map_norm(channels, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        y = jax.nn.gelu(self.norm1(conv3x3(x, self.conv1)))
        return jax.nn.gelu(x + self.norm2(conv3x3(y, self.conv2)))


class AtariEncoder(nnx.Module):
    """Atari frames [..., H, W, C] (uint8) -> latent [..., D]: UniZero's
    downsampling ResNet (LightZero's DownSample + RepresentationNetworkUniZero,
    after MuZero's Atari representation network, Schrittwieser et al. 2020,
    appendix), in a lighter form (docs/unizero.md, Atari):

        3x3 conv stride 2 (C/2) -> res block -> 3x3 conv stride 2 (C) -> res block
        -> 3x3 average pool stride 2 -> res block -> flatten -> Linear -> LayerNorm

    so a 64 x 64 frame becomes 8 x 8 x C features (LightZero's 64 x 8 x 8 =
    4096 for C = 64) before the projection to D. Frames are scaled to [0, 1]
    here, so replay keeps bytes."""

    def __init__(self, obs_shape: tuple[int, ...], dim: int, channels: int, rngs: nnx.Rngs):
        height, width, in_channels = obs_shape
        half = channels // 2
        self.conv1, self.norm1 = nnx.Linear(9 * in_channels, half, rngs=rngs), feature_map_norm(half, rngs)
        self.block1 = ResidualBlock(half, rngs)
        self.conv2, self.norm2 = nnx.Linear(9 * half, channels, rngs=rngs), feature_map_norm(channels, rngs)
        self.block2 = ResidualBlock(channels, rngs)
        self.block3 = ResidualBlock(channels, rngs)
        eighth = lambda n: -(-n // 8)  # three halvings, each rounding up
        self.linear = nnx.Linear(eighth(height) * eighth(width) * channels, dim, rngs=rngs)
        self.out_norm = nnx.LayerNorm(dim, rngs=rngs)

    def __call__(self, obs: jax.Array) -> jax.Array:
        x = obs.astype(jnp.float32) / 255.0
        x = self.block1(jax.nn.gelu(self.norm1(conv3x3(x, self.conv1, 2))))  # [..., H/2, W/2, C/2]
        x = self.block2(jax.nn.gelu(self.norm2(conv3x3(x, self.conv2, 2))))  # [..., H/4, W/4, C]
        x = self.block3(average_pool(x))  # [..., H/8, W/8, C]
        return self.out_norm(self.linear(x.reshape(x.shape[:-3] + (-1,))))


class WorldModel(nnx.Module):
    """UniZero's model: encoder, action embedding, causal transformer, heads.

    Tokens come in (latent, action) pairs; the latent of env timestep t sits at
    position 2t and its action at 2t + 1. `transformer` runs any token sequence;
    the heads read the next latent (with LayerNorm) and the reward at action
    tokens, the policy and the value at latent tokens.
    """

    def __init__(self, obs_shape, num_actions: int, args: Args, rngs: nnx.Rngs):
        dim = args.embed_dim
        self.encoder = (  # envpool ids: the downsampling ResNet for Atari frames; else the MLP / MinAtar conv
            AtariEncoder(obs_shape, dim, args.conv_channels, rngs)
            if atari.is_envpool(args.env_id)
            else Encoder(obs_shape, dim, rngs)
        )
        self.action_embedding = nnx.Embed(num_actions, dim, rngs=rngs)
        self.blocks = nnx.List([Block(dim, args.num_heads, args.dropout, rngs) for _ in range(args.num_layers)])
        self.final_norm = nnx.LayerNorm(dim, rngs=rngs)
        self.latent_head = head(dim, dim, rngs)
        self.latent_norm = nnx.LayerNorm(dim, rngs=rngs)
        self.reward_head = head(dim, args.support_size, rngs)
        self.policy_head = head(dim, num_actions, rngs)
        self.value_head = head(dim, args.support_size, rngs)

    def transformer(self, tokens: jax.Array, positions: jax.Array, mask: jax.Array, key=None) -> jax.Array:
        """tokens [B, T, D], positions [B, T], mask [B, T, T] -> hidden states [B, T, D]."""
        keys = [None] * len(self.blocks) if key is None else list(jax.random.split(key, len(self.blocks)))
        for block, block_key in zip(self.blocks, keys):
            tokens = block(tokens, positions, mask, block_key)
        return self.final_norm(tokens)

    def next_latent(self, hidden: jax.Array) -> jax.Array:
        return self.latent_norm(self.latent_head(hidden))

    def cached_pass(self, tokens: jax.Array, positions: jax.Array, mask: jax.Array):
        """`transformer` (no dropout) that also keeps each block's keys and values:
        hidden states [B, T, D], keys and values [B, blocks, T, H, Dh]."""
        keys, values = [], []
        for block in self.blocks:
            q, k, v = block.heads_of(tokens, positions)
            keys.append(k)
            values.append(v)
            tokens = block.mix(tokens, q, k, v, mask)
        return self.final_norm(tokens), jnp.stack(keys, 1), jnp.stack(values, 1)

    def extend(self, node: CachedNode, token: jax.Array, position: jax.Array) -> tuple[CachedNode, jax.Array]:
        """One new token [B, D] at `position` [B] through every block: its query attends
        to the node's cached keys and values and its own, the oldest slot dropped (a FIFO
        of fixed width, as `push_token`). Returns the child node and the token's hidden
        state [B, D]; only the new token is computed."""
        x, at = token[:, None], position[:, None]
        valid = jnp.concatenate([node.valid[:, 1:], jnp.ones_like(node.valid[:, :1])], 1)
        keys, values = [], []
        for index, block in enumerate(self.blocks):
            q, k, v = block.heads_of(x, at)
            keys.append(jnp.concatenate([node.keys[:, index, 1:], k], 1))
            values.append(jnp.concatenate([node.values[:, index, 1:], v], 1))
            x = block.mix(x, q, keys[-1], values[-1], valid[:, None, :])
        positions = jnp.concatenate([node.positions[:, 1:], at], 1)
        return CachedNode(jnp.stack(keys, 1), jnp.stack(values, 1), positions, valid), self.final_norm(x)[:, 0]


class Window(NamedTuple):
    """A chunk of `num_unroll_steps` steps as the model sees it; leaves [B, K, ...]."""

    obs: jax.Array  # [B, K, *obs_shape]
    action: jax.Array  # [B, K] int32
    timestep: jax.Array  # [B, K] env timestep of each step's observation
    segment: jax.Array  # [B, K] episode index within the chunk (tokens attend within one segment)
    obs_valid: jax.Array  # [B, K] bool: step k's latent token exists
    action_valid: jax.Array  # [B, K] bool: step k's action token exists


def window_tokens(model: WorldModel, window: Window, latents: jax.Array | None = None):
    """Interleave a window into 2K tokens [o_0, a_0, ..., o_{K-1}, a_{K-1}] with
    their positions (2t, 2t + 1) and the attention mask: causal, within one
    segment (episode), and only among tokens that exist."""
    latents = model.encoder(window.obs) if latents is None else latents  # [B, K, D]
    actions = model.action_embedding(window.action)
    batch, steps, dim = latents.shape
    tokens = jnp.stack([latents, actions], axis=2).reshape(batch, 2 * steps, dim)
    positions = jnp.stack([2 * window.timestep, 2 * window.timestep + 1], axis=2).reshape(batch, 2 * steps)
    valid = jnp.stack([window.obs_valid, window.action_valid], axis=2).reshape(batch, 2 * steps)
    segment = jnp.repeat(window.segment, 2, axis=1)
    causal = jnp.tril(jnp.ones((2 * steps, 2 * steps), bool))
    mask = causal[None] & (segment[:, :, None] == segment[:, None, :]) & valid[:, None, :]
    mask = mask | jnp.eye(2 * steps, dtype=bool)[None]  # every token attends at least to itself
    return tokens, positions, mask


def forward_window(model: WorldModel, window: Window, key: jax.Array | None = None):
    """One pass over a window. Returns, per step [B, K, ...]: policy logits and
    value logits (at latent tokens), next-latent predictions and reward logits
    (at action tokens). `key` turns dropout on."""
    tokens, positions, mask = window_tokens(model, window)
    hidden = model.transformer(tokens, positions, mask, key)
    at_latent, at_action = hidden[:, 0::2], hidden[:, 1::2]
    return (
        model.policy_head(at_latent),
        model.value_head(at_latent),
        model.next_latent(at_action),
        model.reward_head(at_action),
    )


def window_mask(valid: jax.Array) -> jax.Array:
    """[B, W, W] causal attention mask of a token window over its valid tokens
    (valid [B, W]); every token sees itself."""
    width = valid.shape[1]
    return (jnp.tril(jnp.ones((width, width), bool))[None] & valid[:, None, :]) | jnp.eye(width, dtype=bool)[None]


def last_hidden(model: WorldModel, node: SearchNode) -> jax.Array:
    """Hidden state [B, D] of the last token of a token window (causal, valid tokens only)."""
    return model.transformer(node.tokens, node.positions, window_mask(node.valid))[:, -1]


def push_token(node: SearchNode, token: jax.Array, position: jax.Array) -> SearchNode:
    """Append a token [B, D] at `position` [B], dropping the oldest (a FIFO of fixed width)."""
    return SearchNode(
        jnp.concatenate([node.tokens[:, 1:], token[:, None]], 1),
        jnp.concatenate([node.positions[:, 1:], position[:, None]], 1),
        jnp.concatenate([node.valid[:, 1:], jnp.ones_like(node.valid[:, :1])], 1),
    )


def append_token(model: WorldModel, node: SearchNode | CachedNode, token: jax.Array):
    """Append a token [B, D] at the next position: (child node, the token's hidden
    state [B, D]). A SearchNode recomputes its whole window; a CachedNode
    (--search-kv-cache) runs the new token alone against its cached keys and
    values (`WorldModel.extend`): the same outputs while the window drops only
    padding; once a real token leaves it, the tokens after it keep the keys and
    values of the context they entered with (LightZero's UniZero caches them too)."""
    position = node.positions[:, -1] + 1
    if isinstance(node, CachedNode):
        return model.extend(node, token, position)
    node = push_token(node, token, position)
    return node, last_hidden(model, node)


def imagine_step(model: WorldModel, node: SearchNode | CachedNode, action: jax.Array):
    """One step inside the model: append the action token, whose hidden state
    predicts the reward and the next latent; append that latent, whose hidden
    state gives the policy and the value. Returns
    (node, reward [B], latent [B, D], policy logits [B, A], value [B])."""
    node, at_action = append_token(model, node, model.action_embedding(action))
    latent = model.next_latent(at_action)
    node, at_latent = append_token(model, node, latent)
    return (
        node,
        logits_to_scalar(model.reward_head(at_action)),
        latent,
        model.policy_head(at_latent),
        logits_to_scalar(model.value_head(at_latent)),
    )


def cached_root(model: WorldModel, history: History, width: int) -> tuple[CachedNode, jax.Array]:
    """`root_node`'s window run once through the transformer, its keys and values
    kept: (the root's CachedNode, the current latent's hidden state [B, D])."""
    node = root_node(model, history, width)
    hidden, keys, values = model.cached_pass(node.tokens, node.positions, window_mask(node.valid))
    return CachedNode(keys, values, node.positions, node.valid), hidden[:, -1]


def root_node(model: WorldModel, history: History, width: int) -> SearchNode:
    """The real history [o_{t-C+1}, a_{t-C+1}, ..., o_t] (2C - 1 tokens: the
    current observation last, its action not chosen yet) as a token window of
    `width` tokens, left-padded with invalid slots. Steps of an earlier episode
    are already invalid in `history`."""
    latents = model.encoder(history.obs)  # [B, C, D]
    actions = model.action_embedding(history.action)
    batch, steps, dim = latents.shape
    tokens = jnp.stack([latents, actions], axis=2).reshape(batch, 2 * steps, dim)[:, :-1]
    positions = jnp.stack([2 * history.timestep, 2 * history.timestep + 1], axis=2).reshape(batch, 2 * steps)[:, :-1]
    valid = jnp.repeat(history.valid, 2, axis=1)[:, :-1]
    pad = width - (2 * steps - 1)
    return SearchNode(
        jnp.pad(tokens, ((0, 0), (pad, 0), (0, 0))),
        jnp.pad(positions, ((0, 0), (pad, 0))),
        jnp.pad(valid, ((0, 0), (pad, 0))),
    )


def lone_value_logits(model: WorldModel, obs: jax.Array, timestep: jax.Array) -> jax.Array:
    """Value logits of obs with no history: each latent alone at position 2 timestep.
    obs [B, T, *obs_shape], timestep [B, T] -> logits [B, T, support]."""
    latents = model.encoder(obs)
    batch, steps, dim = latents.shape
    hidden = model.transformer(
        latents.reshape(batch * steps, 1, dim),
        2 * timestep.reshape(batch * steps, 1),
        jnp.ones((batch * steps, 1, 1), bool),
    )
    logits = model.value_head(hidden[:, 0])
    return logits.reshape(batch, steps, logits.shape[-1])


def lone_values(model: WorldModel, obs: jax.Array, timestep: jax.Array) -> jax.Array:
    """V(obs) with no history. obs [B, T, *obs_shape], timestep [B, T] -> values [B, T]."""
    return logits_to_scalar(lone_value_logits(model, obs, timestep))


def on_rows(fn, mask: jax.Array, *inputs: jax.Array) -> jax.Array:
    """fn(*inputs) on the rows where mask is True, zeros on the others, computing
    only those rows when they are few. inputs [B, T, ...], mask [B, T] -> [B, T, ...].

    The lone values of a batch are read on a few percent of its rows (terminal
    frames, sums cut by a truncation), yet computing them on every row was 23%
    of a Breakout gradient step (docs/unizero.md, "Lone values on the rows
    that read them"). Up to
    B T / 8 selected rows are gathered into one [1, B T / 8, ...] batch; past
    that, fn runs on every row as before. Each selected row's value is fn's
    either way (row-wise: no row sees another)."""
    batch, steps = mask.shape
    capacity = max(1, batch * steps // 8)
    selected = mask.reshape(-1)
    count = selected.sum()

    def few():
        index = jnp.nonzero(selected, size=capacity, fill_value=0)[0]  # [capacity]; padded with row 0
        out = fn(*(x.reshape((batch * steps,) + x.shape[2:])[index][None] for x in inputs))[0]
        padding = (jnp.arange(capacity) >= count).reshape((capacity,) + (1,) * (out.ndim - 1))
        # Padded entries add 0 to row 0, so a selected row 0 keeps its value.
        rows = jnp.zeros((batch * steps,) + out.shape[1:], out.dtype).at[index].add(jnp.where(padding, 0, out))
        return rows.reshape((batch, steps) + out.shape[1:])

    def every():
        out = fn(*inputs)
        return jnp.where(mask.reshape(mask.shape + (1,) * (out.ndim - 2)), out, 0)

    return jax.lax.cond(count <= capacity, few, every)


# --------------------------------------------------------------------------- #
# Pytrees
# --------------------------------------------------------------------------- #
class Transition(NamedTuple):
    """One collected step of every env as the replay stores it; the buffer adds
    [rows] in front, a sampled window is [B, L, ...]."""

    obs: jax.Array  # [N, *obs_shape]
    action: jax.Array  # [N] int32
    reward: jax.Array  # [N]
    terminated: jax.Array  # [N] bool
    truncated: jax.Array  # [N] bool
    final_obs: jax.Array  # [N, *obs_shape] info["final_observation"]: the next obs, or an ended episode's last one
    timestep: jax.Array  # [N] int32 env timestep of obs (0 at an episode start)
    search_policy: jax.Array  # [N, A] the search's action weights: the policy target
    root_value: jax.Array  # [N] the search's value of the root


class History(struct.PyTreeNode):
    """The last C real steps of every env, the search root's context; leaves [N, C, ...],
    the current step last."""

    obs: jax.Array  # [N, C, *obs_shape]
    action: jax.Array  # [N, C] int32 (the last slot's action is not chosen yet when the root is built)
    timestep: jax.Array  # [N, C] int32
    valid: jax.Array  # [N, C] bool: the slot holds a step of the running episode


class SearchNode(NamedTuple):
    """mctx embedding of a search node: the last 2K tokens leading to it, [B, 2K, ...]."""

    tokens: jax.Array  # [B, 2K, D]
    positions: jax.Array  # [B, 2K]
    valid: jax.Array  # [B, 2K] bool


class CachedNode(NamedTuple):
    """mctx embedding of a search node with --search-kv-cache: each block's keys
    (RoPE applied) and values of the last 2K tokens leading to it."""

    keys: jax.Array  # [B, blocks, 2K, H, Dh]
    values: jax.Array  # [B, blocks, 2K, H, Dh]
    positions: jax.Array  # [B, 2K]
    valid: jax.Array  # [B, 2K] bool


class Hyperparams(struct.PyTreeNode):
    """The float hyperparameters the jitted update reads. They live in the
    runner state, so `train` vmapped over a stacked Hyperparams is a sweep in
    one compile; `from_args` takes them from `Args` (fields of the same name)."""

    learning_rate: jax.Array  # [] AdamW step size (optax.inject_hyperparams puts it in the optimizer state)
    gamma: jax.Array  # [] discount of the n-step value targets and of every search edge
    latent_coef: jax.Array  # [] weight of the latent-consistency MSE
    reward_coef: jax.Array  # [] weight of the reward cross-entropy
    policy_coef: jax.Array  # [] weight of the policy cross-entropy against the search's action weights
    value_coef: jax.Array  # [] weight of the value cross-entropy
    target_update_rate: jax.Array  # [] EMA rate of the target model per gradient step
    dirichlet_alpha: jax.Array  # [] PUCT: Dirichlet noise concentration at the root (collection)
    dirichlet_fraction: jax.Array  # [] PUCT: weight of the Dirichlet noise in the root prior (collection)
    visit_temperature: jax.Array  # [] PUCT: collection samples actions from visit counts ^ (1 / visit_temperature)
    q_rescale_min_gap: jax.Array  # [] smallest max - min gap the search's Q-value rescaling divides by
    policy_entropy_coef: jax.Array  # [] weight of the policy-entropy bonus

    @classmethod
    def from_args(cls, args: Args) -> Hyperparams:
        return cls(*(jnp.float32(getattr(args, f.name)) for f in dataclasses.fields(cls)))


class RunnerState(struct.PyTreeNode):
    """Everything a run carries from one update to the next (and checkpoints)."""

    params: nnx.State
    target_params: nnx.State  # EMA of params: latent and value targets
    opt_state: optax.OptState
    buffer: buffers.Buffer  # Transition, leaves [rows, N, ...]
    env_state: Any  # wrapped gymnax state, leaves [N, ...]
    obs: jax.Array  # [N, *obs_shape]
    timestep: jax.Array  # [N] env timestep of obs
    history: History
    key: jax.Array  # typed PRNG key
    env_steps: jax.Array  # [] env steps so far (per seed)
    gradient_steps: jax.Array  # []
    hparams: Hyperparams


# --------------------------------------------------------------------------- #
# Algorithm logic (pure functions; the unit tests import these)
# --------------------------------------------------------------------------- #
def observe(history: History, obs: jax.Array, timestep: jax.Array) -> History:
    """Shift the history one step and write the current observation [N, ...] last."""
    shift = lambda old, new: jnp.concatenate([old[:, 1:], new[:, None]], axis=1)
    return History(
        shift(history.obs, obs),
        shift(history.action, jnp.zeros_like(history.action[:, 0])),
        shift(history.timestep, timestep),
        shift(history.valid, jnp.ones_like(history.valid[:, 0])),
    )


def record_action(history: History, action: jax.Array, done: jax.Array) -> History:
    """Write the chosen action [N] into the last slot; an episode that ended
    leaves nothing for the next root to see."""
    return history.replace(action=history.action.at[:, -1].set(action), valid=history.valid & ~done[:, None])


def stop_rows(
    terminated: jax.Array, truncated: jax.Array, steps: int, n: int, horizon: jax.Array | None = None
) -> jax.Array:
    """[B, K] window row where the n-step sum of step k stops: the first row of
    k .. k + n - 1 whose step ended the episode, else k + n - 1.
    terminated, truncated: [B, L] with L >= K + n - 1. With `horizon` [B]
    (int, 1 .. n), window b sums horizon[b] steps instead of n."""
    index = jnp.arange(steps)[:, None] + jnp.arange(n)[None, :]  # [K, n]
    done = terminated[:, index] | truncated[:, index]  # [B, K, n]
    if horizon is None:
        return jnp.arange(steps)[None] + jnp.where(done.any(-1), jnp.argmax(done, -1), n - 1)
    done = done & (jnp.arange(n) < horizon[:, None, None])  # ends past a window's horizon do not stop its sums
    return jnp.arange(steps)[None] + jnp.where(done.any(-1), jnp.argmax(done, -1), horizon[:, None] - 1)


def n_step_value_targets(
    rewards, terminated, truncated, window_values, final_values, gamma: float, n: int, horizon=None
):
    """n-step value targets for the first K steps of replayed windows (MuZero's
    z_t, with episode ends handled as in Gymnasium):

        z_t = sum_{i <= k} gamma^i r_{t+i} + gamma^(k+1) (1 - terminated_{t+k}) V_{t+k}

    where k is the first i < n whose step ended the episode (else n - 1; t + k
    is `stop_rows`). Without an end, V_{t+n-1} = window_values[t] is the target
    model's value of the observation n steps later; after a truncation it is
    final_values[t], the value of the final observation of row t + k; after a
    termination it is 0.

    rewards, terminated, truncated: [B, L] with L >= K + n - 1;
    window_values, final_values: [B, K]. Returns [B, K].

    With `horizon` [B] (int, 1 .. n: `value_horizons`), window b's targets sum
    horizon[b] rewards and window_values[b, t] is V_{t+horizon[b]}."""
    chex.assert_equal_shape([rewards, terminated, truncated])
    chex.assert_equal_shape([window_values, final_values])
    steps = window_values.shape[1]
    index = jnp.arange(steps)[:, None] + jnp.arange(n)[None, :]  # [K, n]
    reward, term = rewards[:, index], terminated[:, index]  # [B, K, n]
    done = (term | truncated[:, index]).astype(jnp.float32)
    if horizon is not None:  # the steps past a window's horizon are not summed and do not end it
        within = (jnp.arange(n) < horizon[:, None, None]).astype(jnp.float32)  # [B, 1, n]
        reward, done = reward * within, done * within
    alive = jnp.cumprod(jnp.concatenate([jnp.ones_like(done[..., :1]), 1.0 - done[..., :-1]], -1), -1)
    returns = jnp.sum(gamma ** jnp.arange(n, dtype=jnp.float32) * reward * alive, -1)
    ended = done.any(-1)
    stop = stop_rows(terminated, truncated, steps, n, horizon)  # [B, K]
    terminated_at_stop = jnp.take_along_axis(terminated, stop, 1)
    discount = gamma ** (stop - jnp.arange(steps) + 1.0) * (1.0 - terminated_at_stop.astype(jnp.float32))
    return returns + discount * jnp.where(ended, final_values, window_values)


def value_horizons(age: jax.Array, n: int, td_steps_age: int) -> jax.Array:
    """EfficientZero's off-policy correction (Ye et al. 2021, section 4.3): the
    n-step value target of old data sums fewer real rewards, since the policy
    that earned them is older, and bootstraps sooner from the current target
    model. age [B]: env steps since a window's first step was collected (all
    envs counted, as EfficientZero's transitions). Returns [B] int32,
    clip(n - age // td_steps_age, 1, n)."""
    return jnp.clip(n - age // td_steps_age, 1, n).astype(jnp.int32)


def window_ages(buffer: buffers.Buffer, rows: jax.Array) -> jax.Array:
    """[B] env steps (all envs counted) since replay rows [B] were written: the
    newest row is 0 steps old, the one before it num_envs."""
    return (buffer.position - 1 - rows) % buffer.rows * buffer.num_envs


def advantage_weighted_nll(policy_logits: jax.Array, actions: jax.Array, advantages: jax.Array) -> jax.Array:
    """Advantage-weighted regression of the prior onto the replayed actions
    (Peng et al. 2019, AWR): -mean(w log pi(a | s)) with
    w = min(exp(A_hat), 20) (AWR's weight clip), A_hat the advantage
    normalised over the batch (zero mean, unit standard deviation, as PPO's),
    so the weights do not depend on the task's returns. policy_logits
    [B, K, A], actions [B, K] (the actions taken), advantages [B, K] (no
    gradient flows into them). Returns [].

    The weights are positive, so the loss is bounded below by 0 and its
    minimiser is pi(a | s) proportional to mu(a | s) exp(A_hat), mu
    the replayed actions' policy: actions whose real return beat the value
    prediction gain prior mass, the others lose it. Linear weights (A_hat
    itself, as a policy gradient without PPO's clipping) are not bounded: on
    Breakout-MinAtar they drove the log-probabilities of actions with negative
    advantages toward minus infinity (docs/unizero.md, Breakout)."""
    advantages = jax.lax.stop_gradient(advantages)
    normalised = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    weights = jnp.minimum(jnp.exp(normalised), 20.0)
    log_probs = jax.nn.log_softmax(policy_logits)
    taken = jnp.take_along_axis(log_probs, actions[..., None].astype(jnp.int32), -1)[..., 0]
    return -jnp.mean(weights * taken)


def cross_entropy(logits: jax.Array, target_probs: jax.Array) -> jax.Array:
    """[..., n] logits against [..., n] target probabilities -> [...]. By hand, not
    distrax: the targets are soft (two-hot rewards and values, the search's
    action weights) and MuZero's loss is this plain sum (Schrittwieser et al.
    2020, eq. 1), where distrax's Categorical.cross_entropy goes through a KL."""
    return -jnp.sum(target_probs * jax.nn.log_softmax(logits, axis=-1), axis=-1)


def entropy(log_probs: jax.Array) -> jax.Array:
    """[..., n] log-probabilities -> [...] Shannon entropy -sum_a p_a log p_a, with
    0 log 0 = 0 (the search prunes actions to a weight of exactly 0). Written
    out, not distrax's Categorical.entropy, in the same operations (so the
    compiled programs are the ones of before): importing distrax loads
    TensorFlow Probability's JAX substrate, 1.3 s of every process's import on a
    slow 2-core CPU, for two logged entropies (docs/performance.md, "A second of
    every start"; tests/test_unizero_math.py checks it against distrax)."""
    probs = jnp.exp(log_probs)
    return -jnp.sum(jnp.where(probs == 0, 0.0, log_probs) * probs, axis=-1)


def env_options(env_id: str, max_episode_steps: int = 0) -> dict:
    """Keyword arguments of `envs.make` for `env_id`. Only [H, W, C]
    observations (MinAtar, Pong) reach the encoder's convolution as images;
    every other shape (Catch's [10, 5] board, DeepSea's [8, 8], SimpleBandit's
    [1, 1], FrozenLake's scalar state) is flattened to one float32 vector, the
    encoder's MLP input. `max_episode_steps` (0: the env's own) replaces the
    time limit."""
    env, env_params = envs.make(env_id)
    shape = envs.spec(env, env_params).obs_shape
    options: dict = {"flatten_obs": not (len(shape) == 3 and min(shape[:2]) >= 3)}
    if max_episode_steps:
        options["max_episode_steps"] = max_episode_steps
    return options


def empty_history(num: int, context_steps: int, obs_shape: tuple[int, ...], dtype=jnp.float32) -> History:
    """The root context of `num` envs before their first step: C slots, none
    valid; `dtype` is the observations' (uint8 Atari frames stay bytes)."""
    return History(
        obs=jnp.zeros((num, context_steps) + obs_shape, dtype),
        action=jnp.zeros((num, context_steps), jnp.int32),
        timestep=jnp.zeros((num, context_steps), jnp.int32),
        valid=jnp.zeros((num, context_steps), bool),
    )


def learning_rate_at(args: Args, learning_rate: jax.Array, env_steps: jax.Array) -> jax.Array:
    """The step size of the gradient steps of the update whose collection brought
    a seed to `env_steps` []: `learning_rate`, or with --anneal-lr
    learning_rate * (1 - k / num_updates) in update k = 0, 1, ... (PPO's linear
    decay, as PureJaxRL and CleanRL write it)."""
    if not args.anneal_lr:
        return learning_rate
    update_index = env_steps // args.steps_per_update - 1
    return learning_rate * (1.0 - update_index / args.num_updates)


def visit_temperature_at(args: Args, visit_temperature: jax.Array, env_steps: jax.Array) -> jax.Array:
    """PUCT's collection temperature in the update that starts at a seed's
    `env_steps` []: `visit_temperature`, or with --visit-temperature-decay
    MuZero's schedule over the run, x 1 / 0.5 / 0.25 while fewer than 1/2 / 3/4 /
    all of total_timesteps are done (Schrittwieser et al. 2020, pseudocode, in
    training steps; here env steps, proportional at a fixed replay ratio); the
    two fractions are `visit_temperature_decay_at`."""
    if not args.visit_temperature_decay:
        return visit_temperature
    halve_at, quarter_at = args.visit_temperature_decay_at
    done = env_steps / (args.num_updates * args.steps_per_update)
    return visit_temperature * jnp.where(done < halve_at, 1.0, jnp.where(done < quarter_at, 0.5, 0.25))


def make_optimizer(args: Args) -> optax.GradientTransformation:
    """AdamW (betas 0.9 / 0.95) with weight decay on matrices only (LightZero's
    configure_optimizers), after a global-norm clip (`max_grad_norm` 0 turns it
    off). The learning rate is injected into the optimizer state, so a
    Hyperparams sweep can set it under jit."""
    decay_mask = lambda params: jax.tree.map(lambda x: x.ndim >= 2, params)

    def adamw(learning_rate):
        optimizer = optax.adamw(learning_rate, b1=0.9, b2=0.95, weight_decay=args.weight_decay, mask=decay_mask)
        if args.max_grad_norm > 0:
            optimizer = optax.chain(optax.clip_by_global_norm(args.max_grad_norm), optimizer)
        return optimizer

    return optax.inject_hyperparams(adamw)(learning_rate=args.learning_rate)


# ---- Search (mctx) ----------------------------------------------------------------------
def root_fn(graphdef, params, history: History, width: int, cached: bool = False) -> mctx.RootFnOutput:
    """mctx root: the transformer over the recent real history (leaves [B, C, ...]).
    Prior logits [B, A] and value [B] at the current latent; the token window of
    `width` tokens (a SearchNode, or with `cached` its keys and values, a
    CachedNode) is the root's embedding."""
    world = nnx.merge(graphdef, params)
    node: SearchNode | CachedNode
    if cached:
        node, hidden = cached_root(world, history, width)
    else:
        window = root_node(world, history, width)
        node, hidden = window, last_hidden(world, window)
    return mctx.RootFnOutput(
        prior_logits=world.policy_head(hidden), value=logits_to_scalar(world.value_head(hidden)), embedding=node
    )


def recurrent_fn(graphdef, gamma, params, _key, action: jax.Array, node: SearchNode | CachedNode):
    """mctx dynamics: one imagined step from every node of the batch, action [B]
    -> (reward [B], discount [B], prior logits [B, A], value [B]) and the child
    nodes. No terminal head: every edge is discounted by gamma (LightZero's UniZero)."""
    node, reward, _, prior_logits, value = imagine_step(nnx.merge(graphdef, params), node, action)
    return mctx.RecurrentFnOutput(
        reward=reward, discount=jnp.full(action.shape, gamma), prior_logits=prior_logits, value=value
    ), node


def tree_search(
    graphdef, args: Args, hparams: Hyperparams, params, history: History, key: jax.Array, explore: bool
) -> mctx.PolicyOutput:
    """One search per env from its History (leaves [B, C, ...]): action [B] and
    action_weights [B, A] (the policy target). `explore` (collection): Gumbel
    noise, or Dirichlet noise and visit counts at `visit_temperature`;
    otherwise (evaluation) greedy and noise-free."""
    root = root_fn(graphdef, params, history, 2 * args.num_unroll_steps, args.search_kv_cache)  # nodes of 2K tokens
    dynamics = functools.partial(recurrent_fn, graphdef, hparams.gamma)
    if args.search_policy == "gumbel":
        return mctx.gumbel_muzero_policy(
            params,
            key,
            root,
            dynamics,
            args.num_simulations,
            max_num_considered_actions=args.max_num_considered_actions,
            gumbel_scale=1.0 if explore else 0.0,
            qtransform=functools.partial(mctx.qtransform_completed_by_mix_value, epsilon=hparams.q_rescale_min_gap),
        )
    return mctx.muzero_policy(
        params,
        key,
        root,
        dynamics,
        args.num_simulations,
        dirichlet_fraction=hparams.dirichlet_fraction if explore else 0.0,
        dirichlet_alpha=hparams.dirichlet_alpha,
        temperature=hparams.visit_temperature if explore else 0.0,
        qtransform=functools.partial(mctx.qtransform_by_parent_and_siblings, epsilon=hparams.q_rescale_min_gap),
    )


# ---- Collection and evaluation ----------------------------------------------------------
def collect_step(
    env, env_params, search, explore_epsilon: float, state: RunnerState, visit_temperature: jax.Array | None = None
):
    """One env step of every env (N), acting with the search (`search(params,
    history, key, explore, hparams)`), or with probability `explore_epsilon`
    uniformly at random; the step goes to replay. `visit_temperature` (PUCT)
    replaces the hparams' one for this step (the decay's). Returns the state and
    (episode info, search stats): leaves [N] and []."""
    key, search_key, step_key = jax.random.split(state.key, 3)
    history = observe(state.history, state.obs, state.timestep)
    history = parallel.constrain_data(history)  # --parallel data: the search's root batch is split over devices
    hparams = state.hparams if visit_temperature is None else state.hparams.replace(visit_temperature=visit_temperature)
    out = search(state.params, history, search_key, True, hparams)
    # Epsilon-greedy: its key is folded from the search's, so the other streams (and every run at 0) are unchanged.
    coin_key, random_key = jax.random.split(jax.random.fold_in(search_key, 1))
    num_actions = out.action_weights.shape[-1]
    random_action = jax.random.randint(random_key, out.action.shape, 0, num_actions, out.action.dtype)
    action = jnp.where(jax.random.uniform(coin_key, out.action.shape) < explore_epsilon, random_action, out.action)
    next_obs, env_state, reward, terminated, truncated, info = env.step(step_key, state.env_state, action, env_params)
    done = terminated | truncated
    transition = Transition(
        obs=state.obs,
        action=action,
        reward=reward.astype(jnp.float32),
        terminated=terminated,
        truncated=truncated,
        final_obs=info["final_observation"],
        timestep=state.timestep,
        search_policy=out.action_weights,
        root_value=out.search_tree.summary().value,
    )
    state = state.replace(
        buffer=buffers.add(state.buffer, transition),
        env_state=env_state,
        obs=next_obs,
        timestep=jnp.where(done, 0, state.timestep + 1),
        history=record_action(history, action, done),
        key=key,
        env_steps=state.env_steps + state.obs.shape[0],
    )
    stats = {
        "root_value": transition.root_value.mean(),
        # Renormalised as distrax's Categorical(probs=...) did, so the logged number is unchanged.
        "search_entropy": entropy(jnp.log(out.action_weights / out.action_weights.sum(-1, keepdims=True))).mean(),
    }
    return state, ({k: info[k] for k in ("episode_done", "episode_return", "episode_length")}, stats)


def evaluate_greedy(eval_env, env_params, search, args: Args, max_steps: int, state: RunnerState, key: jax.Array):
    """One episode per eval env (E = eval_episodes), acting greedily with the
    search (no Gumbel or Dirichlet noise, argmax); the root sees the same
    history as in collection. Returns the episode returns [E] (and the
    recording, `envs.with_recording`, when eval_env records)."""
    reset_key, key = jax.random.split(key)
    obs, env_state = eval_env.reset(reset_key, env_params)
    E = args.eval_episodes
    # --parallel data: the episodes' searches are split over the devices as collection's are, when E
    # is a multiple of them (one device runs a search's small operations on one core: docs/performance.md,
    # "One seed on every core").
    shard = parallel.constrain_data if E % parallel.data_device_count() == 0 else lambda tree: tree

    def body(carry):
        obs, env_state, timestep, history, key, finished, returns, t = carry
        key, search_key, step_key = jax.random.split(key, 3)
        history = shard(observe(history, obs, timestep))
        action = search(state.params, history, search_key, False, state.hparams).action
        obs, env_state, _, terminated, truncated, info = eval_env.step(step_key, env_state, action, env_params)
        done = terminated | truncated
        newly = info["episode_done"] & ~finished
        returns = jnp.where(newly, info["episode_return"], returns)
        return (
            obs,
            env_state,
            jnp.where(done, 0, timestep + 1),
            record_action(history, action, done),
            key,
            finished | newly,
            returns,
            t + 1,
        )

    def keep_going(carry):
        return ~jnp.all(carry[5]) & (carry[7] < max_steps + 1)

    history = empty_history(E, args.context_steps, obs.shape[1:], obs.dtype)
    carry = (obs, env_state, jnp.zeros(E, jnp.int32), history, key, jnp.zeros(E, bool), jnp.zeros(E), 0)
    final = jax.lax.while_loop(keep_going, body, carry)
    return envs.with_recording(final[6], eval_env, final[1])


# ---- Learning ---------------------------------------------------------------------------
PRIORITY_EPSILON = 1e-6  # added to |v - z| so no window's priority is exactly 0 (Schaul et al. 2016, section 3.3)


def window_at(windows: Transition, segment: jax.Array, start: int | jax.Array, steps: int) -> Window:
    """Rows start .. start + steps - 1 of replayed windows (leaves [B, L, ...]) as
    the model sees them: a Window with leaves [B, steps, ...], every token present.
    `start` is one row for all windows, or [B] rows, one per window."""
    if isinstance(start, int):
        rows = lambda x: x[:, start : start + steps]
    else:
        index = start[:, None] + jnp.arange(steps)  # [B, steps]
        rows = lambda x: jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), 1)
    ones = jnp.ones((windows.action.shape[0], steps), bool)
    return Window(rows(windows.obs), rows(windows.action), rows(windows.timestep), rows(segment), ones, ones)


def episode_segments(windows: Transition) -> jax.Array:
    """[B, L] episode index inside each window: the row after an ended one starts
    a new episode, and attention never crosses from one episode to another."""
    done = windows.terminated | windows.truncated
    batch = done.shape[0]
    return jnp.cumsum(jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), done[:, :-1].astype(jnp.int32)], 1), 1)


def compute_targets(target: WorldModel, windows: Transition, segment: jax.Array, gamma, args: Args, age=None):
    """Latent targets [B, K, D] and n-step value targets [B, K] of the first K
    rows of replayed windows [B, L, ...], from the EMA target model (no dropout,
    no gradient). age [B]: env steps since each window's first step, read with
    --td-steps-age (`value_horizons`)."""
    K, n = args.num_unroll_steps, args.td_steps
    horizon = value_horizons(age, n, args.td_steps_age) if args.td_steps_age > 0 else None
    latent_targets = target.encoder(windows.final_obs[:, :K])
    # V(o_{t+n}) as LightZero reads it: a fresh window starting n rows later
    # (horizon[b] rows later with the off-policy correction).
    start = n if horizon is None else horizon
    window_values = logits_to_scalar(forward_window(target, window_at(windows, segment, start, K))[1])
    # V(final observation) of the row where each n-step sum stops, for sums cut
    # short by a truncation: only those K rows of each window are read, so only
    # they are computed, not all L (docs/unizero.md, "Where the time goes").
    stop = stop_rows(windows.terminated, windows.truncated, K, n, horizon)  # [B, K]
    at_stop = lambda x: jnp.take_along_axis(x, stop.reshape(stop.shape + (1,) * (x.ndim - 2)), 1)
    # Read only where the sum stops at a truncation (a termination's bootstrap is 0).
    cut = at_stop(windows.truncated) & ~at_stop(windows.terminated)  # [B, K]
    final_values = on_rows(
        functools.partial(lone_values, target), cut, at_stop(windows.final_obs), at_stop(windows.timestep) + 1
    )
    value_targets = n_step_value_targets(
        windows.reward, windows.terminated, windows.truncated, window_values, final_values, gamma, n, horizon
    )
    return jax.lax.stop_gradient((latent_targets, value_targets))


def importance_weights(probability: jax.Array, num_valid: jax.Array, beta: jax.Array) -> jax.Array:
    """Prioritized-replay correction w_i = (N P(i))^-beta, divided by the largest
    weight in the batch so updates are only ever scaled down (Schaul et al. 2016, section 3.4)."""
    weights = (num_valid * probability) ** -beta
    return weights / weights.max()


def weighted_batch_mean(x: jax.Array, weights: jax.Array | None) -> jax.Array:
    """Mean of a per-window loss x [B, ...] over everything; with prioritised replay's
    importance weights [B], the weighted mean over windows of each window's mean."""
    if weights is None:  # uniform replay: jnp.mean, so the compiled loss is the one without priorities
        return jnp.mean(x)
    return jnp.mean(weights * jnp.mean(x.reshape(x.shape[0], -1), axis=1))


def unizero_loss(
    world: WorldModel,
    target: WorldModel,
    windows: Transition,
    hparams: Hyperparams,
    key,
    args: Args,
    weights: jax.Array | None = None,
    age: jax.Array | None = None,
):
    """UniZero's joint loss on replayed windows, leaves [B, L, ...]: the first K
    rows are trained (latent consistency, reward, policy, value), the rows
    after them feed the n-step targets. `key` is the dropout key; `weights` [B]
    prioritised replay's importance weights (None: uniform replay); `age` [B]
    env steps since each window's first step (read with --td-steps-age). Returns
    (loss [], metrics of []); with weights, metrics["priority"] [B] is each
    window's new priority, MuZero's |search value - n-step value target| of
    its first step."""
    K = args.num_unroll_steps
    segment = episode_segments(windows)
    policy_logits, value_logits, next_latents, reward_logits = forward_window(
        world, window_at(windows, segment, 0, K), key if args.dropout > 0 else None
    )
    latent_targets, value_targets = compute_targets(target, windows, segment, hparams.gamma, args, age)

    batch_mean = functools.partial(weighted_batch_mean, weights=weights)
    latent_loss = batch_mean(jnp.square(next_latents - latent_targets))
    reward_loss = batch_mean(cross_entropy(reward_logits, scalar_to_probs(windows.reward[:, :K], args.support_size)))
    policy_loss = batch_mean(cross_entropy(policy_logits, windows.search_policy[:, :K]))
    value_loss = batch_mean(cross_entropy(value_logits, scalar_to_probs(value_targets, args.support_size)))
    policy_entropy = jnp.mean(entropy(jax.nn.log_softmax(policy_logits)))
    value_predictions = logits_to_scalar(value_logits)
    total = (
        hparams.latent_coef * latent_loss
        + hparams.reward_coef * reward_loss
        + hparams.policy_coef * policy_loss
        + hparams.value_coef * value_loss
        - hparams.policy_entropy_coef * policy_entropy  # keeps the prior from collapsing onto noisy targets
    )
    metrics = {}  # the optional terms' own losses, and the new priorities
    if weights is not None:
        metrics["priority"] = jnp.abs(windows.root_value[:, 0] - value_targets[:, 0])  # [B]
    if args.terminal_value_coef > 0:  # static: at 0 the compiled loss is the one without the term, bit for bit
        # An episode's last frame is never a row's observation (the next row is the
        # reset's), so no value target reaches it, yet the dynamics predicts its latent
        # and the search values it. MuZero's absorbing state: its value is 0.
        terminal = windows.terminated[:, :K].astype(jnp.float32)  # [B, K]
        terminal_logits = on_rows(
            functools.partial(lone_value_logits, world),
            windows.terminated[:, :K],
            windows.final_obs[:, :K],
            windows.timestep[:, :K] + 1,
        )
        zero_probs = scalar_to_probs(jnp.zeros_like(terminal), args.support_size)
        metrics["terminal_value_loss"] = jnp.sum(terminal * cross_entropy(terminal_logits, zero_probs)) / jnp.maximum(
            terminal.sum(), 1.0
        )
        total = total + args.terminal_value_coef * metrics["terminal_value_loss"]
    if args.advantage_coef > 0:  # static: at 0 the compiled loss is the one without the term, bit for bit
        # The search's policy target only sees the model's Q-values; this term sees
        # the real returns of the actions taken (docs/unizero.md, "Why the wall holds").
        advantages = value_targets - value_predictions
        metrics["advantage_loss"] = advantage_weighted_nll(policy_logits, windows.action[:, :K], advantages)
        total = total + args.advantage_coef * metrics["advantage_loss"]
    return total, {
        "loss": total,
        "latent_loss": latent_loss,
        "reward_loss": reward_loss,
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "value_target": value_targets.mean(),
        "value_prediction": value_predictions.mean(),
        "policy_entropy": policy_entropy,
        **metrics,
    }


# --------------------------------------------------------------------------- #
# Training
# --------------------------------------------------------------------------- #
class UniZero(NamedTuple):
    init: Any  # (key, hparams=None) -> RunnerState
    update: Any  # RunnerState -> (RunnerState, metrics)
    train: Any  # (key, hparams=None) -> (RunnerState, metrics [num_updates])
    evaluate: Any  # (RunnerState, key) -> returns [eval_episodes] (search, no noise); with --capture-video also an envs.Recording
    root_fn: Any  # (params, History) -> mctx.RootFnOutput
    recurrent_fn: Any  # mctx recurrent_fn(params, key, action [B], SearchNode) -> (RecurrentFnOutput, SearchNode)
    search: Any  # (params, History, key, explore, hparams=None) -> mctx.PolicyOutput
    loss: Any  # (params, target_params, windows [B, L], key, hparams=None) -> (loss, metrics)
    collect_step: Any  # (RunnerState, None) -> (RunnerState, info): one search and env step of every env
    learn: Any  # (RunnerState, None) -> (RunnerState, metrics): one gradient step on a replayed batch
    graphdef: Any
    spec: envs.EnvSpec


def make_envs(args: Args):
    """(env, env_params, eval_env, spec): the training envs (num_envs) and the
    greedy evaluation's (eval_episodes), with --capture-video recording each
    seed's first evaluation episode (jaxzoo.video)."""
    if atari.is_envpool(args.env_id):
        # DeepMind's preprocessing by envpool, stepped inside jit (common/atari.py), the Args' Atari flags
        # as atari.make's keywords; frames stay uint8. The evaluation pool is a second pool (role 1) with
        # its own seed stream; the logged episode is the whole game, unclipped.
        preprocessing = atari.preprocessing(args)
        env, env_params = atari.make(args.env_id, args.num_envs, seed=args.seed, **preprocessing)
        eval_env, _ = atari.make(args.env_id, args.eval_episodes, seed=args.seed, role=1, **preprocessing)
        if args.capture_video:
            eval_env = envs.RecordEpisode(eval_env, env.spec.max_episode_steps + 1)
        return env, env_params, eval_env, env.spec
    env_kwargs = env_options(args.env_id, args.max_episode_steps)
    spec = envs.spec(*envs.make(args.env_id, **env_kwargs))
    if not spec.discrete:
        raise ValueError(
            f"{args.env_id} has a continuous action space ({spec.num_actions}-dimensional Box); UniZero's tree search "
            "here needs discrete actions (algos/ppo.py or algos/mpo.py handle continuous control)"
        )
    env, env_params = envs.make(args.env_id, args.num_envs, **env_kwargs)
    eval_env, _ = envs.make(args.env_id, args.eval_episodes, **env_kwargs)
    if args.capture_video:
        eval_env = envs.RecordEpisode(eval_env, spec.max_episode_steps + 1)
    return env, env_params, eval_env, spec


def make_train(args: Args) -> UniZero:
    """Build the environments, the model's graphdef and the optimizer, and
    return the training functions (`UniZero`); `train` is the whole run."""
    env, env_params, eval_env, spec = make_envs(args)
    N, L = args.num_envs, args.window_length
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: WorldModel(spec.obs_shape, spec.num_actions, args, nnx.Rngs(0))))
    optimizer = make_optimizer(args)

    def or_default(hparams: Hyperparams | None) -> Hyperparams:
        return Hyperparams.from_args(args) if hparams is None else hparams

    def init(key: jax.Array, hparams: Hyperparams | None = None) -> RunnerState:
        key, model_key, env_key = jax.random.split(key, 3)
        params = nnx.split(WorldModel(spec.obs_shape, spec.num_actions, args, nnx.Rngs(model_key)))[1]
        obs, env_state = env.reset(env_key, env_params)
        example = Transition(
            obs=obs[0],
            action=jnp.int32(0),
            reward=jnp.float32(0),
            terminated=jnp.bool_(False),
            truncated=jnp.bool_(False),
            final_obs=obs[0],
            timestep=jnp.int32(0),
            search_policy=jnp.zeros(spec.num_actions),
            root_value=jnp.float32(0),
        )
        return RunnerState(
            params=params,
            target_params=params,
            opt_state=optimizer.init(params),
            buffer=buffers.init(example, args.buffer_size, N),
            env_state=env_state,
            obs=obs,
            timestep=jnp.zeros(N, jnp.int32),
            history=empty_history(N, args.context_steps, spec.obs_shape, obs.dtype),
            key=key,
            env_steps=jnp.int32(0),
            gradient_steps=jnp.int32(0),
            hparams=or_default(hparams),
        )

    def search(params, history: History, key: jax.Array, explore: bool, hparams: Hyperparams | None = None):
        return tree_search(graphdef, args, or_default(hparams), params, history, key, explore)

    def loss_fn(
        params, target_params, windows: Transition, key, hparams: Hyperparams | None = None, weights=None, age=None
    ):
        world, target = nnx.merge(graphdef, params), nnx.merge(graphdef, target_params)
        return unizero_loss(world, target, windows, or_default(hparams), key, args, weights, age)

    def learn(state: RunnerState, _):
        """One gradient step on `batch_size` replayed windows (uniformly, or by
        priority with --priority-exponent), then the EMA."""
        hp = state.hparams
        key, sample_key, dropout_key = jax.random.split(state.key, 3)
        prioritised = args.priority_exponent > 0
        alpha = args.priority_exponent if prioritised else None
        sample = buffers.sample(state.buffer, sample_key, args.batch_size, L, priority_exponent=alpha)
        windows = parallel.constrain_data(sample.windows)  # --parallel data: the batch is split over devices
        weights = None
        if prioritised:
            weights = importance_weights(sample.probability, sample.num_valid, jnp.float32(args.priority_correction))
        age = window_ages(state.buffer, sample.rows) if args.td_steps_age > 0 else None
        grads, stats = jax.grad(loss_fn, has_aux=True)(
            state.params, state.target_params, windows, dropout_key, hp, weights, age
        )
        buffer = state.buffer
        if prioritised:
            priority = jax.lax.stop_gradient(stats.pop("priority")) + PRIORITY_EPSILON
            buffer = buffers.set_priorities(buffer, sample.rows, sample.envs, priority)
            stats["search_value_error"] = priority.mean()  # mean |search value - n-step target| of the batch
        learning_rate = learning_rate_at(args, hp.learning_rate, state.env_steps)
        opt_state = state.opt_state._replace(
            hyperparams={**state.opt_state.hyperparams, "learning_rate": learning_rate}
        )
        updates, opt_state = optimizer.update(grads, opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        rate = hp.target_update_rate
        target_params = jax.tree.map(lambda t, p: (1 - rate) * t + rate * p, state.target_params, params)
        state = state.replace(
            params=params,
            target_params=target_params,
            opt_state=opt_state,
            buffer=buffer,
            key=key,
            gradient_steps=state.gradient_steps + 1,
        )
        return state, {**stats, "grad_norm": optax.tree.norm(grads)}

    def update(state: RunnerState):
        """num_steps steps of every env with search, then replay_ratio x new
        steps gradient steps once `learning_starts` steps are in replay."""
        temperature = visit_temperature_at(args, state.hparams.visit_temperature, state.env_steps)
        collect = lambda state, _: collect_step(env, env_params, search, args.explore_epsilon, state, temperature)
        state, (episode_info, search_stats) = jax.lax.scan(collect, state, None, args.num_steps)
        learning = (state.env_steps >= args.learning_starts) & buffers.valid_starts(state.buffer, L).any()

        def do_learn(state):
            return jax.lax.scan(learn, state, None, args.gradient_steps)

        def skip(state):
            shapes = jax.eval_shape(do_learn, state)[1]
            return state, jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype), shapes)

        state, stats = jax.lax.cond(learning, do_learn, skip, state)
        metrics = {
            **envs.episode_metrics(episode_info),
            **jax.tree.map(jnp.mean, stats),
            **jax.tree.map(jnp.mean, search_stats),
            "gradient_steps": state.gradient_steps.astype(jnp.float32),
            "buffer_size": (state.buffer.size * N).astype(jnp.float32),
        }
        if atari.is_envpool(args.env_id):
            # An Atari "episode" is the whole game: the unclipped score over all its lives (common/atari.py, 5).
            metrics["game_score"], metrics["game_length"] = metrics["episode_return"], metrics["episode_length"]
        return state, metrics

    def train(key: jax.Array, hparams: Hyperparams | None = None):
        """The whole run as one `lax.scan` over updates: jit it, vmap it over
        seeds (keys) and hyperparameters (a stacked Hyperparams)."""
        return jax.lax.scan(lambda s, _: update(s), init(key, hparams), None, args.num_updates)

    def evaluate(state: RunnerState, key: jax.Array) -> jax.Array:
        return evaluate_greedy(eval_env, env_params, search, args, spec.max_episode_steps, state, key)

    return UniZero(
        init,
        update,
        train,
        evaluate,
        functools.partial(root_fn, graphdef, width=2 * args.num_unroll_steps, cached=args.search_kv_cache),
        functools.partial(recurrent_fn, graphdef, args.gamma),
        search,
        loss_fn,
        lambda state, _: collect_step(env, env_params, search, args.explore_epsilon, state),
        learn,
        graphdef,
        spec,
    )


# --------------------------------------------------------------------------- #
# Host loop
# --------------------------------------------------------------------------- #
def main(args: Args) -> runner.RunResult:
    """Train `num_seeds` seeds in chunks of `log_every` updates (common/runner.py:
    run directory, metrics.csv, progress, checkpoints with replay, resume), then
    evaluate greedily with the search."""
    # Resume, run-root and cache checks, before anything is built; the CPU devices of --parallel (Args.DATA_AXIS).
    args = runner.prepare(args, "unizero")
    algo = make_train(args)
    return runner.run(
        args,
        "unizero",
        algo.init,
        algo.update,
        algo.evaluate,
        num_updates=args.num_updates,
        steps_per_update=args.steps_per_update,
        eval_every=args.eval_every,
        # --parallel data: the environments (axis 0 of env_state, obs, timestep and the search history) and
        # the replay columns they fill (axis 1 of the buffer's data and priorities, [rows, num_envs]) are
        # split over devices.
        data_axes=lambda state: jax.tree.map(lambda _: None, state).replace(
            env_state=0,
            obs=0,
            timestep=0,
            history=0,
            buffer=jax.tree.map(lambda _: None, state.buffer).replace(data=1, priority=1),
        ),
    )


if __name__ == "__main__":
    with cli.user_errors():
        main(cli.parse(Args, "unizero"))
