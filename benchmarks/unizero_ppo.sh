#!/usr/bin/env bash
# Every UniZero-PPO number and curve in docs/unizero_ppo.md comes from this script.
#   bash benchmarks/unizero_ppo.sh [cartpole-v0|cartpole|all]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/out/unizero_ppo
PY=${PYTHON:-python}
SEEDS=${SEEDS:-4}
what=${1:-all}

if [[ $what == cartpole-v0 || $what == all ]]; then
  rm -rf "$OUT/cartpole-v0"
  $PY algos/unizero_ppo.py --preset cartpole-v0 --num-seeds "$SEEDS" --run-root "$OUT/cartpole-v0" --eval-search 16
  $PY -m common.plot $OUT/cartpole-v0/* --out docs/img/unizero_ppo_cartpole_v0.png \
    --title "UniZero-PPO on CartPole-v0 (200-step cap), $SEEDS seeds"
fi
if [[ $what == cartpole || $what == all ]]; then
  rm -rf "$OUT/cartpole" "$OUT/ppo-cartpole"
  $PY algos/unizero_ppo.py --preset cartpole --num-seeds "$SEEDS" --run-root "$OUT/cartpole" --eval-search 16
  $PY algos/ppo.py --preset cartpole --total-timesteps 100000 --num-seeds "$SEEDS" --run-root "$OUT/ppo-cartpole" \
    --exp-name ppo
  $PY -m common.plot $OUT/cartpole/* $OUT/ppo-cartpole/* --out docs/img/unizero_ppo_vs_ppo_cartpole.png \
    --title "CartPole-v1, $SEEDS seeds: UniZero-PPO vs PPO at equal env steps"
fi
