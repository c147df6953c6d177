#!/usr/bin/env bash
# Every World Models number and image in docs/world_models.md comes from this script.
#   bash benchmarks/world_models.sh [real|dream|dream-sweep|seeds|iterate|dream-done|iterate-keep|done-hidden|stop-rule|figures|carracing|carracing-cpu|carracing-dream|all]
# real: the pixel-cartpole preset, all four stages, C evolved in the real env.
# dream: C evolved inside the real run's M (pixel-cartpole-dream preset, V and M
#   loaded from the real run with --source-run), evaluated in the real env.
# dream-sweep: the same at temperatures 0.5, 1.0, 1.15 (the paper's best) and 1.5.
# seeds: real and dream (tau 2.0) again over SEEDS seeds (default 4, seeds 0..SEEDS-1,
#   vmapped in one process), each seed with its own V, M and C.
# figures: reconstructions, dream rollouts, CMA-ES curves and the results table
#   (benchmarks/world_models_figures.py -> docs/img/world_models_*.png,
#   benchmarks/out/world_models/summary.md).
# dream-done: --dream-done sample and expected on iterate's round 0 (after `iterate`), then
#   threshold against expected on seeds 4-7, then the iterative round with expected (about 90 min
#   on the idle 2-core Xeon).
# carracing: the carracing-small preset (needs box2d; skipped with a message otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/out/world_models
PY=${PYTHON:-python}
what=${1:-all}
export PYTHONPATH=.

if [[ $what == real || $what == all ]]; then
  rm -rf "$OUT/real"
  /usr/bin/time -v $PY algos/world_models.py --preset pixel-cartpole --run-root "$OUT/real" 2> "$OUT/real.time" \
    || { tail -20 "$OUT/real.time"; exit 1; }
fi
if [[ $what == dream || $what == all ]]; then
  rm -rf "$OUT/dream"
  real_run=$(ls -d "$OUT"/real/*/ | head -1)
  $PY algos/world_models.py --preset pixel-cartpole-dream --dream-done threshold --stages controller --source-run "$real_run" \
    --run-root "$OUT/dream"
fi
if [[ $what == dream-sweep || $what == all ]]; then
  # The paper's temperature study (its VizDoom table): C evolved in dreams at several tau, each evaluated for real.
  real_run=$(ls -d "$OUT"/real/*/ | head -1)
  for tau in 0.5 1.0 1.15 1.5; do
    rm -rf "$OUT/dream-tau-$tau"
    $PY algos/world_models.py --preset pixel-cartpole-dream --dream-done threshold --stages controller --source-run "$real_run" \
      --dream-temperature "$tau" --exp-name "wm-dream-tau-$tau" --run-root "$OUT/dream-tau-$tau"
  done
