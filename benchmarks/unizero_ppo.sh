#!/usr/bin/env bash
# Every UniZero-PPO number and curve in docs/unizero_ppo.md comes from this script.
#   bash benchmarks/unizero_ppo.sh [cartpole|cartpole-v0|ablations|breakout|breakout-ablations|breakout-context|speed|all]
# SEEDS (default 4) sets the seed count; BREAKOUT_STEPS (default 500000) the
# Breakout-MinAtar budget per seed. Runs go to benchmarks/out/unizero_ppo/, and
#   python benchmarks/summarize.py benchmarks/out/unizero_ppo/<group>/*
# prints the results table (final return, greedy evaluation, compile and loop time).
# The UniZero (MCTS) curve of the CartPole-v0 plot comes from `bash benchmarks/unizero.sh vs-lightzero`
# (run it first; without it the plot has three curves).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/out/unizero_ppo
PY=${PYTHON:-python}
SEEDS=${SEEDS:-4}
BREAKOUT_STEPS=${BREAKOUT_STEPS:-500000}
what=${1:-all}

if [[ $what == cartpole || $what == all ]]; then  # the default run: CartPole-v1, 100k steps
  rm -rf "$OUT/cartpole" "$OUT/ppo-cartpole"
  $PY algos/unizero_ppo.py --num-seeds "$SEEDS" --run-root "$OUT/cartpole" --eval-search 16
  $PY algos/ppo.py --preset cartpole --total-timesteps 100000 --num-seeds "$SEEDS" --run-root "$OUT/ppo-cartpole" \
    --exp-name ppo
  $PY -m jaxzoo.plot $OUT/cartpole/* $OUT/ppo-cartpole/* --labels "UniZero-PPO (defaults)" PPO --smooth 3 \
    --out docs/img/unizero_ppo_vs_ppo_cartpole.png --title "CartPole-v1, $SEEDS seeds: UniZero-PPO vs PPO at equal env steps"
fi
if [[ $what == cartpole-v0 || $what == all ]]; then  # the seed's CartPole-v0: 200-step episodes, 20k steps
  rm -rf "$OUT/cartpole-v0" "$OUT/seed" "$OUT/ppo-cartpole-v0"
  $PY algos/unizero_ppo.py --preset cartpole-v0 --num-seeds "$SEEDS" --run-root "$OUT/cartpole-v0" --eval-search 16
  $PY algos/unizero_ppo.py --preset seed --num-seeds "$SEEDS" --run-root "$OUT/seed" --eval-search 16
  # Plain PPO (CleanRL's CartPole settings) on the same task and budget.
  $PY algos/ppo.py --preset cartpole --max-episode-steps 200 --total-timesteps 20000 --num-seeds "$SEEDS" \
    --run-root "$OUT/ppo-cartpole-v0" --exp-name ppo-v0
  runs=($OUT/cartpole-v0/* $OUT/seed/* $OUT/ppo-cartpole-v0/*)
  labels=("UniZero-PPO (cartpole-v0)" "UniZero-PPO (seed settings)" PPO)
  for run in benchmarks/out/unizero/vs-lightzero/*/; do  # one run directory per seed
    if [[ -f $run/eval.json ]]; then runs+=("$run"); labels+=("UniZero (MCTS, 16 sims)"); fi
  done
  $PY -m jaxzoo.plot "${runs[@]}" --labels "${labels[@]}" --out docs/img/unizero_ppo_cartpole_v0.png --smooth 3 \
    --title "CartPole-v0 (200-step cap), 20k env steps per seed"
fi
if [[ $what == ablations || $what == all ]]; then  # the cartpole-v0 preset with one setting changed at a time
  ablate() {  # name, flags...
    local name=$1; shift
    rm -rf "$OUT/ablations/$name"
    $PY algos/unizero_ppo.py --preset cartpole-v0 --num-seeds "$SEEDS" --run-root "$OUT/ablations/$name" \
      --exp-name "$name" "$@"
  }
  ablate joint-loss --no-ppo-heads-only
  ablate gamma-0.99 --gamma 0.99
  ablate no-norm-adv --no-norm-adv-rollout
  ablate no-target-kl --target-kl 0
  ablate lr-1e-4 --learning-rate 1e-4
  ablate pr498-minibatch --num-minibatches 3  # 26 windows = 130 transitions, about PR 498's 128
