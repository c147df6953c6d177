"""IMPALA's and APPO's formulas against slow reference loops and PPO."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxzoo.algos import impala, ppo
from jaxzoo.algos.impala import appo_surrogate, vtrace


def vtrace_by_definition(behaviour_lp, target_lp, rewards, values, next_values, terminated, truncated, gamma, lam,
                         rho_bar, c_bar):
    """Eq. 1 of the IMPALA paper as a sum, one (s, env) at a time:

        v_s = V(x_s) + sum_{t=s}^{end} gamma^{t-s} (prod_{i=s}^{t-1} c_i) delta_t,

    delta_t = rho_t (r_t + gamma V(x_{t+1}) - V(x_t)), V(x_{t+1}) = next_values[t]
    (0 if terminated), the sum stopping at the episode's or the rollout's end;
    c_i = lam min(c_bar, pi/mu). Eq. 4's advantage: rho_s (r_s + gamma v_{s+1} - V(x_s)),
    v_{s+1} = next_values[s] at an episode or rollout end."""
    T, N = rewards.shape
    ratio = np.exp(target_lp.astype(np.float64) - behaviour_lp)
    rho, c = np.minimum(rho_bar, ratio), lam * np.minimum(c_bar, ratio)
    bootstrap = np.where(terminated, 0.0, next_values)
    delta = rho * (rewards + gamma * bootstrap - values)
    targets = np.zeros((T, N))
    for n in range(N):
        for s in range(T):
            total, weight = 0.0, 1.0
            for t in range(s, T):
                total += weight * delta[t, n]
                if terminated[t, n] or truncated[t, n]:
                    break
                weight *= gamma * c[t, n]
            targets[s, n] = values[s, n] + total
    advantages = np.zeros((T, N))
    for n in range(N):
        for s in range(T):
            ends = terminated[s, n] or truncated[s, n] or s == T - 1
            next_target = next_values[s, n] if ends else targets[s + 1, n]
            next_target = 0.0 if terminated[s, n] else next_target
            advantages[s, n] = rho[s, n] * (rewards[s, n] + gamma * next_target - values[s, n])
    return targets, advantages


def lambda_return_by_definition(rewards, values, next_values, terminated, truncated, gamma, lam):
    """The lambda-return G_s = r_s + gamma [(1 - lam) V(x_{s+1}) + lam G_{s+1}],
    G_{s+1} replaced by V(x_{s+1}) (= next_values[s]) where the episode or the
    rollout ends, and no bootstrap after a termination."""
    T, N = rewards.shape
    returns = np.zeros((T, N))
    for n in range(N):
        following = 0.0
        for s in reversed(range(T)):
            bootstrap = 0.0 if terminated[s, n] else next_values[s, n]
            if terminated[s, n] or truncated[s, n] or s == T - 1:
                following = bootstrap
            else:
                following = (1 - lam) * bootstrap + lam * following
            returns[s, n] = rewards[s, n] + gamma * following
            following = returns[s, n]
    return returns


def random_rollout(seed, T=40, N=3, consistent=False):
    """Random [T, N] data with terminations and truncations. `consistent`: the
    bootstrap value of a step inside an episode is the next step's value, as
    when both come from one critic (V(final obs) = V(next obs) without a reset)."""
    rng = np.random.default_rng(seed)
    f = lambda: rng.normal(size=(T, N)).astype(np.float32)
    rewards, values, next_values, behaviour_lp = f(), f(), f(), f() - 1.0
    target_lp = behaviour_lp + 0.7 * f()
    ends = rng.random((T, N))
    terminated, truncated = ends < 0.1, (ends >= 0.1) & (ends < 0.2)
    if consistent:
        inside = ~(terminated | truncated)[:-1]
        next_values[:-1] = np.where(inside, values[1:], next_values[:-1])
    return behaviour_lp, target_lp, rewards, values, next_values, terminated, truncated


@pytest.mark.parametrize("seed, lam, rho_bar, c_bar", [(0, 1.0, 1.0, 1.0), (1, 0.9, 1.5, 0.8), (2, 0.5, 0.5, 2.0)])
def test_vtrace_matches_the_definition_with_terminations_and_truncations(seed, lam, rho_bar, c_bar):
    data = random_rollout(seed)
    *_, terminated, truncated = data
    assert terminated.any() and truncated.any()
    ratio = np.exp(data[1] - data[0])
    assert (ratio > max(rho_bar, c_bar)).any() and (ratio < min(rho_bar, c_bar)).any()  # both truncations bite
    out = vtrace(*map(jnp.asarray, data), 0.97, lam, rho_bar, c_bar)
    targets, advantages = vtrace_by_definition(*data, 0.97, lam, rho_bar, c_bar)
    np.testing.assert_allclose(out.targets, targets, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out.pg_advantages, advantages, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out.rhos, np.minimum(rho_bar, ratio), rtol=1e-6)


@pytest.mark.parametrize("lam", [1.0, 0.95, 0.6])
def test_on_policy_vtrace_without_truncation_is_the_lambda_return(lam):
    """pi = mu and rho_bar = c_bar = infinity (1e9): every rho is 1, every c is
    lambda, and v_s is the lambda-return; the advantage is the one-step TD
    error to the next lambda-return."""
    behaviour_lp, _, rewards, values, next_values, terminated, truncated = random_rollout(3, consistent=True)
    out = vtrace(*map(jnp.asarray, (behaviour_lp, behaviour_lp, rewards, values, next_values, terminated, truncated)),
                 0.99, lam, 1e9, 1e9)
    returns = lambda_return_by_definition(rewards, values, next_values, terminated, truncated, 0.99, lam)
    np.testing.assert_allclose(out.targets, returns, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(out.rhos, 1.0)
    # Advantage = r_s + gamma v_{s+1} - V(x_s), v_{s+1} the next lambda-return inside an episode.
    inside = ~(terminated | truncated)[:-1]
    expected = rewards[:-1] + 0.99 * np.where(inside, returns[1:], np.where(terminated[:-1], 0, next_values[:-1]))
    np.testing.assert_allclose(out.pg_advantages[:-1], expected - values[:-1], rtol=1e-4, atol=1e-4)
    # ... and with lambda = 1 the targets equal GAE(1) returns of ppo.py.
    if lam == 1.0:
        _, gae_returns = ppo.compute_gae(*map(jnp.asarray, (rewards, values, next_values, terminated, truncated)),
                                         0.99, 1.0)
        np.testing.assert_allclose(out.targets, gae_returns, rtol=1e-4, atol=1e-4)


def test_truncation_bootstraps_termination_does_not_and_both_cut_the_trace():
    # One env, 3 steps; the episode ends at step 1, then a new one starts.
    ones = jnp.ones((3, 1))
    values = 0.5 * ones
    next_values = jnp.array([[0.5], [10.0], [0.5]])  # V(final observation) at step 1 is 10
    end = jnp.array([[False], [True], [False]])
    no_end = jnp.zeros_like(end)
    zeros = jnp.zeros((3, 1))
    truncated = vtrace(zeros, zeros, ones, values, next_values, no_end, end, 0.9, 1.0, 1.0, 1.0)
    terminated = vtrace(zeros, zeros, ones, values, next_values, end, no_end, 0.9, 1.0, 1.0, 1.0)
    assert truncated.targets[1, 0] == pytest.approx(1 + 0.9 * 10)
    assert terminated.targets[1, 0] == pytest.approx(1.0)
    assert truncated.pg_advantages[1, 0] == pytest.approx(1 + 0.9 * 10 - 0.5)
    assert terminated.pg_advantages[1, 0] == pytest.approx(0.5)
    # Step 2 belongs to the next episode: it does not leak into step 1, and step 0 sees step 1's target.
    assert truncated.targets[2, 0] == pytest.approx(1 + 0.9 * 0.5)
    assert truncated.targets[0, 0] == pytest.approx(1 + 0.9 * (1 + 0.9 * 10))


def test_off_policy_weights_scale_the_correction():
    """rho truncates the temporal difference: a target policy 4x more likely
    than the behaviour counts at most rho_bar times."""
    T = 1
    behaviour_lp, target_lp = jnp.log(jnp.full((T, 1), 0.2)), jnp.log(jnp.full((T, 1), 0.8))
    reward, value, next_value = jnp.ones((T, 1)), jnp.zeros((T, 1)), jnp.zeros((T, 1))
    no = jnp.zeros((T, 1), bool)
    for rho_bar, expected in [(1.0, 1.0), (2.0, 2.0), (10.0, 4.0)]:
        out = vtrace(behaviour_lp, target_lp, reward, value, next_value, no, no, 0.9, 1.0, rho_bar, 1.0)
        assert out.targets[0, 0] == pytest.approx(expected, rel=1e-5)
        assert out.pg_advantages[0, 0] == pytest.approx(expected, rel=1e-5)


def test_appo_without_lag_is_ppos_clipped_surrogate():
    """Lag 0 and a fresh target network: behaviour = target, and APPO's policy
    loss is exactly PPO's clipped surrogate (ppo.py), ratios and gradients too."""
    keys = jax.random.split(jax.random.key(0), 3)
    new_lp, behaviour_lp, advantage = (jax.random.normal(k, (256,)) * 0.3 for k in keys)
    ours = appo_surrogate(new_lp, behaviour_lp, behaviour_lp, advantage, 0.2, 2.0)
    theirs = ppo.clipped_surrogate(new_lp, behaviour_lp, advantage, 0.2)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(a, b)
    assert (np.abs(np.asarray(ours[1]) - 1) > 0.2).any()  # clipping bites somewhere in this draw
    grad = lambda f: jax.grad(lambda lp: f(lp)[0].mean())(new_lp)
    np.testing.assert_array_equal(
        grad(lambda lp: appo_surrogate(lp, behaviour_lp, behaviour_lp, advantage, 0.2, 2.0)),
        grad(lambda lp: ppo.clipped_surrogate(lp, behaviour_lp, advantage, 0.2)),
    )


