"""Results table (markdown) from run directories, for docs/.

    python benchmarks/summarize.py benchmarks/out/ppo/*/*

For each run: env, exp_name, seeds, env steps per seed, the final training
return (per seed: mean of the logged episode returns over the last 5% of
updates; then mean and std over seeds), the greedy evaluation at the end (mean
over seeds of each seed's mean, and the std of those per-seed means), the
weakest seed's evaluation, and the compile and training-loop wall times.

    python benchmarks/summarize.py --reach 195 benchmarks/out/unizero/cartpole-v0/*

prints instead, for runs logged with `--eval-every`, the env steps and the
training-loop seconds at which each seed's evaluation first reached 195.

    python benchmarks/summarize.py --windows 250000 game_score benchmarks/out/ppo/atari/seed*/*

prints, per run, the mean of a logged metric over consecutive windows of
that many env steps (docs/ppo.md's Breakout table: the whole-game score).

    python benchmarks/summarize.py --episode-windows 20000 benchmarks/out/unizero/breakout-minatar-lr1e-3/*/

prints, per seed, the mean return of the training episodes that ended in each
window of env steps (each logged row weighted by its `episodes_finished`),
then the mean over seeds: docs/unizero.md's and docs/unizero_ppo.md's
Breakout-MinAtar tables.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from jaxzoo import logger, plot


def summarize(run_dir: Path) -> dict:
    args = json.loads((run_dir / "args.json").read_text())
    evaluation = json.loads((run_dir / "eval.json").read_text())
    steps, curves = plot.seed_curves(run_dir, "episode_return")
    tail = max(1, len(steps) // 20)
    final = np.array([np.nanmean(c[-tail:]) for c in curves])
    per_seed_eval = np.asarray(evaluation["returns"]).mean(axis=1)
    return {
        "env": args["env_id"],
        "exp": args["exp_name"],
        "seeds": len(curves),
        "steps": int(steps[-1]),
        "final_train": (final.mean(), final.std()),
        "eval": (per_seed_eval.mean(), per_seed_eval.std()),
        "worst_eval": per_seed_eval.min(),
        "compile_s": evaluation.get("compile_seconds", float("nan")),
        "train_s": evaluation["train_seconds"],
    }


def first_reach(run_dir: Path, threshold: float) -> list[tuple[float, float] | None]:
    """Per seed, `(env steps, wall seconds)` of the first logged evaluation
    (`eval_return`, from `--eval-every`) at or above `threshold`; None if none."""
    rows = logger.read_metrics(run_dir)
    if "eval_return" not in rows:
        raise ValueError(f"{run_dir}: no eval_return column; run it with --eval-every N")
    reached = []
    for seed in np.unique(rows["seed"]):
        hit = (rows["seed"] == seed) & (rows["eval_return"] >= threshold)
        first = np.argmin(np.where(hit, rows["global_step"], np.inf)) if hit.any() else None
        reached.append(None if first is None else (rows["global_step"][first], rows["wall_seconds"][first]))
    return reached


def main_reach(run_dirs: list[str], threshold: float) -> None:
    print(f"| run | seeds | env steps to eval >= {threshold:g} (per seed) | training-loop seconds (per seed) | compile (s) |")
    print("| --- | --- | --- | --- | --- |")
    for run_dir in run_dirs:
        args = json.loads((Path(run_dir) / "args.json").read_text())
        compile_s = json.loads((Path(run_dir) / "eval.json").read_text()).get("compile_seconds", float("nan"))
        reached = first_reach(Path(run_dir), threshold)
        steps = ", ".join("never" if r is None else f"{r[0]:,.0f}" for r in reached)
        seconds = ", ".join("-" if r is None else f"{r[1]:.0f}" for r in reached)
        print(f"| {args['exp_name']} | {len(reached)} | {steps} | {seconds} | {compile_s:.1f} |")


def window_means(run_dir: Path, metric: str, window: int) -> tuple[np.ndarray, np.ndarray]:
    """The mean of `metric` over the rows of each window (w * window, (w + 1) *
    window] of env steps, all seeds pooled -> (window ends [W], means [W])."""
    rows = logger.read_metrics(run_dir)
    if metric not in rows:
        raise ValueError(f"{run_dir}: no {metric!r} column; it has {sorted(rows)}")
    steps, values = rows["global_step"], rows[metric]
    ends = np.arange(window, steps.max() + window, window)
    means = np.array([np.nanmean(values[(steps > end - window) & (steps <= end)]) for end in ends])
    return ends, means


def main_windows(run_dirs: list[str], window: int, metric: str) -> None:
    for run_dir in run_dirs:
        ends, means = window_means(Path(run_dir), metric, window)
        print(f"{run_dir}: mean {metric} per {window:,} env steps")
        print("| env steps | " + " | ".join(f"{int(end) - window:,}-{int(end):,}" for end in ends) + " |")
        print("| --- |" + " --- |" * len(ends))
        print(f"| {metric} | " + " | ".join(f"{m:.1f}" for m in means) + " |")


def episode_window_means(run_dir: Path, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per seed, the mean return of the training episodes that ended in each
    window (w * window, (w + 1) * window] of env steps: each row's
    `episode_return` (a mean over the episodes that ended during its update)
    weighted by its `episodes_finished` -> (window ends [W], seeds [S],
    means [S, W]; NaN where no episode of that seed ended in the window)."""
    rows = logger.read_metrics(run_dir)
    steps, seeds = rows["global_step"], rows["seed"]
    finished = np.nan_to_num(rows["episodes_finished"])
    returns = np.where(finished > 0, rows["episode_return"], 0.0)
    ends = np.arange(window, steps.max() + window, window)
    seed_ids = np.unique(seeds)
    means = np.full((len(seed_ids), len(ends)), np.nan)
    for i, seed in enumerate(seed_ids):
        for w, end in enumerate(ends):
            inside = (seeds == seed) & (steps > end - window) & (steps <= end)
            if finished[inside].sum() > 0:
                means[i, w] = (returns[inside] * finished[inside]).sum() / finished[inside].sum()
    return ends, seed_ids, means


