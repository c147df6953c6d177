#!/usr/bin/env bash
# Every algorithm file on one GPU, unchanged: the figures of docs/performance.md's GPU section.
#   PUREJAXRL=/path/to/folder bash benchmarks/gpu.sh [out_dir] [seconds_left]
# (the folder holding PureJaxRL's ppo_nodebug.py, ppo_vmap8.py and wrappers.py as
# benchmarks/speed.py's prepare_purejaxrl writes them)
# 1. the `tiny` preset of each of the eight files, all at once (no memory preallocation, so
#    they share the GPU): each must exit 0 on the GPU backend;
# 2. ppo.py against PureJaxRL's ppo.py on CartPole-v1, 500k steps, PureJaxRL's settings, whole
#    processes, cold (no compile cache), interleaved, 1 seed and 8 vmapped seeds;
# 3. the README's main job, `python algos/unizero_ppo.py`;
# 4. ppo.py's breakout-minatar preset (10M steps), 2 seeds, for what time is left
#    (seconds_left, default 3600, counted from the start of this script).
# Output: out_dir (default benchmarks/out/gpu) gets gpu.txt, tiny.txt (+ each file's log),
# timing_*.json and .txt, main.log, minatar.log; run directories go to out_dir/runs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/out/gpu}
budget=${2:-3600}
PY=${PYTHON:-python}
start_all=$SECONDS
mkdir -p "$OUT/runs"
RUNS=$(cd "$OUT/runs" && pwd)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $PY -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"; } > "$OUT/gpu.txt" 2>&1

milliseconds() { date +%s%3N; }

echo "== 1. tiny presets" >&2
: > "$OUT/tiny.txt"
for algo in ppo rainbow mpo impala unizero unizero_ppo planet world_models; do
  (
    t0=$(milliseconds)
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 300 $PY "algos/$algo.py" --preset tiny --run-root "$RUNS/tiny" \
      > "$OUT/tiny_$algo.log" 2>&1
    rc=$?
    echo "$algo exit=$rc wall_s=$(( ($(milliseconds) - t0) / 1000 ))" >> "$OUT/tiny.txt"
  ) &
done
wait
cat "$OUT/tiny.txt" >&2

echo "== 2. ppo.py against PureJaxRL (cold, interleaved)" >&2
if [[ -n ${PUREJAXRL:-} ]]; then
  $PY benchmarks/time_commands.py --repeats "${REPEATS:-3}" --cwd "$PUREJAXRL" --out "$OUT/timing_1seed.json" \
    --cmd jaxzoo-cold "$PY $PWD/algos/ppo.py --preset cartpole --no-compile-cache --run-root $RUNS/timing" \
    --cmd purejaxrl-debug-off "$PY ppo_nodebug.py" > "$OUT/timing_1seed.txt" 2>&1
  $PY benchmarks/time_commands.py --repeats "${REPEATS:-3}" --cwd "$PUREJAXRL" --out "$OUT/timing_8seeds.json" \
    --cmd jaxzoo-cold "$PY $PWD/algos/ppo.py --preset cartpole --num-seeds 8 --no-compile-cache --run-root $RUNS/timing" \
    --cmd purejaxrl-debug-off "$PY ppo_vmap8.py" > "$OUT/timing_8seeds.txt" 2>&1
  cat "$OUT"/timing_*.txt >&2
else
  echo "PUREJAXRL not set: skipped" >&2
fi

echo "== 3. the README's main job" >&2
t0=$(milliseconds)
timeout 600 $PY algos/unizero_ppo.py --run-root "$RUNS/main" > "$OUT/main.log" 2>&1
echo "unizero_ppo exit=$? wall_s=$(( ($(milliseconds) - t0) / 1000 ))" | tee -a "$OUT/main.log" >&2

left=$(( budget - (SECONDS - start_all) - 15 ))
echo "== 4. ppo.py breakout-minatar, 2 seeds, ${left} s at most" >&2
if (( left > 60 )); then
  t0=$(milliseconds)
  timeout "$left" $PY algos/ppo.py --preset breakout-minatar --num-seeds 2 --run-root "$RUNS/minatar" \
    > "$OUT/minatar.log" 2>&1
  echo "ppo breakout-minatar exit=$? wall_s=$(( ($(milliseconds) - t0) / 1000 ))" | tee -a "$OUT/minatar.log" >&2
fi
