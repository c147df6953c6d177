#!/usr/bin/env bash
# Every MPO number and curve in docs/mpo.md comes from this script.
#   bash benchmarks/mpo.sh [pendulum|acme|mountaincar|all]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/out/mpo
PY=${PYTHON:-python}
SEEDS=${SEEDS:-4}
what=${1:-all}

run() {  # name, flags...
  local name=$1; shift
  rm -rf "$OUT/$name"
  $PY algos/mpo.py --num-seeds "$SEEDS" --run-root "$OUT/$name" --exp-name "$name" "$@"
}

if [[ $what == pendulum || $what == all ]]; then run pendulum --preset pendulum; fi
if [[ $what == acme || $what == all ]]; then run acme --preset acme; fi
if [[ $what == mountaincar || $what == all ]]; then run mountaincar --preset mountaincar-continuous; fi
if [[ -d $OUT/pendulum && -d $OUT/acme ]]; then
  $PY -m common.plot $OUT/pendulum/* $OUT/acme/* --out docs/img/mpo_pendulum.png \
    --title "MPO on Pendulum-v1, $SEEDS seeds: seed-004 defaults vs acme preset"
  $PY benchmarks/plot_duals.py $OUT/pendulum/* $OUT/acme/* --out docs/img/mpo_duals.png
fi
if [[ -d $OUT/mountaincar ]]; then
  $PY -m common.plot $OUT/mountaincar/* --out docs/img/mpo_mountaincar.png --title "MPO on MountainCarContinuous-v0"
fi