def test_appo_ratio_is_against_the_target_with_the_behaviour_ratio_clipped():
    """r = min(mu / pi_target, c) * pi / mu (RLlib's APPO, IMPACT's target-worker clipping)."""
    new_lp, target_lp = jnp.log(jnp.array([0.5, 0.5])), jnp.log(jnp.array([0.4, 0.1]))
    behaviour_lp = jnp.log(jnp.array([0.3, 0.3]))  # mu / pi_target = 0.75 (kept), 3 (clipped to 2)
    _, ratio = appo_surrogate(new_lp, behaviour_lp, target_lp, jnp.ones(2), 0.2, 2.0)
    np.testing.assert_allclose(ratio, [0.5 / 0.4, 2.0 * 0.5 / 0.3], rtol=1e-6)


def test_the_shared_formulas_are_ppos_copies():
    """clipped_surrogate, explained_variance and adapt_kl_coef are the text of
    ppo.py's (one formula, one form: docs/glossary.md)."""
    import inspect

    for name in ("clipped_surrogate", "explained_variance", "adapt_kl_coef"):
        assert inspect.getsource(getattr(impala, name)) == inspect.getsource(getattr(ppo, name)), name


def loss_inputs(appo=False, lag_kl=0.0):
    """A tiny network, a random [T, M] batch and its Hyperparams."""
    from flax import nnx

    from jaxzoo import envs

    spec = envs.EnvSpec((4,), True, 2, None, None, 10)
    graphdef, params = nnx.split(impala.ActorCritic(spec, "mlp", (8,), "tanh", False, nnx.Rngs(0)))
    keys = jax.random.split(jax.random.key(1), 4)
    T, M = 5, 3
    obs = jax.random.normal(keys[0], (T, M, 4))
    action = jax.random.randint(keys[1], (T, M), 0, 2)
    dist = nnx.merge(graphdef, params).act(obs)
    behaviour_lp = dist.log_prob(action) + lag_kl * jax.random.normal(keys[2], (T, M))
    ends = jax.random.uniform(keys[3], (T, M))
    batch = impala.Batch(obs, action, behaviour_lp, jnp.ones((T, M)), ends < 0.1, (ends > 0.1) & (ends < 0.2),
                         obs + 0.1)
    args = impala.Args(appo=appo)
    return graphdef, params, batch, impala.Hyperparams.from_args(args)


