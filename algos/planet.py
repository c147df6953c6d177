"""PlaNet: latent dynamics learned from pixels and planning in latent space, the whole run in one `jax.jit`.

Paper: Hafner et al. 2019, "Learning Latent Dynamics for Planning from Pixels"
(Deep Planning Network, arXiv:1811.04551); sizes and training loop as in the
paper and Kaixhin/PlaNet (seed 003).

The idea: no policy and no value function. A recurrent state-space model
(RSSM) learns the environment from image sequences: a deterministic GRU belief
h_t = f(h_{t-1}, s_{t-1}, a_{t-1}) carries memory, a diagonal-Gaussian latent
state s_t carries uncertainty, with a prior p(s_t | h_t) for prediction and a
posterior q(s_t | h_t, o_t) for filtering; decoders reconstruct the image and
the reward from (h_t, s_t). The ELBO is image + reward likelihood minus
KL(q || p), the KL clipped below by free nats. To act, the agent filters the
latent state from the frames seen so far and runs the cross-entropy method
(CEM) over action sequences, scoring each by the rewards the model predicts
along an open-loop prior rollout, and executes the first action of the final
mean (model-predictive control). Data collection (seed episodes of random
actions, then one planned episode per iteration), the sequence replay and every
model update run inside one compiled `lax.scan`, vmapped over seeds, on a pixel
Pendulum-v1 rendered in JAX (common/pixels.py).

    python algos/planet.py --preset cpu             # pixel Pendulum-v1, minutes on a CPU
    python algos/planet.py --preset paper           # the paper's sizes and planner
    python algos/planet.py --preset tiny            # seconds: what the tests run

Details, logged metrics and measured results: docs/planet.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Annotated, Any, ClassVar, Literal, NamedTuple

import chex
import distrax
import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

from jaxzoo import buffers, cli, dmc, envs, parallel, pixels, runner
from jaxzoo.checks import AtLeastOne, NonNegative, Positive, Range, check_fields
from jaxzoo.layers import StridedConv, StridedConvTranspose


# --------------------------------------------------------------------------- #
# Arguments
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class Args:
    """PlaNet (Hafner et al. 2019) on a pixel gymnax environment, jitted end to end."""

    exp_name: str = "planet"
    """name of the experiment: part of the run directory and the plot label"""
    seed: Annotated[int, NonNegative] = 0
    """seed of the first run; seed index i uses seed + i"""
    num_seeds: Annotated[int, AtLeastOne] = 1
    """independent seeds trained at once with `jax.vmap` (DeepMind Control tasks: 1)"""
    env_id: str = "Pendulum-v1"
    """gymnax environment id with a pixel renderer in common/pixels.py (continuous actions only), or a DeepMind
    Control task 'dmc:<domain>-<task>' stepped on the host (optional extra: pip install -e '.[dmc]'; one seed)"""
    total_timesteps: Annotated[int, AtLeastOne] = 100_000
    """environment steps per seed collected by the planner (the random seed episodes come on top)"""
    log_every: Annotated[int, AtLeastOne] = 5
    """updates (= planned episodes) per jitted chunk: metrics, progress and checkpoints happen between chunks"""
    track: bool = False
    """log to Weights & Biases (needs the `logging` extra)"""
    tensorboard: bool = False
    """write TensorBoard event files into the run directory (needs the `logging` extra)"""
    save_model: bool = True
    """write checkpoints of the whole runner state, replay included (needed for --resume)"""
    checkpoint_every: Annotated[int, AtLeastOne] = 10
    """updates between checkpoints (rounded up to a chunk boundary); one is also written at the end"""
    resume: str | None = None
    """run directory to resume: the run continues with its saved args.json; a flag that differs from it is refused, except total_timesteps and the reporting flags (docs/reliability.md)"""
    run_root: str = "runs"
    """directory under which run directories are created"""
    eval_episodes: Annotated[int, AtLeastOne] = 5
    """planned episodes without exploration noise per seed at the end of training"""
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
    """updates between evaluations during training (planner, no noise), logged as eval_return; 0: only at the end"""
    image_size: int = 64
    """side of the square image observations: 16, 32 or 64 pixels"""
    grayscale: bool = False
    """one-channel images instead of RGB"""
    action_repeat: Annotated[int, AtLeastOne] = 2
    """environment steps per planned action; rewards are summed over them"""
    seed_episodes: Annotated[int, AtLeastOne] = 5
    """episodes of uniformly random actions collected before the first model update"""
    collect_interval: Annotated[int, AtLeastOne] = 100
    """model updates per iteration, before the iteration's planned episode"""
    batch_size: Annotated[int, AtLeastOne] = 50
    """sequences per model update"""
    DATA_AXIS: ClassVar[str] = "batch_size"
    """the field --parallel data splits over the devices (the sequences of each model update; runner.data_axis)"""
    chunk_size: Annotated[int, Range(ge=2)] = 50
    """steps (after action repeat) per sequence"""
    buffer_size: Annotated[int, AtLeastOne] = 25_000
    """replay capacity per seed in agent steps (one frame each, stored as uint8)"""
    belief_size: Annotated[int, AtLeastOne] = 200
    """GRU belief (deterministic state) size"""
    state_size: Annotated[int, AtLeastOne] = 30
    """stochastic latent state size"""
    hidden_size: Annotated[int, AtLeastOne] = 200
    """hidden layer width of the prior, posterior and reward networks"""
    embedding_size: Annotated[int, AtLeastOne] = 1024
    """image embedding size (the paper's 64x64 encoder gives 2 x 2 x 256 = 1024)"""
    cnn_depth: Annotated[int, AtLeastOne] = 32
    """channels of the first encoder convolution, doubled per layer (the decoder mirrors it)"""
    min_std: Annotated[float, NonNegative] = 0.1
    """minimum standard deviation of the prior and posterior: softplus(x) + min_std"""
    free_nats: Annotated[float, NonNegative] = 3.0
    """KL(q || p) below this many nats per step is not penalised"""
    overshooting_kl_beta: Annotated[float, NonNegative] = 0.0
    """weight of the latent-overshooting KL (0: off, the paper's RSSM setting)"""
    overshooting_distance: Annotated[int, AtLeastOne] = 50
    """longest open-loop prediction of latent overshooting"""
    bit_depth: Annotated[int, Range(ge=1, le=8)] = 5
    """bits per colour channel of the observations, plus uniform dequantisation noise"""
    learning_rate: Annotated[float, Positive] = 1e-3
    """Adam learning rate"""
    adam_eps: Annotated[float, Positive] = 1e-4
    """Adam epsilon"""
    max_grad_norm: Annotated[float, NonNegative] = 1000.0
    """global gradient-norm clip (0: none)"""
    planning_horizon: Annotated[int, AtLeastOne] = 12
    """actions per planned sequence"""
    optimisation_iters: Annotated[int, AtLeastOne] = 10
    """CEM iterations per planned action"""
    candidates: Annotated[int, AtLeastOne] = 1000
    """action sequences sampled per CEM iteration"""
    top_candidates: Annotated[int, AtLeastOne] = 100
    """elite sequences the CEM Gaussian is refitted to"""
    plan_with_mean: bool = False
    """score candidates on prior-mean rollouts instead of sampled states (the paper samples; docs/planet.md)"""
    exploration_noise: Annotated[float, NonNegative] = 0.3
    """std of the Gaussian noise added to planned actions while collecting (actions scaled to [-1, 1])"""
    reward_scale: Annotated[float, Positive] = 1.0
    """the reward model learns reward_scale x the (action-repeat summed) reward; logged returns stay unscaled"""

    def __post_init__(self):
        check_fields(self)
        if self.image_size not in DECODER_KERNELS:
            raise ValueError(
                f"image_size={self.image_size} is not supported; accepted: one of {sorted(DECODER_KERNELS)}"
            )
        if self.top_candidates > self.candidates:
            raise ValueError(
                f"top_candidates={self.top_candidates} exceeds candidates={self.candidates}; accepted: "
                "top_candidates <= candidates"
            )
        if dmc.is_dmc(self.env_id):
            dmc.parse(self.env_id)
            if self.num_seeds != 1:
                raise ValueError(
                    f"{self.env_id} is stepped on the host, one seed per process: num_seeds must be 1, "
                    f"got {self.num_seeds}"
                )

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (self.image_size, self.image_size, 1 if self.grayscale else 3)

    @property
    def feature_size(self) -> int:
        return self.belief_size + self.state_size

    @property
    def episode_steps(self) -> int:
        """Agent steps (planned actions) per episode: the env's time limit / action_repeat, rounded up."""
        return math.ceil(env_spec(self.env_id).max_episode_steps / self.action_repeat)

    @property
    def steps_per_update(self) -> int:
        """Environment steps of one iteration: one episode."""
        return self.episode_steps * self.action_repeat

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.steps_per_update


