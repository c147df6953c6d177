"""The paper's iterative procedure with its stopping rule, per seed (Ha and
Schmidhuber 2018, section 5: "4. Go back to (2) if task has not been
completed"): each round's controller is judged on the real episodes that the
next round's collect stage plays with it (`--collect-with`, the
`controller_episode_return` of that stage's metrics.csv: about 55 episodes a
seed, real env steps the procedure spends anyway), and a seed stops at the
first round whose controller reaches the threshold there. Its result is that
round's own evaluation (eval.json: 100 other real episodes), so the episodes
that choose a round are not the ones that score it.

    python benchmarks/world_models_stop_rule.py --threshold 475 \\
        ROUND0_RUN ROUND1_RUN [ROUND2_RUN ...] --checks ROUND1_RUN ROUND2_RUN [ROUND3_CHECK_RUN ...]

ROUNDk_RUN: the run whose controller stage made round k's controller; the
k-th --checks run: the run whose collect stage played round k's controller
(the next round, or a collect-only run). Prints the chosen round and returns
per seed, and writes them as JSON with --out.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path


def read(run: Path) -> tuple[list[float], list[float]]:
    """(each seed's check: the controller-played episodes' mean return in this run's collect stage,
    each seed's evaluation mean) of a run; either may be empty."""
    checks: list[float] = []
    metrics = run / "collect" / "metrics.csv"
    if metrics.exists():
        rows = sorted(csv.DictReader(metrics.open()), key=lambda row: int(row["seed_index"]))
        checks = [float(row["controller_episode_return"]) for row in rows if row.get("controller_episode_return")]
    evaluation = run / "eval.json"
    per_seed = json.loads(evaluation.read_text()).get("per_seed", []) if evaluation.exists() else []  # none: no C stage
    evals = [seed[0] for seed in per_seed]
    return checks, evals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rounds", nargs="+", type=Path)
    parser.add_argument("--checks", nargs="+", type=Path, required=True)
    parser.add_argument("--threshold", type=float, default=475.0)
    parser.add_argument("--out", type=Path, default=None)
    flags = parser.parse_args()
    evals = [read(run)[1] for run in flags.rounds]
    checks = [read(run)[0] for run in flags.checks]
    if any(not c for c in checks) or any(not e for e in evals):
        raise SystemExit("every round needs its eval.json and every check run a collect stage with --collect-with")
    chosen = []
    for seed in range(len(evals[0])):
        for k, (check, evaluation) in enumerate(zip(checks, evals)):
            if check[seed] >= flags.threshold:
                chosen.append({"seed": seed, "round": k, "check": check[seed], "eval": evaluation[seed]})
                break
        else:  # never reached it within the rounds run: the last round's controller stands
            k = len(checks) - 1
            chosen.append({"seed": seed, "round": None, "check": checks[k][seed], "eval": evals[k][seed]})
    for row in chosen:
        where = f"round {row['round']}" if row["round"] is not None else f"not reached in {len(checks)} rounds"
        print(f"seed {row['seed']}: {where}; check {row['check']:.1f}, evaluation {row['eval']:.1f}")
    results = [row["eval"] for row in chosen]
    above = sum(r > flags.threshold for r in results)
    mean = sum(results) / len(results)
    print(f"evaluation over seeds: {mean:.1f} (mean), {above} of {len(results)} above {flags.threshold:g}")
    if flags.out:
        flags.out.write_text(json.dumps({"threshold": flags.threshold, "seeds": chosen, "mean": mean}, indent=2) + "\n")


if __name__ == "__main__":
    main()
