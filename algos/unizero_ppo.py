"""UniZero-PPO: UniZero's transformer world model, its policy trained by PPO
without search, the whole run in one `jax.jit`.

Papers: Pu et al. 2024, "UniZero: Generalized and Efficient Planning with
Scalable Latent World Models" (arXiv:2406.10667); Schulman et al. 2017 (PPO,
arXiv:1707.06347) and 2016 (GAE, arXiv:1506.02438).

The idea (the design of seed 000, a UniZero + PPO agent on LightZero): keep
UniZero's world model, a causal transformer over interleaved
(observation-latent, action) tokens whose heads predict the next latent and the
reward (read at the action token) and the policy and value (read at the latent
token), and keep its self-supervised losses; but drop MCTS. Collection samples
actions from the policy head (temperature-scaled softmax), evaluation takes its
argmax, and the policy and value heads are trained by PPO with GAE on fresh
data that is thrown away after each training phase:

    loss = 10 latent MSE + 1 reward CE + 1 PPO clipped surrogate
           + 0.5 value CE(two-hot h(return)) - c_ent entropy.

Acting and training share one context rule: the rollout is cut into aligned
chunks of `num_unroll_steps` steps, the policy at a step sees the tokens of its
chunk (and episode) so far, and training runs exactly those chunks as windows,
so the log-probs stored at collection are the ones training recomputes: the
PPO ratio of the first update is 1.

Where this file departs from the seed (six bugs fixed, each pinned by a test;
defaults changed where measurements said so), docs/unizero_ppo.md says what
and why; `--preset seed` restores the seed's settings.

    python algos/unizero_ppo.py                        # CartPole-v1, 100k steps (= --preset cartpole)
    python algos/unizero_ppo.py --preset cartpole-v0   # the seed's CartPole-v0 (200-step episodes), 20k steps
    python algos/unizero_ppo.py --preset seed          # ... with the seed's algorithm settings as well
    python algos/unizero_ppo.py --eval-search 16       # also evaluate with 16-simulation Gumbel MCTS

Details, logged metrics and measured results: docs/unizero_ppo.md.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, NamedTuple

import chex
import jax
import jax.numpy as jnp
import mctx
import numpy as np
import optax
from flax import nnx, struct

from jaxzoo import cli, envs, layers, parallel, runner
from jaxzoo.checks import AtLeastOne, Fraction, NonNegative, OpenFraction, Positive, Range, check_fields


# --------------------------------------------------------------------------- #
# Arguments
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class Args:
    """UniZero-PPO: UniZero's world model, policy and value trained by PPO without search."""

    exp_name: str = "unizero_ppo"
    """name of the experiment: part of the run directory and the plot label"""
    seed: Annotated[int, NonNegative] = 0
    """seed of the first run; seed index i uses seed + i"""
    num_seeds: Annotated[int, AtLeastOne] = 1
    """independent seeds trained at once with `jax.vmap`"""
    env_id: str = "CartPole-v1"
    """gymnax environment id (discrete actions only)"""
    total_timesteps: Annotated[int, AtLeastOne] = 100_000
    """environment steps per seed"""
    log_every: Annotated[int, AtLeastOne] = 5
    """updates per jitted chunk: metrics, progress and checkpoints happen between chunks"""
    track: bool = False
    """log to Weights & Biases (needs the `logging` extra)"""
    tensorboard: bool = False
    """write TensorBoard event files into the run directory (needs the `logging` extra)"""
    save_model: bool = True
    """write checkpoints of the whole runner state (needed for --resume)"""
    checkpoint_every: Annotated[int, AtLeastOne] = 50
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
    """updates between greedy evaluations during training (argmax policy), logged as eval_return; 0: only at the end"""
    max_episode_steps: Annotated[int, NonNegative] = 0
    """time limit of an episode in env steps; 0 keeps the env's own (200 for the seed's CartPole-v0)"""
    num_envs: Annotated[int, AtLeastOne] = 8
    """parallel environments per seed (the seed: 8 collector envs)"""
    DATA_AXIS: ClassVar[str] = "num_envs"
    """the field --parallel data splits over the devices (the environments; runner.data_axis)"""
    num_steps: Annotated[int, AtLeastOne] = 50
    """env steps per env per collection phase (a multiple of num_unroll_steps)"""
    num_unroll_steps: Annotated[int, AtLeastOne] = 5
    """chunk length in env steps: the context of the policy and the length of a training window"""
    sampling_temperature: Annotated[float, Positive] = 0.25
    """collection samples from softmax(logits / sampling_temperature); the stored log-prob is of that distribution"""
    update_epochs: Annotated[int, NonNegative] = 4
    """epochs over the phase's windows, each shuffled into num_minibatches minibatches (the standard PPO
    schedule; LightZero PR 498 uses 4); 0: the seed's schedule, replay_ratio draws of batch_size windows"""
    num_minibatches: Annotated[int, AtLeastOne] = 4
    """minibatches per epoch when update_epochs > 0"""
    replay_ratio: Annotated[float, Positive] = 0.25
    """update_epochs 0 only: gradient steps per new transition in each training phase (the seed: 0.25)"""
    batch_size: Annotated[int, AtLeastOne] = 256
    """update_epochs 0 only: windows per gradient step, drawn with replacement from the phase's fresh windows"""
    ppo_heads_only: bool = True
    """the PPO surrogate, entropy and value losses train only the policy and value heads (the transformer's
    features reach them through a stop-gradient), as in LightZero PR 498; the world-model losses train the
    rest (off: the seed, one joint loss)"""
    gamma: Annotated[float, Fraction] = 0.997
    """discount of GAE (the seed: 0.99; LightZero's UniZero and PR 498: 0.997)"""
    gae_lambda: Annotated[float, Fraction] = 0.95
    """GAE lambda"""
    clip_coef: Annotated[float, Positive] = 0.2
    """PPO clipping epsilon"""
    norm_adv_rollout: bool = True
    """normalise advantages over the phase's whole rollout (off: the seed)"""
    target_kl: Annotated[float, NonNegative] = 0.03
    """stop a training phase once a batch's approximate KL exceeds this (0: never, the seed; PR 498: 0.03)"""
    latent_coef: Annotated[float, NonNegative] = 10.0
    """weight of the latent-consistency MSE"""
    reward_coef: Annotated[float, NonNegative] = 1.0
    """weight of the reward cross-entropy"""
    policy_coef: Annotated[float, NonNegative] = 1.0
    """weight of the PPO clipped surrogate"""
    value_coef: Annotated[float, NonNegative] = 0.5
    """weight of the value cross-entropy"""
    ent_coef: Annotated[float, NonNegative] = 0.01
    """weight of the entropy bonus (the seed's 0.01)"""
    learning_rate: Annotated[float, Positive] = 3e-4
    """AdamW learning rate (the seed: 1e-4)"""
    anneal_lr: bool = False
    """decay the learning rate linearly to 0 over the run (off: the seed)"""
    weight_decay: Annotated[float, NonNegative] = 1e-4
    """AdamW weight decay (on matrices only)"""
    max_grad_norm: Annotated[float, NonNegative] = 5.0
    """global gradient-norm clip (0 turns clipping off)"""
    target_update_rate: Annotated[float, OpenFraction] = 0.05
    """EMA rate of the target encoder that makes latent targets"""
    embed_dim: Annotated[int, AtLeastOne] = 64
    """latent and token width"""
    num_layers: Annotated[int, AtLeastOne] = 2
    """transformer layers"""
    num_heads: Annotated[int, AtLeastOne] = 2
    """attention heads"""
    dropout: Annotated[float, Range(ge=0, lt=1)] = 0.0
    """dropout in the transformer during training (LightZero: 0.1; it makes the first PPO ratio differ from 1)"""
    support_size: Annotated[int, Range(ge=3)] = 101
    """bins of the categorical reward and value heads, on [-(n-1)/2, (n-1)/2] in h-space"""
    eval_search: Annotated[int, NonNegative] = 0
    """also evaluate with Gumbel MuZero search of this many simulations on the trained model (0: off)"""
    search_discount: Annotated[float, Fraction] = 0.997
    """discount of the evaluation search"""

    def __post_init__(self):
        check_fields(self)  # the ranges beside the fields (jaxzoo.checks)
        if self.num_steps % self.num_unroll_steps:
            raise ValueError(
                f"num_steps={self.num_steps} is not a multiple of num_unroll_steps={self.num_unroll_steps} (rollouts "
                f"are cut into whole chunks); accepted: a multiple of {self.num_unroll_steps}"
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
        if self.update_epochs > 0 and self.num_minibatches > self.num_windows:
            raise ValueError(
                f"num_minibatches={self.num_minibatches} exceeds the {self.num_windows} "
                f"{self.num_unroll_steps}-step windows a phase collects; accepted: in [1, {self.num_windows}]"
            )
        if self.num_updates < 1:
            raise ValueError(
                f"total_timesteps={self.total_timesteps} is less than one rollout (num_envs * num_steps = "
                f"{self.batch_steps} steps); accepted: total_timesteps >= {self.batch_steps}"
            )

    @property
    def batch_steps(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.batch_steps

    @property
    def num_windows(self) -> int:
        return self.batch_steps // self.num_unroll_steps

    @property
    def gradient_steps(self) -> int:
        if self.update_epochs > 0:
            return self.update_epochs * self.num_minibatches
        return max(1, round(self.replay_ratio * self.batch_steps))


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
    # attention weights' [B, H, T, T] slowly (docs/performance.md, "Random draws").
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
        keys = [None] * 3 if key is None else list(jax.random.split(key, 3))
        batch, length, dim = x.shape
        q, k, v = jnp.split(
            self.qkv(self.norm1(x)).reshape(batch, length, 3 * self.heads, dim // self.heads), 3, axis=2
        )
        q, k = rope(q, positions), rope(k, positions)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(dim // self.heads)
        scores = jnp.where(mask[:, None], scores, -1e30)
        attention = dropout(jax.nn.softmax(scores, axis=-1), self.dropout_rate, keys[0])
        out = jnp.einsum("bhqk,bkhd->bqhd", attention, v).reshape(batch, length, dim)
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


class WorldModel(nnx.Module):
    """UniZero's model: encoder, action embedding, causal transformer, heads.

    Tokens come in (latent, action) pairs; the latent of env timestep t sits at
    position 2t and its action at 2t + 1. `transformer` runs any token sequence;
    the heads read the next latent (with LayerNorm) and the reward at action
    tokens, the policy and the value at latent tokens.
    """

    def __init__(self, obs_shape, num_actions: int, args: Args, rngs: nnx.Rngs):
        dim = args.embed_dim
        self.encoder = Encoder(obs_shape, dim, rngs)
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


def forward_window(model: WorldModel, window: Window, key: jax.Array | None = None, heads_only: bool = False):
    """One pass over a window. Returns, per step [B, K, ...]: policy logits and
    value logits (at latent tokens), next-latent predictions and reward logits
    (at action tokens). `key` turns dropout on; `heads_only` stops the policy
    and value gradients at the transformer's output (`--ppo-heads-only`)."""
    tokens, positions, mask = window_tokens(model, window)
    hidden = model.transformer(tokens, positions, mask, key)
    at_latent, at_action = hidden[:, 0::2], hidden[:, 1::2]
    features = jax.lax.stop_gradient(at_latent) if heads_only else at_latent
    return (
        model.policy_head(features),
        model.value_head(features),
        model.next_latent(at_action),
        model.reward_head(at_action),
    )


def last_hidden(model: WorldModel, node: SearchNode) -> jax.Array:
    """Hidden state [B, D] of the last token of a token window (causal, valid tokens only)."""
    width = node.tokens.shape[1]
    mask = (jnp.tril(jnp.ones((width, width), bool))[None] & node.valid[:, None, :]) | jnp.eye(width, dtype=bool)[None]
    return model.transformer(node.tokens, node.positions, mask)[:, -1]


def push_token(node: SearchNode, token: jax.Array, position: jax.Array) -> SearchNode:
    """Append a token [B, D] at `position` [B], dropping the oldest (a FIFO of fixed width)."""
    return SearchNode(
        jnp.concatenate([node.tokens[:, 1:], token[:, None]], 1),
        jnp.concatenate([node.positions[:, 1:], position[:, None]], 1),
        jnp.concatenate([node.valid[:, 1:], jnp.ones_like(node.valid[:, :1])], 1),
    )


def imagine_step(model: WorldModel, node: SearchNode, action: jax.Array):
    """One step inside the model: append the action token, whose hidden state
    predicts the reward and the next latent; append that latent, whose hidden
    state gives the policy and the value. Returns
    (node, reward [B], latent [B, D], policy logits [B, A], value [B])."""
    node = push_token(node, model.action_embedding(action), node.positions[:, -1] + 1)
    at_action = last_hidden(model, node)
    latent = model.next_latent(at_action)
    node = push_token(node, latent, node.positions[:, -1] + 1)
    at_latent = last_hidden(model, node)
    return (
        node,
        logits_to_scalar(model.reward_head(at_action)),
        latent,
        model.policy_head(at_latent),
        logits_to_scalar(model.value_head(at_latent)),
    )


# --------------------------------------------------------------------------- #
# Pytrees
# --------------------------------------------------------------------------- #
class Hyperparams(struct.PyTreeNode):
    """Hyperparameters read inside the jitted update. They live in the runner
    state, so `train` can be vmapped over them (a sweep in one compile)."""

    learning_rate: jax.Array  # [] AdamW step size (before --anneal-lr's decay)
    gamma: jax.Array  # [] discount of GAE
    gae_lambda: jax.Array  # [] GAE lambda
    clip_coef: jax.Array  # [] PPO clipping epsilon
    latent_coef: jax.Array  # [] weight of the latent-consistency MSE
    reward_coef: jax.Array  # [] weight of the reward cross-entropy
    policy_coef: jax.Array  # [] weight of the PPO clipped surrogate
    value_coef: jax.Array  # [] weight of the value cross-entropy
    ent_coef: jax.Array  # [] weight of the entropy bonus

    @classmethod
    def from_args(cls, args: Args) -> Hyperparams:
        return cls(*(jnp.float32(getattr(args, f.name)) for f in dataclasses.fields(cls)))


class Transition(NamedTuple):
    """One collected step; under the rollout scan every field gains [T, N] in front."""

    obs: jax.Array  # [N, *obs_shape]
    action: jax.Array  # [N]
    log_prob: jax.Array  # [N] log-prob of `action` under softmax(logits / temperature): what was sampled
    value: jax.Array  # [N] V(obs) from the value head, same context as the policy
    next_value: jax.Array  # [N] V of the true next state (final observation), same context rule
    reward: jax.Array  # [N]
    terminated: jax.Array  # [N] bool
    truncated: jax.Array  # [N] bool
    final_obs: jax.Array  # [N, *obs_shape] info["final_observation"]
    timestep: jax.Array  # [N] env timestep of obs (0 at an episode start)
    episode_done: jax.Array  # [N] statistics from jaxzoo.envs.EpisodeStatistics
    episode_return: jax.Array  # [N]
    episode_length: jax.Array  # [N]


class Batch(NamedTuple):
    """Training windows: leaves [W, K, ...]."""

    window: Window
    log_prob: jax.Array  # [W, K]
    advantage: jax.Array
    target_return: jax.Array
    reward: jax.Array
    final_obs: jax.Array  # [W, K, *obs_shape]: latent targets
    value: jax.Array


class Context(struct.PyTreeNode):
    """The current chunk of every env during collection; leaves [N, K, ...]."""

    obs: jax.Array
    action: jax.Array
    timestep: jax.Array
    valid: jax.Array  # [N, K] bool: slot holds a step of this chunk and episode


class SearchNode(NamedTuple):
    """mctx embedding of a search node: the last 2K tokens leading to it, [B, 2K, ...]."""

    tokens: jax.Array  # [B, 2K, D]
    positions: jax.Array  # [B, 2K]
    valid: jax.Array  # [B, 2K] bool


class RunnerState(struct.PyTreeNode):
    """Everything a run carries from one phase to the next (and checkpoints)."""

    params: nnx.State
    target_encoder: nnx.State  # EMA of the encoder: latent targets
    opt_state: optax.OptState
    env_state: Any
    obs: jax.Array  # [N, *obs_shape]
    timestep: jax.Array  # [N] env timestep of obs
    context: Context
    key: jax.Array
    update_step: jax.Array  # []
    hparams: Hyperparams


# --------------------------------------------------------------------------- #
# Algorithm logic (pure functions; the unit tests import these)
# --------------------------------------------------------------------------- #
def tempered_log_probs(logits: jax.Array, temperature: float | jax.Array) -> jax.Array:
    """log softmax(logits / T) [..., A]: the distribution collection samples from,
    and whose log-probs PPO compares (docs/unizero_ppo.md, bug 3). Written out
    rather than a distrax.Categorical: the temperature is part of what the PPO
    ratio is defined on, and a reader should see it in the stored log-prob."""
    return jax.nn.log_softmax(logits / temperature, axis=-1)


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


def explained_variance(prediction: jax.Array, target: jax.Array) -> jax.Array:
    """1 - Var[target - prediction] / Var[target] (1 is perfect, <= 0 is useless)."""
    return 1.0 - jnp.var(target - prediction) / (jnp.var(target) + 1e-8)


def cross_entropy(logits: jax.Array, target_probs: jax.Array) -> jax.Array:
    return -jnp.sum(target_probs * jax.nn.log_softmax(logits, axis=-1), axis=-1)


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


def minibatch_indices(args: Args, key: jax.Array) -> jax.Array:
    """Which of a phase's `num_windows` windows each gradient step trains on:
    [gradient_steps, windows per step]. With `update_epochs` > 0, each epoch is
    a fresh permutation cut into `num_minibatches` equal minibatches (every
    window at most once per epoch; the remainder of an uneven split sits out
    that epoch); otherwise `batch_size` draws with replacement per step (the seed's schedule)."""
    if args.update_epochs > 0:
        size = args.num_windows // args.num_minibatches
        permutations = jax.vmap(lambda k: jax.random.permutation(k, args.num_windows))(
            jax.random.split(key, args.update_epochs)
        )
        return permutations[:, : size * args.num_minibatches].reshape(args.gradient_steps, size)
    return jax.random.randint(key, (args.gradient_steps, args.batch_size), 0, args.num_windows)


def make_optimizer(args: Args) -> optax.GradientTransformation:
    """AdamW (betas 0.9 / 0.95) with weight decay on matrices only (LightZero's
    configure_optimizers) after a global-norm clip (0: none). The learning rate
    is an injected hyperparameter, set before each step by `learning_rate_at`."""
    decay_mask = lambda params: jax.tree.map(lambda x: x.ndim >= 2, params)

    def adamw(learning_rate):
        optimizer = optax.adamw(learning_rate, b1=0.9, b2=0.95, weight_decay=args.weight_decay, mask=decay_mask)
        if args.max_grad_norm > 0:  # 0 turns clipping off
            optimizer = optax.chain(optax.clip_by_global_norm(args.max_grad_norm), optimizer)
        return optimizer

    return optax.inject_hyperparams(adamw)(learning_rate=args.learning_rate)


def learning_rate_at(args: Args, hparams: Hyperparams, step: jax.Array) -> jax.Array:
    """The learning rate of optimizer step `step` []: constant, or with --anneal-lr
    a linear decay to 0 over the run's optimizer steps (as CleanRL's and PureJaxRL's PPO)."""
    if not args.anneal_lr:
        return hparams.learning_rate
    return optax.linear_schedule(hparams.learning_rate, 0.0, args.num_updates * args.gradient_steps)(step)


# ---- Acting: the chunked context of collection and evaluation --------------------------
def empty_context(n: int, num_unroll_steps: int, obs_shape: tuple[int, ...]) -> Context:
    """No step of any of `n` envs' chunks yet: leaves [n, K, ...]."""
    return Context(
        obs=jnp.zeros((n, num_unroll_steps) + obs_shape),
        action=jnp.zeros((n, num_unroll_steps), jnp.int32),
        timestep=jnp.zeros((n, num_unroll_steps), jnp.int32),
        valid=jnp.zeros((n, num_unroll_steps), bool),
    )


def context_window(context: Context, slot: jax.Array) -> Window:
    """The chunk so far as a one-segment window [n, K]: latents up to `slot`,
    actions before it."""
    num_unroll_steps = context.action.shape[1]
    return Window(
        context.obs,
        context.action,
        context.timestep,
        jnp.zeros_like(context.timestep),
        context.valid,
        context.valid & (jnp.arange(num_unroll_steps) < slot),
    )


def policy_at(model: WorldModel, context: Context, slot: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Policy logits [n, A] and value [n] at chunk slot `slot`, from the
    tokens of this chunk so far (latents up to the slot, actions before it)."""
    logits, value_logits, _, _ = forward_window(model, context_window(context, slot))
    return logits[:, slot], logits_to_scalar(value_logits[:, slot])


def place(context: Context, slot: jax.Array, obs: jax.Array, timestep: jax.Array) -> Context:
    """Write observations obs [n, *obs_shape] at env timesteps [n] into slot
    `slot` of every env's chunk."""
    num_unroll_steps, obs_dims = context.action.shape[1], context.obs.ndim - 2
    at = jnp.arange(num_unroll_steps) == slot
    return context.replace(
        obs=jnp.where(at.reshape((1, num_unroll_steps) + (1,) * obs_dims), obs[:, None], context.obs),
        timestep=jnp.where(at[None], timestep[:, None], context.timestep),
        valid=context.valid | at[None],
    )


def place_action(context: Context, slot: jax.Array, action: jax.Array) -> Context:
    """Write actions [n] into slot `slot` of every env's chunk."""
    at = jnp.arange(context.action.shape[1]) == slot
    return context.replace(action=jnp.where(at[None], action[:, None], context.action))


def collect_step(args: Args, env, env_params, graphdef: nnx.GraphDef, carry: tuple[RunnerState, nnx.State], step_index):
    """One env step of all N envs with the pure policy (no search), sampled at
    the sampling temperature. carry = (state, params); returns it and a
    Transition with leaves [N, ...]."""
    state, params = carry
    model = nnx.merge(graphdef, params)
    num_envs, num_unroll_steps = state.context.action.shape
    obs_shape = state.obs.shape[1:]
    slot = step_index % num_unroll_steps
    key, action_key, step_key = jax.random.split(state.key, 3)
    context = place(state.context, slot, state.obs, state.timestep)
    logits, value = policy_at(model, context, slot)
    log_probs = tempered_log_probs(logits, args.sampling_temperature)
    action = jax.random.categorical(action_key, log_probs)
    next_obs, env_state, reward, terminated, truncated, info = env.step(step_key, state.env_state, action, env_params)
    context = place_action(context, slot, action)

    # V of the true next state under the policy's own context rule: the same
    # chunk if it goes on, a fresh chunk if this step ended it.
    next_slot = (slot + 1) % num_unroll_steps
    fresh_chunk = empty_context(num_envs, num_unroll_steps, obs_shape)
    base = jax.tree.map(lambda c, e: jnp.where(next_slot == 0, e, c), context, fresh_chunk)
    _, next_value = policy_at(model, place(base, next_slot, info["final_observation"], state.timestep + 1), next_slot)

    done = terminated | truncated
    fresh = done[:, None] | (next_slot == 0)
    transition = Transition(
        obs=state.obs,
        action=action,
        log_prob=jnp.take_along_axis(log_probs, action[:, None], 1)[:, 0],
        value=value,
        next_value=next_value,
        reward=reward,
        terminated=terminated,
        truncated=truncated,
        final_obs=info["final_observation"],
        timestep=state.timestep,
        episode_done=info["episode_done"],
        episode_return=info["episode_return"],
        episode_length=info["episode_length"],
    )
    state = state.replace(
        env_state=env_state,
        obs=next_obs,
        timestep=jnp.where(done, 0, state.timestep + 1),
        context=context.replace(valid=context.valid & ~fresh),
        key=key,
    )
    return (state, params), transition


def make_windows(traj: Transition, advantages: jax.Array, returns: jax.Array, num_unroll_steps: int) -> Batch:
    """Cut the rollout [T, N] into its aligned chunks: [N * T / K, K] windows.
    A window's segments are the episodes within it (a step with timestep 0
    starts a new one), exactly the contexts the policy acted with."""
    T, N = traj.reward.shape
    to_windows = lambda x: jnp.swapaxes(x, 0, 1).reshape((N * T // num_unroll_steps, num_unroll_steps) + x.shape[2:])
    starts = to_windows(traj.timestep == 0)
    segment = jnp.cumsum(starts.astype(jnp.int32), axis=1)
    ones = jnp.ones(starts.shape, bool)
    window = Window(to_windows(traj.obs), to_windows(traj.action), to_windows(traj.timestep), segment, ones, ones)
    return Batch(
        window,
        to_windows(traj.log_prob),
        to_windows(advantages),
        to_windows(returns),
        to_windows(traj.reward),
        to_windows(traj.final_obs),
        to_windows(traj.value),
    )


# ---- Learning: the loss and one gradient step ------------------------------------------
def unizero_ppo_loss(
    args: Args,
    graphdef: nnx.GraphDef,
    params: nnx.State,
    target_encoder: nnx.State,
    batch: Batch,
    key: jax.Array,
    hparams: Hyperparams,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The world-model losses and the PPO terms on windows [B, K]:

        loss = latent_coef MSE(next latent, EMA-encoded final obs) + reward_coef CE(reward)
               + policy_coef clipped surrogate + value_coef CE(two-hot h(return)) - ent_coef H.

    Returns (loss [], metrics: dict of [] arrays)."""
    world = nnx.merge(graphdef, params)
    logits, value_logits, next_latents, reward_logits = forward_window(
        world, batch.window, key if args.dropout > 0 else None, heads_only=args.ppo_heads_only
    )
    target_latents = jax.lax.stop_gradient(nnx.merge(nnx.graphdef(world.encoder), target_encoder)(batch.final_obs))
    latent_loss = jnp.mean(jnp.square(next_latents - target_latents))
    reward_loss = jnp.mean(cross_entropy(reward_logits, scalar_to_probs(batch.reward, args.support_size)))
    value_loss = jnp.mean(cross_entropy(value_logits, scalar_to_probs(batch.target_return, args.support_size)))
    log_probs = tempered_log_probs(logits, args.sampling_temperature)
    new_log_prob = jnp.take_along_axis(log_probs, batch.window.action[..., None], -1)[..., 0]
    surrogate, ratio = clipped_surrogate(new_log_prob, batch.log_prob, batch.advantage, hparams.clip_coef)
    policy_loss = surrogate.mean()
    entropy = -jnp.mean(jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1))
    total = (
        hparams.latent_coef * latent_loss
        + hparams.reward_coef * reward_loss
        + hparams.policy_coef * policy_loss
        + hparams.value_coef * value_loss
        - hparams.ent_coef * entropy
    )
    log_ratio = new_log_prob - batch.log_prob
    return total, {
        "loss": total,
        "latent_loss": latent_loss,
        "reward_loss": reward_loss,
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "ratio_mean": ratio.mean(),
        "ratio_max": ratio.max(),
        "ratio_max_deviation": jnp.abs(ratio - 1.0).max(),
        "approx_kl": jnp.mean((ratio - 1.0) - log_ratio),
        "clip_fraction": jnp.mean(jnp.abs(ratio - 1.0) > hparams.clip_coef),
    }


def gradient_step(args: Args, graphdef: nnx.GraphDef, optimizer, batch: Batch, hparams: Hyperparams, carry, inputs):
    """One AdamW step on the windows `indices` [B] of the phase's `batch`, then
    the target encoder's EMA. carry = (params, target_encoder, opt_state,
    stopped); once `stopped` (a batch's approximate KL passed target_kl) the
    carry stays as it is. Returns (carry, (metrics of [] arrays, step ran []))."""
    params, target_encoder, opt_state, stopped = carry
    indices, dropout_key = inputs
    minibatch = jax.tree.map(lambda x: x[indices], batch)
    minibatch = parallel.constrain_data(minibatch)  # --parallel data: the windows are split over devices
    loss = lambda p: unizero_ppo_loss(args, graphdef, p, target_encoder, minibatch, dropout_key, hparams)
    grads, stats = jax.grad(loss, has_aux=True)(params)
    learning_rate = learning_rate_at(args, hparams, opt_state.count)
    opt_state = opt_state._replace(hyperparams={**opt_state.hyperparams, "learning_rate": learning_rate})
    updates, new_opt_state = optimizer.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    new_target = jax.tree.map(
        lambda t, p: (1 - args.target_update_rate) * t + args.target_update_rate * p,
        target_encoder,
        new_params["encoder"],
    )
    keep = ~stopped
    params, opt_state, target_encoder = jax.tree.map(
        lambda n, o: jnp.where(keep, n, o),
        (new_params, new_opt_state, new_target),
        (params, opt_state, target_encoder),
    )
    if args.target_kl > 0:
        stopped = stopped | (stats["approx_kl"] > args.target_kl)
    return (params, target_encoder, opt_state, stopped), (stats, keep)


# ---- Evaluation: greedy play, optionally with search ----------------------------------
def play(eval_env, env_params, max_steps: int, context: Context, key: jax.Array, choose) -> jax.Array:
    """One episode in each of the E eval envs, acting with the chunked context
    of collection (`context`: an empty one [E, K]); `choose(context, slot, key)
    -> actions [E]`. Stops when all finished or after `max_steps` steps;
    returns the undiscounted returns [E]."""
    num_episodes, num_unroll_steps = context.action.shape
    reset_key, key = jax.random.split(key)
    obs, env_state = eval_env.reset(reset_key, env_params)

    def body(carry):
        obs, env_state, timestep, context, step_index, key, finished, returns = carry
        key, step_key, choose_key = jax.random.split(key, 3)
        slot = step_index % num_unroll_steps
        context = place(context, slot, obs, timestep)
        action = choose(context, slot, choose_key)
        context = place_action(context, slot, action)
        obs, env_state, _, terminated, truncated, info = eval_env.step(step_key, env_state, action, env_params)
        done = terminated | truncated
        fresh = done[:, None] | ((slot + 1) % num_unroll_steps == 0)
        context = context.replace(valid=context.valid & ~fresh)
        newly = info["episode_done"] & ~finished
        returns = jnp.where(newly, info["episode_return"], returns)
        return (
            obs,
            env_state,
            jnp.where(done, 0, timestep + 1),
            context,
            step_index + 1,
            key,
            finished | newly,
            returns,
        )

    def keep_going(carry):
        return ~jnp.all(carry[6]) & (carry[4] < max_steps)

    timestep, finished = jnp.zeros(num_episodes, jnp.int32), jnp.zeros(num_episodes, bool)
    carry = (obs, env_state, timestep, context, 0, key, finished, jnp.zeros(num_episodes))
    final = jax.lax.while_loop(keep_going, body, carry)
    return envs.with_recording(final[7], eval_env, final[1])


def search_root(model: WorldModel, context: Context, slot: jax.Array) -> mctx.RootFnOutput:
    """The real chunk so far as the root's token window [n, 2K] (left-padded)."""
    window = context_window(context, slot)
    tokens, positions, _ = window_tokens(model, window)
    width = tokens.shape[1]  # 2K: the longest context training shows
    valid = jnp.stack([window.obs_valid, window.action_valid], 2).reshape(tokens.shape[0], width)
    # Move the tokens up to and including the current latent (index 2 slot) to the end.
    shift = width - 1 - 2 * slot
    roll = lambda x: jnp.roll(x, shift, axis=1)
    keep = jnp.arange(width) >= shift
    node = SearchNode(roll(tokens), roll(positions), roll(valid) & keep[None])
    hidden = last_hidden(model, node)
    return mctx.RootFnOutput(
        prior_logits=model.policy_head(hidden), value=logits_to_scalar(model.value_head(hidden)), embedding=node
    )


def search_recurrent_fn(graphdef: nnx.GraphDef, discount: float):
    """mctx dynamics: one imagined step from every node of the batch."""

    def recurrent_fn(params, _key, action, node: SearchNode):
        node, reward, _, prior_logits, value = imagine_step(nnx.merge(graphdef, params), node, action)
        output = mctx.RecurrentFnOutput(
            reward=reward, discount=jnp.full(action.shape, discount), prior_logits=prior_logits, value=value
        )
        return output, node

    return recurrent_fn


# --------------------------------------------------------------------------- #
# Training
# --------------------------------------------------------------------------- #
class UniZeroPPO(NamedTuple):
    """What `make_train` returns: pure functions closed over the static config."""

    init: Any  # (key, hparams=None) -> RunnerState
    update: Any  # RunnerState -> (RunnerState, metrics: dict of [] arrays)
    train: Any  # (key, hparams=None) -> (RunnerState, metrics: dict of [num_updates] arrays)
    evaluate: Any  # (RunnerState, key) -> returns [eval_episodes] (pure policy, argmax); with --capture-video also an envs.Recording
    evaluate_search: Any  # (RunnerState, key) -> returns [eval_episodes] (Gumbel MuZero search)
    collect: Any  # RunnerState -> (RunnerState, Transition [T, N])
    make_windows: Any  # (Transition [T, N], advantages [T, N], returns [T, N]) -> Batch [N T / K, K]
    loss: Any  # (params, target_encoder, Batch, key, hparams=None) -> (loss [], metrics)
    graphdef: Any
    spec: envs.EnvSpec


def make_train(args: Args) -> UniZeroPPO:
    env_kwargs = env_options(args.env_id, args.max_episode_steps)
    spec = envs.spec(*envs.make(args.env_id, **env_kwargs))
    if not spec.discrete:
        raise ValueError(f"{args.env_id} has a continuous action space; UniZero-PPO here needs discrete actions")
    env, env_params = envs.make(args.env_id, args.num_envs, **env_kwargs)
    eval_env, _ = envs.make(args.env_id, args.eval_episodes, **env_kwargs)
    # --capture-video: the pure-policy evaluation records each seed's first episode (jaxzoo.video).
    recorded_eval_env = envs.RecordEpisode(eval_env, spec.max_episode_steps + 1) if args.capture_video else eval_env
    K, N, T = args.num_unroll_steps, args.num_envs, args.num_steps
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: WorldModel(spec.obs_shape, spec.num_actions, args, nnx.Rngs(0))))
    optimizer = make_optimizer(args)

    def init(key: jax.Array, hparams: Hyperparams | None = None) -> RunnerState:
        hparams = Hyperparams.from_args(args) if hparams is None else hparams
        key, model_key, env_key = jax.random.split(key, 3)
        params = nnx.split(WorldModel(spec.obs_shape, spec.num_actions, args, nnx.Rngs(model_key)))[1]
        obs, env_state = env.reset(env_key, env_params)
        return RunnerState(
            params=params,
            target_encoder=params["encoder"],
            opt_state=optimizer.init(params),
            env_state=env_state,
            obs=obs,
            timestep=jnp.zeros(N, jnp.int32),
            context=empty_context(N, K, spec.obs_shape),
            key=key,
            update_step=jnp.int32(0),
            hparams=hparams,
        )

    def collect(state: RunnerState) -> tuple[RunnerState, Transition]:
        """num_steps steps of num_envs envs -> Transition [T, N]; the rollout
        starts on a chunk boundary (num_steps is a multiple of K)."""
        step = functools.partial(collect_step, args, env, env_params, graphdef)
        (state, _), traj = jax.lax.scan(step, (state, state.params), jnp.arange(T))
        return state, traj

    def windows(traj: Transition, advantages: jax.Array, returns: jax.Array) -> Batch:
        return make_windows(traj, advantages, returns, K)

    def loss(params, target_encoder, batch: Batch, key, hparams: Hyperparams | None = None):
        hparams = Hyperparams.from_args(args) if hparams is None else hparams
        return unizero_ppo_loss(args, graphdef, params, target_encoder, batch, key, hparams)

    def update(state: RunnerState) -> tuple[RunnerState, dict[str, jax.Array]]:
        """One phase: collect num_steps x num_envs steps, GAE over the rollout,
        then `gradient_steps` steps on windows of this phase's data only (PPO's
        epochs x minibatches, or the seed's draws with replacement), stopped early
        past target_kl; the data is then discarded."""
        hp = state.hparams
        state, traj = collect(state)
        advantages, returns = compute_gae(
            traj.reward, traj.value, traj.next_value, traj.terminated, traj.truncated, hp.gamma, hp.gae_lambda
        )
        # return = advantage + value is fixed before any normalisation; the surrogate then sees
        # advantages normalised over the whole rollout (not per minibatch) when --norm-adv-rollout is on.
        policy_advantages = (
            (advantages - advantages.mean()) / (advantages.std() + 1e-8) if args.norm_adv_rollout else advantages
        )
        batch = windows(traj, policy_advantages, returns)
        key, update_key, index_key = jax.random.split(state.key, 3)
        step = functools.partial(gradient_step, args, graphdef, optimizer, batch, hp)
        (params, target_encoder, opt_state, _), (stats, executed) = jax.lax.scan(
            step,
            (state.params, state.target_encoder, state.opt_state, jnp.bool_(False)),
            (minibatch_indices(args, index_key), jax.random.split(update_key, args.gradient_steps)),
        )
        weights = executed.astype(jnp.float32)
        # On the phase's first batch the policy is the one that collected: |ratio - 1| ~ 0 (docs: bug 4).
        first_deviation = stats.pop("ratio_max_deviation")[0]
        stats = jax.tree.map(lambda x: jnp.sum(x * weights) / weights.sum(), stats)
        state = state.replace(
            params=params,
            target_encoder=target_encoder,
            opt_state=opt_state,
            key=key,
            update_step=state.update_step + 1,
        )
        episodes = {"episode_done": traj.episode_done, "episode_return": traj.episode_return}
        metrics = {
            **envs.episode_metrics({**episodes, "episode_length": traj.episode_length}),
            **stats,
            "first_ratio_max_deviation": first_deviation,
            "gradient_steps_run": weights.sum(),
            "advantage_mean": advantages.mean(),
            "advantage_std": advantages.std(),
            "return_mean": returns.mean(),
            "return_std": returns.std(),
            "explained_variance": explained_variance(batch.value.reshape(-1), batch.target_return.reshape(-1)),
        }
        return state, metrics

    def train(key: jax.Array, hparams: Hyperparams | None = None):
        """The whole run as one `lax.scan` over phases: jit it, vmap it over
        seeds (keys) and hyperparameters."""
        return jax.lax.scan(lambda s, _: update(s), init(key, hparams), None, args.num_updates)

    def play_episodes(key: jax.Array, choose, env=eval_env):
        """One episode in each eval env, each from an empty chunk: returns [eval_episodes]."""
        empty = empty_context(args.eval_episodes, K, spec.obs_shape)
        return play(env, env_params, spec.max_episode_steps + 1, empty, key, choose)

    def evaluate(state: RunnerState, key: jax.Array) -> jax.Array:
        """Pure policy, argmax, no search (the seed's eval_with_pure_policy)."""
        model = nnx.merge(graphdef, state.params)
        greedy = lambda context, slot, _: jnp.argmax(policy_at(model, context, slot)[0], -1)
        return play_episodes(key, greedy, recorded_eval_env)

    recurrent_fn = search_recurrent_fn(graphdef, args.search_discount)

    def evaluate_search(state: RunnerState, key: jax.Array) -> jax.Array:
        """Gumbel MuZero search (mctx) with `eval_search` simulations, greedy
        (no Gumbel noise), on the same chunked contexts."""

        def choose(context, slot, key):
            root = search_root(nnx.merge(graphdef, state.params), context, slot)
            out = mctx.gumbel_muzero_policy(
                state.params, key, root, recurrent_fn, num_simulations=args.eval_search, gumbel_scale=0.0
            )
            return out.action

        return play_episodes(key, choose)

    return UniZeroPPO(init, update, train, evaluate, evaluate_search, collect, windows, loss, graphdef, spec)


# --------------------------------------------------------------------------- #
# Host loop
# --------------------------------------------------------------------------- #
def main(args: Args) -> runner.RunResult:
    """Train `num_seeds` seeds in chunks of `log_every` phases (common/runner.py),
    then evaluate the pure policy greedily and, with --eval-search, with search."""
    # Resume, run-root and cache checks, before anything is built; the CPU devices of --parallel (Args.DATA_AXIS).
    args = runner.prepare(args, "unizero_ppo")
    algo = make_train(args)
    result = runner.run(
        args,
        "unizero_ppo",
        algo.init,
        algo.update,
        algo.evaluate,
        num_updates=args.num_updates,
        steps_per_update=args.batch_steps,
        eval_every=args.eval_every,
        # --parallel data: the environments (axis 0 of env_state, obs, timestep, context) are split over devices.
        data_axes=lambda state: jax.tree.map(lambda _: None, state).replace(env_state=0, obs=0, timestep=0, context=0),
    )
    if args.eval_search:
        seeds = args.seed + np.arange(args.num_seeds, dtype=np.int32)
        evaluate = jax.jit(
            jax.vmap(lambda s, seed: algo.evaluate_search(s, jax.random.fold_in(jax.random.key(seed), 1)))
        )
        returns = np.asarray(evaluate(result.state, seeds))
        print(
            f"with {args.eval_search}-simulation Gumbel search: {returns.mean():.2f} +- {returns.std():.2f} "
            f"(pure policy: {result.eval_returns.mean():.2f})",
            flush=True,
        )
        (Path(result.run_dir) / "eval_search.json").write_text(
            json.dumps(
                {"num_simulations": args.eval_search, "returns": returns.tolist(), "mean": float(returns.mean())},
                indent=2,
            )
        )
    return result


if __name__ == "__main__":
    with cli.user_errors():
        main(cli.parse(Args, "unizero_ppo"))
