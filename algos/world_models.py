"""World Models: a VAE (V), an MDN-RNN (M) and a linear controller (C) evolved by CMA-ES, from pixels.

Paper: Ha & Schmidhuber 2018, "World Models" / "Recurrent World Models
Facilitate Policy Evolution" (arXiv:1803.10122); CMA-ES as in Hansen 2016,
"The CMA Evolution Strategy: A Tutorial" (arXiv:1604.00772).

The idea: split the agent into a large world model trained without rewards and
a tiny controller trained only on rewards. (1) A random policy collects
rollouts. (2) V, a convolutional VAE, compresses every frame to a small latent
z. (3) M, an LSTM with a mixture-density head, learns p(z_{t+1} | z_t, a_t,
h_t) as a mixture of Gaussians per latent dimension (plus, optionally, the
reward and whether the episode ends). (4) C, a = W [z_t, h_t] + b, a few
hundred parameters, is evolved by CMA-ES, scoring each candidate by its mean
return in the real environment or inside M's "dream" (z sampled with
temperature tau). Every stage is pure JAX: the random rollouts and each CMA-ES
generation's whole population run as one vmapped, jitted program on a pixel
CartPole rendered in JAX (common/pixels.py). The gymnasium CarRacing-v3 of the
paper runs through a host-side path (needs box2d). `make_train(args).train(key,
hparams)` fuses every stage in one program; vmapped over a stacked
`Hyperparams` it is a hyperparameter sweep in one compile.

    python algos/world_models.py                                  # pixel CartPole, all four stages
    python algos/world_models.py --preset pixel-cartpole-dream --stages controller --source-run RUN_DIR
    python algos/world_models.py --preset tiny                    # seconds: what the tests run
    python algos/world_models.py --stages collect vae             # any subset of stages, in order

Details, logged metrics and measured results: docs/world_models.md.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import math
import signal
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, NamedTuple

import chex
import distrax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct

from jaxzoo import checkpoint, cli, envs, logger, parallel, pixels, results, runner
from jaxzoo.checks import AtLeastOne, Fraction, NonNegative, Positive, Range, check_fields
from jaxzoo.layers import StridedConv, StridedConvTranspose

Stage_ = Literal["collect", "vae", "mdn", "controller"]
STAGES: tuple[Stage_, ...] = ("collect", "vae", "mdn", "controller")
DreamDone = Literal["threshold", "sample", "expected"]  # --dream-done, see survives()
DREAM_DONE: tuple[DreamDone, ...] = typing.get_args(DreamDone)
HOST_ENVS = ("CarRacing-v3",)  # gymnasium envs stepped on the host (box2d)


# --------------------------------------------------------------------------- #
# Arguments
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class Args:
    """World Models (Ha & Schmidhuber 2018): V, M and C trained in stages from pixels."""

    exp_name: str = "world-models"
    """name of the experiment: part of the run directory and the plot label"""
    seed: Annotated[int, NonNegative] = 0
    """seed of the first run; seed index i uses seed + i"""
    num_seeds: Annotated[int, AtLeastOne] = 1
    """independent seeds trained at once with `jax.vmap` (host envs: 1)"""
    env_id: str = "CartPole-v1"
    """a gymnax env with a pixel renderer in common/pixels.py, or CarRacing-v3 (gymnasium, host-side, needs box2d)"""
    total_timesteps: Annotated[int, AtLeastOne] = 30_000
    """random-policy env steps (episode slots) collected in stage 1: num_rollouts = total_timesteps // rollout_steps"""
    log_every: Annotated[int, AtLeastOne] = 1
    """updates per jitted chunk of every stage (V and M: `*_batches` gradient steps; C: one generation)"""
    track: bool = False
    """log to Weights & Biases (needs the `logging` extra)"""
    tensorboard: bool = False
    """write TensorBoard event files into each stage's directory (needs the `logging` extra)"""
    save_model: bool = True
    """write checkpoints of every stage's whole state (needed for --resume and --source-run)"""
    checkpoint_every: Annotated[int, AtLeastOne] = 5
    """updates between checkpoints (rounded up to a chunk boundary); one is also written at the end of a stage"""
    resume: str | None = None
    """run directory to resume: the run continues with its saved args.json (finished stages are loaded); a flag that differs from it is refused, except total_timesteps and the reporting flags (docs/reliability.md)"""
    run_root: str = "runs"
    """directory under which run directories are created"""
    eval_episodes: Annotated[int, AtLeastOne] = 100
    """real-environment episodes of the final controller (the paper: 100)"""
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
    stages: tuple[Stage_, ...] = STAGES
    """stages run by this command, in pipeline order; earlier stages' outputs come from --source-run"""
    source_run: str | None = None
    """run directory holding the finished stages this command does not run (their last checkpoints)"""
    image_size: int = 64
    """side of the square frames in pixels: 64 (the paper's 4 convolutions), 32 or 16"""
    grayscale: bool = False
    """one-channel frames instead of RGB"""
    rollout_steps: Annotated[int, AtLeastOne] = 100
    """steps per stored rollout, the sequences M learns from: each rollout is one episode, cut here if it lasts longer (or, with --collect-steps, one piece of one)"""
    collect_steps: Annotated[int, NonNegative] = 0
    """longest collected episode, a multiple of rollout_steps, stored as consecutive rollouts of rollout_steps steps (M learns each piece from a fresh memory, the dreams may start at any piece); 0: rollout_steps"""
    collect_with: str | None = None
    """a finished run directory whose V, M and C (the CMA-ES mean of each seed) play the collect stage's last (1 - collect_random_fraction) episodes, the rest random: the paper's iterative training procedure (section 5); None: every episode random"""
    collect_policy: Literal["uniform", "random-controller"] = "uniform"
    """the random policy of the collect stage: uniform, actions drawn uniformly from the action space each step; random-controller (CarRacing only), the authors' extract.py: a linear C with random weights of scale U(0, 0.01) per episode, which drives nearly straight at half gas (uniform CarRacing actions brake as much as they accelerate: the car barely leaves the start)"""
    collect_random_fraction: Annotated[float, Fraction] = 0.5
    """with --collect-with, the share of the collected episodes that are still uniformly random"""
    collect_keep: bool = False
    """with --collect-with, keep the earlier run's rollouts: this run's are theirs, then the new ones (the paper's iterative procedure adds to its storage; same rollout_steps needed)"""
    z_size: Annotated[int, AtLeastOne] = 32
    """latent size of V (the paper: 32 for CarRacing, 64 for VizDoom)"""
    vae_depth: Annotated[int, AtLeastOne] = 32
    """channels of V's first convolution, doubled per layer (the paper: 32, 64, 128, 256)"""
    vae_learning_rate: Annotated[float, Positive] = 1e-4
    """Adam learning rate of V"""
    vae_batch_size: Annotated[int, AtLeastOne] = 100
    """frames per gradient step of V, drawn uniformly from the collected frames"""
    vae_batches: Annotated[int, AtLeastOne] = 100
    """gradient steps of V per update"""
    vae_updates: Annotated[int, AtLeastOne] = 10
    """updates of V (vae_batches steps each)"""
    kl_weight: Annotated[float, NonNegative] = 1.0
    """weight of KL(q(z|x) || N(0, I)) against the summed squared reconstruction error"""
    free_bits: Annotated[float, NonNegative] = 0.5
    """nats per latent dimension of KL that are not penalised (the paper's code: kl_tolerance 0.5)"""
    rnn_size: Annotated[int, AtLeastOne] = 256
    """LSTM hidden size of M (the paper: 256 for CarRacing)"""
    num_mixtures: Annotated[int, AtLeastOne] = 5
    """Gaussians per latent dimension in M's mixture-density head"""
    mdn_learning_rate: Annotated[float, Positive] = 1e-3
    """Adam learning rate of M"""
    mdn_batch_size: Annotated[int, AtLeastOne] = 32
    """rollouts per gradient step of M (whole rollouts of rollout_steps steps)"""
    mdn_batches: Annotated[int, AtLeastOne] = 50
    """gradient steps of M per update"""
    mdn_updates: Annotated[int, AtLeastOne] = 10
    """updates of M (mdn_batches steps each)"""
    mdn_grad_clip: Annotated[float, NonNegative] = 1.0
    """global gradient-norm clip of M (0: none)"""
    predict_reward: bool = True
    """M also predicts the reward of each step (needed to train C in the dream)"""
    predict_done: bool = True
    """M also predicts whether each step ends the episode (needed to train C in the dream)"""
    done_hidden: Annotated[int, NonNegative] = 0
    """width of a hidden ReLU layer between M's LSTM output and its done head (0: the head is linear in h, as the paper's VizDoom M; CartPole's end is two-sided, |angle| > 12 degrees, issue 26)"""
    balance_done: bool = False
    """weigh the done head's cross-entropy so that the steps that end an episode count as much, in all, as those that do not (a done is 1 step in 22 of random play; docs/world_models.md, issue 26)"""
    controller_env: Literal["real", "dream"] = "real"
    """where C's candidates are scored: the real env (through V and M) or M's dream"""
    population: Annotated[int, Range(ge=2)] = 16
    """CMA-ES population size (candidates per generation; >= 2: CMA-ES recombines the better half)"""
    trials: Annotated[int, AtLeastOne] = 4
    """episodes per candidate; fitness = their mean return"""
    generations: Annotated[int, AtLeastOne] = 30
    """CMA-ES generations"""
    cma_sigma: Annotated[float, Positive] = 0.5
    """initial CMA-ES step size (search starts at zero weights)"""
    dream_done: DreamDone = "threshold"
    """how M's done head ends a dreamed episode: 'threshold' when p(done) > 0.5; 'sample' a Bernoulli(p) draw each step; 'expected' never, each reward weighted by the probability of being alive, prod (1 - p) over the steps before (Dreamer's continuation weights; docs/world_models.md, issue 26)"""
    dream_temperature: Annotated[float, Positive] = 1.15
    """tau of M's sampling in the dream: mixture logits / tau, stds * sqrt(tau) (the paper: 1.15)"""
    host_envs: Annotated[int, AtLeastOne] = 16
    """CarRacing-v3 only: envs stepped at once, each in its own process (gymnasium's AsyncVectorEnv, every core busy); more episodes than this (a generation, the evaluation) run in rounds"""
    controller_max_steps: Annotated[int, NonNegative] = 0
    """longest scored episode, real or dreamed; 0: the env's time limit"""
    fast_compile: bool = False
    """compile every program without LLVM optimisation: about half the compile time, slower code (tiny runs, tests)"""

    def __post_init__(self):
        check_fields(self)
        if self.env_id not in (*pixels.RENDERERS, *HOST_ENVS):
            accepted = (*pixels.RENDERERS, *HOST_ENVS)
            raise ValueError(
                f"env_id {self.env_id!r} is not supported{envs.did_you_mean(self.env_id, accepted)}; "
                f"accepted: {', '.join(accepted)}"
            )
        if self.image_size not in DECODER_KERNELS:
            raise ValueError(
                f"image_size={self.image_size} is not supported; accepted: one of {sorted(DECODER_KERNELS)}"
            )
        unknown = [s for s in self.stages if s not in STAGES]
        if unknown or not self.stages:
            raise ValueError(f"stages {list(self.stages)} are not a non-empty subset of {list(STAGES)}")
        if list(self.stages) != sorted(self.stages, key=STAGES.index) or len(set(self.stages)) != len(self.stages):
            raise ValueError(f"stages {list(self.stages)} must be distinct and in pipeline order {list(STAGES)}")
        if self.controller_env not in ("real", "dream"):
            raise ValueError(f"controller_env must be 'real' or 'dream', got {self.controller_env!r}")
        if self.dream_done not in DREAM_DONE:
            raise ValueError(f"dream_done must be one of {list(DREAM_DONE)}, got {self.dream_done!r}")
        if self.controller_env == "dream" and not (self.predict_done and self.predict_reward):
            raise ValueError(
                "controller_env='dream' needs M's reward and done heads: set predict_reward and "
                f"predict_done (got predict_reward={self.predict_reward}, predict_done={self.predict_done})"
            )
        if self.num_episodes < 1:
            raise ValueError(
                f"total_timesteps={self.total_timesteps} is less than one episode of collect_steps="
                f"{self.episode_steps} steps; accepted: total_timesteps >= collect_steps"
            )
        if self.mdn_batch_size > self.num_rollouts:
            raise ValueError(
                f"mdn_batch_size={self.mdn_batch_size} exceeds the {self.num_rollouts} rollouts "
                f"(total_timesteps={self.total_timesteps} // rollout_steps={self.rollout_steps}); "
                "accepted: mdn_batch_size <= total_timesteps // rollout_steps"
            )
        if self.env_id in HOST_ENVS and self.num_seeds != 1:
            raise ValueError(f"{self.env_id} runs on the host: num_seeds must be 1, got {self.num_seeds}")
        if self.collect_with is not None and "collect" not in self.stages:
            raise ValueError(
                f"collect_with={self.collect_with!r} acts on the collect stage, which stages {list(self.stages)} "
                "do not run; accepted: --collect-with with 'collect' in --stages"
            )
        if self.collect_keep and self.collect_with is None:
            raise ValueError("collect_keep keeps the rollouts of the --collect-with run: pass --collect-with RUN_DIR")
        if self.collect_steps and self.collect_steps % self.rollout_steps:
            raise ValueError(
                f"collect_steps={self.collect_steps} is not a multiple of rollout_steps={self.rollout_steps}; "
                "accepted: 0 (episodes cut at rollout_steps) or a multiple of rollout_steps"
            )
        if self.collect_policy == "random-controller" and self.env_id not in HOST_ENVS:
            raise ValueError(
                f"collect_policy='random-controller' is the authors' CarRacing collection; env_id {self.env_id!r} "
                f"is collected with collect_policy='uniform'; accepted with random-controller: {', '.join(HOST_ENVS)}"
            )
        if self.collect_with is not None and self.env_id in HOST_ENVS:
            raise ValueError(
                f"collect_with: {self.env_id} is collected on the host with random actions only; accepted: "
                f"--collect-with with a pure-JAX pixel env ({', '.join(pixels.RENDERERS)})"
            )

    @property
    def episode_steps(self) -> int:
        """The longest collected episode (collect_steps, or rollout_steps when it is 0)."""
        return self.collect_steps or self.rollout_steps

    @property
    def num_episodes(self) -> int:
        """Episodes the collect stage plays."""
        return self.total_timesteps // self.episode_steps

    @property
    def num_rollouts(self) -> int:
        """Rollouts of rollout_steps steps it stores: each episode cut into episode_steps // rollout_steps pieces."""
        return self.num_episodes * (self.episode_steps // self.rollout_steps)

    DATA_AXIS: ClassVar[str] = "num_rollouts"
    """the field --parallel data splits over the devices (the collected rollouts; runner.data_axis)"""

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.image_size, self.image_size, 1 if self.grayscale else 3)


