"""Random policies on CarRacing-v3 over 100 episodes of up to 1000 steps: the
baselines the evolved controllers of docs/world_models.md are read against.
`uniform`: actions uniform in [-1, 1] x [0, 1] x [0, 1] (the seed's random
policy); `random-controller`: the authors' random C, the carracing presets'
collect policy (world_models.CarRacingHost.random_policy). The episodes run
as the controllers' do (CarRacingHost.episodes: host_envs processes as a work
queue, episode i on the track of seed + i).

    python benchmarks/world_models_carracing_random.py --out benchmarks/out/world_models/carracing-cpu/random.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from jaxzoo import cli
from jaxzoo.algos import world_models as wm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1_000_000, help="first track seed (the runs draw theirs at random)")
    parser.add_argument("--host-envs", type=int, default=16)
    parser.add_argument("--out", default=None)
    flags = parser.parse_args()
    summary = {}
    for policy in ("uniform", "random-controller"):
        args = cli.preset_args(wm.Args, "world_models", "carracing-cpu")
        host = wm.CarRacingHost(dataclasses.replace(args, host_envs=flags.host_envs, collect_policy=policy))
        seeds = list(range(flags.seed, flags.seed + flags.episodes))
        returns = host.episodes(seeds, 1000, host.random_policy(seeds))[1].sum(1)
        host.close()
        summary[policy] = {"episodes": len(returns), "mean": float(returns.mean()), "std": float(returns.std()),
                           "returns": returns.tolist()}
        print(f"{policy} random policy on CarRacing-v3: {returns.mean():.1f} +- {returns.std():.1f} "
              f"over {len(returns)} episodes", flush=True)
    if flags.out:
        Path(flags.out).parent.mkdir(parents=True, exist_ok=True)
        Path(flags.out).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":  # the fork server of the host envs re-imports this module
    main()
