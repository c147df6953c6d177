"""common/buffers.py: ring storage, valid windows, uniform and prioritized sampling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxzoo import buffers


def filled(rows_written, rows=6, num_envs=2):
    buffer = buffers.init({"t": jnp.int32(0), "x": jnp.zeros(3)}, capacity=rows * num_envs, num_envs=num_envs)
    for t in range(rows_written):
        buffer = buffers.add(buffer, {"t": jnp.full(num_envs, t, jnp.int32), "x": jnp.full((num_envs, 3), float(t))})
    return buffer


def test_ring_overwrites_oldest_and_windows_never_wrap():
    buffer = filled(8)  # 6 rows: times 6, 7 overwrote 0, 1
    assert int(buffer.size) == 6 and int(buffer.position) == 2
    assert sorted(np.asarray(buffer.data["t"][:, 0])) == [2, 3, 4, 5, 6, 7]
    valid = np.asarray(buffers.valid_starts(buffer, 3))
    starts = sorted(int(t) for t in np.asarray(buffer.data["t"][:, 0])[valid])
    assert starts == [2, 3, 4, 5]  # windows of 3 end at time 7 at the latest
    sample = buffers.sample(buffer, jax.random.key(0), 256, length=3)
    t = np.asarray(sample.windows["t"])
    assert (np.diff(t, axis=1) == 1).all()  # consecutive steps of one env, no wrap into old rows
    assert set(t[:, 0]) == {2, 3, 4, 5}
    assert int(sample.num_valid) == 4 * 2


@pytest.mark.parametrize("prioritized", [False, True])
def test_history_rows_come_before_the_window_and_are_never_overwritten(prioritized):
    """With history h a window carries the h rows before its start; a start is
    valid only if those rows are still in the ring (the oldest h starts are not),
    and `rows` and the probabilities stay the start's."""
    buffer = filled(8)  # times 2..7 in the ring
    alpha = 0.5 if prioritized else None
    valid = np.asarray(buffers.valid_starts(buffer, 2, history=3))
    assert sorted(int(t) for t in np.asarray(buffer.data["t"][:, 0])[valid]) == [5, 6]
    assert bool(buffers.can_sample(buffer, 2, history=3)) and not bool(buffers.can_sample(filled(4), 2, history=3))
    sample = buffers.sample(buffer, jax.random.key(0), 256, length=2, priority_exponent=alpha, history=3)
    t = np.asarray(sample.windows["t"])
    assert t.shape == (256, 5) and (np.diff(t, axis=1) == 1).all()
    assert set(t[:, 3]) == {5, 6}  # the start, after 3 rows of history
    np.testing.assert_array_equal(
        np.asarray(buffer.data["t"])[np.asarray(sample.rows), np.asarray(sample.envs)], t[:, 3]
    )
    assert int(sample.num_valid) == 2 * 2
    np.testing.assert_allclose(sample.probability, 1 / 4, rtol=1e-6)


def test_partially_filled_buffer_samples_only_written_rows():
    buffer = filled(3)
    sample = buffers.sample(buffer, jax.random.key(1), 64, length=2)
    assert set(np.asarray(sample.windows["t"])[:, 0]) <= {0, 1}
    np.testing.assert_allclose(sample.probability, 1 / 4)


@pytest.mark.parametrize("rows_written", [4, 9])
def test_uniform_sampling_is_uniform_over_valid_starts(rows_written):
    """Uniform sampling indexes valid starts directly; every (row, env) start
    that `valid_starts` allows is equally likely, and no other is drawn."""
    buffer = filled(rows_written, rows=6, num_envs=2)
    draws = jax.jit(jax.vmap(lambda k: buffers.sample(buffer, k, 32, length=2)))(
        jax.random.split(jax.random.key(4), 1000)
    )
    counts = np.zeros((6, 2))
    np.add.at(counts, (np.asarray(draws.rows).ravel(), np.asarray(draws.envs).ravel()), 1)
    valid = np.broadcast_to(np.asarray(buffers.valid_starts(buffer, 2))[:, None], (6, 2))
    assert counts[~valid].sum() == 0
    np.testing.assert_allclose(counts[valid] / counts.sum(), 1 / valid.sum(), atol=0.01)
    np.testing.assert_allclose(draws.probability, 1 / valid.sum())


def test_prioritized_sampling_is_proportional_to_priority_power_alpha():
    buffer = filled(6, rows=6, num_envs=1)
    priorities = jnp.array([1.0, 2.0, 3.0, 4.0, 0.5, 6.0])
    buffer = buffers.set_priorities(buffer, jnp.arange(6), jnp.zeros(6, jnp.int32), priorities)
    alpha = 0.7
    draws = jax.jit(jax.vmap(lambda k: buffers.sample(buffer, k, 64, length=1, priority_exponent=alpha).rows))(
        jax.random.split(jax.random.key(2), 2000)
    )
    frequency = np.bincount(np.asarray(draws).ravel(), minlength=6) / draws.size
    expected = np.asarray(priorities) ** alpha / np.sum(np.asarray(priorities) ** alpha)
    np.testing.assert_allclose(frequency, expected, atol=0.005)
    sample = buffers.sample(buffer, jax.random.key(3), 8, priority_exponent=alpha)
    np.testing.assert_allclose(sample.probability, expected[np.asarray(sample.rows)], rtol=1e-5)


def test_prioritized_sampling_never_draws_an_invalid_start(monkeypatch):
    """A stratum at the very top of [0, 1) times the total mass rounds to the total
    in float32; the draw must still be a valid start with a positive probability
    (an invalid last start with probability 0 made an infinite importance weight)."""
    buffer = filled(4, rows=6, num_envs=2)  # rows 3.. are not written: the last flat starts are invalid
    buffer = buffers.set_priorities(buffer, jnp.arange(2), jnp.zeros(2, jnp.int32), jnp.array([0.3, 0.7]))
    monkeypatch.setattr(jax.random, "uniform", lambda key, shape: jnp.full(shape, 1.0 - 2.0**-24))
    sample = buffers.sample(buffer, jax.random.key(0), 4, length=2, priority_exponent=0.5)
    valid = np.asarray(buffers.valid_starts(buffer, 2))
    assert valid[np.asarray(sample.rows)].all()
    assert (np.asarray(sample.probability) > 0).all()


def test_new_rows_get_the_largest_priority_seen():
    buffer = filled(2, rows=4, num_envs=1)
    buffer = buffers.set_priorities(buffer, jnp.array([0]), jnp.array([0]), jnp.array([7.0]))
    buffer = buffers.add(buffer, {"t": jnp.array([9]), "x": jnp.zeros((1, 3))})
    assert float(buffer.priority[2, 0]) == 7.0 and float(buffer.max_priority) == 7.0


def test_capacity_too_small_is_an_error():
    with pytest.raises(ValueError, match="fewer than 2 rows"):
        buffers.init({"x": jnp.zeros(1)}, capacity=3, num_envs=2)
