"""Greedy evaluation of a run's checkpoint, read-only: the run directory is not
written to, so a stopped run can be evaluated mid-way and resumed after.

    python benchmarks/eval_checkpoint.py RUN_DIR [RUN_DIR ...] [--episodes 10] [--update N]

Each run is rebuilt from its args.json by the algorithm file that wrote it,
its newest checkpoint (or update N's) restored, and evaluated by the
program the run's own evaluation uses (common/runner.py,
`evaluation_program`: the same keys, compiled the same way), so on a
finished run's last checkpoint this repeats its eval.json. For the files
whose runs go through common/runner.py: not world_models.py (staged) nor
impala.py's `--architecture sebulba` (actor threads), which are refused.
docs/unizero.md (Breakout-MinAtar, 500k) uses it to compare the greedy
policy with the training return.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
from pathlib import Path

import jax
import numpy as np

from jaxzoo import checkpoint, cli, runner


def evaluate_checkpoint(run_dir: str, episodes: int | None = None, update: int | None = None):
    """(update, returns [num_seeds, episodes]) of the run's checkpoint at `update`
    (None: its newest), with `episodes` greedy episodes per seed (None: the
    run's own eval_episodes)."""
    args_path = Path(run_dir) / "args.json"
    if not args_path.exists():
        raise SystemExit(f"{run_dir!r} is not a run directory: it has no args.json")
    algorithm = json.loads(args_path.read_text()).get("algorithm")
    if algorithm is None:
        raise SystemExit(f"{args_path} does not name the algorithm that wrote it (written before runs did)")
    module = importlib.import_module(f"jaxzoo.algos.{algorithm}")
    args = cli.load_run_args(module.Args, run_dir, algorithm)
    if algorithm == "world_models" or getattr(args, "architecture", None) == "sebulba":
        raise SystemExit(
            f"{run_dir!r} was written by {algorithm}.py's own loop, not common/runner.py's; "
            "its checkpoints hold no single evaluable state (accepted: ppo, rainbow, mpo, planet, unizero, "
            "unizero_ppo, impala without --architecture sebulba)"
        )
    if episodes is not None:
        args = dataclasses.replace(args, eval_episodes=episodes)
    algo = module.make_train(args)
    seeds = args.seed + np.arange(args.num_seeds, dtype=np.int32)
    template = jax.eval_shape(lambda s: runner.init_seeds(algo.init, s), seeds)
    state, restored = checkpoint.restore(run_dir, template, update)
    returns = runner.evaluation_program(args, algo.evaluate, args.eval_every)(state, seeds)
    if isinstance(returns, tuple):  # --capture-video runs also return the recording
        returns = returns[0]
    return restored, np.asarray(returns)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--episodes", type=int, default=None, help="greedy episodes per seed (default: the run's own)")
    parser.add_argument("--update", type=int, default=None, help="the checkpoint's update (default: the newest)")
    options = parser.parse_args(argv)
    if options.episodes is not None and options.episodes < 1:
        parser.error(f"--episodes must be at least 1, got {options.episodes}")
    for run_dir in options.run_dirs:
        update, returns = evaluate_checkpoint(run_dir, options.episodes, options.update)
        for seed_index, seed_returns in enumerate(returns):
            print(
                f"{run_dir} update {update} seed index {seed_index}: greedy {seed_returns.mean():.2f} "
                f"+- {seed_returns.std():.2f} over {len(seed_returns)} episodes ({' '.join(f'{r:g}' for r in seed_returns)})"
            )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
