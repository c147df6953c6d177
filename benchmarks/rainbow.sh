#!/usr/bin/env bash
# Every Rainbow / DQN-family number and curve in docs/rainbow.md comes from this script.
#   bash benchmarks/rainbow.sh [cartpole|tuning|ablation|minatar|timing|atari|atari-curve|all]
#   PRESETS="noisy rllib-rainbow" bash benchmarks/rainbow.sh cartpole   # a subset of the presets
# Runs go to benchmarks/out/rainbow/, curves to docs/img/, and
#   python benchmarks/summarize.py benchmarks/out/rainbow/<group>/*
# prints the results tables. Timing needs PureJaxRL's dqn.py and a harness that
# runs it on gymnax >= 1.0 (see docs/rainbow.md): PUREJAXRL_DQN="python /path/run_dqn.py".
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/out/rainbow
PY=${PYTHON:-python}
SEEDS=${SEEDS:-4}
what=${1:-all}

run() {  # group, name, flags...
  local group=$1 name=$2; shift 2
  rm -rf "$OUT/$group/$name"
  $PY algos/rainbow.py --num-seeds "$SEEDS" --run-root "$OUT/$group/$name" --exp-name "$name" "$@"
}

if [[ $what == cartpole || $what == all ]]; then
  for preset in ${PRESETS:-dqn double dueling per noisy c51 rainbow rllib-dqn rllib-rainbow}; do
    run cartpole "$preset" --preset "$preset"
  done
  if [[ -z ${PRESETS:-} ]]; then  # the plots need every preset's runs
  $PY -m jaxzoo.plot $OUT/cartpole/{dqn,double,dueling,per,noisy,c51,rainbow}/* --out docs/img/rainbow_cartpole.png \
    --title "DQN family on CartPole-v1, $SEEDS seeds each" --smooth 5
  $PY -m jaxzoo.plot $OUT/cartpole/{rllib-dqn,rllib-rainbow,rainbow}/* --out docs/img/rainbow_rllib.png \
    --title "RLlib 2.40 configurations vs this file's rainbow preset" --smooth 5
  fi
  if [[ -d $OUT/cartpole/rllib-rainbow ]]; then
    $PY -m jaxzoo.plot $OUT/cartpole/rllib-rainbow/* --out docs/img/rainbow_rllib_rainbow.png \
      --title "rllib-rainbow on CartPole-v1, $SEEDS seeds" --smooth 5
  fi
fi
if [[ $what == tuning ]]; then  # the 8-seed runs behind the per / noisy presets (docs/rainbow.md)
  SEEDS=8
  run tuning per-alpha-0.5 --preset dqn --prioritized --per-alpha 0.5
  run tuning per-clip10 --preset per  # alpha 0.5 + global-norm clip 10
  run tuning noisy-sigma-0.25 --preset noisy --sigma0 0.25
  run tuning noisy-double --preset noisy --double-q
  run tuning noisy-sigma-0.1 --preset noisy --sigma0 0.1
  run tuning noisy-sigma-0.25-lr-5e-4 --preset noisy --sigma0 0.25 --learning-rate 5e-4
  run tuning noisy-clip10 --preset noisy --max-grad-norm 10
  run tuning noisy --preset noisy  # the preset itself over 8 seeds (its noise metrics: docs/rainbow.md)
  run tuning noisy-anneal-lr --preset noisy --anneal-lr
  run tuning noisy-buffer-50k --preset noisy --buffer-size 50000
  # Adam's epsilon (the preset: 1e-8, as CleanRL's dqn_jax): Rainbow's 1.5e-4 (Hessel et al.
  # 2018, table 1), CleanRL c51's 0.01 / batch, Dopamine's Rainbow 3.125e-4 (0.01 / 32).
  run tuning noisy-adam-eps-1.5e-4 --preset noisy --adam-eps 1.5e-4
  run tuning noisy-adam-eps-7.8e-5 --preset noisy --adam-eps 7.8125e-5
  run tuning noisy-adam-eps-3e-4 --preset noisy --adam-eps 3e-4
  run tuning noisy-adam-eps-3.125e-4 --preset noisy --adam-eps 3.125e-4
  run tuning noisy-adam-eps-1.5e-4-lr-5e-4 --preset noisy --adam-eps 1.5e-4 --learning-rate 5e-4
  $PY -m jaxzoo.plot $OUT/tuning/{noisy,noisy-buffer-50k,noisy-anneal-lr,noisy-adam-eps-3.125e-4}/* --out docs/img/rainbow_noisy.png \
    --title "noisy preset variants on CartPole-v1, 8 seeds each" --smooth 5
fi
if [[ $what == ablation || $what == all ]]; then
  run ablation rainbow --preset rainbow
  run ablation no-double --preset rainbow --no-double-q
  run ablation no-dueling --preset rainbow --no-dueling
  run ablation no-prioritized --preset rainbow --no-prioritized
  run ablation no-noisy --preset rainbow --no-noisy
  run ablation no-distributional --preset rainbow --num-atoms 1 --adam-eps 1e-8
  run ablation no-n-step --preset rainbow --n-step 1
  $PY -m jaxzoo.plot $OUT/ablation/*/* --out docs/img/rainbow_ablation.png \
    --title "Rainbow minus one component, CartPole-v1, $SEEDS seeds each" --smooth 5
