#!/usr/bin/env bash
# Every IMPALA / APPO number and curve in docs/impala.md comes from this script.
#   bash benchmarks/impala.sh [cartpole|appo|rllib|lag|sebulba|breakout-minatar[-impala|-ppo]|all]
# SEEDS (default 2) sets the seed count of the breakout-minatar runs.
# Runs go to benchmarks/out/impala/<part>/, curves to docs/img/, and
# benchmarks/summarize.py prints the results table from the run directories.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/out/impala
PY=${PYTHON:-python}
what=${1:-all}

run() {  # name, num_seeds, flags...
  local name=$1 seeds=$2; shift 2
  rm -rf "${OUT:?}/$name"
  /usr/bin/time -f "$name: %e s wall" $PY algos/impala.py --num-seeds "$seeds" --run-root "$OUT/$name" \
    --exp-name "impala-$name" --no-save-model "$@"
}

# The file's defaults (= the cartpole preset): IMPALA, policy lag 2, 1M steps.
if [[ $what == cartpole || $what == all ]]; then
  run cartpole 4 --preset cartpole
  $PY -m jaxzoo.plot "$OUT/cartpole"/* --out docs/img/impala_cartpole.png --title "IMPALA, CartPole-v1, 4 seeds" --smooth 20
fi
# The same settings with APPO's loss (a hard target copy after every gradient step).
if [[ $what == appo || $what == all ]]; then
  run appo 4 --preset cartpole --appo
fi
# The notebook's RLlib presets, on CartPole-v1.
if [[ $what == rllib || $what == all ]]; then
  run rllib-impala 4 --preset rllib-impala
  run rllib-appo 4 --preset rllib-appo
  $PY -m jaxzoo.plot "$OUT/rllib-impala"/* "$OUT/rllib-appo"/* --out docs/img/impala_rllib.png \
    --title "RLlib presets, CartPole-v1, 4 seeds" --smooth 20
fi
# What the policy lag costs: the cartpole preset at lags 0, 2, 4 and 8.
if [[ $what == lag || $what == all ]]; then
  for lag in 0 2 4 8; do run "lag$lag" 4 --preset cartpole --policy-lag "$lag"; done
  $PY -m jaxzoo.plot "$OUT"/lag{0,2,4,8}/* --out docs/img/impala_lag.png --title "IMPALA, CartPole-v1, policy lag" --smooth 20
fi
# The actor-learner (--architecture sebulba): env steps/s with 1, 2 and 4 actor threads,
# 3 runs of 300k steps each of the cartpole preset on 5 forced host devices: the threads
# sharing cpu:0 with the learner (shared); the threads on cpu:0-3, the learner on cpu:4
# (apart); as shared but 16 envs per thread, so the batch grows with the threads (wide);
# and the in-jit form on one seed for reference (anakin). Then whether it learns: the
# cartpole preset's 1M steps, 1 seed, 2 threads.
if [[ $what == sebulba || $what == all ]]; then
  export XLA_FLAGS="${XLA_FLAGS:-} --xla_force_host_platform_device_count=5"
  uptime
  for repeat in 1 2 3; do
    name="sebulba-anakin-1-r$repeat"
    rm -rf "${OUT:?}/$name"
    $PY algos/impala.py --preset cartpole --total-timesteps 300000 --run-root "$OUT/$name" --exp-name sebulba-anakin \
      --no-save-model | tail -1
  done
  for layout in shared apart wide; do
    for threads in 1 2 4; do
      flags=(--actor-device-ids 0 --learner-device-ids 0)
      [[ $layout == apart ]] && flags=(--actor-device-ids 0 1 2 3 --learner-device-ids 4)
      [[ $layout == wide ]] && flags+=(--num-envs $((16 * threads)))
      for repeat in 1 2 3; do
        name="sebulba-$layout-$threads-r$repeat"
        rm -rf "${OUT:?}/$name"
        $PY algos/impala.py --preset cartpole --architecture sebulba --num-actor-threads "$threads" "${flags[@]}" \
          --total-timesteps 300000 --run-root "$OUT/$name" --exp-name "sebulba-$layout-$threads" --no-save-model \
          | tail -1
      done
    done
  done
  uptime
  run sebulba-cartpole 1 --preset cartpole --architecture sebulba --num-actor-threads 2
  $PY - "$OUT" <<'SUMMARY'
import json, sys
from pathlib import Path
import numpy as np
from jaxzoo import logger
print("| layout | actor threads | env steps/s (median of 3) | the 3 runs | policy lag mean / max | queue fill | learner wait per update |")
print("| --- | --- | --- | --- | --- | --- | --- |")
layouts = [("anakin", "in-jit form, 1 seed (reference)"), ("shared", "threads and learner on cpu:0"),
           ("apart", "threads on cpu:0-3, learner on cpu:4"), ("wide", "as shared, 16 envs per thread")]
for layout, where in layouts:
    for threads in (1,) if layout == "anakin" else (1, 2, 4):
        speed, lag, lag_max, fill, wait = [], [], [], [], []
        for run in sorted(Path(sys.argv[1]).glob(f"sebulba-{layout}-{threads}-r*/*")):
            rows, evaluation = logger.read_metrics(run), json.loads((run / "eval.json").read_text())
            speed.append(rows["global_step"].max() / evaluation["train_seconds"])  # training loop, compile excluded
            if "policy_lag_mean" in rows:
                lag.append(rows["policy_lag_mean"].mean()); lag_max.append(rows["policy_lag_max"].max())
                fill.append(rows["queue_fill"].mean()); wait.append(rows["learner_wait_seconds"].mean())
        sebulba = (f"{np.mean(lag):.2f} / {max(lag_max):.0f} | {np.mean(fill):.2f} | {1e3 * np.mean(wait):.2f} ms"
                   if lag else "— | — | —")
        print(f"| {where} | {threads if layout != 'anakin' else '—'} | {np.median(speed):,.0f} | "
              f"{', '.join(f'{s:,.0f}' for s in speed)} | {sebulba} |")
