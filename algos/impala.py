"""IMPALA with V-trace, and APPO as a flag, the whole run in one `jax.jit`.

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
KL penalty. This file is the in-jit ("Anakin") form: rollout and learning in
one compiled `lax.scan`, vmapped over seeds, the lag made explicit: the actors
use the learner's parameters of `policy_lag` updates ago, kept in a ring in
the runner state.

    python algos/impala.py                                  # CartPole-v1, 1M steps
    python algos/impala.py --appo --policy-lag 4
    python algos/impala.py --preset rllib-appo --num-seeds 4

Details, logged metrics and measured results: docs/impala.md.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NamedTuple, TypeAlias

import chex
import distrax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct

from jaxzoo import cli, envs, layers, parallel, runner
from jaxzoo.checks import AtLeastOne, Fraction, NonNegative, Positive, check_fields


# --------------------------------------------------------------------------- #
# Arguments
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class Args:
    """IMPALA (Espeholt et al. 2018) or APPO on a gymnax environment, jitted end to end."""

    exp_name: str = "impala"
    """name of the experiment: part of the run directory and the plot label"""
    seed: Annotated[int, NonNegative] = 0
    """seed of the first run; seed index i uses seed + i"""
    num_seeds: Annotated[int, AtLeastOne] = 1
    """independent seeds trained at once with `jax.vmap`"""
    env_id: str = "CartPole-v1"
    """gymnax environment id"""
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
    """devices: seeds shards the seed axis, data shards one run's data and averages gradients (off: one device; auto: seeds over the devices that divide num_seeds; docs/scaling.md)"""
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

    # algorithm-specific
    appo: bool = False
    """APPO: PPO's clipped surrogate on the V-trace advantages against a target network (RLlib's APPO); else IMPALA's V-trace policy gradient (eq. 4)"""
    policy_lag: Annotated[int, NonNegative] = 2
    """updates by which the actors' parameters lag the learner's: actors act with the parameters of policy_lag updates ago (0: on-policy)"""
    max_episode_steps: Annotated[int, NonNegative] = 0
    """time limit of an episode in env steps; 0 keeps the env's own (200 makes CartPole-v1 into CartPole-v0)"""
    num_envs: Annotated[int, AtLeastOne] = 16
    """parallel environments per seed (actors)"""
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
    torso: Literal["auto", "mlp", "cnn"] = "auto"
    """network torso: auto picks cnn for image observations [H, W, C], mlp otherwise"""
    hidden_sizes: Annotated[tuple[int, ...], AtLeastOne] = (64, 64)
    """MLP layer widths (after the convolution for the cnn torso)"""
    activation: Literal["tanh", "relu"] = "tanh"
    """hidden-layer activation"""
    shared_torso: bool = False
    """actor and critic share one torso (else two separate ones)"""

    def __post_init__(self):
        check_fields(self)  # the ranges beside the fields (jaxzoo.checks)
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

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.batch_size


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


# A categorical over logits for discrete actions, a diagonal Gaussian for continuous ones.
Distribution: TypeAlias = "distrax.Categorical | distrax.MultivariateNormalDiag"


class ActorCritic(nnx.Module):
    """obs [..., *obs_shape] -> (policy, value [...]); the leading axes are
    free, so the learner evaluates a whole [T, N] trajectory batch at once.

    Discrete: logits [..., A]. Continuous: Gaussian mean [..., A] with a
    learned, state-independent log-std [A]. The policy head starts near
    uniform (orthogonal gain 0.01), the value head with gain 1.
    """

    def __init__(self, spec: envs.EnvSpec, torso: str, hidden_sizes, activation, shared_torso, rngs: nnx.Rngs):
        def make_torso():
            if torso == "cnn":
                return MinAtarCNN(spec.obs_shape, hidden_sizes, activation, rngs)
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
    evaluate: Any  # (RunnerState, key) -> episode returns [eval_episodes]
    policy: Any  # (params, obs [B, *obs_shape]) -> (distribution, value [B])
    spec: envs.EnvSpec


