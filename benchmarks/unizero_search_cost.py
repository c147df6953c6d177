"""Search cost of algos/unizero.py: milliseconds per vectorised env step (one
search over `num_envs` roots) for Gumbel MuZero and PUCT at several simulation
counts, on the default CartPole model (untrained weights: the cost of a search
does not depend on them). Compilation is excluded; each measurement is the
median of `--repeats` timed calls after a warm-up, with jax.block_until_ready.

    python benchmarks/unizero_search_cost.py --out benchmarks/out/unizero/search_cost.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import jax

from jaxzoo.algos import unizero as uz  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--simulations", type=int, nargs="+", default=[4, 8, 16, 25, 50])
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=str, default=None)
    cli = parser.parse_args()
    rows = []
    for policy in ("gumbel", "puct"):
        for sims in cli.simulations:
            args = dataclasses.replace(uz.Args(), search_policy=policy, num_simulations=sims, num_envs=cli.num_envs)
            algo = uz.make_train(args)
            state = jax.jit(algo.init)(jax.random.key(0))
            history = uz.observe(state.history, state.obs, state.timestep)
            search = jax.jit(lambda key: algo.search(state.params, history, key, explore=True).action)
            jax.block_until_ready(search(jax.random.key(0)))  # compile and warm up
            times = []
            for i in range(cli.repeats):
                start = time.perf_counter()
                jax.block_until_ready(search(jax.random.key(i + 1)))
                times.append(time.perf_counter() - start)
            ms = 1000 * statistics.median(times)
            rows.append({"search_policy": policy, "num_simulations": sims, "num_envs": cli.num_envs,
                         "ms_per_vector_step": ms, "ms_per_env_step": ms / cli.num_envs})
            print(f"{policy:6s} {sims:3d} simulations: {ms:7.2f} ms per search of {cli.num_envs} envs "
                  f"({ms / cli.num_envs:.3f} ms per env step)", flush=True)
    if cli.out:
        Path(cli.out).parent.mkdir(parents=True, exist_ok=True)
        Path(cli.out).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
