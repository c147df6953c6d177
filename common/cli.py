"""Command line: tyro over an algorithm's `Args`, plus `--preset NAME`.

`--preset NAME` reads the table `[NAME]` from `configs/<algo>.toml` and uses it
as the defaults; every other flag on the command line then overrides those.
Unknown presets and unknown keys fail loudly, naming what is accepted.

    args = cli.parse(Args, "ppo")              # sys.argv
    args = cli.parse(Args, "ppo", ["--preset", "tiny", "--seed", "3"])
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib.resources
import json
import os
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import tyro

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

ArgsT = TypeVar("ArgsT", bound="DataclassInstance")  # an algorithm's frozen `Args` dataclass


def presets(algo: str) -> dict[str, dict[str, Any]]:
    """All preset tables of `configs/<algo>.toml` (empty if the file is missing),
    read from the installed package (`jaxzoo.configs`), so a copied algorithm
    file finds its presets wherever it runs."""
    path = importlib.resources.files("jaxzoo.configs").joinpath(f"{algo}.toml")
    if not path.is_file():
        return {}
    return tomllib.loads(path.read_text())


def apply_overrides(args: ArgsT, overrides: dict[str, Any], source: str) -> ArgsT:
    """`dataclasses.replace` that names the bad key and the accepted ones."""
    fields = {f.name for f in dataclasses.fields(args)}
    normalised = {key.replace("-", "_"): value for key, value in overrides.items()}
    unknown = sorted(set(normalised) - fields)
    if unknown:
        raise ValueError(
            f"{source}: unknown key(s) {unknown}; accepted keys are the fields of "
            f"{type(args).__name__}: {sorted(fields)}"
        )
    # TOML has no tuples; fields typed as tuples get their lists converted.
    for f in dataclasses.fields(args):
        if f.name in normalised and isinstance(getattr(args, f.name), tuple):
            normalised[f.name] = tuple(normalised[f.name])
    return dataclasses.replace(args, **normalised)


def resolve_preset(algo: str, preset: str, tables: dict | None = None) -> dict[str, Any]:
    """The key/value table of a preset, with `extends = "other"` (a preset it
    builds on) resolved: the other preset's table, then this one's keys on top."""
    tables = presets(algo) if tables is None else tables
    if preset not in tables:
        raise ValueError(
            f"unknown preset {preset!r} for {algo}; available presets in configs/{algo}.toml: {sorted(tables)}"
        )
    table = dict(tables[preset])
    base = table.pop("extends", None)
    return {**resolve_preset(algo, base, tables), **table} if base else table


def preset_args(args_cls: type[ArgsT], algo: str, preset: str | None) -> ArgsT:
    """Default `Args` with the preset table (if any) applied."""
    args = args_cls()
    if preset is None:
        return args
    return apply_overrides(args, resolve_preset(algo, preset), f"preset {preset!r} in configs/{algo}.toml")


def _pop_preset(argv: list[str]) -> tuple[str | None, list[str]]:
    rest, preset, i = [], None, 0
    while i < len(argv):
        token = argv[i]
        if token == "--preset":
            if i + 1 >= len(argv):
                raise SystemExit("--preset needs a name, e.g. --preset tiny")
            preset, i = argv[i + 1], i + 2
            continue
        if token.startswith("--preset="):
            preset = token.split("=", 1)[1]
        else:
            rest.append(token)
        i += 1
    return preset, rest


def parse(args_cls: type[ArgsT], algo: str, argv: Sequence[str] | None = None) -> ArgsT:
    """Parse the command line into `args_cls`, with `--preset NAME` applied first."""
    argv = list(sys.argv[1:] if argv is None else argv)
    preset, rest = _pop_preset(argv)
    try:
        defaults = preset_args(args_cls, algo, preset)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None
    names = ", ".join(sorted(presets(algo))) or "none"
    description = (
        f"{(args_cls.__doc__ or '').strip()}\n\n"
        f"--preset NAME applies a table of configs/{algo}.toml as the defaults "
        f"(presets: {names}); flags given after it override it."
    )
    return tyro.cli(args_cls, args=rest, default=defaults, description=description)


# Exit codes of the algorithm scripts (docs/reliability.md).
EXIT_USAGE = 2  # bad arguments, unknown env id, unusable or busy run directory, missing checkpoint
EXIT_DIVERGED = 3  # a seed's state became non-finite: the run stopped, its last finite checkpoint kept
# Stopped by SIGINT / SIGTERM after writing a checkpoint: 128 + the signal number (130, 143).

# Fields that may differ from the saved run when resuming it: how long it runs,
# how it reports, where it caches compiled code, and how it is laid out over
# devices and processes (a run checkpointed on 1 device resumes on 8, and back). Any other flag given with
# --resume that differs from the run's args.json is refused.
RESUMABLE_FIELDS = (
    "resume",
    "total_timesteps",
    "log_every",
    "checkpoint_every",
    "track",
    "tensorboard",
    "compile_cache",
    "save_model",
    "run_root",
    "parallel",
    "distributed",
    "coordinator_address",
    "num_processes",
    "process_id",
    "distributed_timeout",
    "capture_video",
)


def load_run_args(args_cls: type[ArgsT], run_dir: str | os.PathLike, algorithm: str | None = None) -> ArgsT:
    """The `Args` a run was started with, read back from its `args.json`.

    With `algorithm`, a run written by another algorithm file is refused: its
    args.json names its algorithm (runs written before it did are recognised by
    their set of fields)."""
    path = Path(run_dir) / "args.json"
    if not path.exists():
        raise FileNotFoundError(
            f"cannot resume from {str(run_dir)!r}: {path} does not exist "
            "(pass the directory of an earlier run, e.g. runs/CartPole-v1__ppo__0__...)"
        )
    try:
        saved = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"cannot resume from {str(run_dir)!r}: {path} is not valid JSON ({error})") from None
    fields = {f.name for f in dataclasses.fields(args_cls)}
    if algorithm is not None:
        written_by = saved.get("algorithm")
        foreign = sorted(set(saved) - fields - {"algorithm", "jaxzoo_version"})
        missing = sorted(fields - set(saved))
        if written_by not in (None, algorithm) or (written_by is None and (foreign or missing)):
            by = (
                f"{written_by}.py"
                if written_by
                else "another algorithm file (its fields differ: "
                + f"{foreign[:4]} not in {algorithm}'s Args, {missing[:4]} missing)"
            )
            raise ValueError(
                f"cannot resume {str(run_dir)!r} with {algorithm}.py: it was written by {by}; "
                f"resume it with the file that wrote it"
            )
    saved = {k: v for k, v in saved.items() if k in fields}
    return apply_overrides(args_cls(), saved, str(path))


def resolve_resume(args: ArgsT, algorithm: str | None = None) -> ArgsT:
    """With `args.resume` set, the `Args` saved in that run directory (its
    args.json): a resumed run continues exactly the run it resumes.

    Fields of `args` that differ from the class defaults were given on the
    command line (or by a preset); those may change on resume only if they are
    in RESUMABLE_FIELDS, and they are applied. Any other given field that
    differs from the saved run is refused, with the list of differences.
    Without `args.resume`, `args` unchanged."""
    resume = getattr(args, "resume", None)
    if resume is None:
        return args
    saved = load_run_args(type(args), resume, algorithm)
    defaults = type(args)()
    given = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(args)
        if getattr(args, f.name) != getattr(defaults, f.name)
    }
    conflicts = {
        name: (getattr(saved, name), value)
        for name, value in given.items()
        if name not in RESUMABLE_FIELDS and value != getattr(saved, name)
    }
    if conflicts:
        listed = "; ".join(f"{name}: run has {old!r}, given {new!r}" for name, (old, new) in conflicts.items())
        raise ValueError(
            f"--resume {resume}: flags differ from the saved run ({listed}). A resumed run continues the "
            f"run as it was started; only {', '.join(RESUMABLE_FIELDS[1:])} may change on resume"
        )
    return dataclasses.replace(saved, **{k: v for k, v in given.items() if k in RESUMABLE_FIELDS})


def check_run_root(run_root: str | os.PathLike) -> None:
    """Refuse, before anything compiles, a run root that is a file or where no
    run directory can be created."""
    root = Path(run_root)
    existing = next((p for p in (root, *root.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise ValueError(
            f"run_root={str(run_root)!r}: {str(existing)!r} is a file, not a directory; "
            "pass a directory for the run directories (e.g. --run-root runs)"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(
            f"run_root={str(run_root)!r}: {str(existing)!r} is not writable by this user; "
            "pass a directory you can write to (--run-root)"
        )


def configure_jax(compile_cache: bool, cache_dir: str | None = None) -> None:
    """Turn JAX's persistent compilation cache on, so a second run of the same
    command starts without compiling (`--no-compile-cache` turns it off)."""
    import jax

    if not compile_cache:
        jax.config.update("jax_enable_compilation_cache", False)
        return
    cache_dir = cache_dir or os.environ.get("JAXZOO_CACHE_DIR", str(Path.home() / ".cache" / "jaxzoo" / "jax"))
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


class Diverged(RuntimeError):
    """A seed's runner state became non-finite (NaN or inf): the run stopped."""


@contextlib.contextmanager
def user_errors():
    """Around `main` in a script: bad input (ValueError, FileNotFoundError) is
    printed as one `error: ...` line with exit code 2 (EXIT_USAGE) instead of a
    traceback, a diverged run with exit code 3 (EXIT_DIVERGED). Set
    JAXZOO_TRACEBACK=1 to see the traceback.

    It also moves every object alive at entry (the imported modules: jax,
    flax, gymnax, ...) and again at exit out of the garbage collector's
    sight (`gc.freeze`): the collections during tracing stop walking them, and
    the interpreter's final ones do not walk anything, which made a CartPole
    run's exit about 0.4 s shorter here (docs/performance.md). Frozen objects are
    still freed by reference counting."""
    gc.freeze()
    try:
        yield
    except (ValueError, FileNotFoundError, Diverged) as error:
        if os.environ.get("JAXZOO_TRACEBACK"):
            raise
        kind = "diverged" if isinstance(error, Diverged) else "error"
        print(f"{kind}: {error}", file=sys.stderr)
        raise SystemExit(EXIT_DIVERGED if isinstance(error, Diverged) else EXIT_USAGE) from None
    finally:
        gc.freeze()  # what the run made, too: the interpreter's exit then frees without walking