# --------------------------------------------------------------------------- #
# Networks
# --------------------------------------------------------------------------- #
# V's stride-2, 4 x 4, unpadded convolutions: 64 -> 31 -> 14 -> 6 -> 2 (the
# paper's encoder), 32 -> 15 -> 6 -> 2, 16 -> 7 -> 2. The decoder's transposed
# convolutions grow a 1 x 1 map back: 1 -> 5 -> 13 -> 30 -> 64 with kernels 5,
# 5, 6, 6 (the paper's), 1 -> 5 -> 14 -> 32, 1 -> 6 -> 16.
DECODER_KERNELS = {16: (6, 6), 32: (5, 6, 6), 64: (5, 5, 6, 6)}
VAE_PART = nnx.PathContains("vae")  # the filter that splits V's parameters from M's


class VAE(nnx.Module):
    """V (paper section 2.1 and appendix A.1).

    encode(frames [..., S, S, C] in [0, 1]) -> (mean, log_var) [..., Z]: ReLU
        convolutions of depth x (1, 2, 4, 8) channels down to 2 x 2, flattened,
        one linear layer to 2Z.
    decode(z [..., Z]) -> frames [..., S, S, C]: a linear layer to a 1 x 1 map
        of 4 x 8 x depth features (the paper's 1024), ReLU transposed
        convolutions, the last one linear. The paper ends in a sigmoid; with the
        squared error on white-background frames the sigmoid saturates at 1 and
        the small dark cart and pole get no gradient, so the output is linear
        (as PlaNet's decoder) and pictures clip it to [0, 1]
        (docs/world_models.md).
    """

    def __init__(self, image_shape: tuple[int, int, int], depth: int, z_size: int, rngs: nnx.Rngs):
        kernels = DECODER_KERNELS[image_shape[0]]
        widths = [depth * 2**i for i in range(len(kernels))]
        self.convs = nnx.List(
            [StridedConv(c_in, c_out, 4, rngs) for c_in, c_out in zip([image_shape[2]] + widths[:-1], widths)]
        )
        self.flat = 4 * widths[-1]
        self.to_latent = nnx.Linear(self.flat, 2 * z_size, rngs=rngs)
        self.from_latent = nnx.Linear(z_size, self.flat, rngs=rngs)
        out_widths = widths[::-1][1:] + [image_shape[2]]
        self.deconvs = nnx.List(
            [
                StridedConvTranspose(c_in, c_out, k, rngs)
                for c_in, c_out, k in zip([self.flat] + out_widths[:-1], out_widths, kernels)
            ]
        )
        self.image_shape = image_shape

    def encode(self, frames: jax.Array) -> tuple[jax.Array, jax.Array]:
        lead = frames.shape[:-3]
        x = frames.reshape((-1, *self.image_shape))
        for conv in self.convs:
            x = jax.nn.relu(conv(x))
        mean, log_var = jnp.split(self.to_latent(x.reshape((x.shape[0], -1))), 2, axis=-1)
        log_var = jnp.clip(log_var, -10.0, 5.0)  # keeps exp(log_var) finite without a KL term
        return mean.reshape((*lead, -1)), log_var.reshape((*lead, -1))

    def decode(self, z: jax.Array) -> jax.Array:
        lead = z.shape[:-1]
        x = self.from_latent(z).reshape((-1, 1, 1, self.flat))
        for i, deconv in enumerate(self.deconvs):
            x = deconv(x)
            if i < len(self.deconvs) - 1:
                x = jax.nn.relu(x)
        chex.assert_shape(x, (None, *self.image_shape))
        return x.reshape((*lead, *self.image_shape))


class MDNOutput(NamedTuple):
    """M's prediction for the next step; leading axes [...] free."""

    logits: jax.Array  # [..., Z, K] unnormalised log mixture weights, per latent dimension
    mean: jax.Array  # [..., Z, K]
    log_std: jax.Array  # [..., Z, K]
    reward: jax.Array  # [...] predicted reward of the step (0 without the head)
    done_logit: jax.Array  # [...] logit of "this step ends the episode" (-inf-like without the head)


class MDNRNN(nnx.Module):
    """M (paper section 2.2 and appendix A.2): an LSTM over [z_t, a_t] whose
    output h_{t+1} parameterises p(z_{t+1}) as a mixture of K Gaussians per
    latent dimension, plus optional reward and done heads (the paper's VizDoom
    M predicts "done").

    step(carry (c, h) [..., H] each, z [..., Z], action [..., A]) -> (carry, MDNOutput)
    """

    def __init__(self, z_size: int, action_size: int, args: Args, rngs: nnx.Rngs):
        self.lstm = nnx.LSTMCell(z_size + action_size, args.rnn_size, rngs=rngs)
        self.mdn = nnx.Linear(args.rnn_size, 3 * z_size * args.num_mixtures, rngs=rngs)
        self.reward = nnx.Linear(args.rnn_size, 1, rngs=rngs) if args.predict_reward else None
        done_head: nnx.Module | None = None
        if args.predict_done and args.done_hidden:
            hidden = nnx.Linear(args.rnn_size, args.done_hidden, rngs=rngs)
            done_head = nnx.Sequential(hidden, jax.nn.relu, nnx.Linear(args.done_hidden, 1, rngs=rngs))
        elif args.predict_done:
            done_head = nnx.Linear(args.rnn_size, 1, rngs=rngs)
        self.done = done_head
        self.z_size, self.num_mixtures = z_size, args.num_mixtures

    def step(self, carry, z: jax.Array, action: jax.Array):
        carry, h = self.lstm(carry, jnp.concatenate([z, action], axis=-1))
        params = self.mdn(h).reshape((*h.shape[:-1], self.z_size, self.num_mixtures, 3))
        reward = self.reward(h)[..., 0] if self.reward is not None else jnp.zeros(h.shape[:-1])
        done_logit = self.done(h)[..., 0] if self.done is not None else jnp.full(h.shape[:-1], -30.0)
        # log-stds kept in a numerically safe range
        return carry, MDNOutput(params[..., 0], params[..., 1], jnp.clip(params[..., 2], -7.0, 3.0), reward, done_logit)


class Models(nnx.Module):
    """V and M side by side: one graph for the pure functions below (each stage
    trains one of them; C is a flat parameter vector, not a module)."""

    def __init__(self, args: Args, action_size: int, rngs: nnx.Rngs):
        self.vae = VAE(args.image_shape, args.vae_depth, args.z_size, rngs)
        self.mdn = MDNRNN(args.z_size, action_size, args, rngs)


# --------------------------------------------------------------------------- #
# Pytrees
# --------------------------------------------------------------------------- #
class Params(NamedTuple):
    """The Models parameters in two parts, so each stage differentiates and
    optimises only its own (`nnx.split(models, PathContains("vae"), ...)`)."""

    vae: nnx.State
    mdn: nnx.State


class Rollouts(struct.PyTreeNode):
    """Stage 1's output: N random-policy episodes from their reset, cut at T steps."""

    frames: jax.Array  # [N, T + 1, S, S, C] uint8; frame t is seen before action t
    actions: jax.Array  # [N, T, A] float (one-hot for discrete actions)
    rewards: jax.Array  # [N, T]
    terminated: jax.Array  # [N, T] bool: step t ended the episode (not a time limit)
    valid: jax.Array  # [N, T] bool: step t happened (within the episode)


class Hyperparams(struct.PyTreeNode):
    """The float hyperparameters the jitted stages read. They live in the
    stages' states (TrainState, ControllerState), so `train` can be vmapped
    over a stacked Hyperparams: a sweep of every stage in one compile (stage 1,
    the random rollouts, reads none; a host env such as CarRacing cannot be
    traced, so its stages are not vmappable)."""

    vae_learning_rate: jax.Array  # [] Adam learning rate of V
    kl_weight: jax.Array  # [] weight of V's KL term against the reconstruction error
    free_bits: jax.Array  # [] nats per latent dimension of V's KL that are not penalised
    mdn_learning_rate: jax.Array  # [] Adam learning rate of M
    cma_sigma: jax.Array  # [] initial CMA-ES step size of C's search
    dream_temperature: jax.Array  # [] tau of M's sampling when C is scored in the dream

    @classmethod
    def from_args(cls, args: Args) -> Hyperparams:
        return cls(*(jnp.float32(getattr(args, f.name)) for f in dataclasses.fields(cls)))


class TrainState(struct.PyTreeNode):
    """V's or M's stage state: what a checkpoint holds."""

    params: Params  # V's and M's parameters (only one of them changes in a stage)
    opt_state: optax.OptState  # optax.inject_hyperparams state: the learning rate is hparams'
    key: jax.Array
    hparams: Hyperparams


class CMAState(struct.PyTreeNode):
    """CMA-ES search distribution N(mean, sigma^2 C) over P controller parameters (Hansen 2016)."""

    mean: jax.Array  # [P]
    sigma: jax.Array  # [] step size
    cov: jax.Array  # [P, P] C
    eigvecs: jax.Array  # [P, P] B, C = B diag(eigvals) B^T
    eigvals: jax.Array  # [P] D^2
    path_sigma: jax.Array  # [P] p_sigma, conjugate evolution path
    path_c: jax.Array  # [P] p_c, evolution path of C
    generation: jax.Array  # []


class ControllerState(struct.PyTreeNode):
    cma: CMAState
    key: jax.Array
    best_params: jax.Array  # [P] best candidate seen
    best_fitness: jax.Array  # [] its fitness
    hparams: Hyperparams


# --------------------------------------------------------------------------- #
# Algorithm logic (pure functions; the unit tests import these)
# --------------------------------------------------------------------------- #
def gaussian_kl_to_standard(mean: jax.Array, log_var: jax.Array) -> jax.Array:
    """KL(N(mean, exp(log_var)) || N(0, 1)) per dimension, [..., Z] -> [..., Z]:
    0.5 (mean^2 + exp(log_var) - 1 - log_var) (Kingma & Welling 2014, app. B).
    Written out rather than distrax's Normal.kl_divergence: the closed form is
    the paper's equation, and it reads log_var directly (no log of a std)."""
    return 0.5 * (jnp.square(mean) + jnp.exp(log_var) - 1.0 - log_var)


def vae_loss(vae: VAE, frames: jax.Array, key: jax.Array, kl_weight: float | jax.Array, free_bits: float | jax.Array):
    """frames [B, S, S, C] in [0, 1] -> (loss [], metrics). The paper's
    objective: squared reconstruction error summed over pixels, plus the KL
    summed over z dimensions with a floor of free_bits * Z nats (below it the
    KL has no gradient, the paper code's kl_tolerance); both averaged over B."""
    mean, log_var = vae.encode(frames)  # [B, Z]
    z = mean + jnp.exp(0.5 * log_var) * jax.random.normal(key, mean.shape)  # reparameterised sample
    reconstruction = vae.decode(z)
    reconstruction_loss = jnp.square(reconstruction - frames).sum((-3, -2, -1)).mean()
    kl = gaussian_kl_to_standard(mean, log_var).sum(-1)  # [B]
    kl_loss = jnp.maximum(kl, free_bits * mean.shape[-1]).mean()
    loss = reconstruction_loss + kl_weight * kl_loss
    return loss, {
        "vae_loss": loss,
        "reconstruction_loss": reconstruction_loss,
        "kl": kl.mean(),
        "pixel_mae": jnp.abs(reconstruction - frames).mean(),
    }


def mdn_distribution(logits: jax.Array, mean: jax.Array, log_std: jax.Array) -> distrax.MixtureSameFamily:
    """M's p(z_{t+1}): per latent dimension a mixture of K Gaussians, logits /
    mean / log_std [..., Z, K] -> a distribution of batch shape [..., Z]."""
    return distrax.MixtureSameFamily(distrax.Categorical(logits=logits), distrax.Normal(mean, jnp.exp(log_std)))


def mdn_log_prob(target: jax.Array, logits: jax.Array, mean: jax.Array, log_std: jax.Array) -> jax.Array:
    """log p(target) under the mixture, target [..., Z] -> [..., Z]:
    log sum_k softmax(logits)_k N(target; mean_k, exp(log_std_k)^2) (distrax: by logsumexp)."""
    return mdn_distribution(logits, mean, log_std).log_prob(target)


