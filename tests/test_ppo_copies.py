"""algos/ppo.py and algos/unizero_ppo.py each carry their own copy of PPO's
formulas (so each file reads alone): GAE, the clipped surrogate and the
explained variance. These tests pin one form: the copies are the same text,
and they compute the same values."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxzoo.algos import ppo, unizero_ppo

SHARED = ["compute_gae", "clipped_surrogate", "explained_variance"]


@pytest.mark.parametrize("name", SHARED)
def test_the_copies_are_the_same_text(name):
    assert inspect.getsource(getattr(ppo, name)) == inspect.getsource(getattr(unizero_ppo, name))


def test_gae_copies_agree_with_terminations_and_truncations():
    keys = jax.random.split(jax.random.key(0), 5)
    T, N = 33, 4
    rewards, values, next_values = (jax.random.normal(k, (T, N)) for k in keys[:3])
    terminated = jax.random.bernoulli(keys[3], 0.1, (T, N))
    truncated = jax.random.bernoulli(keys[4], 0.1, (T, N)) & ~terminated
    assert terminated.any() and truncated.any()
    inputs = (rewards, values, next_values, terminated, truncated, jnp.float32(0.97), jnp.float32(0.9))
    for a, b in zip(ppo.compute_gae(*inputs), unizero_ppo.compute_gae(*inputs), strict=True):
        np.testing.assert_array_equal(a, b)


def test_surrogate_and_explained_variance_copies_agree():
    keys = jax.random.split(jax.random.key(1), 3)
    new_log_prob, old_log_prob, advantage = (jax.random.normal(k, (64,)) * 0.3 for k in keys)
    ours, theirs = (m.clipped_surrogate(new_log_prob, old_log_prob, advantage, 0.2) for m in (ppo, unizero_ppo))
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(a, b)
    # -min(r A, clip(r) A) per sample, and r is clipped somewhere in this draw.
    ratio = np.exp(np.asarray(new_log_prob) - np.asarray(old_log_prob))
    expected = -np.minimum(ratio * advantage, np.clip(ratio, 0.8, 1.2) * advantage)
    np.testing.assert_allclose(ours[0], expected, rtol=1e-6)
    assert (np.abs(ratio - 1) > 0.2).any()
    prediction, target = new_log_prob, advantage
    np.testing.assert_array_equal(
        ppo.explained_variance(prediction, target), unizero_ppo.explained_variance(prediction, target)
    )
