"""What prioritised replay's importance weights do to a batch, read from a run's replay.

    python benchmarks/priority_weights.py <run dir> [--batch-size 256] [--pairs 1,1 0.6,0.4]

Loads the priorities p of the newest checkpoint of a UniZero run trained with
`--priority-exponent` (the buffer's [rows, envs] priorities; unwritten rows are 0),
prints their quantiles, then for each (alpha, beta) pair draws batches as the
sampler does (P(i) = p_i^alpha / sum p^alpha) and prints the median over batches
of the mean importance weight (N P(i))^-beta / max, of the batch's Kish effective
size (sum w)^2 / sum w^2, and the share of draws that fall on the top tenth of
priorities (0.10 when uniform). docs/unizero.md ("Prioritised replay on top of
the combination") quotes its output.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--pairs", nargs="+", default=["1,1", "0.6,0.4", "1,0.4", "0.6,1"], help="alpha,beta pairs")
    args = parser.parse_args()
    checkpoints = sorted((args.run_dir / "checkpoints").glob("update_*.npz"))
    if not checkpoints:
        raise SystemExit(f"no checkpoints/update_*.npz under {args.run_dir}")
    with np.load(checkpoints[-1]) as saved:
        if ".buffer.priority" not in saved.files:
            raise SystemExit(f"{checkpoints[-1]} holds no replay priorities")
        priority = saved[".buffer.priority"].astype(np.float64).reshape(-1)
    priority = priority[priority > 0]  # written rows only
    n = priority.size
    quantiles = np.quantile(priority, [0, 0.01, 0.1, 0.5, 0.9, 0.99, 1])
    print(f"{checkpoints[-1]}: {n} written steps; priority quantiles 0/1/10/50/90/99/100%:")
    print("  " + ", ".join(f"{q:.3g}" for q in quantiles))
    top_tenth = priority >= np.quantile(priority, 0.9)
    rng = np.random.default_rng(0)
    print("| alpha | beta | mean weight | effective batch | draws from the top tenth |")
    print("| --- | --- | --- | --- | --- |")
    for pair in args.pairs:
        alpha, beta = (float(x) for x in pair.split(","))
        probability = priority**alpha / np.sum(priority**alpha)
        means, sizes = [], []
        for _ in range(args.batches):
            drawn = rng.choice(n, args.batch_size, p=probability)
            weights = (n * probability[drawn]) ** -beta
            weights /= weights.max()
            means.append(weights.mean())
            sizes.append(weights.sum() ** 2 / np.sum(weights**2))
        share = probability[top_tenth].sum()
        print(
            f"| {alpha:g} | {beta:g} | {np.median(means):.3f} | {np.median(sizes):.1f} of {args.batch_size} | {share:.2f} |"
        )


if __name__ == "__main__":
    main()