fi
if [[ $what == minatar || $what == all ]]; then
  run minatar breakout --preset breakout-minatar
  $PY -m jaxzoo.plot $OUT/minatar/breakout/* --out docs/img/rainbow_breakout_minatar.png \
    --title "Rainbow on Breakout-MinAtar, $SEEDS seeds"
fi
if [[ $what == atari ]]; then  # docs/rainbow.md, Atari: throughput of the atari preset (envpool: one seed per process)
  # ATARI_STEPS env steps (default 40k: the preset's 20k acting-only steps, then 20k with learning), no checkpoints.
  rm -rf "$OUT/atari/throughput"
  uptime
  /usr/bin/time -v $PY algos/rainbow.py --preset atari --total-timesteps "${ATARI_STEPS:-40000}" --no-save-model \
    --run-root "$OUT/atari/throughput"
  uptime
fi
# docs/rainbow.md, Atari: the atari preset's learning curve on Breakout, one seed (SEED, default 0),
# RAINBOW_ATARI_STEPS agent steps (default 1,000,000 = 4M frames; a few hours on the idle 2-core
# Xeon), a checkpoint (with its 1.4 GB replay) every 10 metric rows = 100k steps. Not part of
# `all`. Running it again resumes an unfinished run from its last checkpoint.
if [[ $what == atari-curve ]]; then
  root="$OUT/atari/curve-seed${SEED:-0}"
  last=$(ls -d "$root"/*/ 2>/dev/null | tail -1 || true)
  if [[ -z $last ]]; then
    $PY algos/rainbow.py --preset atari --seed "${SEED:-0}" --total-timesteps "${RAINBOW_ATARI_STEPS:-1000000}" \
      --checkpoint-every 10 --run-root "$root" --exp-name rainbow-atari
  elif [[ ! -f $last/eval.json ]]; then
    $PY algos/rainbow.py --resume "$last"
  fi
  $PY -m jaxzoo.plot "$root"/* --metric game_score --out docs/img/rainbow_atari_breakout.png \
    --title "Rainbow, Breakout (envpool, atari preset), game score"
fi
if [[ $what == timing || $what == all ]]; then
  : "${PUREJAXRL_DQN:?set PUREJAXRL_DQN to the command that runs the PureJaxRL dqn.py; it gets the seed count appended}"
  # TIMING_SEEDS picks the comparisons (default both), REPEATS overrides the repeats (5 for 1 seed, 3 for 8).
  for seeds in ${TIMING_SEEDS:-1 8}; do
    repeats=${REPEATS:-$([[ $seeds == 1 ]] && echo 5 || echo 3)}
    name=$([[ $seeds == 1 ]] && echo 1seed || echo "${seeds}seeds")
    $PY benchmarks/time_commands.py --repeats "$repeats" --out "$OUT/timing_$name.json" \
      --cmd jaxzoo "$PY $PWD/algos/rainbow.py --preset dqn --num-seeds $seeds --no-compile-cache --run-root /tmp/jaxzoo-timing" \
      --cmd purejaxrl "$PUREJAXRL_DQN $seeds"
  done
fi
