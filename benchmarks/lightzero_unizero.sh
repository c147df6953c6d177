#!/usr/bin/env bash
# LightZero's own UniZero on CartPole-v0, on the CPU: the other side of the side-by-side in
# docs/unizero.md. Writes docs/data/lightzero_unizero_cartpole_v0.csv (one row per evaluation).
#
# LightZero lives in its own virtual environment, outside this repository and never in .venv
# (its DI-engine pins setuptools<=66.1.1, which pip's resolver cannot square with torch 2.13's
# setuptools>=77, so DI-engine and lightzero go in with --no-deps and their other requirements
# are listed by hand):
#   python3.11 -m venv /work/lightzero-venv
#   /work/lightzero-venv/bin/pip install torch==2.13.0       # first: the CPU build on this machine's disk
#   /work/lightzero-venv/bin/pip install --no-deps lightzero==0.2.0 DI-engine==0.5.3
#   /work/lightzero-venv/bin/pip install -c <(echo torch==2.13.0) "yapf==0.29.0" "gym==0.25.1" \
#     "gymnasium[atari]==0.28.0" "numpy<2,>=1.24.1" "DI-treetensor>=0.4.0" "DI-toolkit>=0.1.0" trueskill \
#     "tensorboardX>=2.2" "wandb<=0.19.0" matplotlib "easydict>=1.9" pyyaml enum-tools cloudpickle hickle \
#     tabulate "click>=7.0.0" "flask<=2.0.3" "werkzeug<=2.0.3" requests responses URLObject pynng sniffio \
#     redis "mpire>=2.3.5" einops pympler minigrid moviepy pytest line_profiler xxhash openai
# (pip then warns "di-engine 0.5.3 requires setuptools<=66.1.1"; nothing here needs that.)
#
#   LIGHTZERO_PYTHON=/work/lightzero-venv/bin/python bash benchmarks/lightzero_unizero.sh
#
# SEEDS (default "0 1 2 3") are run PARALLEL (default 1) at a time (the docs' run: PARALLEL=2,
# one core each, nothing else running);
# MAX_ENV_STEP (default 50000) and MAX_WALL_SECONDS (default 3600) cap each run; a run also
# stops at LightZero's own stop rule, the first evaluation with mean return >= 195.
# EVAL_FREQ (default 250 training iterations; the package config's is 1000) sets how often
# LightZero's evaluator (3 greedy episodes) runs; THREADS (default 1) is torch.set_num_threads:
# on this shared 2-core machine, 2 intra-op threads made a 3-episode evaluation ~20x slower
# than 1 under a load average of 12.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LIGHTZERO_PYTHON:?set LIGHTZERO_PYTHON to the python of the virtual environment with lightzero}"
OUT=benchmarks/out/lightzero_unizero
SEEDS=${SEEDS:-0 1 2 3}
CSV=docs/data/lightzero_unizero_cartpole_v0.csv
mkdir -p "$OUT" docs/data

run_seed() {
  local seed=$1
  echo "seed $seed: load before: $(uptime)"
  "$LIGHTZERO_PYTHON" benchmarks/lightzero_unizero.py --seed "$seed" --out-dir "$OUT" \
    --max-env-step "${MAX_ENV_STEP:-50000}" --max-wall-seconds "${MAX_WALL_SECONDS:-3600}" \
    --eval-freq "${EVAL_FREQ:-250}" --threads "${THREADS:-1}" > "$OUT/seed$seed.log" 2>&1
  echo "seed $seed: load after: $(uptime)"
  grep '^\[lightzero_unizero\] done' "$OUT/seed$seed.log" || true
}

# PARALLEL seeds at a time (default 1); with THREADS=1 each takes one core.
running=0
for seed in $SEEDS; do
  run_seed "$seed" &
  running=$((running + 1))
  if ((running >= ${PARALLEL:-1})); then wait -n; running=$((running - 1)); fi
done
wait

# One CSV for every seed run so far (header once).
first=1
for f in "$OUT"/seed*.csv; do
  if [[ $first == 1 ]]; then cat "$f"; first=0; else tail -n +2 "$f"; fi
done > "$CSV"
echo "wrote $CSV"