fi
if [[ $what == seeds || $what == all ]]; then
  seeds=${SEEDS:-4}
  rm -rf "$OUT/real-seeds" "$OUT/dream-seeds"
  /usr/bin/time -v $PY algos/world_models.py --preset pixel-cartpole --num-seeds "$seeds" --exp-name wm-seeds \
    --run-root "$OUT/real-seeds" 2> "$OUT/real-seeds.time" || { tail -20 "$OUT/real-seeds.time"; exit 1; }
  real_run=$(ls -d "$OUT"/real-seeds/*/ | head -1)
  $PY algos/world_models.py --preset pixel-cartpole-dream --dream-done threshold --num-seeds "$seeds" --stages controller \
    --source-run "$real_run" --exp-name wm-dream-seeds --run-root "$OUT/dream-seeds"
fi
# iterate: issue 26's experiment (docs/world_models.md, "Why dream training fails on some seeds").
# Round 0: the pixel-cartpole-dream preset over SEEDS seeds (default 4), every stage (random
# rollouts, V, M, C evolved in M's dream at tau 2.0), evaluated in the real env. Round 1: the paper's
# iterative procedure: collect again with round 0's V, M and C playing half of the episodes
# (--collect-with; 120 episodes of up to 500 steps, since the controller's last that long), train V
# and M afresh on them, evolve C in the new dream. Then both again with M's done head trained on the
# balanced loss (--balance-done): round 0 from round 0's rollouts and V (stages mdn, controller),
# round 1 collecting with that balanced round 0. benchmarks/world_models_transfer.py diagnoses every
# run (transfer.json in its run directory). About 75 minutes on the idle 2-core Xeon. Not in `all`.
if [[ $what == iterate ]]; then
  seeds=${SEEDS:-4}
  it="$OUT/iterate"
  rm -rf "$it"
  newest() { ls -d "$1"/*/ | head -1; }
  round1=(--rollout-steps 500 --total-timesteps 60000)
  $PY algos/world_models.py --preset pixel-cartpole-dream --dream-done threshold --num-seeds "$seeds" --exp-name wm-iterate-0 \
    --run-root "$it/round0"
  $PY algos/world_models.py --preset pixel-cartpole-dream --dream-done threshold --num-seeds "$seeds" --exp-name wm-iterate-1 \
    --collect-with "$(newest "$it/round0")" "${round1[@]}" --run-root "$it/round1"
  $PY algos/world_models.py --preset pixel-cartpole-dream --dream-done threshold --num-seeds "$seeds" --exp-name wm-iterate-0-balanced \
    --balance-done --stages mdn controller --source-run "$(newest "$it/round0")" --run-root "$it/round0-balanced"
  $PY algos/world_models.py --preset pixel-cartpole-dream --dream-done threshold --num-seeds "$seeds" --exp-name wm-iterate-1-balanced \
    --balance-done --collect-with "$(newest "$it/round0-balanced")" "${round1[@]}" --run-root "$it/round1-balanced"
  for run in round0 round1 round0-balanced round1-balanced; do
    $PY benchmarks/world_models_transfer.py "$(newest "$it/$run")"
  done
