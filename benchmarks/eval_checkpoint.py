"""Greedy evaluation of a run's checkpoint, read-only: the run directory is not
written to, so a stopped run can be evaluated mid-way and resumed after.

    python benchmarks/eval_checkpoint.py RUN_DIR [RUN_DIR ...] [--episodes 10] [--update N] [--set FIELD=VALUE ...]

Each run is rebuilt from its args.json by the algorithm file that wrote it,
its newest checkpoint (or update N's) restored, and evaluated by the
program the run's own evaluation uses (common/runner.py,
`evaluation_program`: the same keys, compiled the same way), so on a
finished run's last checkpoint this repeats its eval.json. For the files
whose runs go through common/runner.py: not world_models.py (staged) nor
impala.py's `--architecture sebulba` (actor threads), which are refused.
docs/unizero.md (Breakout-MinAtar, 500k) uses it to compare the greedy
policy with the training return.

`--set FIELD=VALUE` (repeatable) evaluates the same parameters with another
value of one of the run's Args fields that the saved state's shapes do not
depend on: for UniZero the search, e.g. `--set num_simulations=1` (with
Gumbel MuZero and no noise, one simulation acts on the prior's argmax) or
`--set num_simulations=64`. The value is checked by the Args as on the
command line; a field that changes the state's shapes fails at the restore.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import typing
from pathlib import Path

import jax
import numpy as np

from jaxzoo import checkpoint, cli, runner


def load_args(run_dir: str):
    """(the algorithm's module, its Args as the run saved them) of a run directory."""
    args_path = Path(run_dir) / "args.json"
    if not args_path.exists():
        raise SystemExit(f"{run_dir!r} is not a run directory: it has no args.json")
    algorithm = json.loads(args_path.read_text()).get("algorithm")
    if algorithm is None:
        raise SystemExit(f"{args_path} does not name the algorithm that wrote it (written before runs did)")
    module = importlib.import_module(f"jaxzoo.algos.{algorithm}")
    return module, cli.load_run_args(module.Args, run_dir, algorithm)


def restore_state(run_dir: str, module, args, update: int | None = None):
    """(algo, state [num_seeds, ...], its update, seeds [num_seeds]): the run's
    training functions built from `args` by `module.make_train`, and its
    checkpoint at `update` (None: the newest) restored into their state."""
    algo = module.make_train(args)
    seeds = args.seed + np.arange(args.num_seeds, dtype=np.int32)
    template = jax.eval_shape(lambda s: runner.init_seeds(algo.init, s), seeds)
    state, restored = checkpoint.restore(run_dir, template, update)
    return algo, state, restored, seeds


def parse_overrides(args, settings: list[str]) -> dict:
    """["FIELD=VALUE", ...] -> {field: value}, each value parsed as the type of
    the run's own value of that field (bool: true / false)."""
    fields = {f.name for f in dataclasses.fields(args)}
    hints = typing.get_type_hints(type(args))
    overrides: dict = {}
    for setting in settings:
        name, sep, text = setting.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in fields:
            raise SystemExit(
                f"--set {setting!r}: accepted: FIELD=VALUE with FIELD one of the run's args ({', '.join(sorted(fields))})"
            )
        current = getattr(args, name)
        if isinstance(current, bool):
            if text.lower() not in ("true", "false"):
                raise SystemExit(f"--set {setting!r}: {name} is a bool; accepted: true or false")
            overrides[name] = text.lower() == "true"
        elif isinstance(current, (int, float)):
            try:
                overrides[name] = type(current)(text)
            except ValueError:
                raise SystemExit(f"--set {setting!r}: {name} is a {type(current).__name__}; got {text!r}") from None
        else:
            choices = typing.get_args(hints[name]) if typing.get_origin(hints[name]) is typing.Literal else ()
            if choices and text not in choices:
                raise SystemExit(f"--set {setting!r}: accepted values of {name}: {', '.join(map(str, choices))}")
            overrides[name] = text
    return overrides


def evaluate_checkpoint(
    run_dir: str, episodes: int | None = None, update: int | None = None, overrides: dict | None = None
):
    """(update, returns [num_seeds, episodes]) of the run's checkpoint at `update`
    (None: its newest), with `episodes` greedy episodes per seed (None: the
    run's own eval_episodes) and the run's args changed by `overrides`
    ({field: value}: `parse_overrides`)."""
    module, args = load_args(run_dir)
    algorithm = module.__name__.rsplit(".", 1)[-1]
    if algorithm == "world_models" or getattr(args, "architecture", None) == "sebulba":
        raise SystemExit(
            f"{run_dir!r} was written by {algorithm}.py's own loop, not common/runner.py's; "
            "its checkpoints hold no single evaluable state (accepted: ppo, rainbow, mpo, planet, unizero, "
            "unizero_ppo, impala without --architecture sebulba)"
        )
    if episodes is not None:
        args = dataclasses.replace(args, eval_episodes=episodes)
    if overrides:
        args = dataclasses.replace(args, **overrides)  # checked by Args.__post_init__
    algo, state, restored, seeds = restore_state(run_dir, module, args, update)
    returns = runner.evaluation_program(args, algo.evaluate, args.eval_every)(state, seeds)
    if isinstance(returns, tuple):  # --capture-video runs also return the recording
        returns = returns[0]
    return restored, np.asarray(returns)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--episodes", type=int, default=None, help="greedy episodes per seed (default: the run's own)")
    parser.add_argument("--update", type=int, default=None, help="the checkpoint's update (default: the newest)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="evaluate with this value of one of the run's args (repeatable), e.g. num_simulations=64",
    )
    options = parser.parse_args(argv)
    if options.episodes is not None and options.episodes < 1:
        parser.error(f"--episodes must be at least 1, got {options.episodes}")
    for run_dir in options.run_dirs:
        overrides = parse_overrides(load_args(run_dir)[1], options.set) if options.set else None
        update, returns = evaluate_checkpoint(run_dir, options.episodes, options.update, overrides)
        changed = "".join(f" {name}={value}" for name, value in (overrides or {}).items())
        for seed_index, seed_returns in enumerate(returns):
            print(
                f"{run_dir} update {update}{changed} seed index {seed_index}: greedy {seed_returns.mean():.2f} "
                f"+- {seed_returns.std():.2f} over {len(seed_returns)} episodes ({' '.join(f'{r:g}' for r in seed_returns)})"
            )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
