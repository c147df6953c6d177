"""Return of uniformly random actions on a DeepMind Control task, with an action
repeat: the baseline docs/planet.md compares PlaNet's DeepMind Control runs to.

    python benchmarks/dmc_random.py --task cartpole-swingup --action-repeat 8 --episodes 20
"""

import argparse

import numpy as np

from jaxzoo import dmc


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--task", default="cartpole-swingup", help="<domain>-<task>")
    parser.add_argument("--action-repeat", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=20)
    args = parser.parse_args()
    domain, task = dmc.parse(dmc.PREFIX + args.task)
    returns = []
    for episode in range(args.episodes):
        env = dmc.load(domain, task, seed=episode)
        spec, rng = env.action_spec(), np.random.default_rng(episode)
        time_step, total = env.reset(), 0.0
        while not time_step.last():
            action = rng.uniform(spec.minimum, spec.maximum, spec.shape)
            for _ in range(args.action_repeat):
                time_step = env.step(action)
                total += time_step.reward
                if time_step.last():
                    break
        returns.append(total)
    print(f"dmc:{args.task}, uniformly random actions, action repeat {args.action_repeat}, {args.episodes} episodes: "
          f"{np.mean(returns):.1f} +- {np.std(returns):.1f}")


if __name__ == "__main__":
    main()
