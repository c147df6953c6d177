"""Env steps per second against device count, per algorithm file and mode.

    python benchmarks/scaling.py                                  # every device count up to what is visible
    python benchmarks/scaling.py --algos ppo rainbow --devices 1 2 4 --modes seeds data
    python benchmarks/scaling.py --force-cpu-devices --devices 1 2 4   # this CPU split into forced devices
    python benchmarks/scaling.py --compare --force-cpu-devices           # sharded vs 1 device, the tiny presets

Each configuration is one process running an algorithm file's command line
(`algos/<algo>.py`), timed by the run's own eval.json (`train_seconds`, the
training loop without compiling; `compile_seconds` beside it). The workload
grows with the devices (weak scaling), as a user scales out:

    seeds  num_seeds = SEEDS_PER_DEVICE x devices (one run, the seed axis sharded)
    data   num_envs  = the file's num_envs x devices (one seed, its env batch sharded;
           PlaNet: its batch_size, the sequences per model update)

so ideal scaling keeps the training loop's time flat and multiplies env steps
per second by the device count. On GPUs the devices are chosen with
CUDA_VISIBLE_DEVICES; with --force-cpu-devices the CPU is split into N XLA
host devices (`--xla_force_host_platform_device_count`), which share the
machine's cores: that measures the sharded program's overhead and checks it
runs, not a speed-up. Prints a markdown table (docs/scaling.md).

--compare runs each file's tiny preset with --parallel off and sharded over 4
devices (seeds: 4 seeds; data: 1 seed, 4 envs, or PlaNet's batch of 4
sequences) and prints the largest difference of any logged metric at updates
1-2 and over the whole run, and of the greedy evaluation, relative to the
value's magnitude (absolute below 1e-3); tests/test_scaling.py asserts bounds
on the same.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A short run of each file (tens of seconds on this CPU), and in data mode the
# fields that grow with the devices, with their value per device (None: no data
# mode): the data axis itself (num_envs; PlaNet's batch_size) and what must stay
# a multiple of it (the env steps between gradient phases).
WORKLOADS = {
    "ppo": (["--total-timesteps", "131072"], {"num-envs": 4}),
    "impala": (["--total-timesteps", "131072"], {"num-envs": 16}),
    "rainbow": (["--total-timesteps", "20000", "--learning-starts", "1000"], {"num-envs": 10, "train-frequency": 10}),
    "mpo": (
        ["--preset", "tiny", "--total-timesteps", "3200", "--steps-per-update", "160"],
        {"num-envs": 1, "train-frequency": 2},
    ),
    "unizero_ppo": (["--preset", "tiny"], {"num-envs": 2}),
    "unizero": (["--preset", "tiny"], {"num-envs": 2}),
    "planet": (["--preset", "tiny"], {"batch-size": 4}),
    "world_models": (["--preset", "tiny"], {}),  # data mode: the tiny preset's rollouts and batches, split
}
SEEDS_PER_DEVICE = 2


def error_of(done: subprocess.CompletedProcess) -> str:
    """The error a failed run printed (tyro draws a box around its own), on one line."""
    text = " ".join(line.strip(" │╭╮╰╯─") for line in done.stderr.splitlines())
    start = max(text.rfind("error:"), text.rfind("Error parsing"))
    return " ".join(text[start:].split())[:300] if start >= 0 else f"exit {done.returncode}"


def run_one(algo: str, mode: str, devices: int, force_cpu: bool, run_root: str) -> dict:
    flags, data_fields = WORKLOADS[algo]
    argv = [sys.executable, str(ROOT / "algos" / f"{algo}.py"), *flags, "--run-root", run_root, "--no-compile-cache"]
    if mode == "seeds":
        argv += ["--num-seeds", str(SEEDS_PER_DEVICE * devices), "--parallel", "seeds" if devices > 1 else "off"]
    else:
        if data_fields is None:
            return {"error": "no data mode"}
        argv += ["--num-seeds", "1"]
        for field, per_device in data_fields.items():
            argv += [f"--{field}", str(per_device * devices)]
        argv += ["--parallel", "data" if devices > 1 else "off"]
    env = dict(os.environ)
    if force_cpu:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
        env["JAX_PLATFORMS"] = "cpu"
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(devices))
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode:
        return {"error": error_of(done)}
    run_dir = max(Path(run_root).iterdir(), key=lambda p: p.stat().st_mtime)
    summary = json.loads((run_dir / "eval.json").read_text())
    args = json.loads((run_dir / "args.json").read_text())
    steps = args["total_timesteps"] * args["num_seeds"]
    if "stage_seconds" in summary:  # world_models: its stages' seconds, compiling included
        seconds, compile_seconds = sum(summary["stage_seconds"].values()), float("nan")
    else:
        seconds, compile_seconds = summary["train_seconds"], summary["compile_seconds"]
    return {
        "steps": steps,
        "train_seconds": seconds,
        "compile_seconds": compile_seconds,
        "steps_per_second": steps / seconds,
    }


# Tiny-preset overrides for the comparison: the data axis must split over 4 devices.
COMPARE = {"seeds": ["--num-seeds", "4"], "data": ["--num-seeds", "1", "--num-envs", "4"]}
COMPARE_EXTRA = {
    "mpo": {"data": ["--train-frequency", "4"]},
    "unizero": {"data": ["--buffer-size", "160", "--total-timesteps", "160"]},
}


# Differences are relative to |value|, or absolute below this (KL estimates of 1e-7 would make
# any last-bit difference look large).
FLOOR = 1e-3


def metrics_files(run_dir: Path) -> dict[str, Path]:
    return {str(p.parent.relative_to(run_dir)): p for p in sorted(run_dir.rglob("metrics.csv"))}


def compare(algo: str, mode: str, devices: int, force_cpu: bool) -> str:
    """One table row: `algo`'s tiny preset off vs `mode` on `devices` devices."""
    import numpy as np

    from jaxzoo import logger

    runs = {}
    for parallel in ("off", mode):
        with tempfile.TemporaryDirectory() as run_root:
            argv = [sys.executable, str(ROOT / "algos" / f"{algo}.py"), "--preset", "tiny", "--run-root", run_root]
            whole = algo in ("planet", "world_models")  # their tiny batches already split over 4 devices
            common = COMPARE[mode] if not whole else ["--num-seeds", "4" if mode == "seeds" else "1"]
            argv += [*common, *COMPARE_EXTRA.get(algo, {}).get(mode, []), "--parallel", parallel]
            env = dict(os.environ)
            if force_cpu:
                env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
                env["JAX_PLATFORMS"] = "cpu"
            done = subprocess.run(argv, env=env, capture_output=True, text=True)
            if done.returncode:
                return f"| {algo} | {mode} | {error_of(done)} | | |"
            run_dir = next(Path(run_root).iterdir())
            summary = json.loads((run_dir / "eval.json").read_text())
            metrics = {k: logger.read_metrics(p.parent) for k, p in metrics_files(run_dir).items()}
            runs[parallel] = (metrics, np.asarray(summary["returns"], float))
    (one, one_eval), (sharded, sharded_eval) = runs["off"], runs[mode]
    early = late = 0.0
    for stage, table in one.items():
        for name, x in table.items():
            if name in ("steps_per_second", "wall_seconds"):
                continue
            x, y = np.asarray(x, float), np.asarray(sharded[stage][name], float)
            relative = np.abs(x - y) / np.maximum(np.abs(x), FLOOR)
            relative = np.where(np.isnan(x) & np.isnan(y), 0.0, relative)
            early = max(early, float(np.nanmax(relative[table["update"] <= 2], initial=0.0)))
            late = max(late, float(np.nanmax(relative, initial=0.0)))
    evaluation = float(np.max(np.abs(one_eval - sharded_eval) / np.maximum(np.abs(one_eval), FLOOR)))
    return f"| {algo} | {mode} | {early:.1e} | {late:.1e} | {evaluation:.1e} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--modes", nargs="+", default=["seeds", "data"], choices=["seeds", "data"])
    parser.add_argument("--devices", nargs="+", type=int, default=None, help="device counts (default 1, 2, 4, ...)")
    parser.add_argument("--force-cpu-devices", action="store_true", help="split the CPU into forced host devices")
    parser.add_argument("--compare", action="store_true", help="sharded vs 1 device on the tiny presets (4 devices)")
    options = parser.parse_args()
    if options.compare:
        print("| file | mode | largest difference, updates 1-2 | over the run | greedy evaluation |")
        print("| --- | --- | --- | --- | --- |")
        for algo in options.algos:
            for mode in options.modes:
                if mode == "data" and WORKLOADS[algo][1] is None:
                    print(f"| {algo} | data | refused (no data mode) | | |", flush=True)
                    continue
                print(compare(algo, mode, 4, options.force_cpu_devices), flush=True)
        return
    if options.devices is None:
        import jax

        available = jax.device_count()
        options.devices = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= available]
    print("| file | mode | devices | workload (env steps) | compile s | training loop s | env steps/s | vs 1 device |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for algo in options.algos:
        for mode in options.modes:
            base = None
            for devices in options.devices:
                with tempfile.TemporaryDirectory() as run_root:
                    row = run_one(algo, mode, devices, options.force_cpu_devices, run_root)
                if "error" in row:
                    print(f"| {algo} | {mode} | {devices} | {row['error']} | | | | |", flush=True)
                    continue
                base = row["steps_per_second"] if devices == 1 else base
                ratio = f"{row['steps_per_second'] / base:.2f}x" if base else ""
                print(
                    f"| {algo} | {mode} | {devices} | {row['steps']:,} | {row['compile_seconds']:.1f} | "
                    f"{row['train_seconds']:.1f} | {row['steps_per_second']:,.0f} | {ratio} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
