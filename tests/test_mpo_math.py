"""MPO's formulas against closed forms, Monte Carlo and hand-computed values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxzoo.algos.mpo import (
    alpha_loss,
    decoupled_kls,
    e_step,
    gaussian_kl,
    gaussian_log_prob,
    m_step_loss,
    n_step_targets,
    positive,
    retrace_target,
    weights_kl_to_uniform,
)


def test_gaussian_kl_closed_form_and_monte_carlo():
    mp, sp, mq, sq = 0.3, 0.5, -0.2, 0.8
    kl = float(gaussian_kl(jnp.float32(mp), jnp.log(jnp.float32(sp)), jnp.float32(mq), jnp.log(jnp.float32(sq))))
    assert kl == pytest.approx(np.log(sq / sp) + (sp**2 + (mp - mq) ** 2) / (2 * sq**2) - 0.5, rel=1e-6)
    assert kl == pytest.approx(0.3606286, rel=1e-5)
    x = mp + sp * jax.random.normal(jax.random.key(0), (1_000_000, 1))
    log_p = gaussian_log_prob(x, jnp.full((1,), mp), jnp.log(jnp.full((1,), sp)))
    log_q = gaussian_log_prob(x, jnp.full((1,), mq), jnp.log(jnp.full((1,), sq)))
    assert float(jnp.mean(log_p - log_q)) == pytest.approx(kl, abs=5e-3)


def test_decoupled_kls_split_mean_and_std():
    target_mean, target_log_std = jnp.array([[0.3]]), jnp.log(jnp.array([[0.5]]))
    mean, log_std = jnp.array([[-0.2]]), jnp.log(jnp.array([[0.8]]))
    kl_mean, kl_stddev = decoupled_kls(mean, log_std, target_mean, target_log_std)
    assert float(kl_mean[0]) == pytest.approx(0.5, rel=1e-5)  # 0.5 * 0.5^2 / 0.5^2
    assert float(kl_stddev[0]) == pytest.approx(0.1653161, rel=1e-5)
    same = decoupled_kls(target_mean, target_log_std, target_mean, target_log_std)
    np.testing.assert_allclose(same, 0.0, atol=1e-7)


def test_temperature_gradient_is_epsilon_minus_realised_kl():
    q = jnp.array([[0.0, 1.0, 2.0, 3.0]])
    weights, _ = e_step(q, jnp.float32(1.0), 0.1)
    np.testing.assert_allclose(weights[0], [0.032059, 0.087144, 0.236883, 0.643914], atol=1e-5)
    kl = float(weights_kl_to_uniform(weights)[0])
    assert kl == pytest.approx(0.4387574, rel=1e-4)
    grad = jax.grad(lambda eta: e_step(q, eta, 0.1)[1])(jnp.float32(1.0))
    assert float(grad) == pytest.approx(0.1 - kl, rel=1e-4)  # -0.3387574 < 0: a descent step raises eta
    assert float(jax.grad(lambda eta: e_step(q, eta, 0.1)[1])(jnp.float32(3.0))) == pytest.approx(0.033687, rel=1e-3)


def test_temperature_rises_when_kl_exceeds_epsilon_and_falls_when_under():
    q = jnp.array([[0.0, 1.0, 2.0, 3.0]])
    step = lambda raw: raw - 0.1 * jax.grad(lambda r: e_step(q, positive(r), 0.1)[1])(raw)
    low, high = jnp.float32(0.5), jnp.float32(3.5)  # eta ~ 0.97 (KL > eps) and ~ 3.53 (KL < eps)
    assert float(step(low)) > float(low) and float(step(high)) < float(high)


def test_e_step_weights():
    q = jax.random.normal(jax.random.key(1), (5, 7)) * 3
    weights, _ = e_step(q, jnp.float32(0.7), 0.1)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
    order = jnp.argsort(q, axis=-1)
    assert (jnp.diff(jnp.take_along_axis(weights, order, -1), axis=-1) > 0).all()  # favour higher Q
    np.testing.assert_allclose(e_step(q + 10.0, jnp.float32(0.7), 0.1)[0], weights, atol=1e-6)  # shift invariant
    np.testing.assert_allclose(e_step(q, jnp.float32(1e6), 0.1)[0], 1 / 7, atol=1e-5)  # hot: uniform
    assert (e_step(q, jnp.float32(1e-3), 0.1)[0].argmax(-1) == q.argmax(-1)).all()  # cold: argmax
    grad_q = jax.grad(lambda q: e_step(q, jnp.float32(0.7), 0.1)[0].sum())(q)
    np.testing.assert_array_equal(grad_q, 0.0)  # no gradient through the weights


def test_alpha_grows_when_its_bound_is_violated():
    grad = lambda kl: float(jax.grad(lambda raw: alpha_loss(positive(raw), jnp.array([kl]), 0.1))(jnp.array([0.0]))[0])
    assert grad(0.2) == pytest.approx(0.5 * (0.1 - 0.2), rel=1e-5)  # sigmoid(0) * (eps - KL) = -0.05
    assert grad(0.05) == pytest.approx(0.025, rel=1e-5)
    step = lambda kl: -grad(kl)
    assert step(0.2) > 0 > step(0.05)


def test_m_step_decoupling_and_stop_gradients():
    rng = np.random.default_rng(0)
    B, N, A = 4, 6, 2
    mean, log_std = jnp.asarray(rng.normal(size=(B, A))), jnp.asarray(rng.normal(size=(B, A)) * 0.1)
    target_mean, target_log_std = mean + 0.1, log_std - 0.1
    actions = jnp.asarray(rng.normal(size=(B, N, A)))
    weights = jax.nn.softmax(jnp.asarray(rng.normal(size=(B, N))), -1)
    alphas = jnp.ones(A)

    def loss(mean, log_std, alpha_mean):
        return m_step_loss(mean, log_std, target_mean, target_log_std, actions, weights, alpha_mean, alphas)[0]

    g_mean, g_log_std, g_alpha = jax.grad(loss, argnums=(0, 1, 2))(mean, log_std, alphas)
    assert np.abs(np.asarray(g_mean)).sum() > 0 and np.abs(np.asarray(g_log_std)).sum() > 0
    np.testing.assert_array_equal(g_alpha, 0.0)  # the multipliers are constants in the policy loss
    # The mean term does not see the policy's std and the std term not its mean:
    mean_only = lambda ls: m_step_loss(mean, ls, target_mean, target_log_std, actions, weights, alphas * 0, alphas * 0)[0]
    std_term = jax.grad(mean_only)(log_std)
    expected = jax.grad(lambda ls: -jnp.mean(jnp.sum(weights * gaussian_log_prob(actions, target_mean[:, None], ls[:, None]), -1)))(log_std)
    np.testing.assert_allclose(std_term, expected, rtol=1e-5, atol=1e-6)


def test_m_step_moves_the_mean_towards_heavily_weighted_actions():
    mean, log_std = jnp.zeros((1, 1)), jnp.zeros((1, 1))
    actions = jnp.array([[[1.0], [-1.0]]])
    weights = jnp.array([[0.99, 0.01]])
    loss = lambda m: m_step_loss(m, log_std, mean, log_std, actions, weights, jnp.zeros(1), jnp.zeros(1))[0]
    assert float((mean - 0.1 * jax.grad(loss)(mean))[0, 0]) > 0


def test_retrace_of_length_one_is_td_and_of_length_two_matches_hand_value():
    f = lambda *a: float(retrace_target(*[jnp.asarray(x, jnp.float32) if not isinstance(x, list) or not isinstance(x[0], bool)
                                          else jnp.asarray(x) for x in a], 0.99, 0.95))
    td = f([1.0], [1.8], [0.5], [False], [False], [0.0])
    assert td == pytest.approx(0.5 + 0.99 * 1.8, rel=1e-6)  # 2.282
    two = f([1.0, 2.0], [1.8, 1.2], [0.5, -0.25], [False, False], [False, False], [0.0, np.log(0.5)])
    assert two == pytest.approx(1.7825945, rel=1e-5)
    assert f([1.0, 2.0], [1.8, 1.2], [0.5, -0.25], [True, False], [False, False], [0.0, 0.0]) == pytest.approx(0.5)
    truncated = f([1.0, 2.0], [1.8, 1.2], [0.5, -0.25], [False, False], [True, False], [0.0, 0.0])
    assert truncated == pytest.approx(0.5 + 0.99 * 1.8, rel=1e-6)  # bootstraps from the final observation, trace cut


def test_n_step_stops_at_termination():
    returns, discount, last = n_step_targets(jnp.array([[1.0, 2.0, 4.0]]), jnp.array([[False, True, False]]),
                                             jnp.array([[False, False, False]]), 0.5)
    assert float(returns[0]) == pytest.approx(2.0) and float(discount[0]) == 0.0 and int(last[0]) == 1
