"""Checkpoints of a whole runner state (params, optimizer, env states, replay
buffers, keys, counters): any pytree of arrays, typed PRNG keys included.

A checkpoint is one `.npz` file per saved update under `<run_dir>/checkpoints/`,
one array per pytree leaf, named by its path in the tree, with its SHA-256
beside it (`update_N.npz.sha256`). Both are written to temporary files, synced
and renamed into place (the checksum first), so a run killed mid-write leaves
the previous checkpoint intact. Restoring verifies the checksum; a damaged
newest checkpoint (truncated, bit-flipped, checksum missing) is skipped with a
warning and the newest intact one is used. Restoring needs a template of the
same structure (the state `init` builds), against which every leaf's path,
shape and dtype is checked, so a checkpoint from a different configuration
fails with a clear error instead of silently mis-loading.

Why not orbax-checkpoint: every state here is small (megabytes), so a sharded
or multi-host state is gathered to process 0, which writes it in this format
(~60 lines, no extra dependency, readable by `numpy.load`), and every process
places its own shards on restore (jaxzoo.parallel, docs/scaling.md). Orbax's
per-process sharded writes earn their place for states too large for one
host's memory, which no preset has.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import jax
import numpy as np

_PATTERN = re.compile(r"^update_(\d+)\.npz$")
_KEY_SUFFIX = re.compile(r"^(.*)@prng_key:(.+)$")  # "<leaf path>@prng_key:<impl name>"


def _is_key(x) -> bool:
    """Typed PRNG key leaves (concrete arrays or `jax.eval_shape` structs)."""
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _leaves_with_names(tree) -> list[tuple[str, Any]]:
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(jax.tree_util.keystr(path), leaf) for path, leaf in flat]


def checkpoint_dir(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


def save(run_dir: str | os.PathLike, update: int, state, keep: int = 2) -> Path:
    """Write `state` as the checkpoint of `update`; keep the newest `keep` files."""
    directory = checkpoint_dir(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for name, leaf in _leaves_with_names(jax.device_get(state)):
        if _is_key(leaf):
            # Keys are stored as their raw data, with the PRNG implementation in the name.
            arrays[f"{name}@prng_key:{jax.random.key_impl(leaf)}"] = np.asarray(jax.random.key_data(leaf))
        else:
            arrays[name] = np.asarray(leaf)
    path = directory / f"update_{update:09d}.npz"
    tmp = directory / f".update_{update:09d}.npz.tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stub types the keyword arrays as `allow_pickle`
        f.flush()
        os.fsync(f.fileno())
    _write_atomically(checksum_path(path), _sha256(tmp) + "\n")
    os.replace(tmp, path)
    _sync_directory(directory)
    for old in list_checkpoints(run_dir)[:-keep]:
        old.unlink()
        checksum_path(old).unlink(missing_ok=True)
    return path


def checksum_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _sync_directory(directory: Path) -> None:
    """Make the renames durable (a crash right after cannot undo them)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def damage(path: Path) -> str | None:
    """Why the checkpoint file at `path` cannot be trusted, or None if its
    SHA-256 matches the one written beside it. A checkpoint without a checksum
    file (written before checksums existed) is checked by the CRC-32 of every
    member of its zip archive instead."""
    stored = checksum_path(path)
    if not stored.exists():
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
        except (zipfile.BadZipFile, OSError) as error:
            return f"it is not a readable archive ({error})"
        return None if bad is None else f"member {bad} fails its CRC check"
    if _sha256(path) != stored.read_text().strip():
        return "its SHA-256 does not match (truncated or corrupted)"
    return None


