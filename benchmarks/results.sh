#!/usr/bin/env bash
# The runs behind docs/results.md: each command once, its summary.json,
# run_info.json and args.json copied to docs/data/runs/<algorithm>/<name>/
# (small files; checkpoints and metrics.csv stay in benchmarks/out/results/),
# then the table and figures regenerated from every committed run.
#   bash benchmarks/results.sh [ppo|impala|unizero_ppo|cartpole-v0|mpo|world_models|unizero|rainbow|planet|all]
# The last five are the slow ones (15-60 minutes each on 2 cores, docs/<algo>.md);
# they pass --capture-video, so the clips on their docs pages come from the same
# runs (benchmarks/videos.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/out/results
PY=${PYTHON:-python}
what=${1:-all}

collect() {  # algorithm, name, flags...: one run, its summary copied into docs/data/runs/<algorithm>/<name>/
  local algorithm=$1 name=$2; shift 2
  rm -rf "${OUT:?}/$algorithm/$name"
  $PY "algos/$algorithm.py" --run-root "$OUT/$algorithm/$name" --no-save-model "$@"
  local run=("$OUT/$algorithm/$name"/*/)
  mkdir -p "docs/data/runs/$algorithm/$name"
  cp "${run[0]}"/{summary.json,run_info.json,args.json} "docs/data/runs/$algorithm/$name/"
}

if [[ $what == ppo || $what == all ]]; then
  collect ppo cartpole --preset cartpole --num-seeds 8 --exp-name ppo                               # docs/ppo.md
  collect ppo cartpole-100k --preset cartpole --total-timesteps 100000 --num-seeds 4 --exp-name ppo-100k  # docs/unizero_ppo.md
fi
if [[ $what == impala || $what == all ]]; then
  collect impala cartpole --preset cartpole --num-seeds 4 --exp-name impala  # docs/impala.md
  collect impala appo --preset cartpole --appo --num-seeds 4 --exp-name appo
fi
if [[ $what == unizero_ppo || $what == all ]]; then
  collect unizero_ppo cartpole --num-seeds 4 --exp-name unizero_ppo  # docs/unizero_ppo.md, the default run
fi
if [[ $what == cartpole-v0 || $what == all ]]; then  # docs/unizero_ppo.md's CartPole-v0 comparison, 20k steps
  collect unizero_ppo cartpole-v0 --preset cartpole-v0 --num-seeds 4  # exp_name unizero_ppo-v0 (the preset)
  collect ppo cartpole-v0 --preset cartpole --max-episode-steps 200 --total-timesteps 20000 --num-seeds 4 \
    --exp-name ppo-v0
fi
if [[ $what == mpo || $what == all ]]; then
  collect mpo pendulum --preset pendulum --num-seeds 4 --exp-name mpo --capture-video  # docs/mpo.md
fi
if [[ $what == world_models || $what == all ]]; then
  collect world_models pixel-cartpole --preset pixel-cartpole --capture-video  # docs/world_models.md, 1 seed
fi
if [[ $what == unizero || $what == all ]]; then  # docs/unizero.md's CartPole-v0 runs (against LightZero)
  collect unizero cartpole-v0 --preset cartpole-v0 --num-seeds 4 --eval-every 5 --capture-video
fi
if [[ $what == rainbow || $what == all ]]; then  # docs/rainbow.md's ablation: Rainbow minus one component
  collect rainbow ablation-rainbow --preset rainbow --num-seeds 4 --exp-name rainbow --capture-video
  collect rainbow ablation-no-double --preset rainbow --no-double-q --num-seeds 4 --exp-name rainbow-no-double
  collect rainbow ablation-no-dueling --preset rainbow --no-dueling --num-seeds 4 --exp-name rainbow-no-dueling
  collect rainbow ablation-no-prioritized --preset rainbow --no-prioritized --num-seeds 4 \
    --exp-name rainbow-no-prioritized
  collect rainbow ablation-no-noisy --preset rainbow --no-noisy --num-seeds 4 --exp-name rainbow-no-noisy
  collect rainbow ablation-no-distributional --preset rainbow --num-atoms 1 --adam-eps 1e-8 --num-seeds 4 \
    --exp-name rainbow-no-distributional
  collect rainbow ablation-no-n-step --preset rainbow --n-step 1 --num-seeds 4 --exp-name rainbow-no-n-step
fi
if [[ $what == planet || $what == all ]]; then
  collect planet cpu --preset cpu --num-seeds 4 --eval-every 8 --capture-video  # docs/planet.md
fi
$PY benchmarks/results.py