def mdn_sample(key: jax.Array, logits: jax.Array, mean: jax.Array, log_std: jax.Array, temperature) -> jax.Array:
    """z [..., Z] from the mixture [..., Z, K] at temperature tau: component k ~
    softmax(logits / tau), then mean_k + std_k sqrt(tau) eps (the paper's
    sampling, section 4.3). tau -> 0 gives the mean of the most likely component.
    In two steps rather than `MixtureSameFamily.sample`, which draws noise for
    all K components and keeps one: this draws one per dimension."""
    component_key, noise_key = jax.random.split(key)
    component = distrax.Categorical(logits=logits / temperature).sample(seed=component_key)  # [..., Z]
    pick = lambda x: jnp.take_along_axis(x, component[..., None], axis=-1)[..., 0]
    return distrax.Normal(pick(mean), jnp.exp(pick(log_std)) * jnp.sqrt(temperature)).sample(seed=noise_key)


def mdn_sequence_loss(
    mdn: MDNRNN, z: jax.Array, actions: jax.Array, rewards, terminated, valid, balance_done: bool = False
):
    """M's loss on a batch of whole rollouts, time-major: z [T + 1, B, Z] (V's
    samples), actions [T, B, A], rewards / terminated / valid [T, B]. Step t
    feeds (z_t, a_t) and is scored on z_{t+1} (NLL per latent dimension), the
    reward (squared error) and done (cross-entropy), only where valid. With
    `balance_done` the done cross-entropy is the mean over the steps that
    ended an episode plus the mean over those that did not, halved: rare ends
    weigh as much as the rest, so the head fires (p > 0.5) at them."""
    T, B = valid.shape
    carry = (jnp.zeros((B, mdn.lstm.hidden_features)), jnp.zeros((B, mdn.lstm.hidden_features)))
    _, out = jax.lax.scan(lambda c, x: mdn.step(c, *x), carry, (z[:-1], actions))  # MDNOutput [T, B, ...]
    mask = valid.astype(jnp.float32)
    count = jnp.maximum(mask.sum(), 1.0)
    masked_mean = lambda x: (x * mask).sum() / count
    z_nll = masked_mean(-mdn_log_prob(z[1:], out.logits, out.mean, out.log_std).mean(-1))  # nats per dimension
    loss, metrics = z_nll, {"z_nll": z_nll}
    if mdn.reward is not None:
        metrics["reward_loss"] = masked_mean(jnp.square(out.reward - rewards))
        loss = loss + metrics["reward_loss"]
    if mdn.done is not None:
        done = terminated.astype(jnp.float32)
        bce = optax.sigmoid_binary_cross_entropy(out.done_logit, done)
        if balance_done:
            ends, others = mask * done, mask * (1.0 - done)
            mean_over = lambda weights: (bce * weights).sum() / jnp.maximum(weights.sum(), 1.0)
            metrics["done_loss"] = 0.5 * (mean_over(ends) + mean_over(others))
        else:
            metrics["done_loss"] = masked_mean(bce)
        metrics["done_accuracy"] = masked_mean(((out.done_logit > 0) == terminated).astype(jnp.float32))
        # Of the steps that ended an episode, the share where the head fired (0 in a batch without one).
        metrics["done_recall"] = ((out.done_logit > 0) * mask * done).sum() / jnp.maximum((mask * done).sum(), 1.0)
        loss = loss + metrics["done_loss"]
    return loss, {**metrics, "mdn_loss": loss}


def cma_weights(population: int) -> jax.Array:
    """Positive recombination weights of the best mu = population // 2 [mu],
    w_i proportional to log((population + 1) / 2) - log(i) (Hansen 2016, eq. 49)."""
    mu = population // 2
    raw = np.log((population + 1) / 2) - np.log(np.arange(1, mu + 1))
    return jnp.asarray(raw / raw.sum(), jnp.float32)


def cma_init(mean: jax.Array, sigma: float | jax.Array) -> CMAState:
    """The search distribution N(mean, sigma^2 I) with empty evolution paths."""
    n = mean.shape[0]
    eye = jnp.eye(n)
    return CMAState(
        mean, jnp.asarray(sigma, jnp.float32), eye, eye, jnp.ones(n), jnp.zeros(n), jnp.zeros(n), jnp.int32(0)
    )


def cma_ask(state: CMAState, key: jax.Array, population: int) -> jax.Array:
    """Candidates x_k = mean + sigma C^{1/2} z_k, z_k ~ N(0, I): [population, P].

    C^{1/2} = B D B^T, the symmetric square root. Hansen (2016, eq. 38-39)
    writes B D z_k, the same distribution (B^T z_k ~ N(0, I)); but B is not
    unique where C has repeated eigenvalues (after a few generations most of
    its P eigenvalues are equal), so B D z_k jumps with float noise in C
    (say, another device count), while B D B^T is a continuous function of C."""
    z = jax.random.normal(key, (population, state.mean.shape[0]))
    y = ((z @ state.eigvecs) * jnp.sqrt(state.eigvals)) @ state.eigvecs.T  # B D B^T z_k, [population, P]
    return state.mean + state.sigma * y


def cma_tell(state: CMAState, candidates: jax.Array, fitness: jax.Array, eigh: Callable = jnp.linalg.eigh) -> CMAState:
    """One CMA-ES update from candidates [population, P] and their fitness
    [population] (higher is better), Hansen 2016 section 4 (positive weights,
    rank-one and rank-mu updates, cumulative step-size adaptation, h_sigma).
    `eigh`: the eigendecomposition of the covariance (`eigh_one_at_a_time` in
    data mode)."""
    population, n = candidates.shape
    chex.assert_shape(fitness, (population,))
    weights = cma_weights(population)
    mu = weights.shape[0]
    mu_eff = 1.0 / jnp.sum(weights**2)
    c_sigma = (mu_eff + 2.0) / (n + mu_eff + 5.0)
    d_sigma = 1.0 + 2.0 * jnp.maximum(0.0, jnp.sqrt((mu_eff - 1.0) / (n + 1.0)) - 1.0) + c_sigma
    c_c = (4.0 + mu_eff / n) / (n + 4.0 + 2.0 * mu_eff / n)
    c_1 = 2.0 / ((n + 1.3) ** 2 + mu_eff)
    c_mu = jnp.minimum(1.0 - c_1, 2.0 * (mu_eff - 2.0 + 1.0 / mu_eff) / ((n + 2.0) ** 2 + mu_eff))
    expected_norm = math.sqrt(n) * (1.0 - 1.0 / (4.0 * n) + 1.0 / (21.0 * n**2))  # E||N(0, I)||

    order = jnp.argsort(-fitness)[:mu]  # the best mu, best first
    y = (candidates[order] - state.mean) / state.sigma  # [mu, P]
    y_w = weights @ y  # [P]
    mean = state.mean + state.sigma * y_w  # eq. 41 with c_m = 1
    # C^{-1/2} y_w = B D^{-1} B^T y_w
    whitened = state.eigvecs @ ((state.eigvecs.T @ y_w) / jnp.sqrt(state.eigvals))
    path_sigma = (1.0 - c_sigma) * state.path_sigma + jnp.sqrt(c_sigma * (2.0 - c_sigma) * mu_eff) * whitened  # eq. 43
    norm = jnp.linalg.norm(path_sigma)
    sigma = state.sigma * jnp.exp((c_sigma / d_sigma) * (norm / expected_norm - 1.0))  # eq. 44
    generation = state.generation + 1
    h_sigma = (
        norm / jnp.sqrt(1.0 - (1.0 - c_sigma) ** (2.0 * generation)) < (1.4 + 2.0 / (n + 1.0)) * expected_norm
    ).astype(jnp.float32)
    path_c = (1.0 - c_c) * state.path_c + h_sigma * jnp.sqrt(c_c * (2.0 - c_c) * mu_eff) * y_w  # eq. 45
    delta = (1.0 - h_sigma) * c_c * (2.0 - c_c)
    rank_mu = (y.T * weights) @ y  # sum_i w_i y_i y_i^T
    cov = (
        (1.0 - c_1 - c_mu) * state.cov + c_1 * (jnp.outer(path_c, path_c) + delta * state.cov) + c_mu * rank_mu
    )  # eq. 47 with sum(w) = 1
    cov = 0.5 * (cov + cov.T)
    eigvals, eigvecs = eigh(cov)
    eigvals = jnp.maximum(eigvals, 1e-20)
    return CMAState(mean, sigma, cov, eigvecs, eigvals, path_sigma, path_c, generation)


