"""From process start to a solved CartPole: whole `algos/ppo.py` processes, one seed each.

Issue 27's target: from process start to a greedy return of 475 (CartPole-v1,
10 greedy episodes) in under 5 s. Each seed is one process, timed from spawn
to exit (imports, tracing, loading the compiled program from the warm
compilation cache, training, the greedy evaluation, the exit); its greedy
return is read from the run's eval.json. With several `--config`s the
processes alternate (config A seed 0, config B seed 0, A seed 1, ...), so a
drift of the machine affects all alike. One unmeasured run per config first
fills the compilation cache.

    python benchmarks/ppo_start_to_solved.py --seeds 10 \\
        --config fast "--preset cartpole-fast" \\
        --config cartpole-150k "--preset cartpole --total-timesteps 150000"
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PPO = Path(__file__).resolve().parents[1] / "algos" / "ppo.py"
SOLVED = 475.0


def run(flags: str, seed: int, run_root: str) -> tuple[float, float]:
    """(wall seconds from spawn to exit, mean greedy return) of one process."""
    command = [sys.executable, str(PPO), *shlex.split(flags), "--seed", str(seed), "--run-root", run_root]
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} exited with {done.returncode}: {done.stderr[-2000:]}")
    (run_dir,) = [d for d in Path(run_root).iterdir() if f"__{seed}__" in d.name]
    return wall, json.loads((run_dir / "eval.json").read_text())["mean"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", nargs=2, action="append", metavar=("NAME", "FLAGS"), required=True)
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0 .. SEEDS-1, one process each")
    parser.add_argument("--out", default=None, help="write the per-seed figures here as JSON")
    ns = parser.parse_args()

    results: dict[str, dict] = {name: {"flags": flags, "wall": [], "greedy": []} for name, flags in ns.config}
    with tempfile.TemporaryDirectory() as scratch:
        for name, flags in ns.config:  # fills the compilation cache
            run(flags, 0, f"{scratch}/warm-{name}")
        for seed in range(ns.seeds):
            for name, flags in ns.config:
                wall, greedy = run(flags, seed, f"{scratch}/{name}")
                results[name]["wall"].append(wall)
                results[name]["greedy"].append(greedy)
                print(f"{name} seed {seed}: {wall:.2f} s, greedy {greedy:.1f}", flush=True)

    print("\n| config | flags | median wall (s) | min | max | seeds with greedy >= 475 | median greedy |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in results.items():
        solved = sum(g >= SOLVED for g in r["greedy"])
        print(
            f"| {name} | `{r['flags']}` | {statistics.median(r['wall']):.2f} | {min(r['wall']):.2f} "
            f"| {max(r['wall']):.2f} | {solved} of {ns.seeds} | {statistics.median(r['greedy']):.1f} |"
        )
    if ns.out:
        Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
