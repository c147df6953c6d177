"""Evaluation return against env steps and against wall time: our UniZero
(a run logged with `--eval-every`) beside LightZero's UniZero
(docs/data/lightzero_unizero_cartpole_v0.csv, from benchmarks/lightzero_unizero.sh).
One line per seed, since LightZero's seeds stop at different env steps.

    python benchmarks/unizero_vs_lightzero.py benchmarks/out/unizero/vs-lightzero/*/ \
        --out docs/img/unizero_vs_lightzero_cartpole_v0.png

Our wall time is the training loop's (`wall_seconds`, evaluations included,
compile excluded); LightZero's is its process's from the start of training,
evaluations included. Both lines also print, per seed, the env steps and
seconds at which the evaluation first reached `--reach` (default 195), and
the CPU time per env step of whole processes: ours from the `seedN.time`
file that benchmarks/unizero.sh writes beside each run (with the seconds the
process spent outside its training loop: imports, compilation, final
writes), LightZero's from its CSV's last row. Last, the median over seeds of
the seconds from process start to that first evaluation, for each side, and
their ratio (issue 27's target): ours adds the seconds its process spent
outside the training loop to the loop's seconds at the crossing; a seed that
never reached counts as its last evaluation's time, a lower bound, so the
median is printed as a lower bound (">=") when such a seed falls at or below
the middle.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path

import numpy as np

from jaxzoo import logger


def ours(run_dir: Path) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per seed: env steps, training-loop seconds and evaluation return at each evaluation."""
    rows = logger.read_metrics(run_dir)
    if "eval_return" not in rows:
        raise ValueError(f"{run_dir}: no eval_return column; run it with --eval-every N")
    out = []
    for seed in np.unique(rows["seed"]):
        at = (rows["seed"] == seed) & ~np.isnan(rows["eval_return"])
        order = np.argsort(rows["global_step"][at])
        out.append(tuple(rows[name][at][order] for name in ("global_step", "wall_seconds", "eval_return")))
    return out


def process_times(run_dir: Path) -> tuple[float, float, float] | None:
    """Our process as /usr/bin/time saw it: (wall, CPU, seconds outside the
    training loop), or None without a seedN.time file."""
    args = json.loads((run_dir / "args.json").read_text())
    timing = run_dir.parent / f"seed{args['seed']}.time"
    if args["num_seeds"] != 1 or not timing.exists():
        return None
    wall, user, system = (float(re.search(rf"{name} ([\d.]+) s", timing.read_text())[1])
                          for name in ("wall", "user", "system"))
    return wall, user + system, wall - json.loads((run_dir / "eval.json").read_text())["train_seconds"]


def process_cost(run_dir: Path) -> str | None:
    """Seconds outside the training loop and CPU milliseconds per env step of
    our process, or None without a seedN.time file."""
    if (times := process_times(run_dir)) is None:
        return None
    wall, cpu, outside = times
    steps = logger.read_metrics(run_dir)["global_step"].max()
    return (f"process {wall:,.0f} s, of which {outside:.0f} s outside the training loop; "
            f"{cpu / steps * 1e3:.1f} ms of CPU per env step ({cpu / wall:.2f} cores)")


def lightzero(csv_path: Path) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    rows: dict[int, list[tuple[float, float, float]]] = {}
    with open(csv_path) as f:
        for row in csv.DictReader(f):
            rows.setdefault(int(row["seed"]), []).append(
                (float(row["env_steps"]), float(row["wall_seconds"]), float(row["eval_return"])))
    return [tuple(np.array(column) for column in zip(*rows[seed])) for seed in sorted(rows)]


def lightzero_cpu(csv_path: Path) -> list[str]:
    """Per seed: CPU milliseconds per env step over the whole process (its last row)."""
    last: dict[int, dict] = {}
    with open(csv_path) as f:
        for row in csv.DictReader(f):
            last[int(row["seed"])] = row
    return [f"{float(row['cpu_seconds']) / float(row['env_steps']) * 1e3:.1f} ms of CPU per env step "
            f"({row['cpu_seconds']} s for {row['env_steps']} env steps)" for _, row in sorted(last.items())]


def crossing(returns: np.ndarray, target: float) -> int | None:
    """Index of the first evaluation whose return is >= target (None: none is)."""
    hit = np.flatnonzero(returns >= target)
    return int(hit[0]) if hit.size else None


