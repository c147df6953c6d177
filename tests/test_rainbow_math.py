"""Rainbow's formulas against loops and analytic cases."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxzoo import buffers
from jaxzoo.algos.rainbow import (
    NoisyLinear,
    Transition,
    bootstrap_outputs,
    categorical_projection,
    dueling_aggregate,
    frame_stacks,
    importance_weights,
    linear_schedule,
    n_step_targets,
)


def n_step_loop(rewards, terminated, truncated, gamma):
    B, n = rewards.shape
    out = []
    for b in range(B):
        total, last = 0.0, n - 1
        for k in range(n):
            total += gamma**k * rewards[b, k]
            if terminated[b, k] or truncated[b, k]:
                last = k
                break
        discount = 0.0 if terminated[b, last] else gamma ** (last + 1)
        out.append((total, discount, last))
    return [np.array(x) for x in zip(*out)]


def test_n_step_targets_match_a_loop_across_episode_ends():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(200, 4)).astype(np.float32)
    ends = rng.random((200, 4))
    terminated, truncated = ends < 0.15, (ends >= 0.15) & (ends < 0.3)
    got = n_step_targets(jnp.asarray(rewards), jnp.asarray(terminated), jnp.asarray(truncated), 0.9)
    expected = n_step_loop(rewards, terminated, truncated, 0.9)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    # A truncated end keeps its bootstrap, a terminated one does not.
    r, d, last = n_step_targets(
        jnp.ones((2, 3)), jnp.array([[0, 1, 0], [0, 0, 0]], bool), jnp.array([[0, 0, 0], [0, 1, 0]], bool), 0.5
    )
    np.testing.assert_allclose(r, [1.5, 1.5])
    np.testing.assert_allclose(d, [0.0, 0.25])
    np.testing.assert_array_equal(last, [1, 1])


def projection_loop(probs, returns, discounts, support):
    N = len(support)
    v_min, v_max = support[0], support[-1]
    dz = (v_max - v_min) / (N - 1)
    out = np.zeros_like(probs)
    for b in range(len(probs)):
        for j in range(N):
            tz = min(max(returns[b] + discounts[b] * support[j], v_min), v_max)
            pos = (tz - v_min) / dz
            lo, hi = int(np.floor(pos)), int(np.ceil(pos))
            if lo == hi:
                out[b, lo] += probs[b, j]
            else:
                out[b, lo] += probs[b, j] * (hi - pos)
                out[b, hi] += probs[b, j] * (pos - lo)
    return out


def test_categorical_projection_matches_a_loop_and_conserves_mass():
    rng = np.random.default_rng(1)
    support = np.linspace(-10, 10, 21).astype(np.float32)
    probs = rng.dirichlet(np.ones(21), size=64).astype(np.float32)
    returns = rng.normal(0, 8, size=64).astype(np.float32)  # some shifted atoms fall outside the support
    discounts = rng.choice([0.0, 0.9, 0.99], size=64).astype(np.float32)
    got = np.asarray(
        categorical_projection(jnp.asarray(probs), jnp.asarray(returns), jnp.asarray(discounts), jnp.asarray(support))
    )
    np.testing.assert_allclose(got, projection_loop(probs, returns, discounts, support), atol=1e-5)
    np.testing.assert_allclose(got.sum(1), 1.0, atol=1e-5)


def test_categorical_projection_analytic_cases():
    support = jnp.linspace(-2.0, 2.0, 5)  # atoms -2 -1 0 1 2
    probs = jnp.full((1, 5), 0.2)
    # Terminal: all mass on R; R = 0.25 splits 3:1 between atoms 0 and 1.
    got = categorical_projection(probs, jnp.array([0.25]), jnp.array([0.0]), support)
    np.testing.assert_allclose(got[0], [0, 0, 0.75, 0.25, 0], atol=1e-6)
    # R on an atom: all mass there. R beyond v_max: clipped onto the last atom.
    np.testing.assert_allclose(
        categorical_projection(probs, jnp.array([1.0]), jnp.array([0.0]), support)[0], [0, 0, 0, 1, 0]
    )
    np.testing.assert_allclose(
        categorical_projection(probs, jnp.array([7.0]), jnp.array([0.0]), support)[0], [0, 0, 0, 0, 1]
    )
    # No shift, no clipping: the distribution is unchanged and its mean kept.
    p = jnp.array([[0.1, 0.2, 0.3, 0.25, 0.15]])
    np.testing.assert_allclose(categorical_projection(p, jnp.array([0.0]), jnp.array([1.0]), support), p, atol=1e-6)


def test_dueling_advantages_have_zero_mean():
    value = jnp.array([[[3.0]]])
    advantage = jnp.array([[[1.0], [2.0], [6.0]]])
    q = dueling_aggregate(value, advantage)
    np.testing.assert_allclose(q[0, :, 0], [1.0, 2.0, 6.0])  # 3 + a - mean(a) = a here
    assert float(q.mean() - value.mean()) == pytest.approx(0.0)


def test_double_q_selects_with_the_online_network_and_scores_with_the_target():
    # Two samples, three actions, two atoms. The target network prefers action 0,
    # the online network action 2: DQN bootstraps from the target's action 0,
    # double Q from the target's output at the online network's action 2.
    target_out = jnp.arange(12.0).reshape(2, 3, 2)  # [B, A, atoms]
    target_q = jnp.array([[9.0, 1.0, 0.0], [9.0, 0.0, 1.0]])
    online_q = jnp.array([[0.0, 1.0, 5.0], [0.0, 5.0, 1.0]])
    np.testing.assert_array_equal(bootstrap_outputs(target_out, target_q, None), [[0.0, 1.0], [6.0, 7.0]])
    np.testing.assert_array_equal(bootstrap_outputs(target_out, target_q, online_q), [[4.0, 5.0], [8.0, 9.0]])


def test_importance_weights():
    probability = jnp.array([0.5, 0.25, 0.125, 0.125])
    w = importance_weights(probability, jnp.int32(4), jnp.float32(1.0))
    np.testing.assert_allclose(w, (4 * probability) ** -1.0 / (4 * 0.125) ** -1.0)
    assert float(w.max()) == 1.0
    np.testing.assert_allclose(importance_weights(probability, jnp.int32(4), jnp.float32(0.0)), 1.0)


def test_noisy_linear_initialisation_and_noise():
    layer = NoisyLinear(64, 8, nnx.Rngs(0), sigma0=0.5)
    bound = 1 / np.sqrt(64)
    assert np.abs(np.asarray(layer.w_mu[...])).max() <= bound
    np.testing.assert_allclose(layer.w_sigma[...], 0.5 * bound)
    x = jnp.ones((1, 64))
    mean_output = layer(x)
    noisy = jnp.stack([layer(x, k) for k in jax.random.split(jax.random.key(1), 2000)])
    assert float(jnp.std(noisy[:, 0, 0])) > 0.05  # the noise moves the output
    np.testing.assert_allclose(noisy.mean(0), mean_output, atol=0.05)  # zero-mean noise
    np.testing.assert_array_equal(layer(x, jax.random.key(5)), layer(x, jax.random.key(5)))


def test_linear_schedule():
    assert float(linear_schedule(1.0, 0.1, 100, jnp.float32(0))) == pytest.approx(1.0)
    assert float(linear_schedule(1.0, 0.1, 100, jnp.float32(50))) == pytest.approx(0.55)
    assert float(linear_schedule(1.0, 0.1, 100, jnp.float32(500))) == pytest.approx(0.1)


def test_frame_stacks_rebuild_what_a_stacking_env_showed():
    """A simulated env that stacks K = 3 frames as common/atari.py's stack_in_jit
    does (each step appends a frame; an episode starts with its first frame in
    every slot), with frequent terminations and truncations: a replay of single
    frames, sampled with K - 1 rows of history and rebuilt by frame_stacks, gives
    back the stacked observations and final observations the env produced."""
    K, steps, num_envs, n = 3, 40, 2, 3
    rng = np.random.default_rng(0)
    terminated = rng.random((steps, num_envs)) < 0.15
    truncated = ~terminated & (rng.random((steps, num_envs)) < 0.1)
    new_frame = lambda: rng.integers(0, 256, (num_envs, 2, 2, 1), dtype=np.uint8)
    obs = np.tile(new_frame(), (1, 1, 1, K))  # [N, 2, 2, K c]
    observed, finals = [], []
    for t in range(steps):
        final = np.concatenate([obs[..., 1:], new_frame()], axis=-1)
        observed.append(obs)
        finals.append(final)
        done = (terminated[t] | truncated[t])[:, None, None, None]
        obs = np.where(done, np.tile(new_frame(), (1, 1, 1, K)), final)
    observed, finals = np.stack(observed), np.stack(finals)  # [T, N, 2, 2, K]

    buffer = buffers.init(
        Transition(observed[0, 0, ..., -1:], 0, 0.0, False, False, finals[0, 0, ..., -1:]), steps * num_envs, num_envs
    )
    for t in range(steps):
        row = Transition(
            observed[t, ..., -1:],
            np.zeros(num_envs, np.int32),
            np.zeros(num_envs, np.float32),
            terminated[t],
            truncated[t],
            finals[t, ..., -1:],
        )
        buffer = buffers.add(buffer, jax.tree.map(jnp.asarray, row))
    sample = buffers.sample(buffer, jax.random.key(0), 512, length=n, history=K - 1)
    rebuilt = frame_stacks(sample.windows, K)
    assert rebuilt.obs.shape == (512, n, 2, 2, K) and rebuilt.reward.shape == (512, n)
    rows = np.asarray(sample.rows)[:, None] + np.arange(n)  # time = row: the ring never wrapped
    envs = np.asarray(sample.envs)[:, None]
    assert set(np.asarray(sample.rows)) == set(range(K - 1, steps - n + 1))  # every valid start drawn
    np.testing.assert_array_equal(rebuilt.obs, observed[rows, envs])
    np.testing.assert_array_equal(rebuilt.final_obs, finals[rows, envs])
    np.testing.assert_array_equal(rebuilt.terminated, terminated[rows, envs])
