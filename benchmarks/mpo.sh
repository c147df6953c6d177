#!/usr/bin/env bash
# Every MPO number and curve in docs/mpo.md comes from this script.
#   bash benchmarks/mpo.sh [pendulum|acme|mountaincar|cost|plots|all]
# acme runs Acme's algorithmic choices (the `acme` preset) at the `pendulum`
# preset's CPU sizes (networks, batch, samples, learning start, envs), so the two
# curves differ only in the algorithm. cost times one learner step at several sizes.
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
if [[ $what == acme || $what == all ]]; then run acme --preset acme "${cpu_sizes[@]}"; fi
if [[ $what == mountaincar || $what == all ]]; then run mountaincar --preset mountaincar-continuous; fi
if [[ $what == cost || $what == all ]]; then $PY benchmarks/mpo_cost.py | tee "$OUT/cost.md"; fi
if [[ $what == plots || $what == all ]]; then
  if [[ -d $OUT/pendulum && -d $OUT/acme ]]; then
    $PY -m jaxzoo.plot $OUT/pendulum/* $OUT/acme/* --out docs/img/mpo_pendulum.png \
      --title "MPO on Pendulum-v1, $SEEDS seeds: pendulum vs acme presets"
    $PY benchmarks/plot_duals.py $OUT/pendulum/* $OUT/acme/* --out docs/img/mpo_duals.png
  fi
  if [[ -d $OUT/mountaincar ]]; then
    $PY -m jaxzoo.plot $OUT/mountaincar/* --out docs/img/mpo_mountaincar.png --title "MPO on MountainCarContinuous-v0"
  fi
fi