fi
# dream-done: issue 26's next step, how M's done head ends a dream (--dream-done threshold, the
# default, against sample and expected), each on round 0's plain M and on its balanced M (needs
# `iterate`'s round 0; C evolved again, 4 seeds, evaluated in the real env, then diagnosed).
if [[ $what == dream-done ]]; then
  seeds=${SEEDS:-4}
  it="$OUT/iterate"
  newest() { ls -d "$1"/*/ | head -1; }
  round0=$(newest "$it/round0")
  for rule in sample expected; do
    rm -rf "$it/round0-$rule" "$it/round0-balanced-$rule"
    $PY algos/world_models.py --preset pixel-cartpole-dream --num-seeds "$seeds" --exp-name "wm-iterate-0-$rule" \
      --dream-done "$rule" --stages controller --source-run "$round0" --run-root "$it/round0-$rule"
    $PY algos/world_models.py --preset pixel-cartpole-dream --num-seeds "$seeds" \
      --exp-name "wm-iterate-0-balanced-$rule" --dream-done "$rule" --balance-done --stages mdn controller \
      --source-run "$round0" --run-root "$it/round0-balanced-$rule"
  done
  for run in round0-sample round0-expected round0-balanced-sample round0-balanced-expected; do
    $PY benchmarks/world_models_transfer.py "$(newest "$it/$run")"
  done
  # The chosen rule checked on seeds it was not chosen on (4..7): every stage with the old rule, then C
  # evolved again with 'expected' in the same V and M.
  rm -rf "$it/fresh-threshold" "$it/fresh-expected"
  $PY algos/world_models.py --preset pixel-cartpole-dream --seed 4 --num-seeds "$seeds" --dream-done threshold \
    --exp-name wm-fresh-threshold --run-root "$it/fresh-threshold"
  $PY algos/world_models.py --preset pixel-cartpole-dream --seed 4 --num-seeds "$seeds" --dream-done expected \
    --exp-name wm-fresh-expected --stages controller --source-run "$(newest "$it/fresh-threshold")" \
    --run-root "$it/fresh-expected"
  for run in fresh-threshold fresh-expected; do
    $PY benchmarks/world_models_transfer.py "$(newest "$it/$run")"
  done
  # The iterative round with 'expected': collect with round0-expected's V, M and C, then train V and
  # M afresh (round1-expected), or M alone on round 0's V (round1-expected-keep-v).
  round1=(--dream-done expected --collect-with "$(newest "$it/round0-expected")" --rollout-steps 500 --total-timesteps 60000)
  rm -rf "$it/round1-expected" "$it/round1-expected-keep-v"
  $PY algos/world_models.py --preset pixel-cartpole-dream --num-seeds "$seeds" --exp-name wm-iterate-1-expected \
    "${round1[@]}" --run-root "$it/round1-expected"
  $PY algos/world_models.py --preset pixel-cartpole-dream --num-seeds "$seeds" --exp-name wm-iterate-1-expected-keep-v \
    "${round1[@]}" --stages collect mdn controller --source-run "$round0" --run-root "$it/round1-expected-keep-v"
  for run in round1-expected round1-expected-keep-v; do
    $PY benchmarks/world_models_transfer.py "$(newest "$it/$run")"
  done
fi
# iterate-keep (after dream-done): the iterative round keeping round 0's rollouts (--collect-keep):
# round0-expected's V, M and C play half of 111 new episodes of up to 540 steps, stored as 9
# rollouts of 60 steps each after round 0's 500 random ones; M trained afresh on all of them, V
# kept from round 0 (round1-keep-v) or trained afresh too (round1-keep); C evolved in the new dream.
if [[ $what == iterate-keep ]]; then
  seeds=${SEEDS:-4}
  newest() { ls -d "$1"/*/ | head -1; }
  it="$OUT/iterate"
  round0=$(newest "$it/round0")
  keep=(--dream-done expected --collect-with "$(newest "$it/round0-expected")" --collect-keep --collect-steps 540
        --total-timesteps 60000)
  rm -rf "$it/round1-keep-v" "$it/round1-keep"
  $PY algos/world_models.py --preset pixel-cartpole-dream --num-seeds "$seeds" --exp-name wm-iterate-1-keep-v \
    "${keep[@]}" --stages collect mdn controller --source-run "$round0" --run-root "$it/round1-keep-v"
  $PY benchmarks/world_models_transfer.py "$(newest "$it/round1-keep-v")"
  if [[ -z ${SKIP_V:-} ]]; then
    $PY algos/world_models.py --preset pixel-cartpole-dream --num-seeds "$seeds" --exp-name wm-iterate-1-keep \
      "${keep[@]}" --run-root "$it/round1-keep"
    $PY benchmarks/world_models_transfer.py "$(newest "$it/round1-keep")"
  fi
