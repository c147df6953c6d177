"""Replay in JAX: a time-major ring buffer of transitions from `num_envs`
parallel envs, with uniform or proportional prioritised sampling of windows.

Storage is `[rows, num_envs, ...]`: row t holds what every env did at time t,
so the `length` consecutive steps of one env starting at row t form a window
(for n-step returns, sequence models). Windows never wrap past the write
position into older data; they may cross episode ends, which the stored
`terminated` / `truncated` flags let the algorithm handle.

    buffer = buffers.init(example_step, capacity=10_000, num_envs=10)
    buffer = buffers.add(buffer, step)                  # step leaves [num_envs, ...]
    sample = buffers.sample(buffer, key, batch_size=128, length=3)
    sample.windows                                      # leaves [128, 3, ...]
    buffers.sample(buffer, key, 128, length=3, history=3).windows  # [128, 3 + 3, ...]: 3 rows before each window too
    buffer = buffers.set_priorities(buffer, sample.rows, sample.envs, new_priorities)

Prioritised sampling (Schaul et al. 2016, proportional variant): a window
starting at (t, e) is drawn with probability p_te^alpha / sum p^alpha over
valid starts, by stratified inverse-CDF sampling (a cumulative sum and a
binary search, O(rows x envs) per batch); new rows get the largest priority
seen so far. Uniform sampling indexes the valid starts directly, O(batch). Everything is jittable, vmappable over seeds, and meant to be
donated so XLA updates it in place.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Buffer:
    data: Any  # pytree, leaves [rows, num_envs, ...]
    priority: jax.Array  # [rows, num_envs] raw priorities p (not yet raised to alpha)
    max_priority: jax.Array  # [] largest priority seen: what new rows get
    position: jax.Array  # [] next row to write
    size: jax.Array  # [] rows written so far, at most `rows`

    @property
    def rows(self) -> int:
        return self.priority.shape[0]

    @property
    def num_envs(self) -> int:
        return self.priority.shape[1]


class Sample(NamedTuple):
    windows: Any  # pytree, leaves [batch, length, ...]
    rows: jax.Array  # [batch] start row of each window
    envs: jax.Array  # [batch] env column of each window
    probability: jax.Array  # [batch] probability of drawing this window (uniform: 1 / valid starts)
    num_valid: jax.Array  # [] number of valid window starts


def init(example: Any, capacity: int, num_envs: int) -> Buffer:
    """An empty buffer for `capacity` transitions in total (capacity // num_envs
    rows); `example` is one step of one env (leaves without the env axis)."""
    rows = capacity // num_envs
    if rows < 2:
        raise ValueError(f"capacity={capacity} holds fewer than 2 rows of num_envs={num_envs} transitions")
    data = jax.tree.map(lambda x: jnp.zeros((rows, num_envs) + jnp.shape(x), jnp.asarray(x).dtype), example)
    return Buffer(
        data=data,
        priority=jnp.zeros((rows, num_envs), jnp.float32),
        max_priority=jnp.float32(1.0),
        position=jnp.int32(0),
        size=jnp.int32(0),
    )


def add(buffer: Buffer, step: Any) -> Buffer:
    """Write one time step of every env (leaves [num_envs, ...]) at the write position."""
    data = jax.tree.map(lambda store, x: store.at[buffer.position].set(x), buffer.data, step)
    priority = buffer.priority.at[buffer.position].set(buffer.max_priority)
    return dataclasses.replace(
        buffer,
        data=data,
        priority=priority,
        position=(buffer.position + 1) % buffer.rows,
        size=jnp.minimum(buffer.size + 1, buffer.rows),
    )


def valid_starts(buffer: Buffer, length: int, history: int = 0) -> jax.Array:
    """[rows] bool: rows where a window of `length` steps, and the `history` rows
    before it, lie inside written data without crossing the write position."""
    age = (buffer.position - 1 - jnp.arange(buffer.rows)) % buffer.rows  # 0 = newest row
    return (age >= length - 1) & (age < buffer.size - history)


def can_sample(buffer: Buffer, length: int = 1, history: int = 0) -> jax.Array:
    return buffer.size >= length + history


def sample(
    buffer: Buffer,
    key: jax.Array,
    batch_size: int,
    length: int = 1,
    priority_exponent: float | jax.Array | None = None,
    history: int = 0,
) -> Sample:
    """Draw `batch_size` windows of `length` steps, uniformly over valid starts
    or, with `priority_exponent` (alpha), proportionally to priority^alpha.
    With `history`, each window also holds the `history` rows before its start
    (leaves [batch, history + length, ...]; `rows`, the priorities and the
    probabilities are still the start's): the older frames of a frame stack
    stored one frame per row (rainbow.py). Call only when
    `can_sample(buffer, length, history)`."""
    # Stratified: one uniform draw in each of batch_size equal slices of the mass.
    strata = (jnp.arange(batch_size) + jax.random.uniform(key, (batch_size,))) / batch_size  # [batch] in [0, 1)
    if priority_exponent is None:
        # Valid starts are the rows of age length-1 .. size-1-history (age 0 = newest),
        # in every env: index them directly, O(batch) whatever the capacity.
        num_valid = (buffer.size - history - length + 1) * buffer.num_envs
        flat = jnp.minimum((strata * num_valid).astype(jnp.int32), num_valid - 1)
        age, envs = length - 1 + flat // buffer.num_envs, flat % buffer.num_envs
        rows = (buffer.position - 1 - age) % buffer.rows
        probability = jnp.full((batch_size,), 1.0) / num_valid
    else:
        valid = jnp.broadcast_to(valid_starts(buffer, length, history)[:, None], buffer.priority.shape)
        weights = jnp.where(valid, buffer.priority**priority_exponent, 0.0)
        cumulative = jnp.cumsum(weights.reshape(-1))
        total = cumulative[-1]
        # strata * total can round up to total in float32, and a float32 prefix sum
        # need not be exactly flat over zero weights: either could pick an invalid
        # start, whose probability 0 makes an infinite importance weight and a NaN
        # loss. Stay below total, and send any zero-weight pick to the heaviest start.
        point = jnp.minimum(strata * total, jnp.nextafter(total, jnp.zeros_like(total)))
        flat = jnp.clip(jnp.searchsorted(cumulative, point, side="right"), 0, weights.size - 1)
        flat = jnp.where(weights.reshape(-1)[flat] > 0, flat, jnp.argmax(weights.reshape(-1)))
        rows, envs = flat // buffer.num_envs, flat % buffer.num_envs
        probability, num_valid = weights[rows, envs] / total, valid.sum()
    offsets = jnp.arange(-history, length)
    window_rows = (rows[:, None] + offsets[None, :]) % buffer.rows  # [batch, length]
    windows = jax.tree.map(lambda store: store[window_rows, envs[:, None]], buffer.data)
    return Sample(windows, rows, envs, probability, num_valid)


def set_priorities(buffer: Buffer, rows: jax.Array, envs: jax.Array, priority: jax.Array) -> Buffer:
    """New priorities p for sampled windows (e.g. |TD error| + eps)."""
    return dataclasses.replace(
        buffer,
        priority=buffer.priority.at[rows, envs].set(priority),
        max_priority=jnp.maximum(buffer.max_priority, priority.max()),
    )