@jax.custom_batching.custom_vmap
def eigh_one_at_a_time(matrix: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`jnp.linalg.eigh(matrix)` (eigenvalues, eigenvectors), whose `jax.vmap`
    decomposes the matrices one after another (`lax.map`), to the same bits.
    For --parallel data on XLA:CPU devices, where every device runs the whole
    CMA-ES update of every seed: jaxlib's batched CPU eigh (0.10.2) hands its
    matrices to the intra-op thread pool and waits, and with every device's
    copy of it waiting on a thread of that pool, no thread is left to run them
    (4 seeds on 4 CPU devices hung forever)."""
    return tuple(jnp.linalg.eigh(matrix))  # type: ignore[return-value]


@eigh_one_at_a_time.def_vmap
def _eigh_one_at_a_time_vmap(axis_size: int, in_batched: list, matrix: jax.Array):
    if not in_batched[0]:
        return eigh_one_at_a_time(matrix), (False, False)
    return jax.lax.map(eigh_one_at_a_time, matrix), (True, True)


def controller_action(theta: jax.Array, z: jax.Array, h: jax.Array, action_size: int) -> jax.Array:
    """C: the raw output W [z, h] + b [..., A] of the flat parameters theta
    [P = A (Z + H) + A] (paper eq. in section 2.3); leading axes shared by theta, z, h."""
    features = jnp.concatenate([z, h], axis=-1)  # [..., Z + H]
    n_in = features.shape[-1]
    weights = theta[..., : action_size * n_in].reshape((*theta.shape[:-1], action_size, n_in))
    bias = theta[..., action_size * n_in :]
    return jnp.einsum("...ai,...i->...a", weights, features) + bias


# --------------------------------------------------------------------------- #
# Training
# --------------------------------------------------------------------------- #
class Stage(NamedTuple):
    """One stage for one seed: init(key, inputs, hparams=None) -> state;
    update(state, inputs) -> (state, metrics of [] arrays); num_updates; steps
    per update (for the global_step column); host=True when `update` steps host
    envs and cannot be jitted."""

    init: Callable
    update: Callable
    num_updates: int
    steps_per_update: int
    host: bool = False


class WorldModels(NamedTuple):
    """What `make_train` returns: pure functions closed over the static config."""

    collect: Stage  # inputs: None -> state Rollouts
    vae: Stage  # inputs: Rollouts -> TrainState
    mdn: Stage  # inputs: (Rollouts, params after V, V's (mean, log_var) [N, T + 1, Z]) -> TrainState
    controller: Stage  # inputs: (params after M, initial latents [N, 2, Z]) -> ControllerState
    encode: Callable  # (params, frames [..., S, S, C] uint8) -> (mean, log_var) [..., Z]
    encode_rollouts: Callable  # (params, Rollouts) -> (mean, log_var) [N, T + 1, Z]
    rollouts_shape: Rollouts  # of jax.ShapeDtypeStruct: what stage 1 produces
    initial_latents: Callable  # (params, Rollouts) -> (mean, log_var) of every rollout's first frame [N, 2, Z]
    real_returns: Callable  # (params, thetas [B, P], key, max_steps) -> returns [B] (one episode each)
    dream_returns: Callable  # (params, thetas [B, P], initial latents, key, max_steps) -> returns [B]
    dream: Callable  # (params, theta [P], z0 [Z], key, steps, tau) -> (z [steps + 1, Z], done [steps]) one dream
    merge: Callable  # Params -> Models (V and M as modules)
    evaluate: Callable  # (params, theta [P], key) -> returns [eval_episodes]
    train: Callable  # (key, hparams=None) -> (params, ControllerState, eval returns): every stage in one program
    graphdef: Any
    spec: envs.EnvSpec
    num_params: int  # P, the controller's parameter count
    compiler_options: dict | None  # for every jax.jit of the host loop (Args.fast_compile)


class Setup(NamedTuple):
    """The static configuration every stage's functions close over (built once by `make_train`)."""

    args: Args
    spec: envs.EnvSpec  # the env's action space and time limit
    graphdef: Any  # of Models, split into V's part and M's
    num_params: int  # P = A (Z + H) + A, the controller's parameter count
    max_steps: int  # the longest scored episode, real or dreamed
    host_env: CarRacingHost | None  # the gymnasium env stepped on the host, or None (pure JAX)

    def make_env(self, n: int):
        """n pixel envs batched in one gymnax env -> (env, env_params)."""
        return pixels.make(self.args.env_id, n, size=self.args.image_size, grayscale=self.args.grayscale)

    def env_action(self, raw: jax.Array) -> jax.Array:
        """C's raw output [..., A] -> the env's action: argmax for discrete
        actions, CarRacing's own squashing (CarRacingHost.squash), else tanh
        squashed into [low, high]."""
        if self.spec.discrete:
            return jnp.argmax(raw, axis=-1)
        if self.host_env is not None:
            return self.host_env.squash(raw)
        low, high = (jnp.asarray(x, jnp.float32) for x in (self.spec.action_low, self.spec.action_high))
        return low + (jnp.tanh(raw) + 1.0) * 0.5 * (high - low)

    def model_action(self, action: jax.Array) -> jax.Array:
        """The env's action -> M's input [..., A]: one-hot for discrete actions."""
        return jax.nn.one_hot(action, self.spec.num_actions) if self.spec.discrete else action

    def merge(self, params: Params) -> Models:
        return nnx.merge(self.graphdef, params.vae, params.mdn)

    def fresh_params(self, key: jax.Array) -> Params:
        return Params(*nnx.split(Models(self.args, self.spec.num_actions, nnx.Rngs(key)), VAE_PART, ...)[1:])

    def encode(self, params: Params, frames: jax.Array) -> tuple[jax.Array, jax.Array]:
        """frames [..., S, S, C] uint8 -> V's posterior (mean, log_var) [..., Z]."""
        return self.merge(params).vae.encode(to_float(frames))

    def zero_carry(self, batch: int) -> tuple[jax.Array, jax.Array]:
        """M's LSTM state (c, h) at an episode's start, [batch, H] each."""
        H = self.args.rnn_size
        return (jnp.zeros((batch, H)), jnp.zeros((batch, H)))


def to_float(frames: jax.Array) -> jax.Array:
    """uint8 frames -> float frames in [0, 1] (what V reads)."""
    return frames.astype(jnp.float32) / 255.0


# ----- stage 1: random rollouts -------------------------------------------- #
def cut_into_rollouts(episodes: Rollouts, steps: int) -> Rollouts:
    """Episodes of E = K x `steps` steps [N, E + 1 / E] -> N K rollouts of
    `steps` steps [N K, steps + 1 / steps], episode n's pieces n K ... n K + K - 1
    in order: piece k holds steps k steps ... (k + 1) steps - 1 and the frames
    around them, its last frame the next piece's first. A piece wholly after
    its episode's end has no valid step. NumPy or JAX arrays."""
    N, E = episodes.valid.shape
    K = E // steps
    if K == 1:
        return episodes
    frame_index = np.arange(K)[:, None] * steps + np.arange(steps + 1)[None]  # [K, steps + 1]
    frames = episodes.frames[:, frame_index].reshape((N * K, steps + 1, *episodes.frames.shape[2:]))
    pieces = lambda x: x.reshape((N * K, steps, *x.shape[2:]))  # noqa: E731
    return Rollouts(
        frames, pieces(episodes.actions), pieces(episodes.rewards), pieces(episodes.terminated), pieces(episodes.valid)
    )


def collect_stage(setup: Setup) -> Stage:
    """Stage 1: `num_episodes` episodes, random or, with --collect-with, partly
    played by an earlier run's V, M and C, stored as `num_rollouts` rollouts of
    rollout_steps steps (with --collect-keep after the earlier run's); one
    update that only reports statistics of the collected data."""
    args, spec = setup.args, setup.spec
    N, E = args.num_episodes, args.episode_steps
    # With --collect-with, episodes n >= num_random follow the earlier run's controller. [N] bool
    num_random = round(N * args.collect_random_fraction) if args.collect_with is not None else N
    controlled = np.arange(N) >= num_random

    def init(key, inputs=None, _hparams=None) -> Rollouts:
        """N episodes from reset, vmapped, E steps in a scan; after an episode's
        end its env keeps stepping but nothing is valid. Uniformly random
        actions, or with --collect-with those of `inputs` = (V and M's Params,
        C's theta [P], the earlier run's Rollouts with --collect-keep, else
        None) in the `controlled` episodes (the iterative procedure: M then
        learns the states a controller reaches, which random play never does,
        docs/world_models.md). Then cut into rollouts of rollout_steps steps."""
        if args.collect_with is not None and inputs is None:
            raise ValueError("--collect-with: the collect stage needs the earlier run's (Params, theta, Rollouts)")
        env, env_params = setup.make_env(N)
        reset_key, key = jax.random.split(key)
        obs, env_state = env.reset(reset_key, env_params)
        obs, env_state = parallel.constrain_data((obs, env_state))  # --parallel data: the N episodes are split

        def step(carry, key):
            env_state, obs, alive, lstm = parallel.constrain_data(carry)
            action_key, step_key = jax.random.split(key)
            if spec.discrete:
                action = jax.random.randint(action_key, (N,), 0, spec.num_actions)
            else:
                low, high = (jnp.asarray(x, jnp.float32) for x in (spec.action_low, spec.action_high))
                action = jax.random.uniform(action_key, (N, spec.num_actions), minval=low, maxval=high)
            if inputs is not None:  # --collect-with: the earlier controller acts in its episodes
                params, theta, _ = inputs
                thetas = jnp.broadcast_to(theta, (N, setup.num_params))
                played, lstm = policy_step(setup, params, thetas, pixels_to_uint8(obs), lstm)
                action = jnp.where(controlled.reshape((N,) + (1,) * (action.ndim - 1)), played, action)
            next_obs, env_state, reward, terminated, truncated, info = env.step(step_key, env_state, action, env_params)
            out = (
                setup.model_action(action),
                reward * alive,
                terminated & alive,
                alive,
                pixels_to_uint8(info["final_observation"]),
            )
            return (env_state, next_obs, alive & ~(terminated | truncated), lstm), out

        _, (actions, rewards, terminated, valid, reached) = jax.lax.scan(
            step, (env_state, obs, jnp.ones(N, bool), setup.zero_carry(N)), jax.random.split(key, E)
        )
        # Frame t + 1 is the frame step t reached: the final observation at an episode's end.
        frames = jnp.concatenate([pixels_to_uint8(obs)[None], reached], axis=0)  # [E + 1, N, S, S, C]
        swap = lambda x: jnp.swapaxes(x, 0, 1)
        episodes = Rollouts(swap(frames), swap(actions), swap(rewards), swap(terminated), swap(valid))
        return keep_earlier(inputs, cut_into_rollouts(episodes, args.rollout_steps))

    def keep_earlier(inputs, new: Rollouts) -> Rollouts:
        """--collect-keep: the earlier run's rollouts, then the new ones."""
        kept = None if inputs is None else inputs[2]
        if kept is None:
            return new
        return jax.tree.map(lambda old, fresh: jnp.concatenate([old, fresh]), kept, new)

    def update(state: Rollouts, _inputs=None):
        """Statistics of this run's episodes (with --collect-keep, the last
        num_rollouts rollouts; the kept ones are the earlier run's)."""
        kept = state.valid.shape[0] - args.num_rollouts
        by_episode = lambda x: x[kept:].reshape((N, -1))  # noqa: E731  [N, E]: an episode's pieces, in order
        lengths, returns = by_episode(state.valid).sum(1), by_episode(state.rewards).sum(1)  # [N]
        metrics = {
            "frames": (lengths + 1).sum().astype(jnp.float32),
            "episodes_cut": (lengths == E).mean() * 1.0,
            "rollouts_kept": jnp.float32(kept),
        }
        for policy, episodes in (("random", ~controlled), ("controller", controlled)):
            if episodes.any():  # the mean length and return of each policy's episodes
                metrics[f"{policy}_episode_length"] = (lengths * episodes).sum() / episodes.sum()
                metrics[f"{policy}_episode_return"] = (returns * episodes).sum() / episodes.sum()
        return state, metrics

    host_env = setup.host_env
    if host_env is not None:
        return Stage(lambda key, _inputs=None, _hparams=None: host_env.collect(key), update, 1, N * E, host=True)
    return Stage(init, update, 1, N * E)


def stored_rollouts(args: Args) -> int:
    """Rollouts a run's collect stage stores: its own, after those it keeps
    from its --collect-with run (whose collect stage may be its --source-run's,
    and may have kept some too)."""
    if not args.collect_keep:
        return args.num_rollouts
    assert args.collect_with is not None  # Args checks it
    earlier = cli.load_run_args(Args, args.collect_with)
    while "collect" not in earlier.stages and earlier.source_run is not None:
        earlier = cli.load_run_args(Args, earlier.source_run)
    return stored_rollouts(earlier) + args.num_rollouts


def rollouts_shape(args: Args, action_size: int) -> Rollouts:
    """The shapes stage 1 produces (of jax.ShapeDtypeStruct), for jax.eval_shape and restoring."""
    N, T = stored_rollouts(args), args.rollout_steps
    shapes: list[Any] = [
        jax.ShapeDtypeStruct((N, T + 1, *args.image_shape), jnp.uint8),
        jax.ShapeDtypeStruct((N, T, action_size), jnp.float32),
        jax.ShapeDtypeStruct((N, T), jnp.float32),
        jax.ShapeDtypeStruct((N, T), jnp.bool_),
        jax.ShapeDtypeStruct((N, T), jnp.bool_),
    ]
    return Rollouts(*shapes)


# ----- stage 2: V ---------------------------------------------------------- #
def frame_valid(data: Rollouts) -> jax.Array:
    """[N, T + 1] bool: frame 0 of a rollout whose first step happened (every
    one but the pieces wholly after an episode's end, --collect-steps) and
    every frame a valid step reached."""
    return jnp.concatenate([data.valid[:, :1], data.valid], axis=1)


def with_learning_rate(opt_state, learning_rate: jax.Array):
    """An `optax.inject_hyperparams` state with its learning rate set (from the stage's Hyperparams)."""
    return opt_state._replace(hyperparams={**opt_state.hyperparams, "learning_rate": learning_rate})


def vae_stage(setup: Setup) -> Stage:
    """Stage 2: V trained on frames drawn uniformly from the rollouts (inputs: Rollouts)."""
    args = setup.args
    # Only the learning rate is injected: Adam's b1, b2, eps stay constants (bit-identical numerics).
    tx = optax.inject_hyperparams(lambda learning_rate: optax.adam(learning_rate))(learning_rate=args.vae_learning_rate)

    def init(key, data: Rollouts, hparams: Hyperparams | None = None) -> TrainState:
        hparams = Hyperparams.from_args(args) if hparams is None else hparams
        model_key, key = jax.random.split(key)
        params = setup.fresh_params(model_key)
        return TrainState(params, tx.init(params.vae), key, hparams)

    def update(state: TrainState, data: Rollouts):
        """`vae_batches` Adam steps, each on `vae_batch_size` frames drawn
        uniformly (with replacement) from all N (T + 1) collected frames."""
        flat_frames = data.frames.reshape((-1, *args.image_shape))  # [N (T + 1), S, S, C]
        probabilities = frame_valid(data).reshape(-1).astype(jnp.float32)
        probabilities = probabilities / probabilities.sum()
        hp = state.hparams

        def step(carry, key):
            vae_params, opt_state = carry
            index_key, loss_key = jax.random.split(key)
            index = jax.random.choice(index_key, flat_frames.shape[0], (args.vae_batch_size,), p=probabilities)
            frames = to_float(parallel.constrain_data(flat_frames[index]))  # [B, S, S, C]; --parallel data: split

            def loss_fn(vae_params):
                vae = setup.merge(state.params._replace(vae=vae_params)).vae
                return vae_loss(vae, frames, loss_key, hp.kl_weight, hp.free_bits)

            grads, metrics = jax.grad(loss_fn, has_aux=True)(vae_params)
            updates, opt_state = tx.update(grads, opt_state, vae_params)
            return (optax.apply_updates(vae_params, updates), opt_state), metrics

        key, steps_key = jax.random.split(state.key)
        opt_state = with_learning_rate(state.opt_state, hp.vae_learning_rate)
        (vae_params, opt_state), metrics = jax.lax.scan(
            step, (state.params.vae, opt_state), jax.random.split(steps_key, args.vae_batches)
        )
        new = state.replace(params=state.params._replace(vae=vae_params), opt_state=opt_state, key=key)
        return new, jax.tree.map(jnp.mean, metrics)

    return Stage(init, update, args.vae_updates, args.vae_batches * args.vae_batch_size)


# ----- stage 3: M ---------------------------------------------------------- #
def mdn_stage(setup: Setup) -> Stage:
    """Stage 3: M trained on whole rollouts of V's latents, V fixed (inputs:
    (Rollouts, params after V, V's (mean, log_var) [N, T + 1, Z]))."""
    args = setup.args

    def make_optimizer(learning_rate):
        clip = [optax.clip_by_global_norm(args.mdn_grad_clip)] if args.mdn_grad_clip > 0 else []
        return optax.chain(*clip, optax.adam(learning_rate))

    tx = optax.inject_hyperparams(make_optimizer)(learning_rate=args.mdn_learning_rate)

    def init(key, inputs, hparams: Hyperparams | None = None) -> TrainState:
        hparams = Hyperparams.from_args(args) if hparams is None else hparams
        _, params, _ = inputs
        model_key, key = jax.random.split(key)
        params = params._replace(mdn=setup.fresh_params(model_key).mdn)
        return TrainState(params, tx.init(params.mdn), key, hparams)

    def update(state: TrainState, inputs):
        """`mdn_batches` Adam steps on `mdn_batch_size` random whole rollouts;
        z is resampled from V's posterior at every step (the paper trains M on
        sampled z)."""
        data, _, (z_mean, z_log_var) = inputs  # V's posterior of every frame [N, T + 1, Z]; V stays fixed
        N = data.valid.shape[0]  # the stored rollouts (with --collect-keep, more than num_rollouts)

        def step(carry, key):
            mdn_params, opt_state = carry
            index_key, noise_key = jax.random.split(key)
            index = jax.random.choice(index_key, N, (args.mdn_batch_size,), replace=False)
            # [B, T, ...] -> [T, B, ...]; --parallel data: the B rollouts are split over devices
            time_major = lambda x: jnp.swapaxes(parallel.constrain_data(x[index]), 0, 1)
            mean, log_var = time_major(z_mean), time_major(z_log_var)
            z = mean + jnp.exp(0.5 * log_var) * jax.random.normal(noise_key, mean.shape)  # [T + 1, B, Z]

            def loss_fn(mdn_params):
                mdn = setup.merge(state.params._replace(mdn=mdn_params)).mdn
                return mdn_sequence_loss(
                    mdn,
                    z,
                    time_major(data.actions),
                    time_major(data.rewards),
                    time_major(data.terminated),
                    time_major(data.valid),
                    args.balance_done,
                )

            grads, metrics = jax.grad(loss_fn, has_aux=True)(mdn_params)
            updates, opt_state = tx.update(grads, opt_state, mdn_params)
            return (optax.apply_updates(mdn_params, updates), opt_state), metrics

        key, steps_key = jax.random.split(state.key)
        opt_state = with_learning_rate(state.opt_state, state.hparams.mdn_learning_rate)
        (mdn_params, opt_state), metrics = jax.lax.scan(
            step, (state.params.mdn, opt_state), jax.random.split(steps_key, args.mdn_batches)
        )
        new = state.replace(params=state.params._replace(mdn=mdn_params), opt_state=opt_state, key=key)
        return new, jax.tree.map(jnp.mean, metrics)

    return Stage(init, update, args.mdn_updates, args.mdn_batches * args.mdn_batch_size * args.rollout_steps)


def encode_rollouts(setup: Setup, params: Params, data: Rollouts, shards: int = 1):
    """(mean, log_var) [N, T + 1, Z] of every frame, a rollout at a time; with
    `shards` > 1 (--parallel data over that many devices, the rollouts split
    over them in blocks of N / shards), `shards` rollouts at a time, one from
    each device's block, each device encoding its own."""
    if shards == 1:
        return jax.lax.map(lambda frames: setup.encode(params, frames), data.frames)
    N = data.frames.shape[0]
    blocks = jnp.swapaxes(data.frames.reshape((shards, N // shards, *data.frames.shape[1:])), 0, 1)
    mean, log_var = jax.lax.map(lambda frames: setup.encode(params, parallel.constrain_data(frames)), blocks)
    unblock = lambda x: jnp.swapaxes(x, 0, 1).reshape((N, *x.shape[2:]))  # noqa: E731
    return unblock(mean), unblock(log_var)


def initial_latents(setup: Setup, params: Params, data: Rollouts) -> jax.Array:
    """V's posterior of every rollout's first frame, (mean, log_var) stacked:
    [N, 2, Z], the dreams' start states. A piece wholly after its episode's end
    (--collect-steps) has no frame of its own: it takes the nearest piece before
    it that has one, so every episode's pieces weigh as much in all, spread over
    those it reached."""
    started = data.valid[:, 0]  # [N]
    index = jnp.arange(started.shape[0])
    source = jax.lax.cummax(jnp.where(started, index, 0))  # the last started rollout at or before each
    mean, log_var = setup.encode(params, parallel.constrain_data(data.frames[source, 0]))  # --parallel data: split
    return jnp.stack([mean, log_var], axis=1)


# ----- stage 4: C, acting in the real env and in M's dream ------------------ #
def policy_step(setup: Setup, params: Params, thetas, frames, carry):
    """Acting with V, M and C for a batch [B]: frames [B, S, S, C] uint8 ->
    (env actions [B] or [B, A], next LSTM carry). z is V's posterior mean."""
    models = setup.merge(params)
    z, _ = models.vae.encode(to_float(frames))  # [B, Z]
    action = setup.env_action(controller_action(thetas, z, carry[1], setup.spec.num_actions))
    carry, _ = models.mdn.step(carry, z, setup.model_action(action))
    return action, carry


def real_returns(setup: Setup, params: Params, thetas: jax.Array, key: jax.Array, steps: int, record: bool = False):
    """One real episode per controller in thetas [B, P] -> returns [B]; a
    while loop that stops when every episode has ended (or after `steps`). A
    host env (CarRacing) steps in Python instead (CarRacingHost.returns).
    `record`: also return the first episode's envs.Recording (--capture-video)."""
    if setup.host_env is not None:
        return setup.host_env.returns(
            params, thetas, key, steps, functools.partial(policy_step, setup), setup.zero_carry, record
        )
    batch = thetas.shape[0]
    batched_env, env_params = setup.make_env(batch)
    if record:  # the loop takes at most `steps` steps: one frame for each
        batched_env = envs.RecordEpisode(batched_env, steps)
    reset_key, key = jax.random.split(key)
    # --parallel data: the episodes (a generation's candidates, the evaluation's) are split over devices
    thetas, (obs, env_state) = parallel.constrain_data((thetas, batched_env.reset(reset_key, env_params)))

    def body(carry):
        t, key, env_state, obs, lstm, alive, returns = carry
        key, step_key = jax.random.split(key)
        action, lstm = policy_step(setup, params, thetas, pixels_to_uint8(obs), lstm)
        obs, env_state, reward, terminated, truncated, _ = batched_env.step(step_key, env_state, action, env_params)
        returns = returns + reward * alive
        return t + 1, key, env_state, obs, lstm, alive & ~(terminated | truncated), returns

    cond = lambda carry: (carry[0] < steps) & carry[5].any()
    batch_init = parallel.constrain_data((setup.zero_carry(batch), jnp.ones(batch, bool), jnp.zeros(batch)))
    final = jax.lax.while_loop(cond, body, (jnp.int32(0), key, env_state, obs, *batch_init))
    return envs.with_recording(final[-1], batched_env, final[2])


def dream_step(setup: Setup, models: Models, theta, z, carry, key, temperature):
    """One step inside M: (z [B, Z], carry) -> (z', carry, reward [B], p(done) [B])."""
    action = setup.env_action(controller_action(theta, z, carry[1], setup.spec.num_actions))
    carry, out = models.mdn.step(carry, z, setup.model_action(action))
    z_next = mdn_sample(key, out.logits, out.mean, out.log_std, temperature)
    return z_next, carry, out.reward, jax.nn.sigmoid(out.done_logit)


def survives(done_prob: jax.Array, key: jax.Array, rule: str) -> jax.Array:
    """The share of a dreamed episode that goes on past this step [B], in [0, 1]
    (--dream-done): 'threshold' 0 where p(done) > 0.5, else 1; 'sample' 0 with
    probability p; 'expected' 1 - p, so that a reward k steps on is weighted by
    the probability prod (1 - p) of still being alive (Dreamer's continuation
    weights, Hafner et al. 2020; M's done head trained by plain cross-entropy
    is a calibrated per-state hazard, which 'threshold' throws away)."""
    if rule == "threshold":
        return (done_prob <= 0.5).astype(jnp.float32)
    if rule == "sample":
        return (jax.random.uniform(key, done_prob.shape) >= done_prob).astype(jnp.float32)
    return 1.0 - done_prob


# a dreamed episode stops when every controller's weight of being alive is below this ('expected' only)
DREAM_ALIVE_FLOOR = 1e-3


def dream_returns(setup: Setup, params: Params, thetas, latents, key, steps: int, temperature) -> jax.Array:
    """One dreamed episode per controller [B, P] -> returns [B]: z_0 sampled
    from V's posterior of a random real first frame (latents [N, 2, Z]), then M
    at temperature tau; M's predicted rewards add up, each weighted by how
    much of the episode is still alive (1 or 0 for --dream-done threshold and
    sample, the probability for expected)."""
    models = setup.merge(params)
    batch = thetas.shape[0]
    start_key, noise_key, key = jax.random.split(key, 3)
    start = latents[jax.random.randint(start_key, (batch,), 0, latents.shape[0])]  # [B, 2, Z]
    z = start[:, 0] + jnp.exp(0.5 * start[:, 1]) * jax.random.normal(noise_key, (batch, setup.args.z_size))
    thetas, z = parallel.constrain_data((thetas, z))  # --parallel data: the dreams are split over devices

    def body(carry):
        t, key, z, lstm, alive, returns = carry
        key, step_key = jax.random.split(key)
        z, lstm, reward, done_prob = dream_step(setup, models, thetas, z, lstm, step_key, temperature)
        done_key = jax.random.fold_in(step_key, 1)  # only 'sample' draws; the key stream is as before for the rest
        # the ending step's reward counts (as in the real env), the steps after it do not
        returns = returns + reward * alive
        return t + 1, key, z, lstm, alive * survives(done_prob, done_key, setup.args.dream_done), returns

    cond = lambda carry: (carry[0] < steps) & (carry[4] > DREAM_ALIVE_FLOOR).any()
    batch_init = parallel.constrain_data((setup.zero_carry(batch), jnp.ones(batch), jnp.zeros(batch)))
    return jax.lax.while_loop(cond, body, (jnp.int32(0), key, z, *batch_init))[-1]


def dream(setup: Setup, params: Params, theta, z0, key, steps: int, temperature: float | None = None):
    """One dream of `steps` steps from z0 [Z] (for pictures): (z [steps + 1, Z], done [steps])."""
    temperature = setup.args.dream_temperature if temperature is None else temperature
    models = setup.merge(params)

    def step(carry, key):
        z, lstm = carry
        z_next, lstm, _, done_prob = dream_step(setup, models, theta[None], z, lstm, key, temperature)
        return (z_next, lstm), (z_next[0], done_prob[0] > 0.5)

    _, (zs, dones) = jax.lax.scan(step, (z0[None], setup.zero_carry(1)), jax.random.split(key, steps))
    return jnp.concatenate([z0[None], zs]), dones


def controller_stage(setup: Setup) -> Stage:
    """Stage 4: C evolved by CMA-ES, one generation per update (inputs:
    (params after M, initial latents [N, 2, Z])). Scored in the real env
    through V and M, or in M's dream."""
    args, P = setup.args, setup.num_params

    def init(key, inputs, hparams: Hyperparams | None = None) -> ControllerState:
        hparams = Hyperparams.from_args(args) if hparams is None else hparams
        return ControllerState(
            cma_init(jnp.zeros(P), hparams.cma_sigma), key, jnp.zeros(P), jnp.float32(-jnp.inf), hparams
        )

    def fitness(params, candidates, latents, key, hparams: Hyperparams) -> jax.Array:
        """Mean return over `trials` episodes of each candidate [population, P] -> [population]."""
        # [population * trials, P]; --parallel data: the candidates' episodes are split over devices
        thetas = parallel.constrain_data(jnp.repeat(candidates, args.trials, axis=0))
        if args.controller_env == "dream":
            returns = dream_returns(setup, params, thetas, latents, key, setup.max_steps, hparams.dream_temperature)
        else:
            returns = real_returns(setup, params, thetas, key, setup.max_steps)
        return returns.reshape(args.population, args.trials).mean(1)

    def update(state: ControllerState, inputs):
        """One CMA-ES generation: ask, score the whole population (vmapped
        episodes, one program), tell."""
        params, latents = inputs
        key, ask_key, score_key = jax.random.split(state.key, 3)
        candidates = cma_ask(state.cma, ask_key, args.population)  # [population, P]
        scores = fitness(params, candidates, latents, score_key, state.hparams)
        cma = cma_tell(
            state.cma, candidates, scores, eigh_one_at_a_time if args.parallel == "data" else jnp.linalg.eigh
        )
        best = jnp.argmax(scores)
        improved = scores[best] > state.best_fitness
        new = state.replace(
            cma=cma,
            key=key,
            best_params=jnp.where(improved, candidates[best], state.best_params),
            best_fitness=jnp.maximum(scores[best], state.best_fitness),
        )
        return new, {
            "episode_return": scores.mean(),
            "fitness_best": scores.max(),
            "fitness_worst": scores.min(),
            "best_ever": new.best_fitness,
            "sigma": cma.sigma,
            "mean_norm": jnp.linalg.norm(cma.mean),
        }

    steps = args.population * args.trials * setup.max_steps
    host = setup.host_env is not None and args.controller_env == "real"
    return Stage(init, update, args.generations, steps, host=host)


# --------------------------------------------------------------------------- #
# make_train
# --------------------------------------------------------------------------- #
def make_train(args: Args) -> WorldModels:
    """The four stages and the functions around them, closed over the static config."""
    host_env = CarRacingHost(args) if args.env_id in HOST_ENVS else None
    spec = host_env.spec if host_env is not None else envs.spec(*envs.make(args.env_id))
    action_size = spec.num_actions
    graphdef = nnx.split(nnx.eval_shape(lambda: Models(args, action_size, nnx.Rngs(0))), VAE_PART, ...)[0]
    setup = Setup(
        args=args,
        spec=spec,
        graphdef=graphdef,
        num_params=action_size * (args.z_size + args.rnn_size) + action_size,
        max_steps=args.controller_max_steps or spec.max_episode_steps,
        host_env=host_env,
    )
    collect, vae, mdn, controller = (stage(setup) for stage in (collect_stage, vae_stage, mdn_stage, controller_stage))

    def evaluate(params, theta, key, record: bool = False):
        """The controller theta [P] over `eval_episodes` real episodes (capped, as the scored ones, at
        controller_max_steps; 0: the env's limit) -> returns [eval_episodes] (and, with `record`,
        the first episode's envs.Recording)."""
        thetas = jnp.broadcast_to(theta, (args.eval_episodes, setup.num_params))
        return real_returns(setup, params, thetas, key, setup.max_steps, record)

    def train(key: jax.Array, hparams: Hyperparams | None = None):
        """Every stage in one program, vmappable over keys and over Hyperparams
        (a sweep in one compile; pure-JAX envs only: a host env cannot be
        traced): returns V and M's parameters, the final CMA-ES state and the
        evaluation of its mean [eval_episodes]."""
        hparams = Hyperparams.from_args(args) if hparams is None else hparams
        keys = jax.random.split(key, 5)
        data = collect.init(keys[0])
        vae_state = jax.lax.fori_loop(
            0, args.vae_updates, lambda _, s: vae.update(s, data)[0], vae.init(keys[1], data, hparams)
        )
        mdn_inputs = (data, vae_state.params, encode_rollouts(setup, vae_state.params, data))
        mdn_state = jax.lax.fori_loop(
            0, args.mdn_updates, lambda _, s: mdn.update(s, mdn_inputs)[0], mdn.init(keys[2], mdn_inputs, hparams)
        )
        inputs = (mdn_state.params, initial_latents(setup, mdn_state.params, data))
        controller_state = jax.lax.fori_loop(
            0,
            args.generations,
            lambda _, s: controller.update(s, inputs)[0],
            controller.init(keys[3], inputs, hparams),
        )
        return mdn_state.params, controller_state, evaluate(mdn_state.params, controller_state.cma.mean, keys[4])

    return WorldModels(
        collect=collect,
        vae=vae,
        mdn=mdn,
        controller=controller,
        encode=setup.encode,
        encode_rollouts=functools.partial(encode_rollouts, setup),
        rollouts_shape=rollouts_shape(args, action_size),
        initial_latents=functools.partial(initial_latents, setup),
        real_returns=functools.partial(real_returns, setup),
        dream_returns=lambda params, thetas, latents, key, steps: dream_returns(
            setup, params, thetas, latents, key, steps, args.dream_temperature
        ),
        dream=functools.partial(dream, setup),
        merge=setup.merge,
        evaluate=evaluate,
        train=train,
        graphdef=graphdef,
        spec=spec,
        num_params=setup.num_params,
        compiler_options=runner.RUN_ONCE if args.fast_compile else None,
    )


def pixels_to_uint8(frames: jax.Array) -> jax.Array:
    """Float frames in [0, 1] -> uint8 (what the rollouts store and V reads)."""
    return jnp.round(jnp.clip(frames, 0.0, 1.0) * 255.0).astype(jnp.uint8)


# --------------------------------------------------------------------------- #
# CarRacing-v3 on the host (optional extra: box2d)
# --------------------------------------------------------------------------- #
class CarRacingHost:
    """The paper's CarRacing through gymnasium: envs stepped on the host, V, M
    and C batched and jitted. `host_envs` envs step at once, each in its own
    process (gymnasium's AsyncVectorEnv), so every core renders and simulates
    while the main process runs the models; a batch of more episodes (a CMA-ES
    generation, the evaluation) runs on them as a work queue (`episodes`).
    Frames: the 96 x 96 render without its bottom 12-pixel dashboard, resized
    to image_size (the paper crops and resizes to 64 x 64). Random rollouts
    use actions uniform in [-1, 1] x [0, 1] x [0, 1] or, with
    --collect-policy random-controller, the authors' random C."""

    def __init__(self, args: Args):
        try:
            import Box2D  # noqa: F401
            import gymnasium

            self.gym = gymnasium
        except ImportError as error:
            raise ValueError(
                f"env_id {args.env_id!r} needs gymnasium's box2d extra, which is not installed ({error}); "
                "install it with `pip install -e '.[carracing]'` (box2d and pygame), "
                f"or use a pure-JAX pixel env: {', '.join(pixels.RENDERERS)}"
            ) from None
        self.args = args
        self.spec = envs.EnvSpec(
            obs_shape=args.image_shape,
            discrete=False,
            num_actions=3,
            action_low=np.array([-1.0, 0.0, 0.0], np.float32),
            action_high=np.ones(3, np.float32),
            max_episode_steps=1000,
        )
        self.vector: Any = None  # the AsyncVectorEnv, started on first use and kept (its processes start in seconds)
        # V, M and C's jitted step, made once: a new jax.jit each generation would trace and compile again
        self.act: Callable | None = None
        # one compiled program per frame batch shape (op by op, the resize dispatched a dozen ops every host step)
        self.jitted_preprocess = jax.jit(self.crop_and_resize)

    @staticmethod
    def squash(raw):
        """C's raw output [..., 3] -> (steer, gas, brake) as the authors'
        model.py: tanh, (tanh + 1) / 2, clip(tanh, 0, 1). At raw 0 the car
        goes straight at half gas without braking (a symmetric squash into
        [0, 1] would brake at half as well, and the car would barely move)."""
        squashed = jnp.tanh(raw)
        steer, gas, brake = squashed[..., 0], (squashed[..., 1] + 1.0) / 2.0, jnp.clip(squashed[..., 2], 0.0, 1.0)
        return jnp.stack([steer, gas, brake], axis=-1)

    def random_policy(self, seeds: list[int]) -> Callable:
        """act(frames [W, ...], episode [W], starting [W]) -> actions [W, 3]
        of --collect-policy for the episodes of `seeds` (see `episodes`), each
        episode's draws from its own generator (seeded by its track seed), so
        they do not depend on which process plays it or when. uniform: every
        step uniform in the action box. random-controller: the authors'
        extract.py draws, per episode, a linear C with weights and bias ~ N(0,
        sigma^2), sigma ~ U(0, 0.01), on the features of an untrained V and M
        ([z, h], squared norm about 35: z ~ N(0, I_32), h near 0), so its raw
        output is close to N(0, s^2) each step with s = sigma * sqrt(35) <
        0.06; drawn so here (no V or M exists yet), squashed as C's."""
        rngs = [np.random.default_rng([seed, 1]) for seed in seeds]
        scales = [rng.uniform(0.0, 0.01) * np.sqrt(35.0) for rng in rngs]
        low, high = np.array([-1.0, 0.0, 0.0]), np.ones(3)

        def act(frames, episode, starting):
            playing = episode >= 0  # an idle process's action (0) is ignored
            if self.args.collect_policy == "uniform":
                return np.stack([rngs[e].uniform(low, high) if e >= 0 else np.zeros(3) for e in episode])
            raw = np.stack([scales[e] * rngs[e].standard_normal(3) if e >= 0 else np.zeros(3) for e in episode])
            return np.where(playing[:, None], np.asarray(self.squash(jnp.asarray(raw))), 0.0)  # one squash a step

        return act

    def preprocess(self, frames: np.ndarray) -> np.ndarray:
        """[B, 96, 96, 3] uint8 -> [B, S, S, C] uint8."""
        return np.asarray(self.jitted_preprocess(frames))

    def crop_and_resize(self, frames: jax.Array) -> jax.Array:
        image = frames[:, :84].astype(jnp.float32) / 255.0  # the bottom 12 rows: the dashboard
        image = jax.image.resize(image, (image.shape[0], self.args.image_size, self.args.image_size, 3), "bilinear")
        if self.args.grayscale:
            image = pixels.to_grayscale(image)
        return pixels_to_uint8(image)

    def vector_env(self):
        """The host_envs CarRacing-v3 processes (`make_idle_when_asked`),
        without autoreset (`episodes` resets each process itself). forkserver,
        not fork: a child forked from this multithreaded JAX process could
        deadlock (Python and JAX warn of it); the fork server is started once,
        from a clean process."""
        if self.vector is None:
            make = [make_idle_when_asked] * self.args.host_envs
            self.vector = self.gym.vector.AsyncVectorEnv(
                make, context="forkserver", autoreset_mode=self.gym.vector.AutoresetMode.DISABLED
            )
            atexit.register(self.close)
        return self.vector

    def close(self) -> None:
        if self.vector is not None:
            self.vector.close()
            self.vector = None

    def episodes(self, seeds: list[int], steps: int, act: Callable, keep_frames: bool = False, record: bool = False):
        """Episode i on the track of seeds[i], until it ends or `steps` steps,
        for every i, on the W = host_envs processes as a work queue: a process
        whose episode ends starts the next waiting one at the same step (reset
        to its seed), and one with none left idles (`make_idle_when_asked`: no
        simulation, no render), so a batch costs its episodes' steps, not W
        times its longest. act(frames [W, S, S, C] uint8, episode [W] int
        (the episode each process plays, -1: idle), starting [W] bool (it
        began that episode at this step)) -> actions [W, 3]. Returns actions
        [n, steps, 3], rewards, terminated, valid [n, steps], frames [n, steps
        + 1, S, S, C] (keep_frames; zeros after the end) and episode 0's raw
        96 x 96 frames (record)."""
        vector, n, width = self.vector_env(), len(seeds), self.args.host_envs
        actions = np.zeros((n, steps, 3), np.float32)
        rewards, terminated, valid = (np.zeros((n, steps), dt) for dt in (np.float32, bool, bool))
        frames = np.zeros((n, steps + 1, *self.args.image_shape), np.uint8) if keep_frames else None
        recorded: list[np.ndarray] = []
        episode = np.full(width, -1)  # what each process plays
        t = np.zeros(width, int)  # its step in that episode
        raw = np.zeros((width, 96, 96, 3), np.uint8)
        waiting = iter(range(n))

        def start_next(processes: np.ndarray) -> None:
            """Each of `processes` starts the next waiting episode, or idles."""
            for process in processes:
                episode[process], t[process] = next(waiting, -1), 0
            playing = np.zeros(width, bool)
            playing[processes] = episode[processes] >= 0
            idle = np.zeros(width, bool)
            idle[processes] = episode[processes] < 0
            if playing.any():
                track = [seeds[e] if p else None for p, e in zip(playing, episode)]
                raw[playing] = vector.reset(seed=track, options={"reset_mask": playing})[0][playing]
            if idle.any():
                raw[idle] = vector.reset(options={"reset_mask": idle, "idle": True})[0][idle]

        start_next(np.arange(width))
        starting = episode >= 0
        small = self.preprocess(raw)  # every process's frame [W, S, S, C]: one shape, one compiled program
        while (episode >= 0).any():
            playing = episode >= 0
            e, step = episode[playing], t[playing]
            if frames is not None:
                frames[e, step] = small[playing]
            if record and episode[0] == 0:
                recorded.append(raw[0].copy())
            action = np.asarray(act(small, episode.copy(), starting), np.float32)
            raw, reward, term, trunc, _ = vector.step(action)  # a copy (AsyncVectorEnv's copy=True)
            actions[e, step], rewards[e, step], terminated[e, step] = action[playing], reward[playing], term[playing]
            valid[e, step] = True
            t[playing] += 1
            ended = playing & (term | trunc | (t >= steps))
            small = self.preprocess(raw)
            if frames is not None:  # the frame each episode ended on
                frames[episode[ended], t[ended]] = small[ended]
            starting = np.zeros(width, bool)
            if ended.any():
                start_next(np.flatnonzero(ended))
                small = self.preprocess(raw)
                starting = ended & (episode >= 0)
        return actions, rewards, terminated, valid, frames, recorded

    def collect(self, key) -> Rollouts:
        """num_episodes random episodes of up to collect_steps steps (`episodes`),
        cut into rollouts of rollout_steps steps."""
        args, n = self.args, self.args.num_episodes
        seed = int(jax.random.randint(key, (), 0, 2**31 - 1 - n - args.host_envs))
        seeds = list(range(seed, seed + n))
        actions, rewards, terminated, valid, frames, _ = self.episodes(
            seeds, args.episode_steps, self.random_policy(seeds), keep_frames=True
        )
        episodes = Rollouts(*(jnp.asarray(x) for x in (frames, actions, rewards, terminated, valid)))
        return cut_into_rollouts(episodes, args.rollout_steps)

    def returns(self, params, thetas, key, steps, policy_step, zero_carry, record: bool = False):
        """One host episode per controller in thetas [B, P] (`episodes`; episode
        i on the track of seed + i) -> returns [B] (and, with `record`, the
        first episode as an envs.Recording of its frames [T, 96, 96, 3])."""
        batch, width = thetas.shape[0], self.args.host_envs
        seed = int(jax.random.randint(key, (), 0, 2**31 - 1 - batch - width))
        if self.act is None:
            self.act = jax.jit(policy_step)
        act = self.act
        lstm = fresh = zero_carry(width)

        def controller(frames, episode, starting):
            """Each process's controller (an idle one's: any, its action is ignored) and its
            LSTM state, zeroed where an episode starts."""
            nonlocal lstm
            lstm = jax.tree.map(lambda carry, zero: jnp.where(starting[:, None], zero, carry), lstm, fresh)
            action, lstm = act(params, thetas[np.maximum(episode, 0)], jnp.asarray(frames), lstm)
            return action

        _, rewards, *_, recorded = self.episodes(list(range(seed, seed + batch)), steps, controller, record=record)
        total = jnp.asarray(rewards.sum(axis=1), jnp.float32)
        if record:
            return total, envs.Recording(np.stack(recorded), np.int32(len(recorded)))
        return total


def make_idle_when_asked():
    """One CarRacing-v3 process of CarRacingHost (made in the process itself):
    `reset(options={"idle": True})` parks it until its next reset, each step
    then returning its last frame, reward 0 and no end without simulating or
    rendering, so a process with no episode left in a batch costs nothing."""
    import gymnasium

    class IdleWhenAsked(gymnasium.Wrapper):
        idle, last = False, None

        def reset(self, *, seed=None, options=None):
            self.idle = bool(options and options.get("idle"))
            if not self.idle:
                self.last, info = self.env.reset(seed=seed)
                return self.last, info
            if self.last is None:  # parked before its first episode
                self.last = np.zeros(self.observation_space.shape, self.observation_space.dtype)
            return self.last, {}

        def step(self, action):
            if self.idle:
                return self.last, 0.0, False, False, {}
            self.last, *rest = self.env.step(action)
            return (self.last, *rest)

    env = gymnasium.make("CarRacing-v3")
    env.unwrapped._render_road = VectorizedRoad(env.unwrapped)  # the same pixels, about 2x the steps/s
    return IdleWhenAsked(env)


class VectorizedRoad:
    """CarRacing-v3's `_render_road` with its geometry in numpy: the same
    pixels as gymnasium's (tested frame for frame), about twice the env's
    steps per second on this machine. gymnasium transforms and clips each of
    its ~800 polygons (400 grass squares, ~400 road tiles and kerbs) one
    vertex at a time in Python, every step, though only a few dozen are on
    screen: that loop was about 60% of a step's time (rendering is nearly all
    of it; box2d's physics is ~2%). Here all vertices [N, 4, 2] turn, scale
    and shift at once, with the arithmetic of pygame's Vector2.rotate_rad
    (angle mod 2 pi, then cos and sin in float64, the same operations in the
    same order, so the same float64 coordinates), and only the polygons that
    gymnasium's clip test keeps are drawn, in its order, with its calls."""

    def __init__(self, car_racing):
        from gymnasium.envs.box2d import car_racing as module

        self.env, self.module = car_racing, module
        self.render_road_as_gymnasium = car_racing._render_road  # the bound original
        dim = module.GRASS_DIM  # gymnasium's grass squares, the same floats in the same order
        grass = [
            [
                (dim * x + dim, dim * y + 0),
                (dim * x + 0, dim * y + 0),
                (dim * x + 0, dim * y + dim),
                (dim * x + dim, dim * y + dim),
            ]
            for x in range(-20, 20, 2)
            for y in range(-20, 20, 2)
        ]
        self.grass = np.array(grass, np.float64)  # [400, 4, 2]
        self.track_of, self.vertices = None, self.grass

    def __call__(self, zoom, translation, angle):
        module, env = self.module, self.env
        turn = math.fmod(angle, 2 * math.pi)  # pygame's rotate_rad: the angle in [0, 2 pi) first
        if turn < 0:
            turn += 2 * math.pi
        if math.fmod(turn + 1e-6, math.pi / 2) < 2e-6:  # pygame copies exact quarter turns: defer to gymnasium
            return self.render_road_as_gymnasium(zoom, translation, angle)
        if self.track_of is not env.road_poly:  # a new track (reset): stack its polygons once
            road = [poly for poly, _ in env.road_poly]
            self.vertices = np.concatenate([self.grass, np.array(road, np.float64).reshape(len(road), 4, 2)])
            self.track_of = env.road_poly
        bounds = module.PLAYFIELD
        field = [(bounds, bounds), (bounds, -bounds), (-bounds, -bounds), (-bounds, bounds)]
        env._draw_colored_polygon(env.surf, field, env.bg_color, zoom, translation, angle, clip=False)
        cos, sin = math.cos(turn), math.sin(turn)
        x, y = self.vertices[..., 0], self.vertices[..., 1]
        screen_x = (cos * x - sin * y) * zoom + translation[0]  # [N, 4]
        screen_y = (sin * x + cos * y) * zoom + translation[1]
        margin = module.MAX_SHAPE_DIM
        inside = (-margin <= screen_x) & (screen_x <= module.WINDOW_W + margin)
        inside &= (-margin <= screen_y) & (screen_y <= module.WINDOW_H + margin)
        screen = np.stack([screen_x, screen_y], axis=-1)
        grass = len(self.grass)
        for index in np.flatnonzero(inside.any(axis=1)):  # gymnasium's clip: any vertex near the window
            poly = [tuple(vertex) for vertex in screen[index].tolist()]
            # read each frame: a tile's color changes when the car first touches it
            color = env.grass_color if index < grass else [int(c) for c in env.road_poly[index - grass][1]]
            module.gfxdraw.aapolygon(env.surf, poly, color)
            module.gfxdraw.filled_polygon(env.surf, poly, color)


# --------------------------------------------------------------------------- #
# Host loop
# --------------------------------------------------------------------------- #
# --parallel data (jaxzoo.parallel): the data axis of each stage's state, in
# one seed's leaves (None: replicated). The collected episodes are split over
# the devices (stage 1's env batch, then the Rollouts V, M and C read, and V's
# encodings of them, split alike); V's, M's and C's states (parameters,
# optimiser, CMA-ES) are replicated, and each stage learns from a batch that
# `constrain_data` splits: V's frames, M's rollouts, the episodes of a
# generation's candidates.
STATE_DATA_AXES: dict[str, Any] = {"collect": 0, "vae": None, "mdn": None, "controller": None}
ONE_DEVICE = parallel.Layout("off", None)


def shardings(layout: parallel.Layout, abstract, axes):
    """The sharding of every leaf of a seed-stacked tree (leaves [num_seeds,
    ...]) whose data axes are `axes` (a prefix tree, as in STATE_DATA_AXES);
    None on one device."""
    return layout.state_shardings(abstract, data_axes=axes)


def traced_in(layout: parallel.Layout, fn: Callable) -> Callable:
    """`fn` with `layout.tracing()` around it, for `jax.jit`: in data mode its
    `constrain_data` calls split its batches over the layout's devices."""

    def traced(*args):
        with layout.tracing():
            return fn(*args)

    return traced


def stage_inputs(name: str, outputs: dict, wm: WorldModels, layout: parallel.Layout = ONE_DEVICE):
    """What a stage reads from the earlier stages' final states (leaves
    [num_seeds, ...]); in data mode V's encodings [N, ...] split by rollout, as
    the Rollouts are."""
    if name == "collect":  # --collect-with: the earlier run's V and M and its controllers, or None
        return outputs.get("collect_with")
    data = outputs["collect"]
    if name == "vae":
        return data

    def encode(fn, params):
        fn = jax.vmap(fn)
        placed = (
            {} if layout.mesh is None else {"out_shardings": shardings(layout, jax.eval_shape(fn, params, data), 0)}
        )
        return jax.jit(traced_in(layout, fn), compiler_options=wm.compiler_options, **placed)(params, data)

    if name == "mdn":
        params = outputs["vae"].params
        shards = layout.num_devices if layout.mode == parallel.DATA_AXIS else 1
        return data, params, encode(functools.partial(wm.encode_rollouts, shards=shards), params)
    params = outputs["mdn"].params
    return params, encode(wm.initial_latents, params)


def abstract_stage_state(name: str, stage: Stage, seeds: np.ndarray, inputs, wm: WorldModels):
    """Shapes of a stage's stacked state [num_seeds, ...], as checkpoint templates."""
    if name == "collect":  # its init may step host envs, so the shapes are written out
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct((len(seeds), *x.shape), x.dtype), wm.rollouts_shape)
    return jax.eval_shape(lambda s, i: init_seeds(stage, name, s, i), seeds, inputs)


def init_seeds(stage: Stage, name: str, seeds, inputs):
    """`stage.init` for each seed, one after another (`lax.map`, as common/runner.init_seeds),
    with the key fold_in(key(seed), stage index) so every stage draws its own stream."""
    index = STAGES.index(name)
    return jax.lax.map(lambda a: stage.init(jax.random.fold_in(jax.random.key(a[0]), index), a[1]), (seeds, inputs))


def run_stage(
    args: Args,
    name: str,
    stage: Stage,
    stage_dir: Path,
    inputs,
    seeds: np.ndarray,
    wm: WorldModels,
    stop: runner.StopRequest | None = None,
    layout: parallel.Layout = ONE_DEVICE,
):
    """One stage for all seeds: init (or restore the stage's newest checkpoint,
    which is how --resume continues a stage), then chunks of `log_every` updates
    (one jitted `lax.scan` from jaxzoo.runner.make_chunk, vmapped over seeds by
    jaxzoo.runner.over_seeds, the state donated), metrics.csv and checkpoints
    in `stage_dir`. A non-finite state stops the run (cli.Diverged) before it
    is saved; a SIGINT / SIGTERM (`stop`) checkpoints after the chunk and
    exits. With a `layout` (jaxzoo.parallel) in seeds mode, the seed axis of
    the state and inputs is sharded over its devices; in data mode, the data
    axes of STATE_DATA_AXES (the inputs come placed by `stage_inputs`), the
    rest replicated, and the stage's batch is split by `constrain_data`.
    Only process 0 writes. Returns (state [num_seeds, ...], seconds, chunk traces)."""
    start = time.perf_counter()
    stop = stop or runner.StopRequest()  # not entered: no signal handlers, never stops
    by_seed = layout.seed_sharding()  # None: one device
    by_leaf = None
    if by_seed is not None:
        by_leaf = shardings(layout, abstract_stage_state(name, stage, seeds, inputs, wm), STATE_DATA_AXES[name])
    placed: dict[str, Any] = {} if by_seed is None else {"out_shardings": by_leaf}
    chunk_placed: dict[str, Any] = {} if by_seed is None else {"out_shardings": (by_leaf, by_seed, by_seed)}
    updates_done = checkpoint.latest_update(stage_dir)
    if updates_done is not None:
        state, updates_done = checkpoint.restore(stage_dir, abstract_stage_state(name, stage, seeds, inputs, wm))
        state = parallel.put(state, by_leaf)
    elif stage.host:  # one seed (checked in Args)
        seed_inputs = jax.tree.map(lambda x: x[0], inputs)
        state = jax.tree.map(
            lambda x: x[None],
            stage.init(jax.random.fold_in(jax.random.key(int(seeds[0])), STAGES.index(name)), seed_inputs),
        )
    else:
        state = jax.jit(
            traced_in(layout, lambda s, i: init_seeds(stage, name, s, i)), compiler_options=runner.RUN_ONCE, **placed
        )(parallel.host_array(seeds, by_seed), inputs)
    run_log = (logger.Run if parallel.is_writer() else logger.Silent)(
        args,
        stage_dir,
        total_steps=stage.num_updates * stage.steps_per_update,
        tensorboard=args.tensorboard,
        track=args.track,
        resume_from_update=updates_done,
        meta=META,
    )
    traces = [0]
    if stage.host:

        def run_chunk(state, first_update, last_update, inputs):
            one = lambda tree: jax.tree.map(lambda x: x[0], tree)  # noqa: E731
            state, rows, health = one(state), [], np.full((1, 2), -1)
            for index in range(first_update + 1, last_update + 1):
                state, metrics = stage.update(state, one(inputs))
                rows.append(metrics)
                bad_leaf = int(runner.first_nonfinite_leaf(state))
                if bad_leaf >= 0 and health[0, 0] < 0:
                    health[0] = index, bad_leaf
            return jax.tree.map(lambda x: x[None], state), jax.tree.map(lambda *x: jnp.stack(x)[None], *rows), health
    else:

        def chunk(state, first_update, last_update, inputs):
            # The inputs (rollouts, earlier stages' parameters) are traced
            # arguments, never constants baked into the program.
            traces[0] += 1
            scan, _ = runner.make_chunk(lambda s: stage.update(s, inputs), args.log_every)
            with layout.tracing():  # --parallel data: the stage's batch split over the devices
                return scan(state, first_update, last_update)

        run_chunk = jax.jit(
            runner.over_seeds(chunk, args.num_seeds, (0, None, None, 0)),
            donate_argnums=0,
            compiler_options=wm.compiler_options,
            **chunk_placed,
        )
    last_checkpoint = done = updates_done or 0
    clock = time.perf_counter()
    while done < stage.num_updates:
        count = min(args.log_every, stage.num_updates - done)
        bounds = (done, done + count) if stage.host else (jnp.int32(done), jnp.int32(done + count))
        state, metrics, health = run_chunk(state, *bounds, inputs)
        metrics, health = parallel.to_host((metrics, health))
        metrics = {k: np.asarray(v)[:, :count] for k, v in metrics.items()}
        now = time.perf_counter()
        rate = count * stage.steps_per_update * args.num_seeds / (now - clock)  # the first chunk includes compiling
        metrics["steps_per_second"], clock = np.full((args.num_seeds, count), rate), now
        update_index = np.arange(done + 1, done + count + 1)
        run_log.log(update_index, update_index * stage.steps_per_update, metrics)
        runner.check_health(health, state, metrics, done, args, stage_dir)
        done += count
        due = done - last_checkpoint >= args.checkpoint_every or done == stage.num_updates
        signum = parallel.agree_max(stop.signum or 0)  # any process's signal stops them all here
        if args.save_model and (due or signum):
            runner.write_checkpoint(stage_dir, done, state)
            last_checkpoint = done
        if signum and done < stage.num_updates:
            run_log.close()
            saved = f"checkpoint at update {done} written" if args.save_model else "no checkpoint (--no-save-model)"
            run_log.print(
                f"stopped by {signal.Signals(signum).name} in stage {name!r} after update {done} of "
                f"{stage.num_updates}; {saved}. Resume with:\n  {runner.resume_command(stage_dir.parent)}"
            )
            raise SystemExit(128 + signum)
    run_log.progress(done * stage.steps_per_update, final=True)
    run_log.close()
    jax.block_until_ready(state)
    return state, time.perf_counter() - start, traces[0]


def load_stage(
    run_dir: Path,
    name: str,
    stage: Stage,
    seeds: np.ndarray,
    inputs,
    wm: WorldModels,
    layout: parallel.Layout = ONE_DEVICE,
):
    """A finished stage's final state from `run_dir/<name>/checkpoints`
    (placed over the devices of `layout` as `run_stage` places it)."""
    stage_dir = Path(run_dir) / name
    latest = checkpoint.latest_update(stage_dir)
    if latest is None:
        raise FileNotFoundError(
            f"stage {name!r} is needed but not in --stages, and {str(stage_dir)!r} has no "
            "checkpoint; pass --source-run with a run directory that finished it"
        )
    if latest < stage.num_updates:
        raise ValueError(
            f"stage {name!r} in {str(stage_dir)!r} stopped at update {latest} of {stage.num_updates}; "
            f"finish it with --resume {run_dir}"
        )
    abstract = abstract_stage_state(name, stage, seeds, inputs, wm)
    produced = abstract
    if name in ("collect", "vae"):
        # At the shapes of the run that made it: its rollouts (more than this run's own with
        # --collect-keep), its V (trained beside an M that may differ from this run's: only V is read).
        producer = make_train(cli.load_run_args(Args, run_dir))
        produced = abstract_stage_state(name, getattr(producer, name), seeds, inputs, producer)
    shapes = lambda tree: jax.tree.map(lambda x: (x.shape, x.dtype), tree)  # noqa: E731
    if name == "vae" and shapes(produced.params.vae) != shapes(abstract.params.vae):
        raise ValueError(
            f"stage 'vae' in {str(stage_dir)!r} trained another V (image_size, grayscale, z_size or "
            "vae_depth differ from this run's); accepted: --source-run with a run of the same V sizes"
        )
    state, _ = checkpoint.restore(stage_dir, produced)
    if name == "vae":  # this run's M in place of the producer's untrained one (zeros: the M stage starts its own)
        unused_mdn = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), abstract.params.mdn)
        state, produced = state.replace(params=state.params._replace(mdn=unused_mdn)), abstract
    return parallel.put(state, shardings(layout, produced, STATE_DATA_AXES[name]))


def load_run(run_dir: str | Path) -> tuple[Args, WorldModels, dict]:
    """A run's Args, its `make_train` and the final states of every stage it
    finished (or its --source-run finished), leaves [num_seeds, ...]: for
    figures and notebooks."""
    args = cli.load_run_args(Args, run_dir)
    world_models = make_train(args)
    seeds = args.seed + np.arange(args.num_seeds, dtype=np.int32)
    outputs: dict[str, Any] = {}
    for name in STAGES:
        stage = getattr(world_models, name)
        here = checkpoint.latest_update(Path(run_dir) / name) is not None
        if not here and (args.source_run is None or checkpoint.latest_update(Path(args.source_run) / name) is None):
            break
        outputs[name] = load_stage(
            Path(run_dir) if here else Path(args.source_run),
            name,
            stage,
            seeds,
            stage_inputs(name, outputs, world_models),
            world_models,
        )
    return args, world_models, outputs


def main(args: Args) -> dict:
    """Run the selected stages in order, each in its own directory under the
    run directory (metrics.csv, checkpoints), after loading the earlier ones
    from --source-run; then evaluate the final controller (the CMA-ES mean)
    over `eval_episodes` real episodes. Returns a summary (also eval.json)
    with the stages' final states under "outputs"."""
    # Resume, run-root and cache checks, before anything is built; the CPU devices of --parallel (Args.DATA_AXIS).
    args = runner.prepare(args, "world_models")
    if STAGES.index(args.stages[0]) > 0 and args.source_run is None:
        raise ValueError(
            f"stages {list(args.stages)} start after {STAGES[0]!r}: pass --source-run RUN_DIR, a run "
            "that finished the earlier stages"
        )
    if args.collect_with is not None and "collect" in args.stages:
        check_collect_with(args, cli.load_run_args(Args, args.collect_with))
    layout = make_layout(args)  # a layout the devices cannot run is refused before anything is built
    wm = make_train(args)
    with runner.open_run_dir(args, "world_models") as run_dir, runner.StopRequest() as stop:
        if parallel.is_writer():
            logger.write_args_json(run_dir, args, META)
        return run_pipeline(args, wm, run_dir, stop, layout)


def check_collect_with(args: Args, earlier: Args) -> None:
    """Refuse an --collect-with run whose models or seeds do not fit this run's, naming each difference."""
    models = ("env_id", "image_size", "grayscale", "z_size", "vae_depth", "rnn_size", "num_mixtures")
    fields: tuple[str, ...] = (*models, "predict_reward", "predict_done", "seed", "num_seeds")
    if args.collect_keep:  # its rollouts join this run's
        fields = (*fields, "rollout_steps")
    differences = [
        f"{f}={getattr(earlier, f)!r} there, {getattr(args, f)!r} here"
        for f in fields
        if getattr(earlier, f) != getattr(args, f)
    ]
    if differences:
        raise ValueError(
            f"--collect-with {args.collect_with}: its V, M and C do not fit this run ({'; '.join(differences)}); "
            "accepted: a run of the same env, model sizes and seeds (and rollout_steps, with --collect-keep)"
        )


def collect_with(args: Args, layout: parallel.Layout) -> tuple[Params, jax.Array, Rollouts | None]:
    """The --collect-with run's V and M (Params), its controllers (CMA-ES means
    [num_seeds, P]) and, with --collect-keep, its rollouts."""
    assert args.collect_with is not None
    _, _, earlier = load_run(args.collect_with)
    if "controller" not in earlier:
        raise ValueError(f"--collect-with {args.collect_with}: the run has no finished controller stage")
    played = (earlier["mdn"].params, earlier["controller"].cma.mean, earlier["collect"] if args.collect_keep else None)
    if layout.mesh is None:
        return played
    return parallel.put(jax.tree.map(np.asarray, played), jax.tree.map(lambda _: layout.seed_sharding(), played))


def make_layout(args: Args) -> parallel.Layout:
    """The Layout of --parallel (jaxzoo.parallel). Seeds mode shards every
    stage's seed axis. Data mode splits the collected episodes (num_rollouts)
    over the devices, and the batch of each stage: V's vae_batch_size frames,
    M's mdn_batch_size rollouts, C's population x trials episodes per
    generation and the final evaluation's eval_episodes; the device count must
    divide num_rollouts and the batches of the stages in `args.stages`. Raises
    ValueError naming the first it does not divide, before anything runs."""
    if args.parallel == "data" and args.collect_keep:
        raise ValueError(
            "--parallel data splits this run's num_rollouts over the devices; with --collect-keep the stored "
            "rollouts are more; accepted: --collect-keep with --parallel off, auto or seeds"
        )
    if args.parallel == "data" and args.env_id in HOST_ENVS:
        raise ValueError(
            f"--parallel data: env_id {args.env_id!r} is stepped on the host (gymnasium), which cannot be split "
            f"over devices; accepted: --parallel off or auto, or a pure-JAX pixel env ({', '.join(pixels.RENDERERS)})"
        )
    layout = parallel.make_layout(
        args.parallel,
        args.num_seeds,
        data_size=getattr(args, Args.DATA_AXIS),  # num_rollouts, derived from the two flags its name shows
        data_name=f"{Args.DATA_AXIS} = total_timesteps // rollout_steps = {args.total_timesteps} // {args.rollout_steps}",
    )
    if layout.mode != parallel.DATA_AXIS:
        return layout
    batches = {
        "vae": [("vae_batch_size", args.vae_batch_size)],
        "mdn": [("mdn_batch_size", args.mdn_batch_size)],
        "controller": [
            (f"population * trials = {args.population} * {args.trials}", args.population * args.trials),
            ("eval_episodes", args.eval_episodes),
        ],
    }
    count = layout.num_devices
    for name in args.stages:
        for field, size in batches.get(name, []):
            if size % count:
                raise ValueError(
                    f"--parallel data: {field} = {size} is not a multiple of the {count} visible devices "
                    f"(stage {name!r} splits it over them); accepted: a multiple of {count}"
                )
    return layout


def run_pipeline(
    args: Args, wm: WorldModels, run_dir: Path, stop: runner.StopRequest, layout: parallel.Layout = ONE_DEVICE
) -> dict:
    """`main` inside its locked run directory: the stages, then the evaluation."""
    seeds = args.seed + np.arange(args.num_seeds, dtype=np.int32)
    by_seed = layout.seed_sharding()
    say = print if parallel.is_writer() else (lambda *_: None)
    outputs: dict[str, Any] = {}
    if args.collect_with is not None and "collect" in args.stages:
        outputs["collect_with"] = collect_with(args, layout)
    seconds: dict[str, float] = {}
    traces: dict[str, int] = {}
    for i, name in enumerate(STAGES[: STAGES.index(args.stages[-1]) + 1]):
        stage = getattr(wm, name)
        inputs = stage_inputs(name, outputs, wm, layout)
        if name in args.stages:
            say(f"[world_models] stage {i + 1}/4 {name}: {stage.num_updates} update(s) -> {run_dir / name}")
            outputs[name], seconds[name], traces[name] = run_stage(
                args, name, stage, run_dir / name, inputs, seeds, wm, stop, layout
            )
        else:  # an earlier stage, finished by --source-run (main refuses a late start without it)
            assert args.source_run is not None
            outputs[name] = load_stage(Path(args.source_run), name, stage, seeds, inputs, wm, layout)
    summary: dict[str, Any] = {"run_dir": str(run_dir), "stage_seconds": seconds, "chunk_traces": traces}
    if "controller" in args.stages:
        params, mean = outputs["mdn"].params, outputs["controller"].cma.mean
        keys = jax.vmap(lambda s: jax.random.fold_in(jax.random.key(s), len(STAGES)))(
            parallel.host_array(seeds, by_seed)
        )
        start = time.perf_counter()
        returns = evaluate_controller(args, wm, params, mean, keys, seeds, by_seed, layout, run_dir)
        seconds["evaluate"] = time.perf_counter() - start
        if not np.isfinite(returns).all():
            raise cli.Diverged(
                f"the controller's evaluation returned non-finite returns; no eval.json was written "
                f"(run directory {run_dir})"
            )
        summary.update(
            returns=returns,
            mean=float(returns.mean()),
            std=float(returns.std()),
            per_seed=[[float(r.mean()), float(r.std())] for r in returns],
            best_fitness=parallel.to_host(outputs["controller"].best_fitness),
            controller_env=args.controller_env,
        )
        say(
            f"[world_models] {args.controller_env}-trained controller (CMA-ES mean) over {args.eval_episodes} real "
            f"episodes x {args.num_seeds} seed(s): {returns.mean():.1f} +- {returns.std():.1f}"
        )
    say("[world_models] seconds per stage: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()))
    summary["train_seconds"] = sum(v for k, v in seconds.items() if k != "evaluate")  # the stages run here
    if parallel.is_writer():
        (run_dir / "eval.json").write_text(json.dumps(summary, indent=2, default=_json_default) + "\n")
        if "returns" in summary:  # summary.json, run_info.json (jaxzoo.results; the stages' metrics stay apart)
            results.write_summary(run_dir, results.machine_info())
    return {**summary, "outputs": outputs}


def evaluate_controller(args: Args, wm: WorldModels, params, mean, keys, seeds, by_seed, layout, run_dir: Path):
    """Each seed's final controller (the CMA-ES mean [S, P]) over `eval_episodes`
    real episodes -> returns [S, eval_episodes]; with --capture-video, the first
    episode of each seed is also written to videos/final-seed<S>.mp4."""
    record = args.capture_video
    evaluate = functools.partial(wm.evaluate, record=record)
    on_host = args.env_id in HOST_ENVS  # evaluated in the host env whether C was evolved there or in the dream
    if on_host:  # one seed after another: the host env cannot be traced
        outcomes = [evaluate(jax.tree.map(lambda x: x[j], params), mean[j], keys[j]) for j in range(args.num_seeds)]
        if record:
            returns = np.stack([np.asarray(r) for r, _ in outcomes])
            recordings = [jax.tree.map(lambda x: np.asarray(x)[None], rec) for _, rec in outcomes]
        else:
            returns = np.stack([np.asarray(r) for r in outcomes])
    else:
        placed = {} if by_seed is None else {"out_shardings": by_seed}
        evaluated = jax.jit(traced_in(layout, jax.vmap(evaluate)), compiler_options=wm.compiler_options, **placed)
        outcome = parallel.to_host(evaluated(params, mean, keys))
        returns, recordings = (outcome[0], [outcome[1]]) if record else (outcome, [])
    if record and parallel.is_writer():
        from jaxzoo import video

        host_seeds = parallel.to_host(seeds)
        seed_groups = [[s] for s in host_seeds] if on_host else [host_seeds]
        for recording, group in zip(recordings, seed_groups):
            video.write_recordings(run_dir / "videos", args.env_id, recording, group, "final")
    return returns


# What args.json and each stage's copy of it record besides the Args fields.
META = {"algorithm": "world_models", "jaxzoo_version": runner.package_version()}


def _json_default(x):
    return np.asarray(x).tolist()


if __name__ == "__main__":
    with cli.user_errors():
        main(cli.parse(Args, "world_models"))
