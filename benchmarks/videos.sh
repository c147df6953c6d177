#!/usr/bin/env bash
# The clip of a trained agent on each docs page (docs/img/<algo>_agent.gif):
# a run of the page's main preset with --capture-video, then seed 0's video
# of the final greedy evaluation cut to a short, small GIF by `python -m jaxzoo.video`.
#   bash benchmarks/videos.sh [ppo|impala|rainbow|unizero_ppo|mpo|world_models|unizero|planet|all]
# The four fast files train here (seconds to minutes); MPO, World Models, UniZero
# and PlaNet take 15-60 minutes, so their clips come from the runs of
# benchmarks/results.sh (benchmarks/out/results/<algo>/<name>/, which pass --capture-video).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/out/videos
PY=${PYTHON:-python}
what=${1:-all}

gif() {  # algorithm, run root: the newest video of seed 0 -> docs/img/<algorithm>_agent.gif
  local video
  video=$(ls -t "$2"/*/videos/*-seed0.mp4 | head -1)
  $PY -m jaxzoo.video "$video" "docs/img/$1_agent.gif" --every 3 --width 128 --max-frames 100
}
train() {  # algorithm, flags...: one seed with --capture-video, then its GIF
  local algorithm=$1; shift
  rm -rf "${OUT:?}/$algorithm"
  $PY "algos/$algorithm.py" --run-root "$OUT/$algorithm" --no-save-model --capture-video "$@"
  gif "$algorithm" "$OUT/$algorithm"
}

if [[ $what == ppo || $what == all ]]; then train ppo --preset cartpole; fi
if [[ $what == impala || $what == all ]]; then train impala --preset cartpole; fi
if [[ $what == rainbow || $what == all ]]; then train rainbow --preset rainbow; fi
if [[ $what == unizero_ppo || $what == all ]]; then train unizero_ppo --num-seeds 4; fi  # the documented 4-seed run
for slow in mpo/pendulum world_models/pixel-cartpole unizero/cartpole-v0 planet/cpu; do
  if [[ $what == "${slow%%/*}" || $what == all ]]; then gif "${slow%%/*}" "benchmarks/out/results/$slow"; fi
done