def make_train(args: Args) -> IMPALA:
    max_steps = {"max_episode_steps": args.max_episode_steps} if args.max_episode_steps else {}
    probe_env, probe_params = envs.make(args.env_id)
    probe_spec = envs.spec(probe_env, probe_params)
    image_obs = len(probe_spec.obs_shape) == 3
    torso = args.torso if args.torso != "auto" else ("cnn" if image_obs else "mlp")
    if torso == "cnn" and not image_obs:
        raise ValueError(
            f"torso='cnn' needs image observations [H, W, C]; {args.env_id} observations "
            f"have shape {probe_spec.obs_shape} (use torso='mlp' or 'auto')"
        )
    env, env_params = envs.make(args.env_id, args.num_envs, flatten_obs=torso == "mlp", **max_steps)
    eval_env, _ = envs.make(args.env_id, args.eval_episodes, flatten_obs=torso == "mlp", **max_steps)
    spec = envs.spec(env, env_params)
    build = lambda key: ActorCritic(spec, torso, args.hidden_sizes, args.activation, args.shared_torso, nnx.Rngs(key))
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: build(0)))
    num_updates, lag = args.num_updates, args.policy_lag

    def policy(params: nnx.State, obs: jax.Array):
        return nnx.merge(graphdef, params)(obs)

    def make_optimizer(learning_rate):
        adam = optax.adam(learning_rate, eps=args.adam_eps)
        return optax.chain(optax.clip_by_global_norm(args.max_grad_norm), adam) if args.max_grad_norm > 0 else adam

    optimizer = optax.inject_hyperparams(make_optimizer)(learning_rate=args.learning_rate)

    def init(key: jax.Array, hparams: Hyperparams | None = None) -> RunnerState:
        hparams = Hyperparams.from_args(args) if hparams is None else hparams
        key, model_key, env_key = jax.random.split(key, 3)
        params = nnx.split(build(model_key))[1]
        obs, env_state = env.reset(env_key, env_params)
        return RunnerState(
            params=params,
            target_params=params if args.appo else None,
            # Until policy_lag updates have happened, the actors use the initial parameters.
            actor_params=jax.tree.map(lambda p: jnp.stack([p] * lag), params) if lag else None,
            actor_slot=jnp.zeros((), jnp.int32),
            opt_state=optimizer.init(params),
            env_state=env_state,
            obs=obs,
            key=key,
            update_step=jnp.zeros((), jnp.int32),
            gradient_steps=jnp.zeros((), jnp.int32),
            kl_coef=jnp.float32(args.kl_coef),
            hparams=hparams,
        )

    def update(state: RunnerState) -> tuple[RunnerState, dict[str, jax.Array]]:
        """One iteration: the actors roll out with parameters `policy_lag`
        updates old, the learner takes update_epochs x num_minibatches
        gradient steps on it, and its new parameters enter the actors' ring."""
        hp = state.hparams
        slot = state.actor_slot
        behaviour_params = state.params if lag == 0 else jax.tree.map(lambda ring: ring[slot], state.actor_params)
        key, rollout_key, learn_key = jax.random.split(state.key, 3)
        (env_state, obs, _), traj = collect_rollout(
            env, env_params, graphdef, behaviour_params, state.env_state, state.obs, rollout_key, args.num_steps
        )
        batch = Batch(
            traj.obs, traj.action, traj.behaviour_log_prob, traj.reward, traj.terminated, traj.truncated, traj.final_obs
        )
        # Linear annealing as in PureJaxRL: lr_k = lr * (1 - k / num_updates).
        fraction_left = 1.0 - state.update_step / num_updates if args.anneal_lr else 1.0
        learning_rate = hp.learning_rate * fraction_left
        opt_state = state.opt_state._replace(
            hyperparams={**state.opt_state.hyperparams, "learning_rate": learning_rate}
        )
        carry = (state.params, state.target_params, opt_state, state.gradient_steps)
        (params, target_params, opt_state, gradient_steps), stats = learn(
            args, graphdef, optimizer, batch, carry, hp, state.kl_coef, learn_key
        )
        stats = jax.tree.map(jnp.mean, stats)  # means over the update's gradient steps [epochs, minibatches]
        kl_coef = state.kl_coef
        if args.kl_coef > 0:  # RLlib adapts it after each training step
            kl_coef = adapt_kl_coef(kl_coef, stats["target_kl"], args.kl_target)
        actor_params = state.actor_params
        if lag:
            # The parameters this update started from replace the oldest copy: the ring
            # now holds the learner's last `lag` parameter versions, oldest at slot + 1.
            actor_params = jax.tree.map(lambda ring, p: ring.at[slot].set(p), actor_params, state.params)
        new_state = state.replace(
            params=params,
            target_params=target_params,
            actor_params=actor_params,
            actor_slot=(slot + 1) % max(lag, 1),
            opt_state=opt_state,
            env_state=env_state,
            obs=obs,
            key=key,
            update_step=state.update_step + 1,
            gradient_steps=gradient_steps,
            kl_coef=kl_coef,
        )
        episodes = {"episode_done": traj.episode_done, "episode_return": traj.episode_return}
        metrics = {
            **envs.episode_metrics({**episodes, "episode_length": traj.episode_length}),
            **stats,
            "learning_rate": learning_rate,
            "kl_coef": state.kl_coef,
        }
        return new_state, metrics

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

    return IMPALA(init, update, train, evaluate, policy, spec)


# --------------------------------------------------------------------------- #
# Host loop
# --------------------------------------------------------------------------- #
def main(args: Args) -> runner.RunResult:
    """Train `num_seeds` seeds in chunks of `log_every` updates (common/runner.py:
    run directory, metrics.csv, progress, checkpoints, resume), then evaluate greedily."""
    args = runner.prepare(args, "impala")  # resume, run-root and cache checks, before anything is built
    impala = make_train(args)
    return runner.run(
        args,
        "impala",
        impala.init,
        impala.update,
        impala.evaluate,
        num_updates=args.num_updates,
        steps_per_update=args.batch_size,
        # --parallel data: the environments (axis 0 of env_state and obs) are split over devices.
        data_axes=lambda state: jax.tree.map(lambda _: None, state).replace(env_state=0, obs=0),
        data_size=args.num_envs,
        data_name="num_envs",
    )


if __name__ == "__main__":
    with cli.user_errors():
        main(cli.parse(Args, "impala"))
