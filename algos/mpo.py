"""Maximum a Posteriori Policy Optimisation (MPO), the whole run in one `jax.jit`.

Papers: Abdolmaleki et al. 2018, "Maximum a Posteriori Policy Optimisation"
(arXiv:1806.06920) and "Relative Entropy Regularized Policy Iteration"
(arXiv:1812.02256); Retrace from Munos et al. 2016 (arXiv:1606.02647).

The idea: policy iteration as inference. A critic Q(s, a) is learned off-policy
from replay. The E-step builds a better, non-parametric policy
q(a|s) proportional to pi_target(a|s) exp(Q(s, a) / eta) on N sampled actions
per state, with the temperature eta chosen (by its convex dual) so that
KL(q || pi_target) stays below epsilon. The M-step fits the parametric Gaussian
policy to q by weighted maximum likelihood, under separate KL trust regions for
the mean and for the standard deviation (Lagrange multipliers alpha_mu,
alpha_sigma learned by gradient descent on their duals). The default behaviour
is the annotated PyTorch agent of seed 004; Acme's choices are flags and the
`acme` preset. Acting, replay, and every learner step run inside one compiled
`lax.scan`, vmapped over seeds.

    python algos/mpo.py --preset pendulum       # Pendulum-v1, 100k steps, sized for a CPU (the measured run)
    python algos/mpo.py                         # seed 004's settings (Acme-sized networks: hours on a CPU)
    python algos/mpo.py --preset acme --num-seeds 4
    python algos/mpo.py --preset mountaincar-continuous

Details, logged metrics and measured results: docs/mpo.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Annotated, Any, ClassVar, Literal, NamedTuple

import chex
import distrax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct

from jaxzoo import buffers, cli, envs, parallel, runner
from jaxzoo.checks import AtLeastOne, Fraction, NonNegative, Positive, check_fields


# --------------------------------------------------------------------------- #
# Arguments
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class Args:
    """MPO (Abdolmaleki et al. 2018) for continuous control on a gymnax environment, jitted end to end."""

    exp_name: str = "mpo"
    """name of the experiment: part of the run directory and the plot label"""
    seed: Annotated[int, NonNegative] = 0
    """seed of the first run; seed index i uses seed + i"""
    num_seeds: Annotated[int, AtLeastOne] = 1
    """independent seeds trained at once with `jax.vmap`"""
    env_id: str = "Pendulum-v1"
    """gymnax environment id (continuous actions only)"""
    total_timesteps: Annotated[int, AtLeastOne] = 100_000
    """environment steps per seed"""
    log_every: Annotated[int, AtLeastOne] = 10
    """updates per jitted chunk: metrics, progress and checkpoints happen between chunks"""
    track: bool = False
    """log to Weights & Biases (needs the `logging` extra)"""
    tensorboard: bool = False
    """write TensorBoard event files into the run directory (needs the `logging` extra)"""
    save_model: bool = True
    """write checkpoints of the whole runner state, replay included (needed for --resume)"""
    checkpoint_every: Annotated[int, AtLeastOne] = 20
    """updates between checkpoints (rounded up to a chunk boundary); one is also written at the end"""
    resume: str | None = None
    """run directory to resume: the run continues with its saved args.json; a flag that differs from it is refused, except total_timesteps and the reporting flags (docs/reliability.md)"""
    run_root: str = "runs"
    """directory under which run directories are created"""
    eval_episodes: Annotated[int, AtLeastOne] = 10
    """deterministic (mean-action) evaluation episodes per seed at the end of training"""
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
    num_envs: Annotated[int, AtLeastOne] = 1
    """parallel environments per seed"""
    DATA_AXIS: ClassVar[str] = "num_envs"
    """the field --parallel data splits over the devices (the environments; runner.data_axis)"""
    steps_per_update: Annotated[int, AtLeastOne] = 1000
    """env steps per seed in one `update` (one row of metrics.csv)"""
    train_frequency: Annotated[int, AtLeastOne] = 1
    """env steps per seed between learner phases (a multiple of num_envs)"""
    gradient_steps: Annotated[int, AtLeastOne] = 1
    """learner steps per phase (the seed: one per env step)"""
    buffer_size: Annotated[int, AtLeastOne] = 1_000_000
    """replay capacity in transitions per seed"""
    batch_size: Annotated[int, AtLeastOne] = 256
    """transitions (windows) per learner step"""
    learning_starts: Annotated[int, NonNegative] = 10_000
    """env steps per seed before the first learner step"""
    gamma: Annotated[float, Fraction] = 0.99
    """discount factor"""
    policy_layers: Annotated[tuple[int, ...], AtLeastOne] = (256, 256, 256)
    """LayerNormMLP widths of the policy torso"""
    critic_layers: Annotated[tuple[int, ...], AtLeastOne] = (512, 512, 256)
    """LayerNormMLP widths of the critic torso"""
    log_std_min: float = -20.0
    """lower clamp of the policy's log-std"""
    log_std_max: float = 2.0
    """upper clamp of the policy's log-std"""
    policy_lr: Annotated[float, Positive] = 3e-4
    """policy Adam learning rate (divided by m_steps)"""
    critic_lr: Annotated[float, Positive] = 3e-4
    """critic Adam learning rate"""
    temperature_lr: Annotated[float, Positive] = 3e-4
    """Adam learning rate of the temperature eta (and the penalty temperature)"""
    alpha_lr: Annotated[float, Positive] = 3e-4
    """Adam learning rate of the KL multipliers alpha_mu, alpha_sigma"""
    adam_eps: Annotated[float, Positive] = 1e-5
    """Adam epsilon of every optimizer"""
    max_grad_norm: Annotated[float, NonNegative] = 1.0
    """global-norm clip of each optimizer's gradient: critic, duals, policy separately (0: none)"""
    target_copy_period: Annotated[int, AtLeastOne] = 100
    """gradient steps between hard copies of the online networks into the targets (when target_update_rate is 0)"""
    target_update_rate: Annotated[float, Fraction] = 0.0
    """EMA rate of the targets, applied after every gradient step (0: hard copies every target_copy_period instead)"""
    num_samples: Annotated[int, AtLeastOne] = 20
    """actions sampled per state from the target policy (E-step and critic targets)"""
    epsilon: Annotated[float, Positive] = 0.1
    """E-step bound on KL(q || pi_target)"""
    epsilon_mean: Annotated[float, Positive] = 0.1
    """M-step bound on the mean part of KL(pi_target || pi), per action dimension"""
    epsilon_stddev: Annotated[float, Positive] = 0.1
    """M-step bound on the std part of KL(pi_target || pi), per action dimension"""
    init_temperature: float = 1.0
    """initial raw temperature (eta = softplus(raw) + 1e-8)"""
    init_alpha_mean: float = 10.0
    """initial raw alpha_mu (per dimension, through softplus)"""
    init_alpha_stddev: float = 1000.0
    """initial raw alpha_sigma (per dimension, through softplus)"""
    m_steps: Annotated[int, AtLeastOne] = 1
    """policy gradient steps per learner step (each at policy_lr / m_steps)"""
    critic_target: Literal["td", "retrace"] = "td"
    """n-step TD with the expected target-policy value, or Retrace over windows of n_step steps"""
    n_step: Annotated[int, AtLeastOne] = 1
    """window length in env steps: n-step returns (td) or the Retrace sequence length"""
    retrace_lambda: Annotated[float, Fraction] = 0.95
    """Retrace trace parameter: c_t = lambda min(1, pi_target / behaviour)"""
    action_penalization: bool = False
    """MO-MPO action penalty (Acme): a second temperature keeps actions inside the bounds"""
    epsilon_penalty: Annotated[float, Positive] = 1e-3
    """E-step KL bound of the action-penalty objective"""
    skip_nonfinite: bool = False
    """skip and count learner steps whose batch, target, losses or new parameters are not finite (logged as
    skipped_updates, totalled in the final line and eval.json); off: such a step is applied and the run stops as
    diverged (exit 3)"""

    def __post_init__(self):
        check_fields(self)  # the ranges beside the fields (jaxzoo.checks)
        if self.train_frequency % self.num_envs:
            raise ValueError(
                f"train_frequency={self.train_frequency} must be a multiple of num_envs={self.num_envs}; "
                f"accepted: a multiple of {self.num_envs}"
            )
        if self.steps_per_update % self.train_frequency:
            raise ValueError(
                f"steps_per_update={self.steps_per_update} must be a multiple of train_frequency={self.train_frequency}; "
                f"accepted: a multiple of {self.train_frequency}"
            )
        if self.buffer_size // self.num_envs < self.n_step + 1:
            raise ValueError(
                f"buffer_size={self.buffer_size} is too small for num_envs={self.num_envs}, n_step={self.n_step}; "
                f"accepted: buffer_size >= num_envs * (n_step + 1) = {self.num_envs * (self.n_step + 1)}"
            )
        if not self.log_std_min < self.log_std_max:
            raise ValueError(
                f"log_std_min={self.log_std_min} is not below log_std_max={self.log_std_max}; accepted: "
                "log_std_min < log_std_max"
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
                f"learning_starts={self.learning_starts} is not below {budget}: no learner step would be "
                f"taken; accepted: learning_starts < {run_steps}"
            )

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.steps_per_update

    @property
    def phases_per_update(self) -> int:
        return self.steps_per_update // self.train_frequency


