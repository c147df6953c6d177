#!/usr/bin/env bash
# Every IMPALA / APPO number and curve in docs/impala.md comes from this script.
#   bash benchmarks/impala.sh [cartpole|appo|rllib|lag|all]
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
$PY benchmarks/summarize.py "$OUT"/*/*
