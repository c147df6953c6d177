"""Learning curves from run directories: mean over seeds with a 95% confidence
band, against environment steps, written as PNG.

    python -m jaxzoo.plot runs/CartPole-v1__ppo__0__* --out cartpole.png
    python -m jaxzoo.plot runs/A runs/B --labels A B --metric episode_return

Runs with the same label (by default their `exp_name`) are pooled: every seed
of every run directory is one curve sample.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from jaxzoo.logger import read_metrics


def seed_curves(run_dir: str | Path, metric: str = "episode_return") -> tuple[np.ndarray, list[np.ndarray]]:
    """`(global_steps, [values per seed])`; gaps (NaN, no episode finished in that
    update) are filled with the seed's previous finite value."""
    columns = read_metrics(run_dir)
    if metric not in columns:
        raise ValueError(f"{run_dir}: no column {metric!r}; have {sorted(columns)}")
    seeds = np.unique(columns["seed"])
    curves: list[np.ndarray] = []
    steps = np.empty(0)
    for i, seed in enumerate(seeds):
        mask = columns["seed"] == seed
        order = np.argsort(columns["global_step"][mask])
        x = columns["global_step"][mask][order]
        y = forward_fill(columns[metric][mask][order])
        steps = x if i == 0 else steps
        curves.append(np.interp(steps, x, y) if len(x) != len(steps) else y)
    return steps, curves


def forward_fill(y: np.ndarray) -> np.ndarray:
    y = y.copy()
    finite = np.isfinite(y)
    if not finite.any():
        return y
    index = np.where(finite, np.arange(len(y)), 0)
    np.maximum.accumulate(index, out=index)
    y = y[index]
    y[: np.argmax(finite)] = np.nan
    return y


def trailing_mean(y: np.ndarray, window: int) -> np.ndarray:
    """Mean of the last `window` finite values up to each point (fewer at the start;
    NaN where none is finite). No padding, so a flat curve stays flat at both ends."""
    finite = np.isfinite(y)
    total = np.concatenate([[0.0], np.cumsum(np.where(finite, y, 0.0))])
    count = np.concatenate([[0], np.cumsum(finite)])
    start = np.maximum(np.arange(1, len(y) + 1) - window, 0)
    n = count[1:] - count[start]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (total[1:] - total[start]) / n, np.nan)


def mean_and_ci(curves: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Mean over seeds and the half-width of a normal 95% confidence interval."""
    stacked = np.stack(curves)
    mean = np.nanmean(stacked, axis=0)
    n = np.sum(np.isfinite(stacked), axis=0)
    std = np.nanstd(stacked, axis=0, ddof=1) if stacked.shape[0] > 1 else np.zeros_like(mean)
    return mean, 1.96 * np.nan_to_num(std) / np.sqrt(np.maximum(n, 1))


def plot_runs(
    run_dirs: Sequence[str | Path],
    out: str | Path,
    metric: str = "episode_return",
    labels: Sequence[str] | None = None,
    title: str | None = None,
    smooth: int = 1,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if labels is not None and len(labels) != len(run_dirs):
        raise ValueError(f"{len(labels)} labels for {len(run_dirs)} run directories")
    groups: dict[str, list] = defaultdict(list)
    for i, run_dir in enumerate(run_dirs):
        label = labels[i] if labels else json.loads((Path(run_dir) / "args.json").read_text())["exp_name"]
        groups[label].append(seed_curves(run_dir, metric))
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, runs in groups.items():
        steps = runs[0][0]
        curves = [np.interp(steps, x, c) for x, cs in runs for c in cs]
        if smooth > 1:
            curves = [trailing_mean(c, smooth) for c in curves]
        mean, half_width = mean_and_ci(curves)
        ax.plot(steps, mean, label=f"{label} ({len(curves)} seeds)")
        ax.fill_between(steps, mean - half_width, mean + half_width, alpha=0.25)
    ax.set_xlabel("environment steps")
    ax.set_ylabel(metric.replace("_", " "))
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+")
    parser.add_argument("--out", required=True, help="PNG file to write")
    parser.add_argument("--metric", default="episode_return")
    parser.add_argument("--labels", nargs="*", default=None)
    parser.add_argument("--title", default=None)
    parser.add_argument("--smooth", type=int, default=1, help="moving-average window in logged updates")
    ns = parser.parse_args(argv)
    print(plot_runs(ns.run_dirs, ns.out, ns.metric, ns.labels, ns.title, ns.smooth))


if __name__ == "__main__":
    main()