# --------------------------------------------------------------------------- #
# Networks
# --------------------------------------------------------------------------- #
def torch_linear(in_features: int, out_features: int, rngs: nnx.Rngs, kernel_init=None) -> nnx.Linear:
    """Linear layer with PyTorch's default init (the seed's): kernel and bias
    U[-1/sqrt(fan_in), 1/sqrt(fan_in)]."""
    bound = 1.0 / np.sqrt(in_features)
    return nnx.Linear(
        in_features,
        out_features,
        rngs=rngs,
        kernel_init=kernel_init or nnx.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform"),
        bias_init=lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound),
    )


class LayerNormMLP(nnx.Module):
    """[..., in] -> [..., sizes[-1]]: Linear -> LayerNorm -> tanh, then Linear -> ELU
    for every further layer (the seed's LayerNormMLP with activate_final=True;
    Acme's LayerNormMLP has the same shape)."""

    def __init__(self, in_features: int, sizes: tuple[int, ...], rngs: nnx.Rngs):
        dims = (in_features, *sizes)
        self.layers = nnx.List([torch_linear(a, b, rngs) for a, b in zip(dims[:-1], dims[1:])])
        self.norm = nnx.LayerNorm(sizes[0], epsilon=1e-5, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = jnp.tanh(self.norm(self.layers[0](x)))
        for layer in self.layers[1:]:
            x = jax.nn.elu(layer(x))
        return x


class Policy(nnx.Module):
    """obs [..., O] -> (mean [..., A], log_std [..., A]): a state-dependent diagonal
    Gaussian, no squashing. The raw sample is what log-probs score; the env
    executes clip(a, low, high) (jaxzoo.envs.ClipAction)."""

    def __init__(self, obs_dim: int, action_dim: int, args: Args, rngs: nnx.Rngs):
        self.torso = LayerNormMLP(obs_dim, args.policy_layers, rngs)
        features = args.policy_layers[-1]
        self.mean = nnx.Linear(
            features,
            action_dim,
            rngs=rngs,
            bias_init=nnx.initializers.zeros_init(),
            kernel_init=nnx.initializers.variance_scaling(1.0, "fan_in", "normal"),
        )
        self.log_std = torch_linear(features, action_dim, rngs)
        self.log_std_range = (args.log_std_min, args.log_std_max)

    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        x = self.torso(obs)
        return self.mean(x), jnp.clip(self.log_std(x), *self.log_std_range)


class Critic(nnx.Module):
    """(obs [..., O], action [..., A]) -> Q [...]: LayerNormMLP on the
    concatenation; the action is clipped to the bounds first, so Q scores the
    executed action. Output layer: normal init with std 0.01, zero bias."""

    def __init__(self, obs_dim: int, spec: envs.EnvSpec, args: Args, rngs: nnx.Rngs):
        self.torso = LayerNormMLP(obs_dim + spec.num_actions, args.critic_layers, rngs)
        self.head = nnx.Linear(args.critic_layers[-1], 1, rngs=rngs, kernel_init=nnx.initializers.normal(0.01))
        self.low, self.high = spec.action_low, spec.action_high

    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        action = jnp.clip(action, self.low, self.high)
        return self.head(self.torso(jnp.concatenate([obs, action], axis=-1)))[..., 0]


# --------------------------------------------------------------------------- #
# Pytrees
# --------------------------------------------------------------------------- #
class Transition(NamedTuple):
    """One env step as stored in replay (leaves [num_envs, ...] when added)."""

    obs: jax.Array  # [O]
    action: jax.Array  # [A] raw (unclipped) sample
    log_prob: jax.Array  # [] behaviour log-prob of the raw action (Retrace)
    reward: jax.Array  # []
    terminated: jax.Array  # [] bool
    truncated: jax.Array  # [] bool
    final_obs: jax.Array  # [O] info["final_observation"]: what the step reached, before any reset


class Duals(struct.PyTreeNode):
    """Unconstrained (pre-softplus) Lagrange multipliers."""

    temperature: jax.Array  # [] eta
    alpha_mean: jax.Array  # [A]
    alpha_stddev: jax.Array  # [A]
    penalty_temperature: jax.Array  # [] eta of the action penalty (unused unless action_penalization)


class Hyperparams(struct.PyTreeNode):
    """The float hyperparameters a learner step reads (same meaning as the `Args`
    fields of the same names). They live in the Learner, inside the runner state,
    so `jax.vmap(train, in_axes=(None, 0))` over a stacked Hyperparams is a sweep
    in one compile. Whether targets are copied or averaged stays static
    (`target_update_rate` 0 or not); the rate itself is swept."""

    policy_lr: jax.Array  # [] policy Adam step size (divided by m_steps)
    critic_lr: jax.Array  # [] critic Adam step size
    temperature_lr: jax.Array  # [] Adam step size of the temperatures eta (E-step and action penalty)
    alpha_lr: jax.Array  # [] Adam step size of the KL multipliers alpha_mu, alpha_sigma
    gamma: jax.Array  # [] discount per env step
    epsilon: jax.Array  # [] E-step bound on KL(q || pi_target)
    epsilon_mean: jax.Array  # [] M-step bound on the mean part of the KL, per action dimension
    epsilon_stddev: jax.Array  # [] M-step bound on the std part of the KL, per action dimension
    epsilon_penalty: jax.Array  # [] E-step KL bound of the action-penalty objective
    target_update_rate: jax.Array  # [] EMA rate of the targets (used when the Args value is not 0)
    retrace_lambda: jax.Array  # [] Retrace trace parameter lambda

    @classmethod
    def from_args(cls, args: Args) -> Hyperparams:
        return cls(*(jnp.float32(getattr(args, f.name)) for f in fields(cls)))


class Learner(struct.PyTreeNode):
    policy: nnx.State
    critic: nnx.State
    target_policy: nnx.State
    target_critic: nnx.State
    duals: Duals
    policy_opt: optax.OptState
    critic_opt: optax.OptState
    dual_opt: optax.OptState
    gradient_steps: jax.Array  # [] learner (gradient) steps taken
    skipped: jax.Array  # [] learner steps skipped because something was not finite (skip_nonfinite; else 0)
    hparams: Hyperparams


class RunnerState(struct.PyTreeNode):
    learner: Learner
    buffer: buffers.Buffer
    env_state: Any
    obs: jax.Array  # [num_envs, O]
    key: jax.Array
    env_steps: jax.Array  # []


# --------------------------------------------------------------------------- #
# Algorithm logic (pure functions; the unit tests import these)
# --------------------------------------------------------------------------- #
def positive(raw: jax.Array) -> jax.Array:
    """A dual from its unconstrained parameter: softplus(raw) + 1e-8."""
    return jax.nn.softplus(raw) + 1e-8


def gaussian_kl(mean_p, log_std_p, mean_q, log_std_q) -> jax.Array:
    """KL(N(mean_p, std_p^2) || N(mean_q, std_q^2)) per dimension, closed form:
    log(std_q / std_p) + (std_p^2 + (mean_p - mean_q)^2) / (2 std_q^2) - 1/2.

    Written out in log-stds rather than distrax.Normal(...).kl_divergence: distrax
    forms (mu_p / std_q - mu_q / std_q)^2 and log(exp(log_std)), which moves the small
    decoupled KLs of a trust region by up to ~2% (measured on the tiny preset)."""
    var_ratio = jnp.exp(2.0 * (log_std_p - log_std_q))
    return 0.5 * (var_ratio + jnp.square(mean_p - mean_q) * jnp.exp(-2.0 * log_std_q) - 1.0) + (log_std_q - log_std_p)


def gaussian_log_prob(x, mean, log_std) -> jax.Array:
    """log pi(x) of the diagonal Gaussian policy N(mean, diag(exp(log_std)^2)):
    x, mean, log_std [..., A] -> [...]."""
    return distrax.MultivariateNormalDiag(mean, jnp.exp(log_std)).log_prob(x)


def e_step(q_values: jax.Array, temperature: jax.Array, epsilon: float | jax.Array) -> tuple[jax.Array, jax.Array]:
    """Non-parametric E-step (Abdolmaleki et al. 2018b, eq. 4-5).

    q_values [B, N]: Q of N actions sampled from the target policy per state.
    Returns the weights q_bi = softmax_i(Q_bi / eta) [B, N] (no gradient flows
    through them) and the temperature's dual loss
        eta * (epsilon + mean_b log mean_i exp(Q_bi / eta)),
    whose gradient in eta is epsilon - mean_b KL(q_b || uniform): eta grows when
    the re-weighting moves further than epsilon from the sampling policy.
    """
    scaled = jax.lax.stop_gradient(q_values) / temperature
    weights = jax.lax.stop_gradient(jax.nn.softmax(scaled, axis=-1))
    log_mean_exp = jax.nn.logsumexp(scaled, axis=-1) - jnp.log(q_values.shape[-1])
    return weights, temperature * (epsilon + jnp.mean(log_mean_exp))


def weights_kl_to_uniform(weights: jax.Array) -> jax.Array:
    """KL(q_b || uniform) of each row of E-step weights [B, N] -> [B]; the
    realised E-step KL (the sampled actions come from the target policy)."""
    n = weights.shape[-1]
    return jnp.sum(weights * jnp.log(n * weights + 1e-8), axis=-1)


def decoupled_kls(mean, log_std, target_mean, target_log_std) -> tuple[jax.Array, jax.Array]:
    """Per-dimension batch means [A] of the two halves of KL(pi_target || pi):
    KLbar_mu = mean_b KL(N(mu', sigma') || N(mu, sigma')) (only the mean moves) and
    KLbar_sigma = mean_b KL(N(mu', sigma') || N(mu', sigma)) (only the std moves)."""
    kl_mean = jnp.mean(gaussian_kl(target_mean, target_log_std, mean, target_log_std), axis=0)
    kl_stddev = jnp.mean(gaussian_kl(target_mean, target_log_std, target_mean, log_std), axis=0)
    return kl_mean, kl_stddev


def m_step_loss(
    mean: jax.Array,
    log_std: jax.Array,
    target_mean: jax.Array,
    target_log_std: jax.Array,
    actions: jax.Array,
    weights: jax.Array,
    alpha_mean: jax.Array,
    alpha_stddev: jax.Array,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """Decoupled M-step (Abdolmaleki et al. 2018b, section 4.2.1).

    mean, log_std, target_mean, target_log_std [B, A]; actions [B, N, A] sampled
    from the target policy; weights [B, N]; alphas [A] (used as constants).
    The mean is fitted with the target's std and the std with the target's mean,
        L = - mean_b sum_i q_bi [log N(a_bi; mu, sigma') + log N(a_bi; mu', sigma)]
            + sum_j alpha_mu_j KLbar_mu_j + alpha_sigma_j KLbar_sigma_j,
    with KLbar_mu = mean_b KL(N(mu', sigma') || N(mu, sigma')) and
    KLbar_sigma = mean_b KL(N(mu', sigma') || N(mu', sigma)), per dimension [A].
    Returns (loss, (KLbar_mu, KLbar_sigma)).
    """
    fixed_std = lambda x: jax.lax.stop_gradient(x)
    mean_part = gaussian_log_prob(actions, mean[:, None], fixed_std(target_log_std)[:, None])  # [B, N]
    std_part = gaussian_log_prob(actions, fixed_std(target_mean)[:, None], log_std[:, None])
    weighted_log_likelihood = jnp.mean(jnp.sum(weights * (mean_part + std_part), axis=-1))
    kl_mean, kl_stddev = decoupled_kls(mean, log_std, target_mean, target_log_std)
    penalty = jnp.sum(jax.lax.stop_gradient(alpha_mean) * kl_mean) + jnp.sum(
        jax.lax.stop_gradient(alpha_stddev) * kl_stddev
    )
    return -weighted_log_likelihood + penalty, (kl_mean, kl_stddev)


def alpha_loss(alpha: jax.Array, kl: jax.Array, epsilon: float | jax.Array) -> jax.Array:
    """Dual of a KL trust region: sum_j alpha_j (epsilon - sg(KL_j)); its gradient
    epsilon - KL_j makes alpha_j grow while the bound is violated."""
    return jnp.sum(alpha * (epsilon - jax.lax.stop_gradient(kl)))


def n_step_targets(rewards, terminated, truncated, gamma):
    """n-step returns over windows [B, n] that may cross episode ends: the sum
    stops at the first step k* that terminated or truncated. Returns
    (returns [B], discount [B] = gamma^(k*+1) or 0 if k* terminated, last [B] = k*)."""
    chex.assert_equal_shape([rewards, terminated, truncated])
    n = rewards.shape[1]
    done = (terminated | truncated).astype(jnp.float32)
    alive = jnp.cumprod(jnp.concatenate([jnp.ones_like(done[:, :1]), 1.0 - done[:, :-1]], axis=1), axis=1)
    returns = jnp.sum(gamma ** jnp.arange(n, dtype=jnp.float32) * rewards * alive, axis=1)
    last = jnp.where(done.any(axis=1), jnp.argmax(done, axis=1), n - 1)
    terminated_last = jnp.take_along_axis(terminated, last[:, None], axis=1)[:, 0]
    return returns, gamma ** (last + 1.0) * (1.0 - terminated_last.astype(jnp.float32)), last


def retrace_target(
    q: jax.Array,
    v_next: jax.Array,
    rewards: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    log_rho: jax.Array,
    gamma: float | jax.Array,
    lam: float | jax.Array,
) -> jax.Array:
    """Retrace target for Q(s_0, a_0) from a window of T steps (Munos et al. 2016), all [T]:
        Q_ret = Q(s_0, a_0) + sum_t gamma^t (prod_{i=1..t} c_i) delta_t,
        delta_t = r_t + gamma (1 - terminated_t) V(s'_t) - Q(s_t, a_t),
        c_i = lambda min(1, pi_target(a_i|s_i) / mu(a_i|s_i)),
    where V(s'_t) = E_{a ~ pi_target} Q_target(s'_t, a) of the true next state
    (the final observation at a truncation) and the sum stops at the first
    episode end. With T = 1 it is the 1-step TD target.
    """
    deltas = rewards + gamma * (1.0 - terminated.astype(jnp.float32)) * v_next - q
    traces = lam * jnp.minimum(1.0, jnp.exp(log_rho))
    continues = 1.0 - (terminated | truncated).astype(jnp.float32)

    def backward(carry, step):
        delta, cont, next_trace = step
        carry = delta + gamma * cont * next_trace * carry
        return carry, None

    next_traces = jnp.concatenate([traces[1:], jnp.zeros((1,))])
    correction, _ = jax.lax.scan(backward, jnp.float32(0.0), (deltas, continues, next_traces), reverse=True)
    return q[0] + correction


def all_finite(tree) -> jax.Array:
    return jnp.all(jnp.array([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


# --------------------------------------------------------------------------- #
# Training
# --------------------------------------------------------------------------- #
class Model(NamedTuple):
    """What a learner step uses besides the Learner and the batch: the network
    structures (their weights live in the Learner), the optimizers, the action bounds."""

    policy_def: nnx.GraphDef
    critic_def: nnx.GraphDef
    policy_tx: optax.GradientTransformation
    critic_tx: optax.GradientTransformation
    dual_tx: optax.GradientTransformation
    low: jax.Array  # [A]
    high: jax.Array  # [A]

    def policy(self, params: nnx.State, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
        """obs [..., O] -> (mean, log_std) [..., A]."""
        return nnx.merge(self.policy_def, params)(obs)

    def critic(self, params: nnx.State, obs: jax.Array, action: jax.Array) -> jax.Array:
        """(obs [..., O], action [..., A]) -> Q [...]."""
        return nnx.merge(self.critic_def, params)(obs, action)

    def sample_actions(self, params: nnx.State, obs: jax.Array, key: jax.Array, n: int):
        """n raw samples per state: obs [B, O] -> [B, n, A], with the (mean, log_std) [B, A]."""
        mean, log_std = self.policy(params, obs)
        noise = jax.random.normal(key, (obs.shape[0], n, mean.shape[-1]))
        return mean[:, None] + jnp.exp(log_std)[:, None] * noise, (mean, log_std)

    def expected_q(self, policy_params, critic_params, obs: jax.Array, key: jax.Array, n: int) -> jax.Array:
        """V(s) = mean_k Q(s, a_k), a_k ~ pi(.|s), k = 1..n: obs [B, O] -> [B]."""
        actions, _ = self.sample_actions(policy_params, obs, key, n)
        return self.critic(critic_params, jnp.repeat(obs[:, None], n, 1), actions).mean(axis=1)


def make_optimizers(
    args: Args,
) -> tuple[optax.GradientTransformation, optax.GradientTransformation, optax.GradientTransformation]:
    """Adam for the policy, the critic and the duals (each gradient clipped on its own),
    with the learning rates as injected hyperparameters that `learner_step` sets
    from `Hyperparams`. One optimizer covers all duals (the seed clips their gradient
    jointly), the temperatures and the alphas at their own learning rates."""
    clip = [optax.clip_by_global_norm(args.max_grad_norm)] if args.max_grad_norm > 0 else []

    def adam(learning_rate):
        return optax.chain(*clip, optax.adam(learning_rate, eps=args.adam_eps))

    def dual_adam(temperature_lr, alpha_lr):
        by_dual = {
            "temperature": optax.adam(temperature_lr, eps=args.adam_eps),
            "alpha": optax.adam(alpha_lr, eps=args.adam_eps),
        }
        labels = Duals("temperature", "alpha", "alpha", "temperature")  # type: ignore[arg-type]  # a pytree of labels
        return optax.chain(*clip, optax.multi_transform(by_dual, labels))

    inject = optax.inject_hyperparams
    return (
        inject(adam)(learning_rate=args.policy_lr / args.m_steps),
        inject(adam)(learning_rate=args.critic_lr),
        inject(dual_adam)(temperature_lr=args.temperature_lr, alpha_lr=args.alpha_lr),
    )


def with_hyperparams(opt_state, **values: jax.Array):
    """An inject_hyperparams optimizer state with some hyperparameters replaced."""
    return opt_state._replace(hyperparams={**opt_state.hyperparams, **values})


def critic_targets(args: Args, model: Model, learner: Learner, w: Transition, key: jax.Array) -> jax.Array:
    """Targets [B] for Q(s_0, a_0) from windows [B, n] (target networks, no gradient)."""
    gamma = learner.hparams.gamma
    if args.critic_target == "td":
        returns, discount, last = n_step_targets(w.reward, w.terminated, w.truncated, gamma)
        bootstrap_obs = jnp.take_along_axis(w.final_obs, last[:, None, None], axis=1)[:, 0]
        v_next = model.expected_q(learner.target_policy, learner.target_critic, bootstrap_obs, key, args.num_samples)
        return returns + discount * v_next
    # Retrace: Q and V along the window, importance ratios of the target policy.
    batch, steps = w.reward.shape
    flat = lambda x: x.reshape((batch * steps,) + x.shape[2:])
    q = model.critic(learner.target_critic, w.obs, w.action)  # [B, n]
    v_next = model.expected_q(learner.target_policy, learner.target_critic, flat(w.final_obs), key, args.num_samples)
    mean, log_std = model.policy(learner.target_policy, w.obs)
    log_rho = gaussian_log_prob(w.action, mean, log_std) - w.log_prob
    return jax.vmap(retrace_target, in_axes=(0, 0, 0, 0, 0, 0, None, None))(
        q,
        v_next.reshape(batch, steps),
        w.reward,
        w.terminated,
        w.truncated,
        log_rho,
        gamma,
        learner.hparams.retrace_lambda,
    )


def learner_step(args: Args, model: Model, learner: Learner, w: Transition, key: jax.Array):
    """One MPO update on windows [B, n], in the seed's order: target sync if due,
    critic step, dual step, M-step(s) with the updated multipliers. With
    `skip_nonfinite`, skipped (state unchanged, counted) when anything
    computed is not finite. Returns (Learner, metrics of scalars)."""
    hp = learner.hparams
    target_key, e_key = jax.random.split(key)
    if args.target_update_rate == 0.0:
        sync = learner.gradient_steps % args.target_copy_period == 0
        learner = learner.replace(
            target_policy=jax.tree.map(lambda t, p: jnp.where(sync, p, t), learner.target_policy, learner.policy),
            target_critic=jax.tree.map(lambda t, p: jnp.where(sync, p, t), learner.target_critic, learner.critic),
        )
    obs, action = w.obs[:, 0], w.action[:, 0]

    # Critic: regress Q(s_0, clip(a_0)) on the target.
    y = jax.lax.stop_gradient(critic_targets(args, model, learner, w, target_key))
    critic_loss_fn = lambda params: jnp.mean(jnp.square(model.critic(params, obs, action) - y))
    critic_loss, critic_grads = jax.value_and_grad(critic_loss_fn)(learner.critic)
    critic_opt = with_hyperparams(learner.critic_opt, learning_rate=hp.critic_lr)
    updates, critic_opt = model.critic_tx.update(critic_grads, critic_opt, learner.critic)
    critic_params = optax.apply_updates(learner.critic, updates)

    # E-step with the target networks: N actions per state, scored by the target critic.
    sampled, (target_mean, target_log_std) = model.sample_actions(learner.target_policy, obs, e_key, args.num_samples)
    sampled_q = model.critic(learner.target_critic, jnp.repeat(obs[:, None], args.num_samples, 1), sampled)  # [B, N]
    online_mean, online_log_std = model.policy(learner.policy, obs)
    kl_mean, kl_stddev = decoupled_kls(online_mean, online_log_std, target_mean, target_log_std)

    def dual_loss_fn(duals: Duals):
        q_weights, temperature_loss = e_step(sampled_q, positive(duals.temperature), hp.epsilon)
        loss = temperature_loss + alpha_loss(positive(duals.alpha_mean), kl_mean, hp.epsilon_mean)
        loss = loss + alpha_loss(positive(duals.alpha_stddev), kl_stddev, hp.epsilon_stddev)
        weights = q_weights
        if args.action_penalization:
            # MO-MPO (Abdolmaleki et al. 2020): a second objective, -||a - clip(a)||, with its own temperature.
            cost = -jnp.linalg.norm(sampled - jnp.clip(sampled, model.low, model.high), axis=-1)
            penalty_weights, penalty_loss = e_step(cost, positive(duals.penalty_temperature), hp.epsilon_penalty)
            weights, loss = weights + penalty_weights, loss + penalty_loss
        return loss, (weights, q_weights)

    (dual_loss, (weights, q_weights)), dual_grads = jax.value_and_grad(dual_loss_fn, has_aux=True)(learner.duals)
    dual_opt = with_hyperparams(learner.dual_opt, temperature_lr=hp.temperature_lr, alpha_lr=hp.alpha_lr)
    updates, dual_opt = model.dual_tx.update(dual_grads, dual_opt, learner.duals)
    # Project the raw duals after the step (Acme), not in the forward pass: a
    # forward clamp would freeze a dual below -18 for good.
    duals = jax.tree.map(lambda x: jnp.maximum(x, -18.0), optax.apply_updates(learner.duals, updates))

    # M-step with the updated multipliers.
    alpha_mean, alpha_stddev = positive(duals.alpha_mean), positive(duals.alpha_stddev)

    def policy_loss_fn(params):
        mean, log_std = model.policy(params, obs)
        return m_step_loss(mean, log_std, target_mean, target_log_std, sampled, weights, alpha_mean, alpha_stddev)

    def m_step(carry, _):
        params, opt_state = carry
        (loss, _), grads = jax.value_and_grad(policy_loss_fn, has_aux=True)(params)
        updates, opt_state = model.policy_tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    policy_opt = with_hyperparams(learner.policy_opt, learning_rate=hp.policy_lr / args.m_steps)
    (policy_params, policy_opt), policy_losses = jax.lax.scan(m_step, (learner.policy, policy_opt), None, args.m_steps)

    new = learner.replace(
        policy=policy_params,
        critic=critic_params,
        duals=duals,
        policy_opt=policy_opt,
        critic_opt=critic_opt,
        dual_opt=dual_opt,
        gradient_steps=learner.gradient_steps + 1,
    )
    if args.target_update_rate > 0.0:
        polyak = lambda t, p: (1.0 - hp.target_update_rate) * t + hp.target_update_rate * p
        new = new.replace(
            target_policy=jax.tree.map(polyak, new.target_policy, new.policy),
            target_critic=jax.tree.map(polyak, new.target_critic, new.critic),
        )
    if args.skip_nonfinite:
        ok = all_finite((w, y, critic_loss, dual_loss, policy_losses, critic_params, policy_params, duals))
        learner = jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, learner)
        learner = learner.replace(skipped=learner.skipped + (~ok).astype(jnp.int32))
    else:  # applied as computed: a non-finite state stops the run as diverged (common/runner.py)
        learner = new
    e_step_kl = weights_kl_to_uniform(q_weights)
    metrics = {
        "critic_loss": critic_loss,
        "policy_loss": policy_losses[-1],
        "dual_loss": dual_loss,
        "temperature": positive(duals.temperature),
        "alpha_mean": alpha_mean.mean(),
        "alpha_stddev": alpha_stddev.mean(),
        "kl_mean": kl_mean.mean(),
        "kl_stddev": kl_stddev.mean(),
        "kl_q_rel": e_step_kl.mean() / hp.epsilon,
        "q_weight_entropy": -jnp.mean(jnp.sum(q_weights * jnp.log(q_weights + 1e-8), axis=-1)),
        "q_min": sampled_q.min(),
        "q_max": sampled_q.max(),
        "policy_std_min": jnp.exp(target_log_std).min(),
        "policy_std_max": jnp.exp(target_log_std).max(),
    }
    return learner, metrics


class MPO(NamedTuple):
    init: Any  # (key, hparams=None) -> RunnerState
    update: Any  # RunnerState -> (RunnerState, metrics)
    train: Any  # (key, hparams=None) -> (RunnerState, metrics [num_updates])
    evaluate: Any  # (RunnerState, key) -> returns [eval_episodes]; with --capture-video also an envs.Recording
    learner_step: Any  # (Learner, batch windows, key) -> (Learner, metrics): one MPO update
    spec: envs.EnvSpec
    model: Model


def make_train(args: Args) -> MPO:
    spec = envs.spec(*envs.make(args.env_id))
    if spec.discrete:
        raise ValueError(
            f"{args.env_id} has a discrete action space; this MPO fits a Gaussian policy for continuous "
            "actions (use algos/rainbow.py or algos/ppo.py for discrete ones)"
        )
    env, env_params = envs.make(args.env_id, args.num_envs, flatten_obs=True)
    eval_env, _ = envs.make(args.env_id, args.eval_episodes, flatten_obs=True)
    if args.capture_video:  # record each seed's first evaluation episode for a video (jaxzoo.video)
        eval_env = envs.RecordEpisode(eval_env, spec.max_episode_steps + 1)
    obs_dim = int(np.prod(spec.obs_shape))
    action_dim = spec.num_actions
    model = Model(
        nnx.graphdef(nnx.eval_shape(lambda: Policy(obs_dim, action_dim, args, nnx.Rngs(0)))),
        nnx.graphdef(nnx.eval_shape(lambda: Critic(obs_dim, spec, args, nnx.Rngs(0)))),
        *make_optimizers(args),
        jnp.asarray(spec.action_low),
        jnp.asarray(spec.action_high),
    )
    vector_steps = args.train_frequency // args.num_envs
    window = args.n_step
    step = functools.partial(learner_step, args, model)

    def init(key: jax.Array, hparams: Hyperparams | None = None) -> RunnerState:
        hparams = Hyperparams.from_args(args) if hparams is None else hparams
        key, policy_key, critic_key, env_key = jax.random.split(key, 4)
        policy_params = nnx.split(Policy(obs_dim, action_dim, args, nnx.Rngs(policy_key)))[1]
        critic_params = nnx.split(Critic(obs_dim, spec, args, nnx.Rngs(critic_key)))[1]
        duals = Duals(
            temperature=jnp.float32(args.init_temperature),
            alpha_mean=jnp.full(action_dim, args.init_alpha_mean, jnp.float32),
            alpha_stddev=jnp.full(action_dim, args.init_alpha_stddev, jnp.float32),
            penalty_temperature=jnp.float32(args.init_temperature),
        )
        learner = Learner(
            policy=policy_params,
            critic=critic_params,
            target_policy=policy_params,
            target_critic=critic_params,
            duals=duals,
            policy_opt=model.policy_tx.init(policy_params),
            critic_opt=model.critic_tx.init(critic_params),
            dual_opt=model.dual_tx.init(duals),
            gradient_steps=jnp.int32(0),
            skipped=jnp.int32(0),
            hparams=hparams,
        )
        obs, env_state = env.reset(env_key, env_params)
        example = Transition(
            obs[0], jnp.zeros(action_dim), jnp.float32(0), jnp.float32(0), jnp.bool_(False), jnp.bool_(False), obs[0]
        )
        return RunnerState(
            learner, buffers.init(example, args.buffer_size, args.num_envs), env_state, obs, key, jnp.int32(0)
        )

    def act(state: RunnerState, _):
        """One step of every env with a Gaussian sample of the online policy: actions [num_envs, A]."""
        key, action_key, step_key = jax.random.split(state.key, 3)
        mean, log_std = model.policy(state.learner.policy, state.obs)
        action = mean + jnp.exp(log_std) * jax.random.normal(action_key, mean.shape)
        next_obs, env_state, reward, terminated, truncated, info = env.step(
            step_key, state.env_state, action, env_params
        )
        transition = Transition(
            state.obs,
            action,
            gaussian_log_prob(action, mean, log_std),
            reward,
            terminated,
            truncated,
            info["final_observation"],
        )
        state = state.replace(
            buffer=buffers.add(state.buffer, transition),
            env_state=env_state,
            obs=next_obs,
            key=key,
            env_steps=state.env_steps + args.num_envs,
        )
        return state, {k: info[k] for k in ("episode_done", "episode_return", "episode_length")}

    def learn(state: RunnerState, _):
        """One learner step on `batch_size` windows [B, n_step] drawn uniformly from replay."""
        key, sample_key, step_key = jax.random.split(state.key, 3)
        sample = buffers.sample(state.buffer, sample_key, args.batch_size, window)
        windows = parallel.constrain_data(sample.windows)  # --parallel data: the batch is split over devices
        learner, metrics = step(state.learner, windows, step_key)
        return state.replace(learner=learner, key=key), metrics

    def phase(state: RunnerState, _):
        """train_frequency env steps, then gradient_steps learner steps once learning has started."""
        state, episode_info = jax.lax.scan(act, state, None, vector_steps)
        learning = (state.env_steps >= args.learning_starts) & buffers.can_sample(state.buffer, window)

        def do_learn(state):
            return jax.lax.scan(learn, state, None, args.gradient_steps)

        def skip(state):
            shapes = jax.eval_shape(do_learn, state)[1]
            return state, jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype), shapes)

        state, metrics = jax.lax.cond(learning, do_learn, skip, state)
        return state, (episode_info, metrics)

    def update(state: RunnerState):
        """`steps_per_update` env steps per seed with their learner steps; metrics
        are means over that stretch (NaN before learning starts)."""
        state, (episode_info, metrics) = jax.lax.scan(phase, state, None, args.phases_per_update)
        skipped = {"skipped_updates": state.learner.skipped.astype(jnp.float32)} if args.skip_nonfinite else {}
        return state, {
            **envs.episode_metrics(episode_info),
            **jax.tree.map(jnp.nanmean, metrics),
            "learner_steps": state.learner.gradient_steps.astype(jnp.float32),
            **skipped,
        }

    def train(key: jax.Array, hparams: Hyperparams | None = None):
        """The whole run as one `lax.scan` over updates: jit it, vmap it over
        seeds (keys) and hyperparameters."""
        return jax.lax.scan(lambda s, _: update(s), init(key, hparams), None, args.num_updates)

    def evaluate(state: RunnerState, key: jax.Array) -> jax.Array:
        """The policy mean (clipped by the env), one episode in each of `eval_episodes` envs."""
        mean_action = lambda obs: model.policy(state.learner.policy, obs)[0]
        return envs.evaluate_episodes(eval_env, env_params, mean_action, key, spec.max_episode_steps + 1)

    return MPO(init, update, train, evaluate, step, spec, model)


# --------------------------------------------------------------------------- #
# Host loop
# --------------------------------------------------------------------------- #
def main(args: Args) -> runner.RunResult:
    """Train `num_seeds` seeds in chunks of `log_every` updates (common/runner.py:
    run directory, metrics.csv, progress, checkpoints with replay, resume), then evaluate."""
    # Resume, run-root and cache checks, before anything is built; the CPU devices of --parallel (Args.DATA_AXIS).
    args = runner.prepare(args, "mpo")
    algo = make_train(args)
    return runner.run(
        args,
        "mpo",
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
        main(cli.parse(Args, "mpo"))
