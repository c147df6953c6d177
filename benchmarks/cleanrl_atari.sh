#!/usr/bin/env bash
# Env steps per second of `algos/ppo.py --preset atari` against CleanRL's
# cleanrl/ppo_atari_envpool_xla_jax.py (Breakout-v5, 8 envs x 128 steps, 4
# epochs, 4 minibatches: the defaults of both), on the same machine, run one
# at a time and interleaved: ours, theirs, ours, theirs, ... (docs/ppo.md,
# Atari, Throughput).
#
#   bash benchmarks/cleanrl_atari.sh /path/to/cleanrl [STEPS] [PAIRS]
#
# The first argument is a checkout of CleanRL (github.com/vwxyzjn/cleanrl;
# docs/ppo.md's figures used commit fe8d8a03), which this script does not
# fetch: `git clone` it yourself. Its script runs unmodified, from its own
# virtual environment ($CLEANRL_VENV, default $WORK/.venv), which this script
# creates on first use with pip and python3.11. CleanRL pins jax 0.4.8 /
# jaxlib 0.4.7 and envpool < 0.7 for Python < 3.11; the registry has neither
# for Python 3.11, so the venv takes the oldest that it has (jaxlib 0.4.13,
# envpool 0.8.4) with CleanRL's flax 0.6.8, optax 0.1.4, gym 0.23.1 and tyro
# 0.5.10, and what those need (the pinned list below, installed without
# dependency resolution). torch is imported only for tensorboard's
# SummaryWriter; TORCH_SPEC chooses it (default `torch`; docs/ppo.md used
# torch==2.13.0+cpu from this machine's local wheel directory).
#
# STEPS (default 40960 = 40 updates) is each run's length, PAIRS (default 3)
# the number of (ours, theirs) pairs. Each run goes under `nice -n 10`;
# its whole-process wall time and the load averages before and after are
# recorded. Steps per second of the training loop, compile excluded:
#   ours:   STEPS / train_seconds of its eval.json (the loop after the
#           compile; the greedy evaluation after it is not counted);
#   theirs: from its tensorboard events (charts/SPS_update is written once
#           per iteration): steps of iterations 3..N over the wall time between
#           the events of iteration 2 and N. CleanRL compiles its rollout in
#           iteration 1 and again in iteration 2 (its argument types change),
#           and its printed SPS counts from the start, compiles included.
# Results: $WORK/results-<time>.tsv (one per invocation; logs in $WORK/logs)
# and a summary (medians, ratio ours/theirs) at the end. docs/ppo.md's
# figures: WORK=/tmp/cleanrl bash benchmarks/cleanrl_atari.sh /tmp/cleanrl/checkout 40960 3
set -euo pipefail
CLEANRL=${1:?usage: bash benchmarks/cleanrl_atari.sh /path/to/cleanrl-checkout [STEPS] [PAIRS]  (git clone CleanRL first)}
THEIRS=$(cd "$CLEANRL" 2>/dev/null && pwd)/cleanrl/ppo_atari_envpool_xla_jax.py || true
[[ -d $CLEANRL && -f $THEIRS ]] || { echo "no cleanrl/ppo_atari_envpool_xla_jax.py under $CLEANRL: pass a CleanRL checkout" >&2; exit 2; }
STEPS=${2:-40960}
PAIRS=${3:-3}
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-/tmp/cleanrl-bench}
VENV=${CLEANRL_VENV:-$WORK/.venv}
OURS_PY=${PYTHON:-$REPO/.venv/bin/python}
mkdir -p "$WORK/logs"

if [[ ! -x $VENV/bin/python ]]; then
  python3.11 -m venv "$VENV"
  "$VENV/bin/pip" install --no-deps \
    absl-py==2.5.1 attrs==26.1.0 chex==0.1.82 cloudpickle==3.1.3 dm-env==1.6 dm-tree==0.1.10 \
    docstring_parser==0.18.0 envpool==0.8.4 etils==1.15.0 Farama-Notifications==0.0.6 \
    filelock==4.3.1 flax==0.6.8 fsspec==2026.9.0 grpcio==1.85.3 gym==0.23.1 gym-notices==0.1.0 \
    gymnasium==1.4.0 jax==0.4.13 jaxlib==0.4.13 Jinja2==3.1.6 Markdown==3.11.3 \
    markdown-it-py==4.3.0 MarkupSafe==3.0.4 mdurl==0.1.2 ml-dtypes==0.2.0 mpmath==1.3.0 \
    msgpack==1.2.4 nest-asyncio==1.6.0 networkx==3.6.1 numpy==1.26.4 opt_einsum==3.4.0 \
    optax==0.1.4 optree==0.20.0 orbax==0.1.9 orbax-checkpoint==0.5.16 packaging==26.4 \
    pillow==13.0.0 protobuf==7.36.2 Pygments==2.21.0 PyYAML==6.0.4 rich==15.0.0 scipy==1.12.0 \
    shtab==1.13.0 sympy==1.14.0 tensorboard==2.21.0 tensorboard-data-server==0.7.2 \
    tensorstore==0.1.40 toolz==1.2.0 types-protobuf==7.35.1.20260906 typing_extensions==4.16.0 \
    tyro==0.5.10 Werkzeug==3.1.9 wrapt==2.5.2 zipp==4.1.2
  "$VENV/bin/pip" install "${TORCH_SPEC:-torch}"
