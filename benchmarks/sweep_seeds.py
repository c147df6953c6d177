"""Per-seed returns of benchmarks/unizero_minatar_sweep.sh runs, pooled over calls.

    python benchmarks/sweep_seeds.py docs/data/unizero_ppo_minatar_regime \
        "PPO=ppo_500k,ppo_500k_s8" "pair=uzppo_gamma0.99_latent1,uzppo_gamma0.99_latent1_s4"

The sweep writes, per call, `all_metrics.csv` (every run's metrics.csv, with a `run`
column in front) and `logs_tail.txt` (each run's last log lines, after `== <run>`);
docs/data keeps them as `<set>_all_metrics.csv.gz` and `<set>_logs_tail.txt`. A run
with 8 vmapped seeds on one call and its continuation on other seeds on the next
(`--seed 8`) are one configuration: each GROUP=run,run,... pools their seeds.

Per group and seed: the mean return of the training episodes that ended in
(80k, 100k] (runs of 200k steps or more) and in the run's last 20k env steps, each
logged row weighted by its `episodes_finished` (as `summarize.py --episode-windows`),
and the greedy evaluation at the end (the `per seed:` list of the run's log). Then
the mean and standard deviation over the group's seeds.
"""

from __future__ import annotations

import csv
import gzip
import re
import statistics
import sys
from pathlib import Path


def read_runs(folder: Path) -> tuple[dict[str, list[dict]], dict[str, list[float]]]:
    """-> (rows of each run, greedy return of each seed of each run in seed order)."""
    rows: dict[str, list[dict]] = {}
    for path in sorted(folder.glob("*all_metrics.csv*")):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", newline="") as f:
            for row in csv.DictReader(f):
                rows.setdefault(row["run"], []).append(row)
    greedy: dict[str, list[float]] = {}
    for path in sorted(folder.glob("*logs_tail.txt")):
        run = None
        for line in path.read_text().splitlines():
            if line.startswith("== "):
                run = line.split()[1]
            elif run and (found := re.search(r"per seed: ([^)]*)\)", line)):
                greedy[run] = [float(x) for x in found.group(1).split(",")]
    return rows, greedy


def episode_mean(rows: list[dict], seed: int, low: int, high: int) -> float:
    """Mean return of the training episodes of `seed` that ended in (low, high]."""
    total = count = 0.0
    for row in rows:
        step, finished = int(row["global_step"]), float(row["episodes_finished"] or 0)
        if int(row["seed"]) == seed and low < step <= high and finished > 0:
            total, count = total + finished * float(row["episode_return"]), count + finished
    return total / count if count else float("nan")


def group_table(rows: dict[str, list[dict]], greedy: dict[str, list[float]], runs: list[str]) -> dict[int, tuple]:
    """-> {seed: (return at 80-100k, return over the last 20k, greedy)} over the runs."""
    per_seed = {}
    for run in runs:
        if run not in rows:
            raise SystemExit(f"no run {run!r} in the metrics; runs found: {', '.join(sorted(rows))}")
        last = max(int(r["global_step"]) for r in rows[run])
        seeds = sorted({int(r["seed"]) for r in rows[run]})
        evals = greedy.get(run, [float("nan")] * len(seeds))
        for seed, evaluation in zip(seeds, evals):
            early = episode_mean(rows[run], seed, 80_000, 100_000) if last >= 200_000 else float("nan")
            per_seed[seed] = (early, episode_mean(rows[run], seed, last - 20_000, last), evaluation)
    return dict(sorted(per_seed.items()))


def main(folder: str, groups: list[str]) -> None:
    rows, greedy = read_runs(Path(folder))
    print("| configuration | seeds | 80-100k | last 20k (per seed) | greedy (per seed) |")
    print("| --- | --- | --- | --- | --- |")
    for group in groups:
        name, _, runs = group.partition("=")
        table = group_table(rows, greedy, runs.split(","))
        early, late, evals = (list(column) for column in zip(*table.values()))

        def mean_std(values: list[float]) -> str:
            std = statistics.stdev(values) if len(values) > 1 else 0.0
            return f"{statistics.mean(values):.2f} +- {std:.2f}"

        line = (
            f"| {name} | {min(table)}-{max(table)} | {statistics.mean(early):.2f} | {mean_std(late)} "
            f"({', '.join(f'{x:.1f}' for x in late)}) | {mean_std(evals)} ({', '.join(f'{x:.1f}' for x in evals)}) |"
        )
        print(line.replace("| nan |", "| - |"))  # 80-100k of runs shorter than 200k


if __name__ == "__main__":
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2:])