# --------------------------------------------------------------------------- #
# Networks
# --------------------------------------------------------------------------- #
# Stride-2 convolutions, 4x4 kernels, no padding: 64 -> 31 -> 14 -> 6 -> 2
# (the paper's encoder), 32 -> 15 -> 6 -> 2, 16 -> 7 -> 2. The decoder's
# transposed convolutions grow a 1x1 map back: 1 -> 5 -> 13 -> 30 -> 64 with
# kernels 5, 5, 6, 6 (the paper's), 1 -> 5 -> 14 -> 32, 1 -> 6 -> 16.
DECODER_KERNELS = {16: (6, 6), 32: (5, 6, 6), 64: (5, 5, 6, 6)}


class Encoder(nnx.Module):
    """Image [..., S, S, C] (values in [-0.5, 0.5]) -> embedding [..., E]:
    ReLU convolutions of depth x (1, 2, 4, 8) channels down to 2 x 2, flattened,
    then a linear layer unless that already has E features (the paper's
    64 x 64 x 3 -> 2 x 2 x 256 = 1024)."""

    def __init__(self, image_shape: tuple[int, int, int], depth: int, embedding_size: int, rngs: nnx.Rngs):
        num_layers = len(DECODER_KERNELS[image_shape[0]])
        widths = [depth * 2**i for i in range(num_layers)]
        self.convs = nnx.List(
            [StridedConv(c_in, c_out, 4, rngs) for c_in, c_out in zip([image_shape[2]] + widths[:-1], widths)]
        )
        flat = 4 * widths[-1]
        self.project = nnx.Linear(flat, embedding_size, rngs=rngs) if flat != embedding_size else None
        self.image_shape = image_shape

    def __call__(self, image: jax.Array) -> jax.Array:
        lead = image.shape[:-3]
        x = image.reshape((-1, *self.image_shape))
        for conv in self.convs:
            x = jax.nn.relu(conv(x))
        x = x.reshape((x.shape[0], -1))
        if self.project is not None:
            x = self.project(x)
        return x.reshape((*lead, x.shape[-1]))


class Decoder(nnx.Module):
    """Features [..., D + Z] -> image mean [..., S, S, C]: a linear layer to E
    features seen as a 1 x 1 x E map, then ReLU transposed convolutions of
    depth x (.., 4, 2, 1) channels, the last one linear to C channels."""

    def __init__(
        self, feature_size: int, image_shape: tuple[int, int, int], depth: int, embedding_size: int, rngs: nnx.Rngs
    ):
        kernels = DECODER_KERNELS[image_shape[0]]
        widths = [depth * 2**i for i in reversed(range(len(kernels) - 1))] + [image_shape[2]]
        self.project = nnx.Linear(feature_size, embedding_size, rngs=rngs)
        self.deconvs = nnx.List(
            [
                StridedConvTranspose(c_in, c_out, k, rngs)
                for c_in, c_out, k in zip([embedding_size] + widths[:-1], widths, kernels)
            ]
        )
        self.image_shape = image_shape
        self.embedding_size = embedding_size

    def __call__(self, features: jax.Array) -> jax.Array:
        lead = features.shape[:-1]
        x = self.project(features).reshape((-1, 1, 1, self.embedding_size))
        for i, deconv in enumerate(self.deconvs):
            x = deconv(x)
            if i < len(self.deconvs) - 1:
                x = jax.nn.relu(x)
        chex.assert_shape(x, (None, *self.image_shape))
        return x.reshape((*lead, *self.image_shape))


