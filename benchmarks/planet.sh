#!/usr/bin/env bash
# Every PlaNet number and curve in docs/planet.md comes from this script.
#   bash benchmarks/planet.sh [cpu|paper-smoke|all]
# cpu: the `cpu` preset on pixel Pendulum-v1 over $SEEDS seeds (vmapped in one
# process), then the learning curve. paper-smoke: the `paper` preset for one
# iteration, to time it (a full paper run is far too slow for a CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/out/planet
PY=${PYTHON:-python}
SEEDS=${SEEDS:-4}
what=${1:-all}

if [[ $what == cpu || $what == all ]]; then
  rm -rf "$OUT/cpu"
  $PY algos/planet.py --preset cpu --num-seeds "$SEEDS" --run-root "$OUT/cpu" --eval-every 8
  $PY -m common.plot $OUT/cpu/* --out docs/img/planet_pendulum_cpu.png --smooth 3 \
    --title "PlaNet (cpu preset) on pixel Pendulum-v1, $SEEDS seeds"
  $PY -m common.plot $OUT/cpu/* --out docs/img/planet_pendulum_cpu_eval.png --metric eval_return \
    --title "PlaNet (cpu preset), $SEEDS seeds: planner without exploration noise during training"
  $PY -m common.plot $OUT/cpu/* --out docs/img/planet_pendulum_cpu_losses.png --metric observation_loss \
    --title "PlaNet (cpu preset): image reconstruction loss"
fi
if [[ $what == paper-smoke || $what == all ]]; then
  rm -rf "$OUT/paper-smoke"
  $PY algos/planet.py --preset paper --total-timesteps 200 --eval-episodes 1 --run-root "$OUT/paper-smoke"
fi
