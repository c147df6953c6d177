"""Where a UniZero update's time goes: collection with search, the gradient
steps, and the whole update, for 1 seed (unbatched) and S vmapped seeds.

    python benchmarks/unizero_update_parts.py --seeds 1 2 4 --repeats 5

The `cartpole-v0` preset's model and schedule: one update = `num_steps` steps
of `num_envs` envs with search (collect), then `gradient_steps` gradient
steps (learn). Each part is jitted alone (as in the training chunk: one seed
unbatched, several vmapped, the state donated), warmed up past
`learning_starts`, then timed `--repeats` times; medians of wall and process
CPU time. CPU / wall says how many cores the part kept busy.
"""

import argparse
import dataclasses
import statistics
import time

import jax
import numpy as np

from jaxzoo import cli, runner
from jaxzoo.algos import unizero as uz


def time_part(fn, state, repeats: int):
    """Median wall and CPU seconds of `fn(state)`; returns them and the last state."""
    state = jax.block_until_ready(fn(state))  # compile and warm up
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        state = jax.block_until_ready(fn(state))
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), state


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--preset", default="cartpole-v0")
    options = parser.parse_args()
    print("| seeds | part | wall s (median) | CPU s | cores busy | env steps/s per seed |")
    print("| --- | --- | --- | --- | --- | --- |")
    for seeds in options.seeds:
        args = dataclasses.replace(cli.preset_args(uz.Args, "unizero", options.preset), num_seeds=seeds)
        algo = uz.make_train(args)
        steps = args.num_steps * args.num_envs  # env steps per seed per update

        def jitted(part):
            return jax.jit(runner.over_seeds(part, seeds, (0,)), donate_argnums=0)

        collect = jitted(lambda s: jax.lax.scan(algo.collect_step, s, None, args.num_steps)[0])
        learn = jitted(lambda s: jax.lax.scan(algo.learn, s, None, args.gradient_steps)[0])
        update = jitted(lambda s: algo.update(s)[0])
        state = jax.jit(lambda keys: runner.init_seeds(algo.init, keys))(np.arange(seeds, dtype=np.int32))
        while int(np.min(state.env_steps)) < max(args.learning_starts, args.window_length * args.num_envs):
            state = collect(state)  # enough replay to learn from
        for name, fn in (("collect", collect), ("learn", learn), ("update", update)):
            wall, cpu, state = time_part(fn, state, options.repeats)
            per_seed = f"{steps / wall:.1f}" if name == "update" else ""
            print(f"| {seeds} | {name} | {wall:.3f} | {cpu:.3f} | {cpu / wall:.2f} | {per_seed} |", flush=True)


if __name__ == "__main__":
    main()