def first_reach(curves, target: float) -> list[str]:
    cells = []
    for steps, seconds, returns in curves:
        at = crossing(returns, target)
        cells.append(f"{steps[at]:,.0f} steps, {seconds[at]:,.0f} s" if at is not None
                     else f"not reached by {steps[-1]:,.0f} steps, {seconds[-1]:,.0f} s")
    return cells


def seconds_to_reach(curves, target: float, offsets) -> list[tuple[float, bool]]:
    """Per seed: (seconds to the first evaluation >= target plus its offset,
    whether it was reached); an unreached seed gives its last evaluation's."""
    out = []
    for (_, seconds, returns), offset in zip(curves, offsets):
        at = crossing(returns, target)
        out.append((float(seconds[-1 if at is None else at] + offset), at is not None))
    return out


def median_of_censored(times: list[tuple[float, bool]]) -> tuple[float, bool]:
    """The median of the seeds' seconds, and whether it is exact. An unreached
    seed's value is a lower bound: above the middle its true value cannot move
    the median, at or below the middle it can only raise it (then the median is
    a lower bound too)."""
    ordered = sorted(times)
    middle = ordered[(len(ordered) - 1) // 2 : len(ordered) // 2 + 1]
    exact = all(reached for _, reached in ordered[: len(ordered) // 2 + 1])
    return float(np.mean([t for t, _ in middle])), exact


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", type=Path, nargs="+",
                        help="jaxzoo UniZero runs logged with --eval-every (one per seed, or one with several)")
    parser.add_argument("--lightzero", type=Path, default=Path("docs/data/lightzero_unizero_cartpole_v0.csv"))
    parser.add_argument("--reach", type=float, default=195.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    our_curves = [curve for run_dir in args.run_dirs for curve in ours(run_dir)]
    our_costs = [cost for run_dir in args.run_dirs if (cost := process_cost(run_dir))]
    their_curves = lightzero(args.lightzero)
    sides = {f"jaxzoo UniZero ({len(our_curves)} seeds)": (our_curves, our_costs, "tab:blue"),
             "LightZero UniZero (one process per seed)": (their_curves, lightzero_cpu(args.lightzero), "tab:orange")}
    # From process start: ours adds the seconds outside its loop (our curves' clock is the loop's).
    outside = [times[2] if (times := process_times(d)) else float("nan") for d in args.run_dirs]
    if len(outside) != len(our_curves):
        outside = [float("nan")] * len(our_curves)  # a multi-seed run dir: no per-process split
    medians = {}
    sides_from_start = (("jaxzoo", our_curves, outside), ("LightZero", their_curves, [0.0] * len(their_curves)))
    for label, curves, offsets in sides_from_start:
        times = seconds_to_reach(curves, args.reach, offsets)
        medians[label] = median_of_censored(times)
        cells = ", ".join(f"{t:,.0f}" + ("" if reached else " (not reached: a lower bound)") for t, reached in times)
        print(f"{label}: seconds from process start to the first evaluation >= {args.reach:g}: {cells}; "
              f"median {'' if medians[label][1] else '>= '}{medians[label][0]:,.1f}")
    (ours_median, ours_exact), (theirs_median, theirs_exact) = medians["jaxzoo"], medians["LightZero"]
    if ours_exact:
        print(f"LightZero / jaxzoo, medians from process start: {'' if theirs_exact else '>= '}"
              f"{theirs_median / ours_median:.2f}x")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, (curves, costs, color) in sides.items():
        print(f"{label}: first evaluation >= {args.reach:g}:")
        for seed, cell in enumerate(first_reach(curves, args.reach)):
            print(f"  seed {seed}: {cell}")
        for seed, cost in enumerate(costs):
            print(f"  seed {seed}: {cost}")
        for i, (steps, seconds, returns) in enumerate(curves):
            axes[0].plot(steps, returns, color=color, alpha=0.8, label=label if i == 0 else None)
            axes[1].plot(seconds, returns, color=color, alpha=0.8, label=label if i == 0 else None)
    for axis, xlabel in zip(axes, ("env steps", "wall seconds (training loop / process)")):
        axis.axhline(args.reach, color="gray", linestyle=":", linewidth=1)
        axis.set_xlabel(xlabel)
        axis.set_ylabel("greedy evaluation return")
        axis.grid(alpha=0.3)
    axes[1].set_xscale("log")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle("UniZero on CartPole-v0: evaluation return, one line per seed")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