def main_episode_windows(run_dirs: list[str], window: int) -> None:
    per_seed = []
    for run_dir in run_dirs:
        ends, seed_ids, means = episode_window_means(Path(run_dir), window)
        per_seed += [(f"{Path(run_dir).name}, seed {int(seed)}", ends, row) for seed, row in zip(seed_ids, means)]
    longest = max(per_seed, key=lambda r: len(r[1]))[1]
    print("| run, seed | " + " | ".join(f"{int(end) - window:,}-{int(end):,}" for end in longest) + " |")
    print("| --- |" + " --- |" * len(longest))
    table = np.full((len(per_seed), len(longest)), np.nan)
    for i, (name, _, row) in enumerate(per_seed):
        table[i, : len(row)] = row
        print(f"| {name} | " + " | ".join(f"{m:.2f}" for m in table[i]) + " |")
    print("| mean over seeds | " + " | ".join(f"{m:.2f}" for m in table.mean(axis=0)) + " |")


def main(run_dirs: list[str]) -> None:
    print("| env | run | seeds | env steps / seed | final training return | greedy eval | worst seed | compile (s) | training loop (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for run_dir in run_dirs:
        s = summarize(Path(run_dir))
        print(
            f"| {s['env']} | {s['exp']} | {s['seeds']} | {s['steps']:,} | {s['final_train'][0]:.1f} +- {s['final_train'][1]:.1f} "
            f"| {s['eval'][0]:.1f} +- {s['eval'][1]:.1f} | {s['worst_eval']:.1f} | {s['compile_s']:.1f} | {s['train_s']:.0f} |"
        )


def check_run_dirs(run_dirs: list[str]) -> list[str]:
    """Stop with a message naming what is not a run directory (one with args.json)."""
    bad = [d for d in run_dirs if not (Path(d) / "args.json").is_file()]
    if bad or not run_dirs:
        sys.exit(f"not run directories (no args.json): {bad or 'none given'}; see --help")
    return run_dirs


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__)
        sys.exit(0)
    if not argv:
        sys.exit(__doc__)  # the usage, with exit status 1
    if len(argv) > 1 and argv[0] == "--reach":
        main_reach(check_run_dirs(argv[2:]), float(argv[1]))
    elif len(argv) > 1 and argv[0] == "--episode-windows":
        main_episode_windows(check_run_dirs(argv[2:]), int(argv[1]))
    elif len(argv) > 2 and argv[0] == "--windows":
        main_windows(check_run_dirs(argv[3:]), int(argv[1]), argv[2])
    else:
        main(check_run_dirs(argv))