def list_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Checkpoint files of a run, oldest first."""
    directory = checkpoint_dir(run_dir)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _PATTERN.match(p.name))]
    return [p for _, p in sorted(found)]


def update_of(path: Path) -> int:
    """The update a checkpoint file holds, from its name `update_<N>.npz`."""
    match = _PATTERN.match(path.name)
    if match is None:
        raise ValueError(f"{path} is not named like a checkpoint (update_<N>.npz)")
    return int(match.group(1))


def latest_update(run_dir: str | os.PathLike) -> int | None:
    """The update of the newest intact checkpoint (None if there is none)."""
    intact = [p for p in list_checkpoints(run_dir) if damage(p) is None]
    return update_of(intact[-1]) if intact else None


def restore(run_dir: str | os.PathLike, template, update: int | None = None):
    """Load the newest (or the given) checkpoint into the structure of `template`.

    Returns `(state, update)`. Without `update`, a damaged newest checkpoint is
    skipped with a warning for the newest intact one. Raises FileNotFoundError
    naming the directory when there is no (intact) checkpoint and ValueError
    naming the first leaf that does not match the template.
    """
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        raise FileNotFoundError(
            f"no checkpoint in {str(checkpoint_dir(run_dir))!r} (looked for update_*.npz); "
            "was the run started with --save-model?"
        )
    if update is None:
        for path in reversed(checkpoints):
            problem = damage(path)
            if problem is None:
                break
            warnings.warn(f"skipping damaged checkpoint {path}: {problem}", stacklevel=2)
        else:
            raise FileNotFoundError(
                f"every checkpoint in {str(checkpoint_dir(run_dir))!r} is damaged: {[p.name for p in checkpoints]}"
            )
    else:
        path = checkpoint_dir(run_dir) / f"update_{update:09d}.npz"
        if not path.exists():
            raise FileNotFoundError(f"no checkpoint {str(path)!r}; have {[p.name for p in checkpoints]}")
        if (problem := damage(path)) is not None:
            raise ValueError(f"checkpoint {path} is damaged: {problem}")
    try:
        return _load(path, template)
    except ValueError as error:
        written_by, running = _version_that_wrote(run_dir), package_version()
        if written_by is None or written_by == running:
            raise
        raise ValueError(
            f"{error}. The run was written by jaxzoo {written_by} and this is jaxzoo {running}, whose runner "
            f"state differs: resume it with jaxzoo {written_by}, or start a new run"
        ) from None


def _version_that_wrote(run_dir: str | os.PathLike) -> str | None:
    """The `jaxzoo_version` recorded in the run's args.json (None if absent)."""
    try:
        return json.loads((Path(run_dir) / "args.json").read_text()).get("jaxzoo_version")
    except (OSError, ValueError):
        return None


def package_version() -> str:
    """The installed jaxzoo's version (args.json records it as `jaxzoo_version`)."""
    try:
        return importlib.metadata.version("jaxzoo")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _load(path: Path, template):
    flat, treedef = jax.tree_util.tree_flatten_with_path(template)
    leaves = []
    with np.load(path) as stored:
        arrays = {}
        for name in stored.files:
            match = _KEY_SUFFIX.match(name)
            arrays[match.group(1) if match else name] = (stored[name], match.group(2) if match else None)
    for key_path, leaf in flat:
        name = jax.tree_util.keystr(key_path)
        if name not in arrays:
            raise ValueError(
                f"checkpoint {path} has no leaf {name!r}: it was written by a different "
                "configuration or version of the algorithm"
            )
        value, key_impl = arrays.pop(name)
        if _is_key(leaf) != (key_impl is not None):
            raise ValueError(f"checkpoint {path}: leaf {name!r} is a PRNG key in only one of checkpoint and state")
        if key_impl is not None:
            value = jax.random.wrap_key_data(value, impl=key_impl)
        if value.shape != tuple(leaf.shape) or value.dtype != leaf.dtype:
            raise ValueError(
                f"checkpoint {path}: leaf {name!r} is {value.dtype}{list(value.shape)}, "
                f"the current state expects {leaf.dtype}{list(leaf.shape)} (different Args?)"
            )
        leaves.append(value)
    if arrays:
        raise ValueError(f"checkpoint {path} has leaves the current state lacks: {sorted(arrays)[:5]}")
    state = jax.tree_util.tree_unflatten(treedef, leaves)
    return state, update_of(path)
