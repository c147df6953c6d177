"""Time whole processes side by side: wall time, CPU time and peak memory (max RSS).

Runs each named command `--repeats` times, interleaved (A B A B ...), so slow
drift of the machine affects both alike, and prints the median, min and max of
each plus the ratio of medians. CPU time (user + system, all threads) is the
work a process did; on a machine shared with other jobs it moves far less than
wall time does, so it is the figure to compare when the machine cannot be idle.
Nothing is excluded: import, compilation and
everything the program does are inside the measured time.

    python benchmarks/time_commands.py --repeats 5 \
        --cmd ours "python algos/ppo.py --no-compile-cache --save-model false" \
        --cmd ref  "python /path/to/reference/ppo.py" \
        --out benchmarks/out/ppo_timing.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import time
from pathlib import Path


def run_once(command: str, cwd: str | None) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, peak RSS in MiB) of one run of `command`."""
    start = time.perf_counter()
    process = subprocess.Popen(shlex.split(command), cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError(f"{command!r} exited with {code}: {process.stderr.read().decode()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024  # ru_maxrss is in KiB on Linux


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cmd", nargs=2, action="append", metavar=("NAME", "COMMAND"), required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cwd", default=None, help="working directory for every command")
    parser.add_argument("--out", default=None, help="write the raw timings here as JSON")
    ns = parser.parse_args()

    results = {name: {"command": command, "wall": [], "cpu": [], "rss_mib": []} for name, command in ns.cmd}
    for repeat in range(ns.repeats):
        for name, command in ns.cmd:
            wall, cpu, rss = run_once(command, ns.cwd)
            results[name]["wall"].append(wall)
            results[name]["cpu"].append(cpu)
            results[name]["rss_mib"].append(rss)
            print(f"[{repeat + 1}/{ns.repeats}] {name}: {wall:.2f}s wall, {cpu:.2f}s CPU, peak RSS {rss:.0f} MiB", flush=True)

    print(f"\nmachine: {machine()}")
    print("| command | median wall (s) | min | max | median CPU (s) | median peak RSS (MiB) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, r in results.items():
        r["median_wall"] = statistics.median(r["wall"])
        r["median_cpu"] = statistics.median(r["cpu"])
        r["median_rss_mib"] = statistics.median(r["rss_mib"])
        print(f"| {name} | {r['median_wall']:.2f} | {min(r['wall']):.2f} | {max(r['wall']):.2f} "
              f"| {r['median_cpu']:.2f} | {r['median_rss_mib']:.0f} |")
    names = list(results)
    for other in names[1:]:
        for measure in ("wall", "cpu"):
            ratio = results[other][f"median_{measure}"] / results[names[0]][f"median_{measure}"]
            print(f"median {measure} time of {other} / {names[0]}: {ratio:.2f}")
    if ns.out:
        Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.out).write_text(json.dumps({"machine": machine(), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
