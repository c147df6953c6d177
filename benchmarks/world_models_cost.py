"""What a CarRacing World Models run costs, stage by stage, from measured
throughput (issue 26): for each preset, a probe run of algos/world_models.py
with the preset's sizes (frames, V, M, C, host_envs, batch sizes) and its
counts cut down, then the preset's whole run priced from the probe's rates.

    python benchmarks/world_models_cost.py --presets carracing-cpu carracing-paper \
        --out benchmarks/out/world_models/cost.json

The probe: max(host_envs, mdn_batch_size) random rollouts of --probe-steps
steps; V and M 4 updates of a few batches each; C 3 generations of
host_envs episodes (one round) cut at --probe-steps steps; the evaluation one
round of host_envs episodes.
V's, M's and C's rates are the median steps per second of their metrics.csv
rows after the first (the first update compiles); the random collection
(again, after the envs' processes have started) and V's encoding of the
rollouts (what M learns from) are timed apart. The whole run, in seconds:

    collect    num_rollouts x rollout_steps env steps / collect rate
    V          vae_updates x vae_batches x vae_batch_size frames / V rate
    encode     num_rollouts x (rollout_steps + 1) frames / encode rate
    M          mdn_updates x mdn_batches x mdn_batch_size x rollout_steps / M rate
    C          generations x population x trials x max_steps env steps / C rate
    evaluate   eval_episodes x max_steps env steps / C rate

C's and the evaluation's figures are upper bounds: an episode that ends
early (a finished lap, the car off the playfield) costs less. Every figure
is for the machine the probe ran on (printed with it).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from jaxzoo import cli
from jaxzoo.algos import world_models as wm


def probe_args(args: wm.Args, probe_steps: int, run_root: str) -> wm.Args:
    """The preset's sizes with its counts cut down to a probe of a few minutes."""
    rollouts = max(args.host_envs, args.mdn_batch_size)
    return dataclasses.replace(
        args,
        total_timesteps=rollouts * probe_steps,
        rollout_steps=probe_steps,
        vae_batches=3,
        vae_updates=4,
        mdn_batches=2,
        mdn_updates=4,
        population=args.host_envs,  # one round of the host envs per generation: steps per second do not
        trials=1,  # depend on how many rounds a generation has
        generations=3,
        controller_max_steps=probe_steps,
        eval_episodes=args.host_envs,
        log_every=1,
        save_model=False,
        compile_cache=False,
        capture_video=False,
        run_root=run_root,
    )


def stage_rate(stage_dir: Path) -> float:
    """Median steps per second of a stage's metrics.csv, leaving out the first row (compiling) when there are more."""
    with open(stage_dir / "metrics.csv") as f:
        rates = [float(row["steps_per_second"]) for row in csv.DictReader(f)]
    return statistics.median(rates[1:] if len(rates) > 1 else rates)


def collect_rate(world: wm.WorldModels, args: wm.Args) -> float:
    """Random env steps per second of the collect stage, timed on a second
    collection (the first starts the host_envs processes, seconds that a long
    run pays once); the collect stage's own metrics.csv row cannot say it: the
    host collects in the stage's init, before its update's clock starts."""
    world.collect.init(jax.random.key(0))
    start = time.perf_counter()
    world.collect.init(jax.random.key(1))
    return args.num_rollouts * args.rollout_steps / (time.perf_counter() - start)


def encode_rate(world: wm.WorldModels, params: wm.Params, data: wm.Rollouts) -> float:
    """Frames per second of V's encoding of every collected frame (what M's stage reads), compile excluded."""
    encode = jax.jit(world.encode_rollouts)
    jax.block_until_ready(encode(params, data))
    start = time.perf_counter()
    jax.block_until_ready(encode(params, data))
    return data.frames.shape[0] * data.frames.shape[1] / (time.perf_counter() - start)