fi
# done-hidden (after dream-done): M's done head with a hidden ReLU layer of 64 (--done-hidden 64):
# on round 0's rollouts and V (C in the dream with expected), then the iterative round keeping round
# 0's rollouts, collected by that run's V, M and C, V kept from round 0.
if [[ $what == done-hidden ]]; then
  seeds=${SEEDS:-4}
  it="$OUT/iterate"
  newest() { ls -d "$1"/*/ | head -1; }
  round0=$(newest "$it/round0")
  rm -rf "$it/round0-done-hidden" "$it/round1-keep-v-done-hidden"
  $PY algos/world_models.py --preset pixel-cartpole-dream --num-seeds "$seeds" --exp-name wm-iterate-0-done-hidden \
    --done-hidden 64 --stages mdn controller --source-run "$round0" --run-root "$it/round0-done-hidden"
  $PY benchmarks/world_models_transfer.py "$(newest "$it/round0-done-hidden")"
  $PY algos/world_models.py --preset pixel-cartpole-dream --num-seeds "$seeds" --exp-name wm-iterate-1-keep-v-done-hidden \
    --done-hidden 64 --collect-with "$(newest "$it/round0-done-hidden")" --collect-keep --collect-steps 540 \
    --total-timesteps 60000 --stages collect mdn controller --source-run "$round0" --run-root "$it/round1-keep-v-done-hidden"
  $PY benchmarks/world_models_transfer.py "$(newest "$it/round1-keep-v-done-hidden")"
fi
if [[ $what == figures || $what == all ]]; then
  $PY benchmarks/world_models_figures.py "$OUT"
fi
# carracing-cpu: issue 26's CarRacing result, the carracing-cpu preset for each seed of
# CARRACING_SEEDS (default "0 1"; each a few hours on the idle 2-core Xeon, checkpointed: a killed
# run resumes where it stopped), the evaluation video, a random policy's 100 episodes, the figures.
if [[ $what == carracing-cpu ]]; then
  for seed in ${CARRACING_SEEDS:-0 1}; do
    root="$OUT/carracing-cpu/seed$seed"
    last=$(ls -d "$root"/*/ 2>/dev/null | tail -1 || true)
    if [[ -z $last ]]; then
      $PY algos/world_models.py --preset carracing-cpu --seed "$seed" --capture-video --run-root "$root"
    elif [[ ! -f $last/eval.json ]]; then
      $PY algos/world_models.py --resume "$last"
    fi
  done
  [[ -f $OUT/carracing-cpu/random.json ]] || $PY benchmarks/world_models_carracing_random.py --out "$OUT/carracing-cpu/random.json"
  mkdir -p docs/data/world_models_carracing && cp "$OUT/carracing-cpu/random.json" docs/data/world_models_carracing/
  $PY benchmarks/world_models_figures.py --carracing $(ls -d "$OUT"/carracing-cpu/seed*/*/)
fi
# carracing-dream: issue 26's CarRacing dream: C evolved in M's dream (carracing-cpu-dream: M with
# reward and done heads trained on seed 0's rollouts and V), evaluated over 100 real episodes.
if [[ $what == carracing-dream ]]; then
  source_run=$(ls -d "$OUT"/carracing-cpu/seed0/*/ | head -1)
  root="$OUT/carracing-cpu-dream/seed0"
  last=$(ls -d "$root"/*/ 2>/dev/null | tail -1 || true)
  if [[ -z $last ]]; then
    $PY algos/world_models.py --preset carracing-cpu-dream --stages mdn controller --source-run "$source_run" \
      --capture-video --run-root "$root"
  elif [[ ! -f $last/eval.json ]]; then
    $PY algos/world_models.py --resume "$last"
  fi
  # its small files, kept beside the seeds' (docs/data is committed)
  $PY benchmarks/world_models_figures.py --keep-carracing "$(ls -d "$root"/*/ | tail -1)" dream-seed0
fi
# stop-rule (after done-hidden): the paper's loop with its stopping rule per seed (a round's controller
# is judged on the real episodes the next round's collect stage plays with it): round 1's controllers
# judged by a collect-only round 2, then benchmarks/world_models_stop_rule.py picks each seed's round.
if [[ $what == stop-rule ]]; then
  seeds=${SEEDS:-4}
  it="$OUT/iterate"
  newest() { ls -d "$1"/*/ | head -1; }
  rm -rf "$it/round2-check-done-hidden"
  $PY algos/world_models.py --preset pixel-cartpole-dream --num-seeds "$seeds" --exp-name wm-iterate-2-check-done-hidden \
    --done-hidden 64 --collect-with "$(newest "$it/round1-keep-v-done-hidden")" --collect-steps 540 \
    --total-timesteps 60000 --stages collect --run-root "$it/round2-check-done-hidden"
  $PY benchmarks/world_models_stop_rule.py "$(newest "$it/round0-done-hidden")" "$(newest "$it/round1-keep-v-done-hidden")" \
    --checks "$(newest "$it/round1-keep-v-done-hidden")" "$(newest "$it/round2-check-done-hidden")" \
    --out "$it/stop-rule.json"
fi
if [[ $what == carracing || $what == all ]]; then
  if $PY -c "import Box2D" 2>/dev/null; then
    rm -rf "$OUT/carracing-small"
    $PY algos/world_models.py --preset carracing-small --run-root "$OUT/carracing-small"
  else
    echo "carracing: Box2D is not importable (pip install box2d pygame); skipped"
  fi
fi