class RewardModel(nnx.Module):
    """Features [..., D + Z] -> predicted reward [...]: a 3-layer ReLU MLP."""

    def __init__(self, feature_size: int, hidden_size: int, rngs: nnx.Rngs):
        self.layers = nnx.List(
            [
                nnx.Linear(feature_size, hidden_size, rngs=rngs),
                nnx.Linear(hidden_size, hidden_size, rngs=rngs),
                nnx.Linear(hidden_size, 1, rngs=rngs),
            ]
        )

    def __call__(self, features: jax.Array) -> jax.Array:
        x = jax.nn.relu(self.layers[0](features))
        x = jax.nn.relu(self.layers[1](x))
        return self.layers[2](x)[..., 0]


class RSSM(nnx.Module):
    """The recurrent state-space model's transition, prior and posterior
    (paper section 3, Kaixhin's TransitionModel); leading axes [...] are free.

    transition(belief [..., D], state [..., Z], action [..., A]) -> belief [..., D]:
        h_t = GRU(h_{t-1}, relu(W [s_{t-1}, a_{t-1}]))
    prior(belief) -> (mean, std) [..., Z]:              p(s_t | h_t)
    posterior(belief, embedding [..., E]) -> (mean, std): q(s_t | h_t, e_t)
    with std = softplus(x) + min_std.
    """

    def __init__(self, action_dim: int, args: Args, rngs: nnx.Rngs):
        D, Z, H, E = args.belief_size, args.state_size, args.hidden_size, args.embedding_size
        self.embed_state_action = nnx.Linear(Z + action_dim, D, rngs=rngs)
        self.gru = nnx.GRUCell(D, D, rngs=rngs)
        self.embed_prior = nnx.Linear(D, H, rngs=rngs)
        self.prior_head = nnx.Linear(H, 2 * Z, rngs=rngs)
        self.embed_posterior = nnx.Linear(D + E, H, rngs=rngs)
        self.posterior_head = nnx.Linear(H, 2 * Z, rngs=rngs)
        self.min_std = args.min_std

    def _gaussian(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        mean, raw_std = jnp.split(x, 2, axis=-1)
        return mean, jax.nn.softplus(raw_std) + self.min_std

    def transition(self, belief: jax.Array, state: jax.Array, action: jax.Array) -> jax.Array:
        hidden = jax.nn.relu(self.embed_state_action(jnp.concatenate([state, action], axis=-1)))
        return self.gru(belief, hidden)[0]

    def prior(self, belief: jax.Array) -> tuple[jax.Array, jax.Array]:
        return self._gaussian(self.prior_head(jax.nn.relu(self.embed_prior(belief))))

    def posterior(self, belief: jax.Array, embedding: jax.Array) -> tuple[jax.Array, jax.Array]:
        hidden = jax.nn.relu(self.embed_posterior(jnp.concatenate([belief, embedding], axis=-1)))
        return self._gaussian(self.posterior_head(hidden))


class WorldModel(nnx.Module):
    """Encoder, RSSM, image decoder and reward model: one parameter tree, one optimizer."""

    def __init__(self, action_dim: int, args: Args, rngs: nnx.Rngs):
        self.encoder = Encoder(args.image_shape, args.cnn_depth, args.embedding_size, rngs)
        self.rssm = RSSM(action_dim, args, rngs)
        self.decoder = Decoder(args.feature_size, args.image_shape, args.cnn_depth, args.embedding_size, rngs)
        self.reward = RewardModel(args.feature_size, args.hidden_size, rngs)


# --------------------------------------------------------------------------- #
# Pytrees
# --------------------------------------------------------------------------- #
class Step(NamedTuple):
    """One row of the sequence replay: a frame and how it was reached (leaves
    [num_envs, ...] when added). An episode of L agent steps is L + 1 rows: its
    first frame (`first`, no action, no reward), then one row per step holding
    the frame the step reached (the final observation at an episode end, never
    the next episode's reset frame)."""

    obs: jax.Array  # [S, S, C] uint8
    action: jax.Array  # [A] action (scaled to [-1, 1]) that led to this frame; zeros on a first frame
    reward: jax.Array  # [] reward summed over the action repeat that led here; 0 on a first frame
    first: jax.Array  # [] bool: first frame of an episode (the RSSM restarts from zeros here)


class Latent(NamedTuple):
    belief: jax.Array  # [..., D] deterministic GRU state h_t
    state: jax.Array  # [..., Z] stochastic state sample s_t


class RSSMOutputs(NamedTuple):
    """A filtered sequence, leaves [T, B, ...]."""

    belief: jax.Array  # [T, B, D]
    state: jax.Array  # [T, B, Z] posterior sample
    prior_mean: jax.Array  # [T, B, Z]
    prior_std: jax.Array  # [T, B, Z]
    posterior_mean: jax.Array  # [T, B, Z]
    posterior_std: jax.Array  # [T, B, Z]


class Agent(struct.PyTreeNode):
    """The acting side of one seed: N envs and their filtered latent states."""

    env_state: Any
    obs: jax.Array  # [N, S, S, C] float in [0, 1]: the frame to be recorded next (a reset frame if need_first)
    latent: Latent  # [N, ...] posterior up to the last recorded frame
    need_first: jax.Array  # [N] bool: the next slot records obs as a first frame instead of stepping


class Hyperparams(struct.PyTreeNode):
    """The float hyperparameters the jitted update reads. They live in the
    runner state, so `train` can be vmapped over them (a sweep in one compile)."""

    learning_rate: jax.Array  # [] Adam step size for the whole world model
    free_nats: jax.Array  # [] KL(q || p) per step below this is not penalised (paper section 3)
    overshooting_kl_beta: jax.Array  # [] weight of the latent-overshooting KL (paper eq. 7); the term
    # is built only when Args.overshooting_kl_beta > 0, so a sweep over it starts from a positive value
    exploration_noise: jax.Array  # [] std of the Gaussian noise on planned actions while collecting
    reward_scale: jax.Array  # [] the reward model learns reward_scale x the reward

    @classmethod
    def from_args(cls, args: Args) -> Hyperparams:
        return cls(*(jnp.float32(getattr(args, f.name)) for f in fields(cls)))


class RunnerState(struct.PyTreeNode):
    params: nnx.State
    opt_state: optax.OptState  # Adam's state; its hyperparams["learning_rate"] is set from hparams each update
    buffer: buffers.Buffer
    agent: Agent
    key: jax.Array
    model_updates: jax.Array  # []
    env_steps: jax.Array  # [] environment steps, seed episodes included
    hparams: Hyperparams


# --------------------------------------------------------------------------- #
# Algorithm logic (pure functions; the unit tests import these)
# --------------------------------------------------------------------------- #
def quantise(image: jax.Array) -> jax.Array:
    """Float image in [0, 1] -> uint8 (what replay stores)."""
    return jnp.round(jnp.clip(image, 0.0, 1.0) * 255.0).astype(jnp.uint8)


def preprocess_obs(obs: jax.Array, bit_depth: int, key: jax.Array) -> jax.Array:
    """uint8 frames -> floats in [-0.5, 0.5): reduced to `bit_depth` bits, centred,
    plus uniform dequantisation noise of one quantisation step (Kaixhin's
    preprocess_observation_; the paper's 5 bits)."""
    levels = 2.0**bit_depth
    reduced = jnp.floor(obs.astype(jnp.float32) / 2.0 ** (8 - bit_depth)) / levels - 0.5
    return reduced + jax.random.uniform(key, obs.shape) / levels


def kl_with_free_nats(posterior_mean, posterior_std, prior_mean, prior_std, free_nats: float | jax.Array):
    """Per-step KL(q || p) between the diagonal Gaussians q = N(posterior_mean,
    posterior_std^2) and p = N(prior_mean, prior_std^2), summed over the state
    dimensions [..., Z] -> [...], and the loss max(KL, free_nats) [...].
    Returns (loss, kl).

    Free nats (paper section 3, Kaixhin's kl_loss) are written out by hand:
    below `free_nats` the KL term is a constant with no gradient, so early in
    training the model is not pushed to make the posterior ignore the images."""
    chex.assert_equal_shape([posterior_mean, posterior_std, prior_mean, prior_std])
    posterior = distrax.Normal(posterior_mean, posterior_std)
    prior = distrax.Normal(prior_mean, prior_std)
    kl = posterior.kl_divergence(prior).sum(-1)
    return jnp.maximum(kl, free_nats), kl


def rssm_observe_step(rssm: RSSM, latent: Latent, action, embedding, first, noise) -> tuple[Latent, RSSMOutputs]:
    """One filtering step, leading axes [...] free: reset to zeros where `first`
    [...] (an episode's first frame: no previous state or action), then
    h_t = f(h_{t-1}, s_{t-1}, a_{t-1}), the prior p(s_t | h_t), the posterior
    q(s_t | h_t, e_t) and a reparameterised sample s_t = mean + std * noise."""
    keep = (~first)[..., None].astype(jnp.float32)
    belief = rssm.transition(latent.belief * keep, latent.state * keep, action * keep)
    prior_mean, prior_std = rssm.prior(belief)
    posterior_mean, posterior_std = rssm.posterior(belief, embedding)
    # The sample by hand, from noise passed in: tests fix it, the planner and
    # the video prediction can zero it, and scans need no key per step.
    state = posterior_mean + posterior_std * noise
    return Latent(belief, state), RSSMOutputs(belief, state, prior_mean, prior_std, posterior_mean, posterior_std)


def rssm_observe(rssm: RSSM, latent: Latent, actions, embeddings, firsts, noise) -> RSSMOutputs:
    """Filter a batch of sequences with one `lax.scan` over time.

    latent: initial (belief [B, D], state [B, Z]), usually zeros; actions
    [T, B, A] (row t: the action that led to frame t), embeddings [T, B, E],
    firsts [T, B], noise [T, B, Z] standard normal. Returns RSSMOutputs [T, B, ...].
    """
    chex.assert_equal_shape_prefix([actions, embeddings, firsts, noise], 2)

    def step(latent, inputs):
        return rssm_observe_step(rssm, latent, *inputs)

    return jax.lax.scan(step, latent, (actions, embeddings, firsts, noise))[1]


def rssm_imagine(rssm: RSSM, latent: Latent, actions, noise) -> tuple[Latent, jax.Array, jax.Array]:
    """Open-loop prediction with the prior only: from latent [..., D | Z],
    actions [H, ..., A] and noise [H, ..., Z], returns the predicted latents
    Latent([H, ..., D], [H, ..., Z]) and the prior (mean, std) [H, ..., Z]."""

    def step(latent, inputs):
        action, eps = inputs
        belief = rssm.transition(latent.belief, latent.state, action)
        mean, std = rssm.prior(belief)
        new = Latent(belief, mean + std * eps)
        return new, (new, mean, std)

    return jax.lax.scan(step, latent, (actions, noise))[1]


def open_loop_prediction(
    model: WorldModel, images, actions, firsts, context: int, noise
) -> tuple[jax.Array, jax.Array]:
    """Video prediction (paper figure 4): filter the first `context` frames of
    images [T, B, S, S, C] (preprocessed) with the posterior, then predict the
    remaining T - context steps open loop with the prior, from the recorded
    actions [T, B, A] only. firsts [T, B] as in `rssm_observe` (the predicted
    part should lie inside one episode); noise [T, B, Z] standard normal
    (zeros: the means). Returns decoded frames [T, B, S, S, C] (posterior
    reconstructions for t < context, open-loop predictions after) and
    predicted rewards [T, B] (in the reward model's units, reward_scale x)."""
    chex.assert_equal_shape_prefix([images, actions, firsts, noise], 2)
    zeros = Latent(jnp.zeros((images.shape[1], model.rssm.gru.hidden_features)), jnp.zeros(noise.shape[1:]))
    filtered = rssm_observe(
        model.rssm, zeros, actions[:context], model.encoder(images[:context]), firsts[:context], noise[:context]
    )
    last = Latent(filtered.belief[-1], filtered.state[-1])
    predicted, _, _ = rssm_imagine(model.rssm, last, actions[context:], noise[context:])
    belief = jnp.concatenate([filtered.belief, predicted.belief])
    state = jnp.concatenate([filtered.state, predicted.state])
    feats = jnp.concatenate([belief, state], axis=-1)
    return model.decoder(feats), model.reward(feats)


def cem_plan(
    returns_fn: Callable[[jax.Array, jax.Array], jax.Array],
    key: jax.Array,
    horizon: int,
    action_dim: int,
    iterations: int,
    candidates: int,
    top_k: int,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Cross-entropy method over action sequences in [-1, 1]^(horizon x A).

    Starts from N(0, 1) per entry; each iteration samples `candidates`
    sequences [N, H, A] (clipped to the bounds), scores them with
    `returns_fn(actions [N, H, A], key) -> [N]`, and refits the mean and std to
    the `top_k` best (paper section 4; Kaixhin's MPCPlanner). Returns the final
    (mean [H, A], std [H, A], mean return of the last elites []).
    """

    def iteration(carry, key):
        mean, std, _ = carry
        sample_key, score_key = jax.random.split(key)
        proposal = distrax.Normal(mean, std)  # the sampling distribution: a diagonal Gaussian over [H, A]
        actions = jnp.clip(proposal.sample(seed=sample_key, sample_shape=candidates), -1.0, 1.0)
        returns = returns_fn(actions, score_key)
        chex.assert_shape(returns, (candidates,))
        elite_returns, elite = jax.lax.top_k(returns, top_k)
        elites = actions[elite]
        return (elites.mean(0), elites.std(0), elite_returns.mean()), None

    init = (jnp.zeros((horizon, action_dim)), jnp.ones((horizon, action_dim)), jnp.float32(0.0))
    return jax.lax.scan(iteration, init, jax.random.split(key, iterations))[0]


def overshooting_kl(
    rssm: RSSM, outputs: RSSMOutputs, actions, firsts, distance: int, free_nats: float | jax.Array, key: jax.Array
) -> jax.Array:
    """Latent overshooting (paper section 4, eq. 7), the KL terms only: from
    every filtered latent (h_t, s_t) of outputs [T, B, ...] predict d = 1..distance
    steps open loop with the prior and the recorded actions [T, B, A], and
    penalise max(KL(sg(q_{t+d}) || p_{t+d | t}), free_nats) for every d whose
    target lies inside the chunk and in the same episode (no `first` frame in
    t+1..t+d). Returns the mean over the valid (d, t, b) terms []."""
    T = firsts.shape[0]
    target_mean = jax.lax.stop_gradient(outputs.posterior_mean)
    target_std = jax.lax.stop_gradient(outputs.posterior_std)
    index = jnp.arange(T)[:, None]

    def step(carry, inputs):
        latent, valid = carry
        d, key = inputs
        shift = lambda x: jnp.roll(x, -d, axis=0)  # row t now holds row t + d
        valid = valid & (index + d < T) & ~shift(firsts)
        belief = rssm.transition(latent.belief, latent.state, shift(actions))
        mean, std = rssm.prior(belief)
        latent = Latent(belief, mean + std * jax.random.normal(key, mean.shape))
        loss, _ = kl_with_free_nats(shift(target_mean), shift(target_std), mean, std, free_nats)
        return (latent, valid), (jnp.sum(jnp.where(valid, loss, 0.0)), valid.sum())

    start = (Latent(outputs.belief, outputs.state), jnp.ones(firsts.shape, bool))
    steps = (jnp.arange(1, distance + 1), jax.random.split(key, distance))
    _, (losses, counts) = jax.lax.scan(step, start, steps)
    return losses.sum() / jnp.maximum(counts.sum(), 1)


def features(latent: Latent | RSSMOutputs) -> jax.Array:
    """The decoders' input [..., D + Z]: belief and state side by side."""
    return jnp.concatenate([latent.belief, latent.state], axis=-1)


def zeros_latent(args: Args, *lead: int) -> Latent:
    """The RSSM's start state: zero belief [*lead, D] and state [*lead, Z]."""
    return Latent(jnp.zeros((*lead, args.belief_size)), jnp.zeros((*lead, args.state_size)))


def model_loss(
    model: WorldModel, batch: Step, key: jax.Array, hparams: Hyperparams, args: Args
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The negative ELBO of paper eq. 3 on sequences batch [B, T]: image MSE
    summed over pixels, reward MSE (not on first frames, which no reward led
    to), and max(KL, free nats); each averaged over batch and time; plus
    beta x the latent-overshooting KL (eq. 7) when Args.overshooting_kl_beta > 0.
    Returns (loss [], metrics: dict of [])."""
    obs_key, noise_key, overshoot_key = jax.random.split(key, 3)
    batch = parallel.constrain_data(batch)  # --parallel data: the sequences are split over devices
    time_major = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), batch)
    images = preprocess_obs(time_major.obs, args.bit_depth, obs_key)  # [T, B, S, S, C]
    T, B = time_major.first.shape
    # --parallel data: the sequences are split over devices, but the encoder and the decoder flatten
    # time x batch into one batch, which keeps a split only along its major axis: they run split along
    # time (one exchange before and after each), the filtering scan along the batch.
    by_time = functools.partial(parallel.constrain_data, axis=0)
    by_sequence = functools.partial(parallel.constrain_data, axis=1)
    images = by_time(images)
    outputs = by_sequence(
        rssm_observe(
            model.rssm,
            zeros_latent(args, B),
            time_major.action,
            by_sequence(model.encoder(images)),
            time_major.first,
            jax.random.normal(noise_key, (T, B, args.state_size)),
        )
    )
    feats = features(outputs)
    observation_loss = jnp.square(model.decoder(by_time(feats)) - images).sum((-3, -2, -1)).mean()
    has_reward = (~time_major.first).astype(jnp.float32)
    reward_error = jnp.square(model.reward(feats) - hparams.reward_scale * time_major.reward)
    reward_loss = jnp.sum(reward_error * has_reward) / jnp.maximum(has_reward.sum(), 1.0)
    kl_loss, kl = kl_with_free_nats(
        outputs.posterior_mean, outputs.posterior_std, outputs.prior_mean, outputs.prior_std, hparams.free_nats
    )
    metrics = {
        "observation_loss": observation_loss,
        "reward_loss": reward_loss,
        "kl_loss": kl_loss.mean(),
        "kl_divergence": kl.mean(),
        "posterior_std": outputs.posterior_std.mean(),
    }
    loss = observation_loss + reward_loss + kl_loss.mean()
    if args.overshooting_kl_beta > 0:
        overshooting = overshooting_kl(
            model.rssm,
            outputs,
            time_major.action,
            time_major.first,
            args.overshooting_distance,
            hparams.free_nats,
            overshoot_key,
        )
        loss = loss + hparams.overshooting_kl_beta * overshooting
        metrics["overshooting_kl_loss"] = overshooting
    return loss, {**metrics, "model_loss": loss}


def plan_latent(model: WorldModel, latent: Latent, key: jax.Array, action_dim: int, args: Args):
    """CEM in latent space (paper section 4) from one filtered latent (belief
    [D], state [Z]): every candidate action sequence [H, A] is rolled out with
    the prior (sampled states, as in the paper, or the prior means with
    `plan_with_mean`) and scored by the sum of predicted rewards. Returns the
    first action of the final mean [A] and the elites' predicted return [] (in
    the reward model's units, reward_scale x)."""

    def returns_fn(actions, key):  # [N, H, A] -> [N]
        noise = jax.random.normal(key, (actions.shape[0], args.planning_horizon, args.state_size))
        if args.plan_with_mean:
            noise = jnp.zeros_like(noise)
        # --parallel data: the CEM population (the candidates' rollouts) is split over devices.
        actions, noise = parallel.constrain_data((actions, noise))

        def rollout(action_sequence, eps):
            predicted, _, _ = rssm_imagine(model.rssm, latent, action_sequence, eps)
            return model.reward(features(predicted)).sum()

        return jax.vmap(rollout)(actions, noise)

    mean, _, predicted_return = cem_plan(
        returns_fn,
        key,
        args.planning_horizon,
        action_dim,
        args.optimisation_iters,
        args.candidates,
        args.top_candidates,
    )
    return mean[0], predicted_return


def repeat_action(env, env_params, env_state, env_action, need_first, obs, key, substeps: int, on_host: bool):
    """Apply env_action [N, A] for `substeps` env steps (the action repeat; 1
    for a host env, which repeats it itself), rewards summed. Substeps after an
    episode end are frozen (no step, no reward) and an env with `need_first`
    [N] starts done, so it is not stepped at all. A host env is told which envs
    are active, so a finished one does not advance.
    Returns (env_state, reward [N], done [N], reached frame [N, S, S, C] (the
    final observation at an episode end), next frame to record [N, S, S, C],
    episode info {episode_done, episode_return, episode_length} [substeps, N])."""

    def substep(carry, key):
        env_state, reward, done, reached, next_obs = carry
        active = ~done
        told = (active,) if on_host else ()
        new_obs, new_state, r, terminated, truncated, info = env.step(key, env_state, env_action, env_params, *told)
        select = lambda new, old: jnp.where(active.reshape(active.shape + (1,) * (new.ndim - 1)), new, old)
        carry = (
            envs.where_envs(active, new_state, env_state),
            reward + jnp.where(active, r, 0.0),
            done | (active & (terminated | truncated)),
            select(info["final_observation"], reached),
            select(new_obs, next_obs),
        )
        stats = {
            "episode_done": info["episode_done"] & active,
            "episode_return": info["episode_return"],
            "episode_length": info["episode_length"],
        }
        return carry, stats

    init = (env_state, jnp.zeros(obs.shape[0]), need_first, obs, obs)
    (env_state, reward, done, reached, next_obs), stats = jax.lax.scan(substep, init, jax.random.split(key, substeps))
    return env_state, reward, done, reached, next_obs, stats


# --------------------------------------------------------------------------- #
# Training
# --------------------------------------------------------------------------- #
class PlaNet(NamedTuple):
    init: Any  # (key, hparams=None) -> RunnerState (seed episodes collected)
    update: Any  # RunnerState -> (RunnerState, metrics): collect_interval model updates, one planned episode
    train: Any  # (key, hparams=None) -> (RunnerState, metrics [num_updates])
    evaluate: Any  # (RunnerState, key) -> returns [eval_episodes]; with --capture-video also an envs.Recording
    model_step: Any  # (params, opt_state, batch Step [B, T], key, hparams=None) -> (params, opt_state, metrics)
    plan: Any  # (params, latent [D | Z], key, hparams=None) -> (action [A], predicted return [])
    spec: envs.EnvSpec
    graphdef: Any  # nnx.GraphDef of WorldModel


@functools.cache
def env_spec(env_id: str) -> envs.EnvSpec:
    """Action space and time limit of a gymnax env or a DeepMind Control task (built once, on the host)."""
    return dmc.spec(env_id) if dmc.is_dmc(env_id) else envs.spec(*envs.make(env_id))


def check_env_id(env_id: str) -> None:
    """Refuse, naming it, an env id PlaNet cannot run: a gymnax env without a
    pixel renderer (with the closest accepted id when one is close), or a
    discrete one. DeepMind Control ids are checked by common/dmc.py."""
    if dmc.is_dmc(env_id):
        return
    accepted = [e for e in pixels.RENDERERS if not env_spec(e).discrete]
    if env_id not in pixels.RENDERERS:
        what = "no pixel renderer for env_id" if env_id in envs.ENV_IDS else "unknown env_id"
        raise ValueError(
            f"{what} {env_id!r}{envs.did_you_mean(env_id, accepted)}; accepted: "
            f"{', '.join(accepted)} (rendered in common/pixels.py) or a DeepMind Control task "
            f"'{dmc.PREFIX}<domain>-<task>'"
        )
    if env_spec(env_id).discrete:
        raise ValueError(
            f"{env_id} has a discrete action space; PlaNet plans continuous actions with CEM, so it requires "
            f"a continuous (Box) action space; accepted: {', '.join(accepted)} or '{dmc.PREFIX}<domain>-<task>'"
        )


def make_envs(args: Args):
    """The training env (one per seed) and the `eval_episodes` evaluation envs,
    pixel observations: rendered in JAX (common/pixels.py), or a DeepMind
    Control task stepped and rendered in Python through io_callback
    (common/dmc.py), which does the action repeat itself.
    With --capture-video, the evaluation envs record each seed's first episode
    (envs.RecordEpisode, for jaxzoo.video).
    Returns (env, eval_env, env_params, substeps: env.step calls per agent step)."""
    if dmc.is_dmc(args.env_id):
        size, grayscale, repeat = args.image_size, args.grayscale, args.action_repeat
        make = functools.partial(
            dmc.make, args.env_id, size=size, grayscale=grayscale, action_repeat=repeat, seed=args.seed
        )
        (env, env_params), (eval_env, _) = make(1, role=0), make(args.eval_episodes, role=1)
        substeps = 1
    else:
        make = functools.partial(pixels.make, args.env_id, size=args.image_size, grayscale=args.grayscale)
        (env, env_params), (eval_env, _) = make(1), make(args.eval_episodes)
        substeps = args.action_repeat
    if args.capture_video:
        eval_env = envs.RecordEpisode(eval_env, env_spec(args.env_id).max_episode_steps + 1)
    return env, eval_env, env_params, substeps


def check_sizes(args: Args) -> None:
    """Refuse, naming the values, a budget of less than one episode, seed
    episodes shorter than a sampled chunk, or a replay that holds neither."""
    slots = args.episode_steps + 1
    if args.num_updates < 1:
        raise ValueError(
            f"total_timesteps={args.total_timesteps} is less than one episode ({args.steps_per_update} environment "
            "steps)"
        )
    if args.seed_episodes * slots < args.chunk_size:
        raise ValueError(
            f"seed_episodes={args.seed_episodes} give {args.seed_episodes * slots} replay rows, fewer "
            f"than chunk_size={args.chunk_size}"
        )
    if args.buffer_size < max(slots, args.chunk_size) + 1:
        raise ValueError(
            f"buffer_size={args.buffer_size} must hold more than one episode ({slots} rows) "
            f"and chunk_size={args.chunk_size}"
        )


def make_optimizer(args: Args) -> optax.GradientTransformation:
    """One Adam over the whole world model after a global-norm clip (none when
    max_grad_norm is 0); the learning rate is an injected hyperparameter, so
    each update can set it from the runner state's Hyperparams."""

    def adam_with_clip(learning_rate):
        adam = optax.adam(learning_rate, eps=args.adam_eps)
        return optax.chain(optax.clip_by_global_norm(args.max_grad_norm), adam) if args.max_grad_norm > 0 else adam

    return optax.inject_hyperparams(adam_with_clip)(learning_rate=args.learning_rate)


def make_train(args: Args) -> PlaNet:
    """PlaNet's pieces for `args`: learner step, CEM planner, acting, init,
    update, train and evaluate, closed over the env and the model's graphdef."""
    check_env_id(args.env_id)
    check_sizes(args)
    spec = env_spec(args.env_id)
    env, eval_env, env_params, substeps = make_envs(args)
    on_host, action_dim = dmc.is_dmc(args.env_id), spec.num_actions
    low, high = jnp.asarray(spec.action_low), jnp.asarray(spec.action_high)
    slots = args.episode_steps + 1  # rows per episode: its first frame, then one per agent step
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: WorldModel(action_dim, args, nnx.Rngs(0))))
    optimizer = make_optimizer(args)

    def model_step(params, opt_state, batch: Step, key, hparams: Hyperparams | None = None):
        """One learner step on sequences batch [B, T]: the gradient of
        `model_loss`, clipped, one Adam step at hparams.learning_rate.
        Returns (params, opt_state, metrics: dict of [])."""
        hparams = Hyperparams.from_args(args) if hparams is None else hparams
        loss_fn = lambda params: model_loss(nnx.merge(graphdef, params), batch, key, hparams, args)  # noqa: E731
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        opt_state = opt_state._replace(hyperparams={**opt_state.hyperparams, "learning_rate": hparams.learning_rate})
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, {**metrics, "grad_norm": optax.tree.norm(grads)}

    def plan(params, latent: Latent, key, hparams: Hyperparams | None = None):
        """`plan_latent` with the parameters `params`: the action [A] and the
        elites' predicted return [] in environment units (divided by reward_scale)."""
        hparams = Hyperparams.from_args(args) if hparams is None else hparams
        action, predicted_return = plan_latent(nnx.merge(graphdef, params), latent, key, action_dim, args)
        return action, predicted_return / hparams.reward_scale

    def agent_slot(params, hparams: Hyperparams, agent: Agent, key, env, mode: str, noise_std):
        """One slot for N envs: a first-frame row where `need_first`, otherwise
        choose an action (uniformly random, or planned + N(0, noise_std^2)),
        repeat it (`repeat_action`) and record the reached frame; then filter
        the latent with the recorded row.
        Returns (agent, (row Step [N], substep info [substeps, N], predicted return [N]))."""
        action_key, noise_key, env_key, obs_key, filter_key = jax.random.split(key, 5)
        n = agent.obs.shape[0]
        if mode == "random":
            action = jax.random.uniform(action_key, (n, action_dim), minval=-1.0, maxval=1.0)
            predicted = jnp.full((n,), jnp.nan)
        else:
            action, predicted = jax.vmap(plan, in_axes=(None, 0, 0, None))(
                params, agent.latent, jax.random.split(action_key, n), hparams
            )
            action = jnp.clip(action + noise_std * jax.random.normal(noise_key, action.shape), -1.0, 1.0)
        env_action = low + (action + 1.0) * 0.5 * (high - low)
        env_state, reward, done, reached, next_obs, stats = repeat_action(
            env, env_params, agent.env_state, env_action, agent.need_first, agent.obs, env_key, substeps, on_host
        )
        first = agent.need_first  # a first-frame row: no action led to it
        row = Step(quantise(reached), jnp.where(first[:, None], 0.0, action), reward, first)
        latent = agent.latent
        if mode != "random":  # random acting needs no latent state
            model = nnx.merge(graphdef, params)
            embedding = model.encoder(preprocess_obs(row.obs, args.bit_depth, obs_key))
            noise = jax.random.normal(filter_key, (n, args.state_size))
            latent, _ = rssm_observe_step(model.rssm, latent, row.action, embedding, row.first, noise)
        agent = Agent(env_state, next_obs, latent, ~agent.need_first & done)
        return agent, (row, stats, predicted)

    def collect(state: RunnerState, mode: str, num_slots: int):
        """`num_slots` slots of the training env into replay (`mode` "random":
        uniform actions; "plan": CEM plus exploration noise); returns the state
        and (substep info [num_slots, substeps, 1], predicted returns [num_slots, 1])."""
        key, slot_key = jax.random.split(state.key)

        def slot(carry, key):
            agent, buffer = carry
            noise_std = state.hparams.exploration_noise
            agent, (row, stats, predicted) = agent_slot(state.params, state.hparams, agent, key, env, mode, noise_std)
            return (agent, buffers.add(buffer, row)), (stats, predicted)

        (agent, buffer), (stats, predicted) = jax.lax.scan(
            slot, (state.agent, state.buffer), jax.random.split(slot_key, num_slots)
        )
        return state.replace(agent=agent, buffer=buffer, key=key), (stats, predicted)

    def init(key: jax.Array, hparams: Hyperparams | None = None) -> RunnerState:
        """A fresh model and optimizer, an empty replay, then `seed_episodes`
        episodes of uniformly random actions collected into it."""
        hparams = Hyperparams.from_args(args) if hparams is None else hparams
        key, model_key, env_key = jax.random.split(key, 3)
        params = nnx.split(WorldModel(action_dim, args, nnx.Rngs(model_key)))[1]
        obs, env_state = env.reset(env_key, env_params)
        agent = Agent(env_state, obs, zeros_latent(args, 1), jnp.ones((1,), bool))
        example = Step(
            jnp.zeros(args.image_shape, jnp.uint8), jnp.zeros(action_dim), jnp.float32(0.0), jnp.bool_(False)
        )
        replay = buffers.init(example, args.buffer_size, 1)
        state = RunnerState(params, optimizer.init(params), replay, agent, key, jnp.int32(0), jnp.int32(0), hparams)
        state, _ = collect(state, "random", args.seed_episodes * slots)
        return state.replace(env_steps=jnp.int32(args.seed_episodes * args.steps_per_update))

    def update(state: RunnerState):
        """One PlaNet iteration (paper algorithm 1): `collect_interval` model
        updates on `batch_size` chunks [B, chunk_size] sampled from replay, then
        one episode with the planner (plus exploration noise) into replay.
        Returns (state, metrics: dict of [])."""

        def fit(carry, key):
            params, opt_state = carry
            sample_key, loss_key = jax.random.split(key)
            batch = buffers.sample(state.buffer, sample_key, args.batch_size, args.chunk_size).windows
            params, opt_state, metrics = model_step(params, opt_state, batch, loss_key, state.hparams)
            return (params, opt_state), metrics

        key, fit_key = jax.random.split(state.key)
        (params, opt_state), metrics = jax.lax.scan(
            fit, (state.params, state.opt_state), jax.random.split(fit_key, args.collect_interval)
        )
        model_updates = state.model_updates + args.collect_interval
        state = state.replace(params=params, opt_state=opt_state, key=key, model_updates=model_updates)
        state, (stats, predicted) = collect(state, "plan", slots)
        state = state.replace(env_steps=state.env_steps + args.steps_per_update)
        return state, {
            **envs.episode_metrics(stats),
            **jax.tree.map(jnp.mean, metrics),
            "predicted_return": jnp.nanmean(predicted),
            "model_updates": state.model_updates.astype(jnp.float32),
            "env_steps": state.env_steps.astype(jnp.float32),
        }

    def train(key: jax.Array, hparams: Hyperparams | None = None):
        """The whole run as one `lax.scan` over updates: jit it, vmap it over
        seeds (keys) and hyperparameters. Returns (state, metrics [num_updates])."""
        return jax.lax.scan(lambda s, _: update(s), init(key, hparams), None, args.num_updates)

    def evaluate(state: RunnerState, key: jax.Array) -> jax.Array:
        """`eval_episodes` planned episodes at once, no exploration noise; the
        return of each env's first finished episode [eval_episodes]."""
        reset_key, key = jax.random.split(key)
        obs, env_state = eval_env.reset(reset_key, env_params)
        n = args.eval_episodes
        agent = Agent(env_state, obs, zeros_latent(args, n), jnp.ones((n,), bool))

        def slot(carry, key):
            agent, finished, returns = carry
            agent, (_, stats, _) = agent_slot(state.params, state.hparams, agent, key, eval_env, "plan", 0.0)
            for done, episode_return in zip(stats["episode_done"], stats["episode_return"]):  # over the repeat
                newly = done & ~finished
                returns, finished = jnp.where(newly, episode_return, returns), finished | newly
            return (agent, finished, returns), None

        carry = (agent, jnp.zeros(n, bool), jnp.zeros(n))
        agent, _, returns = jax.lax.scan(slot, carry, jax.random.split(key, slots))[0]
        return envs.with_recording(returns, eval_env, agent.env_state)

    return PlaNet(init, update, train, evaluate, model_step, plan, spec, graphdef)


# --------------------------------------------------------------------------- #
# Host loop
# --------------------------------------------------------------------------- #
def main(args: Args) -> runner.RunResult:
    """Train `num_seeds` seeds in chunks of `log_every` iterations (common/runner.py:
    run directory, metrics.csv, progress, checkpoints with replay, resume), then evaluate."""
    # Resume, run-root and cache checks, before anything is built; the CPU devices of --parallel (Args.DATA_AXIS).
    args = runner.prepare(args, "planet")
    algo = make_train(args)
    return runner.run(
        args,
        "planet",
        algo.init,
        algo.update,
        algo.evaluate,
        num_updates=args.num_updates,
        steps_per_update=args.steps_per_update,
        eval_every=args.eval_every,
        # --parallel data: one training env per seed leaves no env batch to shard, so the state (replay
        # included) is replicated; each model update's sequences and each plan's CEM candidates are split
        # over devices (`constrain_data` above), the gradients averaged across them.
        data_axes=lambda state: None,
    )


if __name__ == "__main__":
    with cli.user_errors():
        main(cli.parse(Args, "planet"))
