#!/usr/bin/env bash
# Every UniZero-PPO number and curve in docs/unizero_ppo.md comes from this script.
#   bash benchmarks/unizero_ppo.sh [cartpole-v0|variants|cartpole|breakout|all]
# SEEDS (default 4) sets the seed count; BREAKOUT_STEPS (default 500000) the
# Breakout-MinAtar budget per seed. Runs go to benchmarks/out/unizero_ppo/, and
#   python benchmarks/summarize.py benchmarks/out/unizero_ppo/<group>/*
# prints the results table (final return, greedy evaluation, compile and loop time).
# The UniZero (MCTS) curve of the CartPole-v0 plot is `bash benchmarks/unizero.sh cartpole-v0`.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/out/unizero_ppo
PY=${PYTHON:-python}
SEEDS=${SEEDS:-4}
BREAKOUT_STEPS=${BREAKOUT_STEPS:-500000}
what=${1:-all}

if [[ $what == cartpole-v0 || $what == all ]]; then
  rm -rf "$OUT/cartpole-v0" "$OUT/ppo-cartpole-v0"
  $PY algos/unizero_ppo.py --preset cartpole-v0 --num-seeds "$SEEDS" --run-root "$OUT/cartpole-v0" --eval-search 16
  # Plain PPO (CleanRL's CartPole settings) on the same task and budget: 200-step episodes, 20k steps.
  $PY algos/ppo.py --preset cartpole --max-episode-steps 200 --total-timesteps 20000 --num-seeds "$SEEDS" \
    --run-root "$OUT/ppo-cartpole-v0" --exp-name ppo-v0
fi
if [[ $what == variants || $what == all ]]; then  # the seed's CartPole-v0 setting with the stabilisers of the docs
  v0() {  # name, flags...
    local name=$1; shift
    rm -rf "$OUT/variants/$name"
    $PY algos/unizero_ppo.py --preset cartpole-v0 --num-seeds "$SEEDS" --run-root "$OUT/variants/$name" --exp-name "$name" "$@"
  }
  v0 kl --target-kl 0.03
  v0 klnorm --target-kl 0.03 --norm-adv
  v0 t1kl --target-kl 0.03 --temperature 1.0
  v0 lrkl --target-kl 0.03 --learning-rate 3e-4
  $PY -m common.plot $OUT/cartpole-v0/* $OUT/variants/lrkl/* $OUT/ppo-cartpole-v0/* benchmarks/out/unizero/cartpole-v0/* \
    --labels "UniZero-PPO (seed settings)" "UniZero-PPO (target KL 0.03, lr 3e-4)" PPO "UniZero (MCTS, 16 sims)" \
    --out docs/img/unizero_ppo_cartpole_v0.png --smooth 3 \
    --title "CartPole-v0 (200-step cap), $SEEDS seeds each, 20k env steps"
fi
if [[ $what == cartpole || $what == all ]]; then
  rm -rf "$OUT/cartpole" "$OUT/ppo-cartpole"
  $PY algos/unizero_ppo.py --preset cartpole --num-seeds "$SEEDS" --run-root "$OUT/cartpole" --eval-search 16
  $PY algos/ppo.py --preset cartpole --total-timesteps 100000 --num-seeds "$SEEDS" --run-root "$OUT/ppo-cartpole" \
    --exp-name ppo
  $PY -m common.plot $OUT/cartpole/* $OUT/ppo-cartpole/* --labels "UniZero-PPO (cartpole preset)" PPO --smooth 3 \
    --out docs/img/unizero_ppo_vs_ppo_cartpole.png --title "CartPole-v1, $SEEDS seeds: UniZero-PPO vs PPO at equal env steps"
fi
if [[ $what == breakout || $what == all ]]; then
  rm -rf "$OUT/breakout-minatar" "$OUT/ppo-breakout-minatar"
  $PY algos/unizero_ppo.py --preset breakout-minatar --total-timesteps "$BREAKOUT_STEPS" --num-seeds "$SEEDS" \
    --run-root "$OUT/breakout-minatar"
  $PY algos/ppo.py --preset breakout-minatar --total-timesteps "$BREAKOUT_STEPS" --num-seeds "$SEEDS" \
    --run-root "$OUT/ppo-breakout-minatar" --exp-name ppo-minatar
  $PY -m common.plot $OUT/breakout-minatar/* $OUT/ppo-breakout-minatar/* --labels UniZero-PPO PPO \
    --out docs/img/unizero_ppo_vs_ppo_breakout.png \
    --title "Breakout-MinAtar, $SEEDS seeds: UniZero-PPO vs PPO at equal env steps"
fi
