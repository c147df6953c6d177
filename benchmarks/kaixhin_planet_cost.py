"""Kaixhin's PlaNet (PyTorch) planner cost at our `cpu` preset's CEM settings, for the
side-by-side with benchmarks/planet_cost.py (docs/planet.md, "Planner cost per step").

Runs with the python of a separate virtual environment that has a CPU build of torch
(nothing else: Kaixhin's models.py and planner.py import only torch); nothing here is
Kaixhin's code. It imports TransitionModel, RewardModel and MPCPlanner from a work tree of
the Kaixhin/PlaNet repository (--planet), builds them at the `cpu` preset's sizes and
times one planning call `planner(belief, state)` (= choosing one action) under
torch.no_grad:

    /tmp/kaixhin-venv/bin/python benchmarks/kaixhin_planet_cost.py --planet /tmp/kaixhin-planet
    python benchmarks/planet_cost.py --presets cpu --no-episode      # ours: the `plan` figure

Tested against Kaixhin/PlaNet commit 28c8491bc01e8f1b911300749e04c308c03db051 (2021-07-29,
its master) with torch 2.13.0+cpu on Python 3.11.

What matches ours (algos/planet.py, `cpu` preset): belief 64, state 16, hidden 64,
embedding 128 (the posterior layer is built but planning never calls it), action size 1
(Pendulum-v1), ReLU (Kaixhin's default activation_function 'relu'), min_std_dev 0.1 (its
default; our min_std 0.1); the same layers (Linear [s, a] -> D, GRUCell D, prior Linear D
-> H -> 2Z with softplus + min std, reward MLP D+Z -> H -> H -> 1); CEM with horizon 12, 5
iterations, 128 candidates, top 12, starting from N(0, 1), refitting mean and std
(population, unbiased=False) to the elites, and returning the first action of the final
mean (both planners do; neither returns a single best sequence); untrained weights;
compilation/warm-up excluded (--warmup plans first: TorchScript's profiling executor
optimises over the first calls; with 5 the first timed call still took 4x the rest);
median of --repeats timed calls, each --plans-per-call plans in a row divided by that
count (the same flags and defaults as planet_cost.py); all of the machine's cores
(torch.set_num_threads, --threads; XLA uses all cores). With these small matrices (128 x
64) torch's intra-op threading can cost more than it saves: on the loaded 2-core machine
of the first check --threads 1 planned about 3x faster than 2 threads (23 against 73 ms),
so give both when quoting Kaixhin's cost.

What differs: (1) the rollouts: Kaixhin samples the prior states (mean + std * randn, the
paper's), while our `cpu` preset has plan_with_mean = true (prior means; the same
arithmetic with zero noise, so about the same cost); (2) action bounds: Kaixhin clamps to
the env's range (Pendulum-v1 [-2, 2], as its main.py passes env.action_range), ours clips
to [-1, 1] and rescales: the same cost, a different search (its N(0, 1) start covers half
the torque range ours does); (3) execution: Kaixhin's is TorchScript (jit.ScriptModule:
its interpreter runs the horizon loop as a sequence of small ops, each batched over the
candidates), ours one XLA program (vmap over candidates, scan over the horizon);
planet_cost.py runs its 10 plans in one program (lax.map), so per-call dispatch is
excluded there, while here each plan is its own Python call as in Kaixhin's main.py (use
planet_cost.py --plans-per-call 1 for ours with dispatch); (4) ours also returns the
elites' mean predicted return (a negligible extra mean); (5) planet_cost.py also times a
model update (and, without --no-episode, an episode) in the same run; only its `plan`
figure is comparable here. Neither number includes the filtering step (encoder +
posterior) that precedes each plan when acting. Per env step = per plan / action repeat (4
in the `cpu` preset, --action-repeat).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

KAIXHIN_COMMIT = "28c8491bc01e8f1b911300749e04c308c03db051"

# Our `cpu` preset (configs/planet.toml) for Pendulum-v1.
CPU_PRESET = dict(
    belief_size=64,
    state_size=16,
    hidden_size=64,
    embedding_size=128,
    action_size=1,
    planning_horizon=12,
    optimisation_iters=5,
    candidates=128,
    top_candidates=12,
    action_repeat=4,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--planet", default="/tmp/kaixhin-planet", help="work tree of Kaixhin/PlaNet")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--plans-per-call", type=int, default=10, help="plans run one after another per timed call")
    parser.add_argument(
        "--warmup", type=int, default=20, help="untimed plans first (TorchScript profiles and optimises)"
    )
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads (default: all cores)"
    )
    parser.add_argument("--action-repeat", type=int, default=CPU_PRESET["action_repeat"])
    parser.add_argument(
        "--min-action", type=float, default=-2.0, help="Pendulum-v1's torque range, as Kaixhin's env gives it"
    )
    parser.add_argument("--max-action", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    cli_args = parser.parse_args()

    sys.path.insert(0, str(Path(cli_args.planet).resolve()))
    import torch
    from models import RewardModel, TransitionModel  # Kaixhin's
    from planner import MPCPlanner  # Kaixhin's

    torch.set_num_threads(cli_args.threads)
    torch.manual_seed(cli_args.seed)
    p = CPU_PRESET
    transition_model = TransitionModel(
        p["belief_size"], p["state_size"], p["action_size"], p["hidden_size"], p["embedding_size"], "relu"
    )  # min_std_dev: its default 0.1
    reward_model = RewardModel(p["belief_size"], p["state_size"], p["hidden_size"], "relu")
    planner = MPCPlanner(
        p["action_size"],
        p["planning_horizon"],
        p["optimisation_iters"],
        p["candidates"],
        p["top_candidates"],
        transition_model,
        reward_model,
        cli_args.min_action,
        cli_args.max_action,
    )
    assert transition_model.min_std_dev == 0.1
    # One env: belief [1, D] and state [1, Z], as its main.py hands the filtered latent to the planner.
    belief, state = torch.zeros(1, p["belief_size"]), torch.zeros(1, p["state_size"])
    count = cli_args.plans_per_call
    times = []
    with torch.no_grad():
        for _ in range(cli_args.warmup):
            action = planner(belief, state)
        assert action.shape == (1, p["action_size"]) and cli_args.min_action <= action.item() <= cli_args.max_action
        for _ in range(cli_args.repeats):
            start = time.perf_counter()
            for _ in range(count):
                planner(belief, state)
            times.append((time.perf_counter() - start) / count)
    plan_s = statistics.median(times)

    commit = KAIXHIN_COMMIT
    if (Path(cli_args.planet) / ".git").exists():
        commit = (
            subprocess.run(
                ["git", "-C", cli_args.planet, "rev-parse", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            or commit
        )
    row = {
        "preset": "cpu",
        "implementation": "Kaixhin/PlaNet",
        "candidates": p["candidates"],
        "planning_horizon": p["planning_horizon"],
        "optimisation_iters": p["optimisation_iters"],
        "top_candidates": p["top_candidates"],
        "action_repeat": cli_args.action_repeat,
        "plan_ms": 1000 * plan_s,
        "plan_ms_per_env_step": 1000 * plan_s / cli_args.action_repeat,
        "plan_ms_all_repeats": [1000 * t for t in times],
    }
    print(
        f"Kaixhin/PlaNet {commit[:7]}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{count} plans per timed call, median of {cli_args.repeats}: plan {row['plan_ms']:.1f} ms "
        f"({p['optimisation_iters']} x {p['candidates']} candidates x {p['planning_horizon']} steps, top "
        f"{p['top_candidates']}; {row['plan_ms_per_env_step']:.2f} ms per env step at action repeat "
        f"{cli_args.action_repeat})",
        flush=True,
    )
    if cli_args.out:
        Path(cli_args.out).parent.mkdir(parents=True, exist_ok=True)
        machine = {
            "cpu_count": os.cpu_count(),
            "processor": platform.processor(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "kaixhin_commit": commit,
            "load_average": os.getloadavg(),
        }
        Path(cli_args.out).write_text(json.dumps({"machine": machine, "rows": [row]}, indent=2) + "\n")


if __name__ == "__main__":
    main()
