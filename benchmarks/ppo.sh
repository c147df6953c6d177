#!/usr/bin/env bash
# Every PPO number and curve in docs/ppo.md comes from this script.
#   bash benchmarks/ppo.sh [cartpole|pendulum|rllib|breakout|space-invaders|minatar|pixel-cartpole|pixel-pendulum|atari|timing|start-to-solved|all]
# MINATAR_SEEDS (default 4) sets the seed count of the two MinAtar runs.
# Runs go to benchmarks/out/ppo/<preset>/, curves to docs/img/, and
# benchmarks/summarize.py prints the results table from the run directories.
# Timing needs a PureJaxRL checkout: PUREJAXRL=/path/to/purejaxrl/purejaxrl
# (with its wrappers adapted to gymnax >= 1.0's six-value step; see docs/ppo.md).
# REPEATS overrides the number of interleaved repeats.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/out/ppo
PY=${PYTHON:-python}
what=${1:-all}

curve() {  # preset, num_seeds, extra flags...
  local preset=$1 seeds=$2; shift 2
  rm -rf "$OUT/$preset"
  $PY algos/ppo.py --preset "$preset" --num-seeds "$seeds" --run-root "$OUT/$preset" --exp-name "ppo-$preset" "$@"
  $PY -m jaxzoo.plot "$OUT/$preset"/* --out "docs/img/ppo_$preset.png" --title "PPO, $preset preset, $seeds seeds"
}

greedy_curve() {  # preset: its runs' --eval-every greedy returns against env steps
  $PY -m jaxzoo.plot "$OUT/$1"/* --metric eval_return --smooth 1 --out "docs/img/ppo_$1_greedy.png" \
    --title "PPO, $1 preset: greedy return (10 episodes per seed)"
}

if [[ $what == cartpole || $what == all ]]; then curve cartpole 8; fi
if [[ $what == pendulum || $what == all ]]; then curve pendulum 4; fi
if [[ $what == rllib || $what == all ]]; then curve rllib 4; fi
if [[ $what == breakout || $what == minatar || $what == all ]]; then curve breakout-minatar "${MINATAR_SEEDS:-4}"; fi
if [[ $what == space-invaders || $what == minatar || $what == all ]]; then curve space-invaders-minatar "${MINATAR_SEEDS:-4}"; fi
# CartPole-v1 from 64 x 64 frames drawn in JAX (issue 29's model-free pixel baseline), PIXEL_SEEDS
# seeds (default 4) of PIXEL_STEPS env steps each (default 500,000, the preset's; the learning rate
# anneals over them), with a greedy evaluation every 25 updates (25,600 env steps) for the return
# at equal env steps against the world-model files (docs/ppo.md, From pixels). Not part of `all`.
if [[ $what == pixel-cartpole ]]; then
  curve pixel-cartpole "${PIXEL_SEEDS:-4}" --total-timesteps "${PIXEL_STEPS:-500000}" --eval-every 25
  greedy_curve pixel-cartpole
fi
# Pendulum-v1 from 64 x 64 frames (the baseline for PlaNet's pixel Pendulum), PIXEL_SEEDS seeds of
# PIXEL_STEPS env steps (default 49,152: 3x PlaNet's 16,000), a greedy evaluation every 2 updates
# (4,096 env steps). Not part of `all`.
if [[ $what == pixel-pendulum ]]; then
  curve pixel-pendulum "${PIXEL_SEEDS:-4}" --total-timesteps "${PIXEL_STEPS:-49152}" --eval-every 2 --log-every 2
  greedy_curve pixel-pendulum
fi
# Breakout from pixels, the atari preset (envpool; one seed per process), ATARI_SEEDS seeds
# (default 2), ATARI_STEPS agent steps each (default 2,500,000 = 10M frames at frame skip 4,
# about 2 hours a seed on the idle 2-core Xeon). Not part of `all`. Running it again resumes
# each seed's unfinished run from its last checkpoint (every 100 updates) and skips
# finished ones, so the curve can be built over several sittings.
if [[ $what == atari ]]; then
  for seed in $(seq 0 $((${ATARI_SEEDS:-2} - 1))); do
    root="$OUT/atari/seed$seed"
    last=$(ls -d "$root"/*/ 2>/dev/null | tail -1 || true)
    if [[ -z $last ]]; then
      $PY algos/ppo.py --preset atari --seed "$seed" --total-timesteps "${ATARI_STEPS:-2500000}" \
        --run-root "$root" --exp-name ppo-atari
    elif [[ ! -f $last/eval.json ]]; then
      $PY algos/ppo.py --resume "$last"
    fi
  done
  $PY -m jaxzoo.plot "$OUT"/atari/seed*/* --metric game_score --smooth 50 --out docs/img/ppo_atari_breakout.png \
    --title "PPO, Breakout (envpool, atari preset), game score"
  $PY benchmarks/summarize.py --windows 250000 game_score "$OUT"/atari/seed*/*  # docs/ppo.md's table
fi
# From process start to a greedy 475 (issue 27): one process per seed, SEEDS (default 10), the
# cartpole-fast preset alternating with the cartpole preset stopped at 150k (docs/performance.md).
if [[ $what == start-to-solved ]]; then
  $PY benchmarks/ppo_start_to_solved.py --seeds "${SEEDS:-10}" --config fast "--preset cartpole-fast" \
    --config cartpole-150k "--preset cartpole --total-timesteps 150000" --out "$OUT/start_to_solved.json"
fi
if [[ $what == timing || $what == all ]]; then
  : "${PUREJAXRL:?set PUREJAXRL to the directory holding the PureJaxRL ppo.py}"
  # PureJaxRL's ppo.py as shipped prints every episode (DEBUG=True); ppo_nodebug.py
  # is the same file with DEBUG=False, ppo_vmap8.py vmaps train over 8 keys.
  $PY algos/ppo.py --preset cartpole --run-root /tmp/jaxzoo-timing >/dev/null  # fills the compile cache
  $PY algos/ppo.py --preset cartpole --num-seeds 8 --run-root /tmp/jaxzoo-timing >/dev/null
  $PY benchmarks/time_commands.py --repeats "${REPEATS:-9}" --cwd "$PUREJAXRL" --out "$OUT/timing_1seed.json" \
    --cmd jaxzoo-cold "$PY $PWD/algos/ppo.py --preset cartpole --no-compile-cache --run-root /tmp/jaxzoo-timing" \
    --cmd jaxzoo-warm "$PY $PWD/algos/ppo.py --preset cartpole --run-root /tmp/jaxzoo-timing" \
    --cmd purejaxrl-debug-off "$PY ppo_nodebug.py" \
    --cmd purejaxrl-as-shipped "$PY ppo.py"
  $PY benchmarks/time_commands.py --repeats "${REPEATS:-5}" --cwd "$PUREJAXRL" --out "$OUT/timing_8seeds.json" \
    --cmd jaxzoo-cold "$PY $PWD/algos/ppo.py --preset cartpole --num-seeds 8 --no-compile-cache --run-root /tmp/jaxzoo-timing" \
    --cmd jaxzoo-warm "$PY $PWD/algos/ppo.py --preset cartpole --num-seeds 8 --run-root /tmp/jaxzoo-timing" \
    --cmd purejaxrl-debug-off "$PY ppo_vmap8.py"
fi
