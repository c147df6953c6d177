"""A uniformly random policy on CarRacing-v3 (actions uniform in [-1, 1] x
[0, 1] x [0, 1], the collect stage's), over 100 episodes of up to 1000 steps:
the baseline the evolved controllers of docs/world_models.md are read
against. The episodes run as the controllers' do (world_models.CarRacingHost,
rounds of host_envs envs in lockstep, seeds seed, seed + 1, ...).

    python benchmarks/world_models_carracing_random.py --out benchmarks/out/world_models/carracing-cpu/random.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np

from jaxzoo import cli
from jaxzoo.algos import world_models as wm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1_000_000, help="first track seed (the runs draw theirs at random)")
    parser.add_argument("--host-envs", type=int, default=16)
    parser.add_argument("--out", default=None)
    flags = parser.parse_args()
    args = dataclasses.replace(cli.preset_args(wm.Args, "world_models", "carracing-cpu"), host_envs=flags.host_envs)
    host = wm.CarRacingHost(args)
    rng = np.random.default_rng(flags.seed)
    random_actions = lambda frames: rng.uniform([-1.0, 0.0, 0.0], [1.0, 1.0, 1.0], (len(frames), 3))  # noqa: E731
    returns = []
    for first in range(0, flags.episodes, flags.host_envs):
        seeds = list(range(flags.seed + first, flags.seed + min(first + flags.host_envs, flags.episodes)))
        rewards = host.lockstep(seeds, 1000, random_actions)[1]
        returns.extend(rewards.sum(1).tolist())
    host.close()
    summary = {"policy": "uniform random", "episodes": len(returns), "mean": float(np.mean(returns)),
               "std": float(np.std(returns)), "returns": returns}
    print(f"random policy on CarRacing-v3: {summary['mean']:.1f} +- {summary['std']:.1f} over {len(returns)} episodes")
    if flags.out:
        Path(flags.out).parent.mkdir(parents=True, exist_ok=True)
        Path(flags.out).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":  # the fork server of the host envs re-imports this module
    main()
