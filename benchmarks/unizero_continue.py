"""Continue a UniZero run from its checkpoint under changed hyperparameters, read-only:
an experiment on a trained agent (docs/unizero.md, "The 10-brick trap").

    python benchmarks/unizero_continue.py RUN_DIR --steps 50000 [--hparam NAME=VALUE ...]
        [--set FIELD=VALUE ...] [--schedule-steps 1000000] [--out metrics.csv] [--save NEW_RUN_DIR]

The run's newest checkpoint (parameters, optimizer, replay, envs) is restored
and trained on for `--steps` more env steps per seed with the run's own update,
after replacing fields of the state's `Hyperparams` (e.g. `q_rescale_min_gap=0.01`),
which the update reads at run time, or of the run's Args that the state's
shapes do not depend on (`--set`, as in eval_checkpoint.py, e.g.
`explore_epsilon=0.05`; compiled in). The run
directory is not written to. With --anneal-lr runs the step size follows
learning_rate x (1 - update / num_updates) with num_updates from
`--schedule-steps` (the run's own total would give 0 at its end). Prints the mean return of the
training episodes ending in each `--window` of env steps, and writes every
update's metrics to `--out` if given. `--save` writes the continued state as
a new run directory (args.json with the changes, one checkpoint), which must
not exist yet, for eval_checkpoint.py and unizero_breakout_replay.py.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib.util
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxzoo import checkpoint, logger
from jaxzoo.algos import unizero

HERE = Path(__file__).resolve().parent


def load_eval_checkpoint():
    spec = importlib.util.spec_from_file_location("eval_checkpoint", HERE / "eval_checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_hparams(settings: list[str]) -> dict[str, float]:
    names = [f.name for f in dataclasses.fields(unizero.Hyperparams)]
    values = {}
    for setting in settings:
        name, sep, text = setting.partition("=")
        if not sep or name not in names:
            raise SystemExit(f"--hparam {setting!r}: accepted: NAME=VALUE with NAME one of {', '.join(names)}")
        try:
            values[name] = float(text)
        except ValueError:
            raise SystemExit(f"--hparam {setting!r}: {name} takes a number, got {text!r}") from None
    return values


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir")
    parser.add_argument("--steps", type=int, default=50_000, help="env steps per seed to train on (default 50,000)")
    parser.add_argument("--hparam", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a run arg to change")
    parser.add_argument("--schedule-steps", type=int, default=None, help="total_timesteps of the lr schedule")
    parser.add_argument("--window", type=int, default=10_000, help="env steps per printed window")
    parser.add_argument("--chunk", type=int, default=25, help="updates per jitted chunk")
    parser.add_argument("--out", default=None, help="CSV of every update's metrics")
    parser.add_argument("--save", default=None, help="new run directory for the continued state")
    options = parser.parse_args(argv)
    changes = parse_hparams(options.hparam)
    if options.save and Path(options.save).exists():
        raise SystemExit(f"--save {options.save!r} exists; name a new directory (a run directory is never shared)")

    eval_checkpoint = load_eval_checkpoint()
    module, args = eval_checkpoint.load_args(options.run_dir)
    if module is not unizero:
        raise SystemExit(f"{options.run_dir!r} is a {module.__name__} run; this script continues unizero runs")
    arg_changes = eval_checkpoint.parse_overrides(args, options.set)
    args = dataclasses.replace(args, **arg_changes, **changes)  # Hyperparams fields are Args fields too
    if options.schedule_steps is not None:
        args = dataclasses.replace(args, total_timesteps=options.schedule_steps)
    algo, state, update, _ = eval_checkpoint.restore_state(options.run_dir, unizero, args)
    state = state.replace(
        hparams=state.hparams.replace(**{k: jnp.full_like(getattr(state.hparams, k), v) for k, v in changes.items()})
    )
    chunk = jax.jit(jax.vmap(lambda s: jax.lax.scan(lambda s, _: algo.update(s), s, None, options.chunk)))
    start_steps = int(np.asarray(state.env_steps)[0])
    print(
        f"restored update {update} at {start_steps:,} env steps; changed: {(changes | arg_changes) or 'nothing'}",
        flush=True,
    )
    rows: list[dict] = []
    started = time.perf_counter()
    while int(np.asarray(state.env_steps)[0]) < start_steps + options.steps:
        state, metrics = chunk(state)
        metrics = jax.tree.map(np.asarray, metrics)  # leaves [seeds, chunk]
        for i in range(options.chunk):
            for seed_index in range(args.num_seeds):
                rows.append({k: float(v[seed_index, i]) for k, v in metrics.items()} | {"seed_index": seed_index})
        done = int(np.asarray(state.env_steps)[0]) - start_steps
        finished = metrics["episodes_finished"]
        mean_return = np.nansum(metrics["episode_return"] * finished) / max(finished.sum(), 1)
        print(
            f"  {done:,} env steps, {time.perf_counter() - started:.0f} s, training return {mean_return:.2f}",
            flush=True,
        )
    steps_per_update = args.steps_per_update
    for row_index, row in enumerate(rows):
        row["env_steps"] = start_steps + (row_index // args.num_seeds + 1) * steps_per_update
    print("window (env steps)   mean return of training episodes ending in it   episodes")
    for low in range(start_steps, start_steps + options.steps, options.window):
        inside = [r for r in rows if low < r["env_steps"] <= low + options.window and r["episodes_finished"] > 0]
        episodes = sum(r["episodes_finished"] for r in inside)
        mean = sum(r["episode_return"] * r["episodes_finished"] for r in inside) / max(episodes, 1)
        print(f"{low:,}-{low + options.window:,}   {mean:.2f}   {int(episodes)}")
    if options.out:
        with open(options.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    if options.save:
        Path(options.save).mkdir(parents=True)
        logger.write_args_json(
            Path(options.save), args, {"algorithm": "unizero", "jaxzoo_version": checkpoint.package_version()}
        )
        update_index = int(np.asarray(state.env_steps)[0]) // steps_per_update
        print(f"saved update {update_index} to {checkpoint.save(options.save, update_index, state)}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
