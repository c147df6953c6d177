#!/usr/bin/env bash
# Every MPO number and curve in docs/mpo.md comes from this script.
#   bash benchmarks/mpo.sh [pendulum|pendulum-256|acme|mountaincar|cost|vs-stoix|plots|all]
# pendulum-256 is the `pendulum` preset with the 256-256 networks it had until
# 2026-11-27 (issue 27: 64-64 gives the same returns at about a quarter of the
# cost). acme runs Acme's algorithmic choices (the `acme` preset) at
# pendulum-256's CPU sizes (networks, batch, samples, learning start, envs), so
# those two curves differ only in the algorithm. cost times one learner step at
# several sizes. vs-stoix: one update of Stoix's MPO beside ours, alternated
# $ROUNDS times (default 3); needs STOIX_PYTHON (an environment set up as
# benchmarks/stoix_mpo_cost.py's docstring says) and STOIX (a Stoix work tree).
# Not part of `all`.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/out/mpo
PY=${PYTHON:-python}
SEEDS=${SEEDS:-4}
what=${1:-all}
export PYTHONPATH=.

run() {  # name, flags...
  local name=$1; shift
  rm -rf "$OUT/$name"
  $PY algos/mpo.py --num-seeds "$SEEDS" --run-root "$OUT/$name" --exp-name "$name" "$@"
}
cpu_sizes=(--num-envs 2 --policy-layers 256 256 --critic-layers 256 256 --batch-size 128 --num-samples 10
           --learning-starts 5000 --total-timesteps 100000)

if [[ $what == pendulum || $what == all ]]; then run pendulum --preset pendulum; fi
if [[ $what == pendulum-256 || $what == all ]]; then
  run pendulum-256 --preset pendulum --policy-layers 256 256 --critic-layers 256 256
fi
if [[ $what == acme || $what == all ]]; then run acme --preset acme "${cpu_sizes[@]}"; fi
if [[ $what == mountaincar || $what == all ]]; then run mountaincar --preset mountaincar-continuous; fi
if [[ $what == cost || $what == all ]]; then $PY benchmarks/mpo_cost.py --seeds 1 4 | tee "$OUT/cost.md"; fi
if [[ $what == vs-stoix ]]; then
  : "${STOIX_PYTHON:?set STOIX_PYTHON}" "${STOIX:?set STOIX to a Stoix work tree}"
  for round in $(seq "${ROUNDS:-3}"); do
    "$STOIX_PYTHON" benchmarks/stoix_mpo_cost.py --stoix "$STOIX"
    "$STOIX_PYTHON" benchmarks/stoix_mpo_cost.py --stoix "$STOIX" --layers 64 64
    "$STOIX_PYTHON" benchmarks/stoix_mpo_cost.py --stoix "$STOIX" --batch-size 64
    "$STOIX_PYTHON" benchmarks/stoix_mpo_cost.py --stoix "$STOIX" --layers 64 64 --batch-size 64
    $PY benchmarks/mpo_cost.py
  done
fi
if [[ $what == plots || $what == all ]]; then
  if [[ -d $OUT/pendulum-256 && -d $OUT/acme ]]; then
    $PY -m jaxzoo.plot $OUT/pendulum-256/* $OUT/acme/* --out docs/img/mpo_pendulum.png \
      --title "MPO on Pendulum-v1, $SEEDS seeds: pendulum (256-256) vs acme presets"
    $PY benchmarks/plot_duals.py $OUT/pendulum-256/* $OUT/acme/* --out docs/img/mpo_duals.png
  fi
  if [[ -d $OUT/pendulum ]]; then
    $PY -m jaxzoo.plot $OUT/pendulum/* $(ls -d $OUT/pendulum-256/* 2>/dev/null) --out docs/img/mpo_pendulum_64.png \
      --title "MPO on Pendulum-v1, $SEEDS seeds: pendulum preset (64-64)"
  fi
  if [[ -d $OUT/mountaincar ]]; then
    $PY -m jaxzoo.plot $OUT/mountaincar/* --out docs/img/mpo_mountaincar.png --title "MPO on MountainCarContinuous-v0"
  fi
fi
