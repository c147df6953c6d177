"""Results table (markdown) from run directories, for docs/.

    python benchmarks/summarize.py benchmarks/out/ppo/*/*

For each run: env, exp_name, seeds, env steps per seed, the final training
return (per seed: mean of the logged episode returns over the last 5% of
updates; then mean and std over seeds), the greedy evaluation at the end (mean
over seeds of each seed's mean, and the std of those per-seed means), the
weakest seed's evaluation, and the compile and training-loop wall times.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from common import plot


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


def main(run_dirs: list[str]) -> None:
    print("| env | run | seeds | env steps / seed | final training return | greedy eval | worst seed | compile (s) | training loop (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for run_dir in run_dirs:
        s = summarize(Path(run_dir))
        print(
            f"| {s['env']} | {s['exp']} | {s['seeds']} | {s['steps']:,} | {s['final_train'][0]:.1f} +- {s['final_train'][1]:.1f} "
            f"| {s['eval'][0]:.1f} +- {s['eval'][1]:.1f} | {s['worst_eval']:.1f} | {s['compile_s']:.1f} | {s['train_s']:.0f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