fi
if [[ $what == breakout || $what == all ]]; then
  rm -rf "$OUT/breakout-minatar" "$OUT/ppo-breakout-minatar"
  $PY algos/unizero_ppo.py --preset breakout-minatar --total-timesteps "$BREAKOUT_STEPS" --num-seeds "$SEEDS" \
    --run-root "$OUT/breakout-minatar"
  $PY algos/ppo.py --preset breakout-minatar --total-timesteps "$BREAKOUT_STEPS" --num-seeds "$SEEDS" \
    --run-root "$OUT/ppo-breakout-minatar" --exp-name ppo-minatar
  $PY -m jaxzoo.plot $OUT/breakout-minatar/* $OUT/ppo-breakout-minatar/* --labels UniZero-PPO PPO \
    --out docs/img/unizero_ppo_vs_ppo_breakout.png \
    --title "Breakout-MinAtar, $SEEDS seeds: UniZero-PPO vs PPO at equal env steps"
fi
if [[ $what == breakout-ablations ]]; then  # issue 29: what the world model adds at 500k (not part of `all`)
  # gamma 0.99 (PPO's), the latent loss at weight 1 (from 10), and no world-model losses at all
  # (PPO alone on the same transformer); each against the `breakout` runs above.
  # Then two of the PPO learner's settings: a larger entropy bonus, and PPO's data per update.
  for row in "gamma0.99|--gamma 0.99" "latent1|--latent-coef 1" "ppo-only|--latent-coef 0 --reward-coef 0" \
    "ent0.03|--ent-coef 0.03" "ppo-volume|--num-envs 64 --num-minibatches 8 --learning-rate 1e-3"; do
    name=${row%%|*}
    rm -rf "$OUT/breakout-$name"
    $PY algos/unizero_ppo.py --preset breakout-minatar-lr3e-4 --total-timesteps "$BREAKOUT_STEPS" --num-seeds "$SEEDS" \
      --run-root "$OUT/breakout-$name" --exp-name "uzppo-$name" --no-save-model ${row#*|}
  done
fi
if [[ $what == breakout-context ]]; then  # issue 29: is it the transformer's context, or the schedule?
  # UniZero-PPO rows: name | preset | flags. The earlier preset (`breakout-minatar-lr3e-4`) with 1-step
  # windows (each token attends to itself only, so the transformer acts as a per-step MLP),
  # then with a larger step alone (lr 5e-3 annealed, clip 0.5; the KL stop and temperature 0.25 kept;
  # docs/unizero_ppo.md stopped it at 150k). The `breakout-minatar-gamma0.997` preset (PPO's whole regime, run by
  # `breakout`) with no world-model losses (PPO alone on the transformer), then with the regime's
  # parts undone one at a time: sampling temperature 0.25, the KL stop 0.03, gradient clip 5, a constant lr.
  # ONLY="name ..." runs just those rows (of both loops).
  wanted() { [[ -z ${ONLY:-} || " $ONLY " == *" $1 "* ]]; }
  for row in "window1|breakout-minatar-lr3e-4|--num-unroll-steps 1" \
    "lr5e-3|breakout-minatar-lr3e-4|--learning-rate 5e-3 --anneal-lr --max-grad-norm 0.5" \
    "ppo-only|breakout-minatar-gamma0.997|--latent-coef 0 --reward-coef 0" \
    "regime-temp0.25|breakout-minatar-gamma0.997|--sampling-temperature 0.25" "regime-kl0.03|breakout-minatar-gamma0.997|--target-kl 0.03" \
    "regime-gradclip5|breakout-minatar-gamma0.997|--max-grad-norm 5" "regime-no-anneal|breakout-minatar-gamma0.997|--no-anneal-lr"; do
    IFS='|' read -r name preset flags <<< "$row"
    wanted "$name" || continue
    rm -rf "$OUT/breakout-$name"
    $PY algos/unizero_ppo.py --preset "$preset" --total-timesteps "$BREAKOUT_STEPS" --num-seeds "$SEEDS" \
      --run-root "$OUT/breakout-$name" --exp-name "uzppo-$name" --no-save-model $flags
  done
  # PPO itself (its CNN, one torso for the policy and one for the value) with one torso shared as
  # UniZero-PPO's is, with UniZero-PPO's earlier schedule (16 envs x 50 steps per update in 4 minibatches,
  # lr 3e-4 constant, gamma 0.997, clip 5, shared torso), and with its two halves: step size, data per update.
  for row in "shared|--shared-torso" \
    "uzschedule|--shared-torso --num-envs 16 --num-steps 50 --num-minibatches 4 --learning-rate 3e-4 --no-anneal-lr --gamma 0.997 --max-grad-norm 5" \
    "lr3e-4|--learning-rate 3e-4 --no-anneal-lr" "16x50|--num-envs 16 --num-steps 50 --num-minibatches 4"; do
    name=${row%%|*}
    wanted "$name" || continue
    rm -rf "$OUT/ppo-breakout-$name"
    $PY algos/ppo.py --preset breakout-minatar --total-timesteps "$BREAKOUT_STEPS" --num-seeds "$SEEDS" \
      --run-root "$OUT/ppo-breakout-$name" --exp-name "ppo-minatar-$name" --no-save-model ${row#*|}
  done
fi
if [[ $what == speed || $what == all ]]; then  # each file alone, 1 seed, CartPole-v1: run nothing else meanwhile
  rm -rf "$OUT/speed"
  time $PY algos/unizero_ppo.py --run-root "$OUT/speed/unizero_ppo"
  time $PY algos/ppo.py --preset cartpole --total-timesteps 100000 --run-root "$OUT/speed/ppo"
  time $PY algos/unizero.py --preset cartpole --total-timesteps 4000 --run-root "$OUT/speed/unizero"
  $PY benchmarks/summarize.py $OUT/speed/*/*  # compile and training-loop seconds; ms per env step = loop / steps
fi
