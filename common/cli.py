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
import importlib.resources
import json
import os
import sys
import tomllib
from pathlib import Path
from typing import Any, Sequence, TypeVar

import tyro

ArgsT = TypeVar("ArgsT")

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
            f"unknown preset {preset!r} for {algo}; "
            f"available presets in configs/{algo}.toml: {sorted(tables)}"
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
        raise SystemExit(f"error: {error}") from None
    names = ", ".join(sorted(presets(algo))) or "none"
    description = (
        f"{(args_cls.__doc__ or '').strip()}\n\n"
        f"--preset NAME applies a table of configs/{algo}.toml as the defaults "
        f"(presets: {names}); flags given after it override it."
    )
    return tyro.cli(args_cls, args=rest, default=defaults, description=description)


def load_run_args(args_cls: type[ArgsT], run_dir: str | os.PathLike) -> ArgsT:
    """The `Args` a run was started with, read back from its `args.json`."""
    path = Path(run_dir) / "args.json"
    if not path.exists():
        raise FileNotFoundError(
            f"cannot resume from {str(run_dir)!r}: {path} does not exist "
            "(pass the directory of an earlier run, e.g. runs/CartPole-v1__ppo__0__...)"
        )
    saved = json.loads(path.read_text())
    saved = {k: v for k, v in saved.items() if k in {f.name for f in dataclasses.fields(args_cls)}}
    return apply_overrides(args_cls(), saved, str(path))


def resolve_resume(args: ArgsT) -> ArgsT:
    """With `args.resume` set, the `Args` saved in that run directory (its
    args.json), keeping `resume`: a resumed run continues exactly the run it
    resumes. Without it, `args` unchanged."""
    if getattr(args, "resume", None) is None:
        return args
    return dataclasses.replace(load_run_args(type(args), args.resume), resume=args.resume)


def configure_jax(compile_cache: bool, cache_dir: str | None = None) -> None:
    """Turn JAX's persistent compilation cache on, so a second run of the same
    command starts without compiling (`--no-compile-cache` turns it off)."""
    import jax

    if not compile_cache:
        jax.config.update("jax_enable_compilation_cache", False)
        return
    cache_dir = cache_dir or os.environ.get(
        "JAXZOO_CACHE_DIR", str(Path.home() / ".cache" / "jaxzoo" / "jax")
    )
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@contextlib.contextmanager
def user_errors():
    """Around `main` in a script: bad input (ValueError, FileNotFoundError) is
    printed as one `error: ...` line with exit code 2 instead of a traceback.
    Set JAXZOO_TRACEBACK=1 to see the traceback."""
    try:
        yield
    except (ValueError, FileNotFoundError) as error:
        if os.environ.get("JAXZOO_TRACEBACK"):
            raise
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