SUMMARY
fi
# IMPALA's breakout-minatar preset beside ppo.py's (same envs, rollout length and network,
# 10M env steps each, SEEDS seeds vmapped in one process each), then both curves against
# env steps and against the training loop's wall seconds.
# `breakout-minatar-impala` or `breakout-minatar-ppo` runs one half alone (then plots both).
if [[ $what == breakout-minatar* || $what == all ]]; then
  seeds=${SEEDS:-2}
  if [[ $what != breakout-minatar-ppo ]]; then
    rm -rf "${OUT:?}/breakout-minatar-impala"
    /usr/bin/time -f "breakout-minatar-impala: %e s wall" $PY algos/impala.py --preset breakout-minatar \
      --num-seeds "$seeds" --run-root "$OUT/breakout-minatar-impala" --exp-name impala-minatar
  fi
  if [[ $what != breakout-minatar-impala ]]; then
    rm -rf "${OUT:?}/breakout-minatar-ppo"
    /usr/bin/time -f "breakout-minatar-ppo: %e s wall" $PY algos/ppo.py --preset breakout-minatar \
      --num-seeds "$seeds" --run-root "$OUT/breakout-minatar-ppo" --exp-name ppo-minatar
  fi
  $PY - "$OUT" "$seeds" <<'PLOT'
import sys
from pathlib import Path
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from jaxzoo.logger import read_metrics
from jaxzoo.plot import forward_fill, mean_and_ci, trailing_mean
out, seeds = Path(sys.argv[1]), sys.argv[2]
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for name, label in (("impala", "IMPALA"), ("ppo", "PPO")):
    curves = {"global_step": [], "wall_seconds": []}
    for run in sorted((out / f"breakout-minatar-{name}").iterdir()):
        rows = read_metrics(run)
        for seed in np.unique(rows["seed"]):
            mine = rows["seed"] == seed
            order = np.argsort(rows["global_step"][mine])
            y = trailing_mean(forward_fill(rows["episode_return"][mine][order]), 20)
            for x_name in curves:
                curves[x_name].append((rows[x_name][mine][order], y))
    for axis, (x_name, per_seed) in zip(axes, curves.items()):
        grid = np.linspace(0, min(x[-1] for x, _ in per_seed), 200)  # every seed covers it
        mean, half_width = mean_and_ci([np.interp(grid, x, y) for x, y in per_seed])
        axis.plot(grid, mean, label=f"{label} ({len(per_seed)} seeds)")
        axis.fill_between(grid, mean - half_width, mean + half_width, alpha=0.25)
for axis, xlabel in zip(axes, ("environment steps", "wall seconds (training loop)")):
    axis.set_xlabel(xlabel)
    axis.set_ylabel("episode return")
    axis.grid(alpha=0.3)
    axis.legend()
fig.suptitle(f"Breakout-MinAtar, {seeds} seeds: IMPALA vs PPO (breakout-minatar presets)")
fig.tight_layout()
fig.savefig("docs/img/impala_vs_ppo_breakout_minatar.png", dpi=120)
print("docs/img/impala_vs_ppo_breakout_minatar.png")
PLOT
fi
$PY benchmarks/summarize.py "$OUT"/*/*