def estimate(args: wm.Args, rates: dict[str, float]) -> dict[str, float]:
    """Seconds of each stage of the preset's whole run at the measured rates."""
    max_steps = args.controller_max_steps or 1000  # CarRacing-v3's time limit
    steps = {
        "collect": args.num_rollouts * args.rollout_steps,
        "vae": args.vae_updates * args.vae_batches * args.vae_batch_size,
        "encode": args.num_rollouts * (args.rollout_steps + 1),
        "mdn": args.mdn_updates * args.mdn_batches * args.mdn_batch_size * args.rollout_steps,
        "controller": args.generations * args.population * args.trials * max_steps,
        "evaluate": args.eval_episodes * max_steps,
    }
    rate_of = {**rates, "evaluate": rates["controller"]}
    return {name: count / rate_of[name] for name, count in steps.items()}


def probe(preset: str, probe_steps: int) -> dict:
    args = cli.preset_args(wm.Args, "world_models", preset)
    if args.env_id not in wm.HOST_ENVS:
        raise SystemExit(f"preset {preset!r} is not a CarRacing preset (env_id {args.env_id!r})")
    with tempfile.TemporaryDirectory() as root:
        small = probe_args(args, probe_steps, root)
        start = time.perf_counter()
        result = wm.main(small)
        probe_seconds = time.perf_counter() - start
        run_dir = Path(result["run_dir"])
        rates = {name: stage_rate(run_dir / name) for name in wm.STAGES[1:]}
        outputs = result["outputs"]
        one = lambda tree: jax.tree.map(lambda x: x[0], tree)  # noqa: E731  (the probe's one seed)
        world = wm.make_train(small)
        rates["collect"] = collect_rate(world, small)
        rates["encode"] = encode_rate(world, one(outputs["vae"].params), one(outputs["collect"]))
    seconds = estimate(args, rates)
    return {
        "preset": preset,
        "probe_seconds": probe_seconds,
        "rates_per_second": rates,
        "estimate_seconds": seconds,
        "estimate_hours": sum(seconds.values()) / 3600,
        # the collected rollouts, held in memory (and in the collect stage's checkpoint) as uint8
        "rollouts_gb": args.num_rollouts * (args.rollout_steps + 1) * int(np.prod(args.image_shape)) / 1e9,
        "counts": {
            "rollouts": args.num_rollouts,
            "rollout_steps": args.rollout_steps,
            "vae_steps": args.vae_updates * args.vae_batches,
            "mdn_steps": args.mdn_updates * args.mdn_batches,
            "generations": args.generations,
            "episodes_per_generation": args.population * args.trials,
            "host_envs": args.host_envs,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["carracing-cpu", "carracing-paper"])
    parser.add_argument("--probe-steps", type=int, default=100, help="steps of each probe rollout and C episode")
    parser.add_argument("--out", default=None, help="JSON file for the figures")
    flags = parser.parse_args()
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {jax.default_backend()}"
    report = {"machine": machine, "load_before": os.getloadavg(), "presets": []}
    for preset in flags.presets:
        figures = probe(preset, flags.probe_steps)
        report["presets"].append(figures)
        print(
            f"\n{preset} on {machine}: rates per second "
            + ", ".join(f"{k} {v:,.0f}" for k, v in figures["rates_per_second"].items())
        )
        for name, seconds in figures["estimate_seconds"].items():
            print(f"  {name:>10}: {seconds / 3600:8.2f} h")
        print(
            f"  {'total':>10}: {figures['estimate_hours']:8.2f} h  (probe took {figures['probe_seconds']:.0f} s); "
            f"rollouts in memory {figures['rollouts_gb']:.1f} GB"
        )
    report["load_after"] = os.getloadavg()
    if flags.out:
        Path(flags.out).parent.mkdir(parents=True, exist_ok=True)
        Path(flags.out).write_text(json.dumps(report, indent=2, default=lambda x: np.asarray(x).tolist()) + "\n")


if __name__ == "__main__":  # the fork server of CarRacing's host envs re-imports this module
    main()
