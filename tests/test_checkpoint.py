"""common/checkpoint.py: round trip of a whole runner state, and clear errors."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxzoo import checkpoint


def state():
    return {
        "params": {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.zeros(3)},
        "key": jax.random.split(jax.random.key(3), 2),
        "step": jnp.int32(7),
        "flags": jnp.array([True, False]),
    }


def test_round_trip_with_typed_keys(tmp_path):
    original = state()
    checkpoint.save(tmp_path, 10, original)
    restored, update = checkpoint.restore(tmp_path, jax.tree.map(jnp.zeros_like, original))
    assert update == 10
    np.testing.assert_array_equal(restored["params"]["w"], original["params"]["w"])
    assert restored["key"].dtype == original["key"].dtype
    np.testing.assert_array_equal(jax.random.key_data(restored["key"]), jax.random.key_data(original["key"]))
    # The restored key draws the same numbers.
    np.testing.assert_array_equal(jax.random.normal(restored["key"][0]), jax.random.normal(original["key"][0]))


def test_keeps_newest_and_restores_latest(tmp_path):
    for update in (1, 2, 3):
        checkpoint.save(tmp_path, update, {**state(), "step": jnp.int32(update)}, keep=2)
    assert [p.name for p in checkpoint.list_checkpoints(tmp_path)] == ["update_000000002.npz", "update_000000003.npz"]
    restored, update = checkpoint.restore(tmp_path, state())
    assert update == 3 and int(restored["step"]) == 3
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))


def test_missing_checkpoint_names_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nowhere")):
        checkpoint.restore(tmp_path / "nowhere", state())


def test_mismatched_shape_is_named(tmp_path):
    checkpoint.save(tmp_path, 1, state())
    template = state()
    template["params"]["w"] = jnp.zeros((4, 3))
    with pytest.raises(ValueError, match=r"\['params'\]\['w'\]"):
        checkpoint.restore(tmp_path, template)


def test_a_checkpoint_of_another_jaxzoo_version_names_both_versions(tmp_path):
    """A runner state that changed between versions (a new leaf) is refused
    naming the leaf and both versions; the same mismatch within one version
    says only what differs."""
    checkpoint.save(tmp_path, 1, state())
    template = {**state(), "hparams": {"learning_rate": jnp.float32(1e-3)}}
    (tmp_path / "args.json").write_text(json.dumps({"jaxzoo_version": "0.0.1"}))
    with pytest.raises(ValueError, match=r"no leaf \"\['hparams'\].*jaxzoo 0\.0\.1 and this is jaxzoo "):
        checkpoint.restore(tmp_path, template)
    (tmp_path / "args.json").write_text(json.dumps({"jaxzoo_version": checkpoint.package_version()}))
    with pytest.raises(ValueError, match="no leaf") as refused:
        checkpoint.restore(tmp_path, template)
    assert "written by jaxzoo" not in str(refused.value)
