#!/usr/bin/env bash
# Every World Models number and image in docs/world_models.md comes from this script.
#   bash benchmarks/world_models.sh [real|dream|dream-sweep|seeds|iterate|figures|carracing|all]
# real: the pixel-cartpole preset, all four stages, C evolved in the real env.
# dream: C evolved inside the real run's M (pixel-cartpole-dream preset, V and M
#   loaded from the real run with --source-run), evaluated in the real env.
# dream-sweep: the same at temperatures 0.5, 1.0, 1.15 (the paper's best) and 1.5.
# seeds: real and dream (tau 2.0) again over SEEDS seeds (default 4, seeds 0..SEEDS-1,
#   vmapped in one process), each seed with its own V, M and C.
# figures: reconstructions, dream rollouts, CMA-ES curves and the results table
#   (benchmarks/world_models_figures.py -> docs/img/world_models_*.png,
#   benchmarks/out/world_models/summary.md).
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
  $PY algos/world_models.py --preset pixel-cartpole-dream --stages controller --source-run "$real_run" \
    --run-root "$OUT/dream"
fi
if [[ $what == dream-sweep || $what == all ]]; then
  # The paper's temperature study (its VizDoom table): C evolved in dreams at several tau, each evaluated for real.
  real_run=$(ls -d "$OUT"/real/*/ | head -1)
  for tau in 0.5 1.0 1.15 1.5; do
    rm -rf "$OUT/dream-tau-$tau"
    $PY algos/world_models.py --preset pixel-cartpole-dream --stages controller --source-run "$real_run" \
      --dream-temperature "$tau" --exp-name "wm-dream-tau-$tau" --run-root "$OUT/dream-tau-$tau"
  done
fi
if [[ $what == seeds || $what == all ]]; then
  seeds=${SEEDS:-4}
  rm -rf "$OUT/real-seeds" "$OUT/dream-seeds"
  /usr/bin/time -v $PY algos/world_models.py --preset pixel-cartpole --num-seeds "$seeds" --exp-name wm-seeds \
    --run-root "$OUT/real-seeds" 2> "$OUT/real-seeds.time" || { tail -20 "$OUT/real-seeds.time"; exit 1; }
  real_run=$(ls -d "$OUT"/real-seeds/*/ | head -1)
  $PY algos/world_models.py --preset pixel-cartpole-dream --num-seeds "$seeds" --stages controller \
    --source-run "$real_run" --exp-name wm-dream-seeds --run-root "$OUT/dream-seeds"
fi
# iterate: issue 26's experiment (docs/world_models.md, "Dream training that transfers"). Round 0:
# the pixel-cartpole-dream preset over SEEDS seeds, every stage (random rollouts, V, M, C evolved
# in M's dream at tau 2.0), evaluated in the real env. Then ROUNDS (default 1) rounds of the paper's
# iterative procedure: collect again with the previous round's V, M and C playing half of the
# episodes (--collect-with; 120 episodes of up to 500 steps, since the controller's last that
# long), train V and M afresh on them, evolve C in the new dream. benchmarks/world_models_transfer.py
# diagnoses every round (transfer.json in its run directory). Not part of `all`.
if [[ $what == iterate ]]; then
  seeds=${SEEDS:-4}
  rm -rf "$OUT/iterate"
  $PY algos/world_models.py --preset pixel-cartpole-dream --num-seeds "$seeds" --exp-name wm-iterate-0 \
    --run-root "$OUT/iterate/round0"
  previous=$(ls -d "$OUT"/iterate/round0/*/ | head -1)
  $PY benchmarks/world_models_transfer.py "$previous"
  for round in $(seq 1 "${ROUNDS:-1}"); do
    $PY algos/world_models.py --preset pixel-cartpole-dream --num-seeds "$seeds" --collect-with "$previous" \
      --rollout-steps 500 --total-timesteps 60000 --exp-name "wm-iterate-$round" --run-root "$OUT/iterate/round$round"
    previous=$(ls -d "$OUT"/iterate/round"$round"/*/ | head -1)
    $PY benchmarks/world_models_transfer.py "$previous"
  done
fi
if [[ $what == figures || $what == all ]]; then
  $PY benchmarks/world_models_figures.py "$OUT"
fi
if [[ $what == carracing || $what == all ]]; then
  if $PY -c "import Box2D" 2>/dev/null; then
    rm -rf "$OUT/carracing-small"
    $PY algos/world_models.py --preset carracing-small --run-root "$OUT/carracing-small"
  else
    echo "carracing: Box2D is not importable (pip install box2d pygame); skipped"
  fi
fi