def test_impala_policy_gradient_is_the_advantage_weighted_score():
    """d loss / d logits of the IMPALA loss (ent_coef = 0, value_coef = 0) is
    -A_t d log pi(a_t|x_t) / d logits / (T M), with A_t the V-trace advantage
    held constant (eq. 4)."""
    graphdef, params, batch, hp = loss_inputs(lag_kl=0.3)
    hp = hp.replace(ent_coef=jnp.float32(0), value_coef=jnp.float32(0))
    loss, stats = impala.learner_loss(params, None, batch, hp, jnp.float32(0), graphdef=graphdef, appo=False,
                                      target_worker_clipping=2.0)
    from flax import nnx

    model = nnx.merge(graphdef, params)
    dist, values = model(batch.obs)
    trace = vtrace(batch.behaviour_log_prob, dist.log_prob(batch.action), batch.reward, values,
                   model.value(batch.final_obs), batch.terminated, batch.truncated, hp.gamma, hp.vtrace_lambda,
                   hp.rho_bar, hp.c_bar)
    assert loss == pytest.approx(float(-(trace.pg_advantages * dist.log_prob(batch.action)).mean()), rel=1e-5)
    assert stats["behaviour_kl"] > 0  # the batch is off-policy
    # The gradient flows through log pi only, not through the advantages (or rho).
    grads = jax.grad(lambda p: impala.learner_loss(p, None, batch, hp, jnp.float32(0), graphdef=graphdef,
                                                   appo=False, target_worker_clipping=2.0)[0])(params)

    def score_loss(p):
        return -(jax.lax.stop_gradient(trace.pg_advantages) * nnx.merge(graphdef, p).act(batch.obs).log_prob(
            batch.action)).mean()

    expected = jax.grad(score_loss)(params)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_appo_kl_penalty_is_the_kl_to_the_target_network():
    graphdef, params, batch, hp = loss_inputs(appo=True)
    moved = jax.tree.map(lambda p: p + 0.3, params)
    base = impala.learner_loss(params, moved, batch, hp, jnp.float32(0), graphdef=graphdef, appo=True,
                               target_worker_clipping=2.0)
    penalised = impala.learner_loss(params, moved, batch, hp, jnp.float32(0.5), graphdef=graphdef, appo=True,
                                    target_worker_clipping=2.0)
    assert base[1]["target_kl"] > 0
    assert penalised[0] == pytest.approx(float(base[0]) + 0.5 * float(base[1]["target_kl"]), rel=1e-5)
    same = impala.learner_loss(params, params, batch, hp, jnp.float32(0.5), graphdef=graphdef, appo=True,
                               target_worker_clipping=2.0)
    assert same[1]["target_kl"] == pytest.approx(0.0, abs=1e-7)
