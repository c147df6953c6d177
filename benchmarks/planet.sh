#!/usr/bin/env bash
# Every PlaNet number and figure in docs/planet.md comes from this script.
#   bash benchmarks/planet.sh [cpu|cpu-collect|cpu-resume|plots|video|cost|vs-kaixhin|paper-smoke|dmc|dmc-resume|all]
# cpu: the `cpu` preset on pixel Pendulum-v1 over $SEEDS seeds (vmapped in one
# process), evaluated (planner, no noise) every 8 episodes; learning curves.
# video: open-loop predictions against the real frames from the cpu run's final
# checkpoint (benchmarks/planet_figures.py). cost: planner, acting and model
# update cost per preset (benchmarks/planet_cost.py). paper-smoke: the `paper`
# preset's whole loop at its sizes for one iteration, with one model update
# instead of 100 (seconds per update and per plan on a CPU: see cost), to show
# it runs end to end; a full paper run is far too slow for a CPU.
# dmc: DeepMind Control cartpole-swingup through the host-side path (needs the
# dmc extra: pip install -e '.[dmc]'), the `cpu-cartpole-swingup` preset, one
# seed per process ($DMC_SEEDS processes one after another), evaluated every 10
# episodes; not part of `all`.
# vs-kaixhin: one CEM plan at the `cpu` preset's settings, ours (with and without
# per-call dispatch) and Kaixhin/PlaNet's (1 and 2 torch threads), interleaved
# $ROUNDS times (default 3); needs KAIXHIN_PYTHON (a python with torch) and
# KAIXHIN_PLANET (a work tree of Kaixhin/PlaNet; benchmarks/kaixhin_planet_cost.py).
# Not part of `all`.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/out/planet
PY=${PYTHON:-python}
SEEDS=${SEEDS:-4}
what=${1:-all}

if [[ $what == cpu || $what == all ]]; then
  rm -rf "$OUT/cpu"
  $PY algos/planet.py --preset cpu --num-seeds "$SEEDS" --run-root "$OUT/cpu" --eval-every 8 --checkpoint-every 4
fi
# cpu-collect: the cpu preset with COLLECT (default 50) model updates per episode instead of 100, the
# same seeds and evaluations (issue 27: the same return for less compute?); not part of `all`.
if [[ $what == cpu-collect ]]; then
  collect=${COLLECT:-50}
  rm -rf "$OUT/cpu-collect$collect"
  $PY algos/planet.py --preset cpu --num-seeds "$SEEDS" --run-root "$OUT/cpu-collect$collect" --eval-every 8 \
    --checkpoint-every 4 --collect-interval "$collect" --exp-name "planet-cpu-collect$collect"
fi
if [[ $what == cpu-resume ]]; then  # continue a killed cpu run from its last checkpoint (every 4 episodes)
  $PY algos/planet.py --resume "$(ls -d $OUT/cpu/*/ | head -1)"
fi
if [[ $what == cpu || $what == cpu-resume || $what == plots || $what == all ]]; then  # plots: of the run so far
  $PY -m jaxzoo.plot $OUT/cpu/* --out docs/img/planet_pendulum_cpu.png --smooth 3 \
    --title "PlaNet (cpu preset) on pixel Pendulum-v1, $SEEDS seeds"
  $PY -m jaxzoo.plot $OUT/cpu/* --out docs/img/planet_pendulum_cpu_eval.png --metric eval_return \
    --title "PlaNet (cpu preset), $SEEDS seeds: evaluation without exploration noise"
  $PY -m jaxzoo.plot $OUT/cpu/* --out docs/img/planet_pendulum_cpu_losses.png --metric observation_loss \
    --title "PlaNet (cpu preset): image reconstruction loss"
fi
if [[ $what == video || $what == all ]]; then
  $PY benchmarks/planet_figures.py "$(ls -d $OUT/cpu/*/ | head -1)" --context 5 --horizon 25 --out "$OUT"
fi
if [[ $what == cost || $what == all ]]; then
  $PY benchmarks/planet_cost.py --presets cpu --out "$OUT/cost_cpu.json"
  # The paper preset's plan (10 x 1000 candidates x 12 steps) and update (50 x 50 frames of 64 x 64 x 3) take
  # seconds each on a CPU: one timed call each, no whole episode.
  $PY benchmarks/planet_cost.py --presets paper --repeats 1 --plans-per-call 1 --no-episode --out "$OUT/cost_paper.json"
fi
if [[ $what == vs-kaixhin ]]; then
  : "${KAIXHIN_PYTHON:?set KAIXHIN_PYTHON to a python with torch}" "${KAIXHIN_PLANET:?set KAIXHIN_PLANET to a Kaixhin/PlaNet work tree}"
  mkdir -p "$OUT/vs-kaixhin"
  for round in $(seq "${ROUNDS:-3}"); do
    $PY benchmarks/planet_cost.py --presets cpu --no-episode --out "$OUT/vs-kaixhin/ours_$round.json"
    $PY benchmarks/planet_cost.py --presets cpu --no-episode --plans-per-call 1 --out "$OUT/vs-kaixhin/ours_ppc1_$round.json"
    for threads in 1 2; do
      "$KAIXHIN_PYTHON" -W ignore benchmarks/kaixhin_planet_cost.py --planet "$KAIXHIN_PLANET" --threads "$threads" \
        --out "$OUT/vs-kaixhin/kaixhin_t${threads}_$round.json"
    done
  done
fi
if [[ $what == paper-smoke || $what == all ]]; then
  rm -rf "$OUT/paper-smoke"
  $PY algos/planet.py --preset paper --total-timesteps 200 --collect-interval 1 --eval-episodes 1 \
    --run-root "$OUT/paper-smoke"
fi
if [[ $what == dmc ]]; then
  rm -rf "$OUT/dmc"
  for seed in $(seq 0 $((${DMC_SEEDS:-1} - 1))); do
    $PY algos/planet.py --preset cpu-cartpole-swingup --seed "$seed" --run-root "$OUT/dmc"
  done
fi
if [[ $what == dmc ]]; then  # the random-action baseline quoted beside it
  $PY benchmarks/dmc_random.py --task cartpole-swingup --action-repeat 8 --episodes 20
fi
if [[ $what == dmc-resume ]]; then  # continue the newest killed dmc run from its last checkpoint
  $PY algos/planet.py --resume "$(ls -td $OUT/dmc/*/ | head -1)"
fi
if [[ $what == dmc || $what == dmc-resume ]]; then
  $PY -m jaxzoo.plot $OUT/dmc/* --out docs/img/planet_dmc_cartpole_swingup.png --smooth 3 \
    --title "PlaNet, cpu-cartpole-swingup preset: training return"
fi
