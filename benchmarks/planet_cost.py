"""Compute cost of algos/planet.py per preset: one CEM plan (the planner's cost
per agent step; ten in a row in one program, divided by ten), one acting step (render, encode, filter, plan, env steps:
from a planned evaluation episode), and one model update; from them the cost
of one training iteration (`collect_interval` updates and one episode).
Untrained weights (the cost does not depend on them); compilation excluded;
each figure is the median of `--repeats` timed calls after a warm-up, with
jax.block_until_ready.

    python benchmarks/planet_cost.py --presets cpu --out benchmarks/out/planet/cost_cpu.json
    python benchmarks/planet_cost.py --presets paper --repeats 1 --plans-per-call 1 --no-episode \
        --out benchmarks/out/planet/cost_paper.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxzoo import buffers, cli  # noqa: E402
from jaxzoo.algos import planet  # noqa: E402


def median_seconds(fn, repeats: int) -> float:
    jax.block_until_ready(fn(0))  # compile and warm up
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(i + 1))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["cpu", "paper"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--plans-per-call", type=int, default=10, help="plans run one after another per timed call")
    parser.add_argument("--no-episode", action="store_true",
                        help="skip timing a whole planned episode (the paper preset's takes minutes per plan step "
                             "on a CPU); acting per step is then reported as plan + the rest unmeasured")
    parser.add_argument("--out", default=None)
    cli_args = parser.parse_args()
    rows = []
    for preset in cli_args.presets:
        args = dataclasses.replace(cli.preset_args(planet.Args, "planet", preset), eval_episodes=1)
        algo = planet.make_train(args)
        state = jax.jit(algo.init)(jax.random.key(0))
        latent = planet.Latent(jnp.zeros(args.belief_size), jnp.zeros(args.state_size))
        # Several plans one after another in one program, so dispatch overhead is not counted.
        count = cli_args.plans_per_call
        plans = jax.jit(lambda params, key: jax.lax.map(lambda k: algo.plan(params, latent, k)[0],
                                                        jax.random.split(key, count)))
        plan_s = median_seconds(lambda i: plans(state.params, jax.random.key(i)), cli_args.repeats) / count
        slots = args.episode_steps + 1
        if cli_args.no_episode:
            episode_s = float("nan")
        else:
            evaluate = jax.jit(algo.evaluate)
            episode_s = median_seconds(lambda i: evaluate(state, jax.random.key(i)), max(1, cli_args.repeats // 2))
        batch = buffers.sample(state.buffer, jax.random.key(1), args.batch_size, args.chunk_size).windows
        model_step = jax.jit(algo.model_step)
        update_s = median_seconds(lambda i: model_step(state.params, state.opt_state, batch, jax.random.key(i))[2],
                                  cli_args.repeats)
        row = {
            "preset": preset, "candidates": args.candidates, "planning_horizon": args.planning_horizon,
            "optimisation_iters": args.optimisation_iters, "image_shape": args.image_shape,
            "batch": [args.batch_size, args.chunk_size], "action_repeat": args.action_repeat,
            "plan_ms": 1000 * plan_s, "plan_ms_per_env_step": 1000 * plan_s / args.action_repeat,
            "act_ms_per_agent_step": 1000 * episode_s / slots, "model_update_ms": 1000 * update_s,
            "iteration_s": args.collect_interval * update_s + (slots * plan_s if cli_args.no_episode else episode_s),
            "num_updates": args.num_updates,
        }
        rows.append(row)
        print(f"{preset}: plan {row['plan_ms']:.1f} ms ({args.optimisation_iters} x {args.candidates} candidates x "
              f"{args.planning_horizon} steps; {row['plan_ms_per_env_step']:.2f} ms per env step at action repeat "
              f"{args.action_repeat}); acting {row['act_ms_per_agent_step']:.1f} ms per agent step; model update "
              f"{row['model_update_ms']:.0f} ms ({args.batch_size} x {args.chunk_size} frames of "
              f"{args.image_shape}); one iteration ({args.collect_interval} updates + one episode) "
              f"{row['iteration_s']:.1f} s" + (" (episode counted as plans only)" if cli_args.no_episode else "")
              + f", {args.num_updates} iterations {args.num_updates * row['iteration_s'] / 3600:.1f} h", flush=True)
    if cli_args.out:
        Path(cli_args.out).parent.mkdir(parents=True, exist_ok=True)
        machine = {"cpu_count": os.cpu_count(), "processor": platform.processor(), "jax": jax.__version__}
        Path(cli_args.out).write_text(json.dumps({"machine": machine, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