fi

load() { cut -d' ' -f1-3 /proc/loadavg; }
RESULTS=$WORK/results-$(date +%Y%m%d-%H%M%S).tsv
printf 'run\tside\tsteps\tsteps_per_s\twall_s\tload_before\tload_after\tdir\n' >"$RESULTS"

timed() {  # name, side, dir, command...: runs it, appends wall and load to $WORK/pending
  local name=$1 side=$2 dir=$3; shift 3
  local before t0 t1
  before=$(load); t0=$(date +%s.%N)
  nice -n 10 "$@" >"$WORK/logs/$name.log" 2>&1
  t1=$(date +%s.%N)
  echo "$name $side $dir $(echo "$t1 - $t0" | bc) $before / $(load)"
}

for i in $(seq 1 "$PAIRS"); do
  tag=$(date +%Y%m%d-%H%M%S)
  ours_root=$WORK/ours/$tag-$i
  line=$(cd "$REPO" && timed "ours_$i" ours "$ours_root" "$OURS_PY" algos/ppo.py --preset atari \
    --total-timesteps "$STEPS" --no-save-model --run-root "$ours_root")
  read -r name side dir wall l1 l2 l3 _ l4 l5 l6 <<<"$line"
  run_dir=$(ls -d "$dir"/*/ | head -1)
  sps=$("$OURS_PY" -c "import json,sys; e=json.load(open(sys.argv[1])); print(f'{$STEPS/e[\"train_seconds\"]:.1f}')" "$run_dir/eval.json")
  printf '%s\t%s\t%s\t%s\t%.0f\t%s %s %s\t%s %s %s\t%s\n' "$name" ours "$STEPS" "$sps" "$wall" $l1 $l2 $l3 $l4 $l5 $l6 "$run_dir" | tee -a "$RESULTS"

  theirs_dir=$WORK/theirs/$tag-$i
  mkdir -p "$theirs_dir"
  line=$(cd "$theirs_dir" && timed "theirs_$i" theirs "$theirs_dir" "$VENV/bin/python" "$THEIRS" --total-timesteps "$STEPS")
  read -r name side dir wall l1 l2 l3 _ l4 l5 l6 <<<"$line"
  sps=$("$VENV/bin/python" - "$theirs_dir" <<'EOF'
import glob, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(glob.glob(sys.argv[1] + "/runs/*")[0]); acc.Reload()
ev = acc.Scalars("charts/SPS_update")  # one per iteration, wall_time when written
a, b = ev[1], ev[-1]  # after iteration 2 (both compiles) .. the last
print(f"{(b.step - a.step) / (b.wall_time - a.wall_time):.1f}")
EOF
)
  printf '%s\t%s\t%s\t%s\t%.0f\t%s %s %s\t%s %s %s\t%s\n' "$name" theirs "$STEPS" "$sps" "$wall" $l1 $l2 $l3 $l4 $l5 $l6 "$theirs_dir" | tee -a "$RESULTS"
done

"$OURS_PY" - "$RESULTS" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
med = {s: statistics.median(float(r["steps_per_s"]) for r in rows if r["side"] == s) for s in ("ours", "theirs")}
wall = {s: statistics.median(float(r["wall_s"]) for r in rows if r["side"] == s) for s in ("ours", "theirs")}
print(f"median steps/s: ours {med['ours']:.1f}, theirs {med['theirs']:.1f}, ratio ours/theirs {med['ours'] / med['theirs']:.2f}")
print(f"median wall: ours {wall['ours']:.0f} s, theirs {wall['theirs']:.0f} s")
EOF
