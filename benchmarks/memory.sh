#!/usr/bin/env bash
# Peak memory (max RSS, GNU time's %M) of each file's documented runs, for docs/performance.md.
#   bash benchmarks/memory.sh [out_file]       (default benchmarks/out/memory.tsv)
# Each command is the documented run (its preset and seed count) cut to a few updates with
# --total-timesteps (and, for World Models, fewer generations and batches): the buffers,
# networks and compiled programs are those of the full run, since every buffer is allocated
# at its full size when the run starts, and the cut run still writes its checkpoints and
# evaluates, the other two places where memory peaks. The Atari rows need `.[atari]`.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_FILE=${1:-benchmarks/out/memory.tsv}
PY=${PYTHON:-python}
ROOT=$(mktemp -d)
mkdir -p "$(dirname "$OUT_FILE")"
printf 'file\tdocumented run\tcut to\tpeak RSS (MiB)\twall (s)\texit\n' > "$OUT_FILE"

measure() {  # file, label, cut, flags...
  local file=$1 label=$2 cut=$3; shift 3
  local stats
  stats=$( { /usr/bin/time -f "%M %e" $PY "algos/$file.py" "$@" --run-root "$ROOT/$file" > /dev/null 2> "$ROOT/err"; echo "exit=$?"; } 2>&1 )
  local rc=${stats##*exit=}
  local kib wall
  read -r kib wall < <(tail -n 2 "$ROOT/err" | grep -E '^[0-9]+ [0-9.]+$' | tail -1)
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$file" "$label" "$cut" "$(( ${kib:-0} / 1024 ))" "${wall:-?}" "$rc" | tee -a "$OUT_FILE"
}

measure ppo "python algos/ppo.py (cartpole, 1 seed)" "whole run"
measure ppo "--preset breakout-minatar --num-seeds 4" "8 updates" --preset breakout-minatar --num-seeds 4 --total-timesteps 65536
measure ppo "--preset atari" "5 updates" --preset atari --total-timesteps 5120 --checkpoint-every 5
measure rainbow "python algos/rainbow.py (1 seed)" "50k steps" --total-timesteps 50000
measure rainbow "--preset breakout-minatar --num-seeds 2" "20k steps" --preset breakout-minatar --num-seeds 2 --total-timesteps 20000
measure rainbow "--preset atari" "3 updates of 10k steps (learning starts at 20k)" --preset atari --total-timesteps 30000
measure mpo "--preset pendulum --num-seeds 4" "10k steps" --preset pendulum --num-seeds 4 --total-timesteps 10000
measure impala "python algos/impala.py --num-seeds 4 (cartpole)" "100k steps" --num-seeds 4 --total-timesteps 100000
measure impala "--preset breakout-minatar --num-seeds 2" "10 updates" --preset breakout-minatar --num-seeds 2 --total-timesteps 81920
measure impala "--preset atari" "50 updates" --preset atari --total-timesteps 32000
measure unizero "--preset cartpole-v0 --num-seeds 4" "2k steps" --preset cartpole-v0 --num-seeds 4 --total-timesteps 2000
measure unizero "--preset breakout-minatar" "2k steps" --preset breakout-minatar --total-timesteps 2000
measure unizero_ppo "python algos/unizero_ppo.py (the main job)" "whole run"
measure unizero_ppo "--preset breakout-minatar --num-seeds 4" "20 phases" --preset breakout-minatar --num-seeds 4 --total-timesteps 16000
measure planet "--preset cpu --num-seeds 4" "8 episodes" --preset cpu --num-seeds 4 --total-timesteps 1600
measure world_models "--preset pixel-cartpole --num-seeds 4" "2 generations, 2 V and M updates" \
  --preset pixel-cartpole --num-seeds 4 --generations 2 --vae-updates 2 --mdn-updates 2
rm -rf "$ROOT"
