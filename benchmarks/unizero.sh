#!/usr/bin/env bash
# Every UniZero number and curve in docs/unizero.md comes from this script.
#   bash benchmarks/unizero.sh [cartpole-v0|puct|cartpole|breakout|breakout-search-fix|breakout-lr|breakout-rr|breakout-500k|breakout-500k-anneal|breakout-500k-explore|breakout-500k-soft|breakout-500k-td10|breakout-500k-adv|breakout-500k-floor|breakout-500k-entropy|breakout-500k-terminal|breakout-500k-puct|breakout-500k-puct-decay|breakout-500k-puct-decay-terminal|breakout-500k-report|atari-100k-cpu|search-cost|parts|vs-lightzero|vs-lightzero-lr|vs-lightzero-interleaved|vs-lightzero-kv|all]
# (puct compares against the vs-lightzero runs: run that first)
# SEEDS (default 4) sets the seed count of the learning curves (seeds SEEDS_FROM, default 0,
# onwards in the one-process-per-seed modes), BREAKOUT_STEPS the
# Breakout budget (docs: SEEDS=2 BREAKOUT_STEPS=100000). The CartPole runs
# evaluate greedily during training (--eval-every): env steps and training-loop
# seconds to an evaluation return of 195 / 475 by
#   python benchmarks/summarize.py --reach 195 benchmarks/out/unizero/cartpole-v0/*
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/out/unizero
PY=${PYTHON:-python}
SEEDS=${SEEDS:-4}
what=${1:-all}

# UniZero's seeds run one process each, one after another: its gradient step is compute-bound,
# and on 2 cores 2 vmapped seeds took 2.78x one seed (docs/unizero.md, "Where the time goes").
# /usr/bin/time records each process whole (imports and compilation included) in ROOT/seedN.time,
# one line per process (a resumed seed has one per segment).
timed_unizero() {  # ROOT, SEED, then algos/unizero.py flags
  local root=$1 seed=$2
  shift 2
  mkdir -p "$root"
  /usr/bin/time -a -f "wall %e s, user %U s, system %S s, max RSS %M KiB" -o "$root/seed$seed.time" \
    $PY algos/unizero.py "$@"
  cat "$root/seed$seed.time"
}
one_process_per_seed() {  # ROOT, then algos/unizero.py flags
  local root=$1 seed
  shift
  for ((seed = ${SEEDS_FROM:-0}; seed < ${SEEDS_FROM:-0} + SEEDS; seed++)); do
    timed_unizero "$root" "$seed" --seed "$seed" --run-root "$root" "$@"
  done
}

# Issue 29's lead for the Breakout plateau (docs/unizero.md): the preset with the Q rescaling's
# floor at LightZero's value_delta_max and its policy-entropy bonus; not part of `all`.
if [[ $what == breakout-search-fix ]]; then
  rm -rf "$OUT/breakout-minatar-search-fix"
  one_process_per_seed "$OUT/breakout-minatar-search-fix" --preset breakout-minatar-lr1e-4 \
    --total-timesteps "${BREAKOUT_STEPS:-500000}" --q-rescale-min-gap 0.01 --policy-entropy-coef 5e-3 \
    --exp-name unizero-minatar-search-fix
  # PPO on the same machine and budget, the table's reference column.
  rm -rf "$OUT/ppo-breakout-minatar-search-fix"
  $PY algos/ppo.py --preset breakout-minatar --total-timesteps "${BREAKOUT_STEPS:-500000}" --num-seeds "$SEEDS" \
    --run-root "$OUT/ppo-breakout-minatar-search-fix" --exp-name ppo-minatar
fi
# Issue 29: UniZero-PPO's lesson on Breakout (its step size was what held it back, docs/unizero_ppo.md)
# tried on UniZero: the preset at LR (default 1e-3, the preset's own since this run; it was
# LightZero's 1e-4, as in `breakout`), then PPO on the same budget and the plot; not part of `all`.
# docs: SEEDS=2 BREAKOUT_STEPS=100000.
if [[ $what == breakout-lr ]]; then
  lr=${LR:-1e-3}
  steps=${BREAKOUT_STEPS:-500000}
  rm -rf "$OUT/breakout-minatar-lr$lr" "$OUT/ppo-breakout-minatar-lr"
  one_process_per_seed "$OUT/breakout-minatar-lr$lr" --preset breakout-minatar \
    --total-timesteps "$steps" --learning-rate "$lr" --exp-name "unizero-minatar-lr$lr"
  $PY algos/ppo.py --preset breakout-minatar --total-timesteps "$steps" --num-seeds "$SEEDS" \
    --run-root "$OUT/ppo-breakout-minatar-lr" --exp-name ppo-minatar
  $PY -m jaxzoo.plot $OUT/breakout-minatar-lr$lr/*/ $OUT/ppo-breakout-minatar-lr/* \
    --out docs/img/unizero_lr_vs_ppo_breakout.png --smooth 5 \
    --title "Breakout-MinAtar, $SEEDS seeds: UniZero (lr $lr) vs PPO"
fi
# Issue 27's lead tried on Breakout (docs/unizero.md): the preset at half the replay ratio, 100k
# steps, seeds 2-3 (SEEDS_FROM, default 2), against breakout-lr's seeds 2-3; not part of `all`.
if [[ $what == breakout-rr ]]; then
  rm -rf "$OUT/breakout-rr0.125"
  SEEDS_FROM=${SEEDS_FROM:-2} one_process_per_seed "$OUT/breakout-rr0.125" --preset breakout-minatar \
    --total-timesteps 100000 --replay-ratio 0.125 --exp-name unizero-minatar-rr0.125
fi
# Runs too long for one sitting: rerunning a mode skips a finished seed (its summary.json), resumes
# a stopped one from its last checkpoint (stop one with SIGTERM: it checkpoints at the next chunk
# boundary) and starts a missing one. ROOT, EXP_NAME, SEED, then the flags of a fresh start.
resume_or_start() {
  local root=$1 exp=$2 seed=$3 run_dir
  shift 3
  mkdir -p "$root"
  run_dir=$(ls -d "$root"/*__"$exp"__"$seed"__* 2>/dev/null | head -1 || true)
  if [[ -n $run_dir && -f $run_dir/summary.json ]]; then
    echo "seed $seed: finished ($run_dir)"
    return
  elif [[ -n $run_dir ]] && ! ls "$run_dir"/checkpoints/*.npz > /dev/null 2>&1; then
    echo "seed $seed: $run_dir has no checkpoint to resume from (stopped before its first); remove it to start again" >&2
    return 1
  elif [[ -n $run_dir ]]; then
    set -- --resume "$run_dir"
  else
    set -- --seed "$seed" --run-root "$root" --exp-name "$exp" "$@"
  fi
  timed_unizero "$root" "$seed" "$@"
}

# Issue 29's 500k half (docs/unizero.md): the preset at half the replay ratio, 500k steps, seeds
# SEEDS_FROM.. (about 1.6 h per seed alone on a 2-core CPU), resumable; not part of `all`.
if [[ $what == breakout-500k ]]; then
  for ((seed = ${SEEDS_FROM:-0}; seed < ${SEEDS_FROM:-0} + SEEDS; seed++)); do
    resume_or_start "$OUT/breakout-rr0.125-500k" unizero-minatar-rr0.125 "$seed" --preset breakout-minatar \
      --total-timesteps 500000 --replay-ratio 0.125
  done
fi
# The same with UniZero-PPO's two lessons on this task (docs/unizero_ppo.md): the step size annealed
# linearly to 0 over the run (`--anneal-lr`) and PPO's discount 0.99 (the preset's is 0.997), after
# breakout-500k's constant-rate seeds flattened at 8-9 from 140k (docs/unizero.md); resumable.
if [[ $what == breakout-500k-anneal ]]; then
  for ((seed = ${SEEDS_FROM:-0}; seed < ${SEEDS_FROM:-0} + SEEDS; seed++)); do
    resume_or_start "$OUT/breakout-rr0.125-anneal-500k" unizero-minatar-rr0.125-anneal "$seed" \
      --preset breakout-minatar --total-timesteps 500000 --replay-ratio 0.125 --anneal-lr --gamma 0.99
  done
fi
# The annealed run with epsilon-greedy exploration on top of the search in collection (10% of the
# steps uniformly random), after its seed 0 fell into the 10-brick trap (docs/unizero.md: a memorised
# route through a deterministic game, values of 0 past it); resumable.
if [[ $what == breakout-500k-explore ]]; then
  for ((seed = ${SEEDS_FROM:-0}; seed < ${SEEDS_FROM:-0} + SEEDS; seed++)); do
    resume_or_start "$OUT/breakout-rr0.125-anneal-eps0.1-500k" unizero-minatar-rr0.125-anneal-eps0.1 "$seed" \
      --preset breakout-minatar --total-timesteps 500000 --replay-ratio 0.125 --anneal-lr --gamma 0.99 \
      --explore-epsilon 0.1
  done
fi
# The annealed run with softer search targets where Q-values nearly tie: the search's min-max
# rescaling of Q-values divides by at least 1 (one brick) instead of 1e-8, so actions whose Q-values
# differ by a fraction of a brick stay near the prior's weights instead of 0 and 1 (docs/unizero.md,
# "The 10-brick trap": sharp targets from differences of 0.04 keep the collection on one route);
# resumable.
if [[ $what == breakout-500k-soft ]]; then
  for ((seed = ${SEEDS_FROM:-0}; seed < ${SEEDS_FROM:-0} + SEEDS; seed++)); do
    resume_or_start "$OUT/breakout-rr0.125-anneal-gap1-500k" unizero-minatar-rr0.125-anneal-gap1 "$seed" \
      --preset breakout-minatar-500k  # = breakout-500k-anneal's flags and --q-rescale-min-gap 1.0
  done
fi
# breakout-500k-soft with 10-step value targets instead of 5 (MuZero's Atari setting): the model's
# one-step Q-values barely tell moving toward the ball from moving away in the steps before a loss
# (docs/unizero.md, "Why the wall holds"), so a rare catch's real return should reach further back
# before the target model's value takes over; resumable. Seed 0 to 202k hit a wall at the eighth
# brick (7.48 at 180-200k against 12.90 with 5-step targets): not adopted.
if [[ $what == breakout-500k-td10 ]]; then
  for ((seed = ${SEEDS_FROM:-0}; seed < ${SEEDS_FROM:-0} + SEEDS; seed++)); do
    resume_or_start "$OUT/breakout-rr0.125-anneal-gap1-td10-500k" unizero-minatar-rr0.125-anneal-gap1-td10 "$seed" \
      --preset breakout-minatar-500k --td-steps 10
  done
fi
# breakout-500k-soft with real returns in the prior's update: advantage-weighted regression of the
# prior onto the replayed actions (Peng et al. 2019; weights exp(advantage), advantage = 5-step return
# - V normalised per batch), as the one-step Q-values of the model barely differ
# before a loss (docs/unizero.md, "Why the wall holds") while the real returns of the actions taken
# do; ADVANTAGE_COEF (default 1) is the term's weight; resumable. (A first version with linear
# weights, unbounded below, is in docs/unizero.md.)
if [[ $what == breakout-500k-adv ]]; then
  coef=${ADVANTAGE_COEF:-1}
  for ((seed = ${SEEDS_FROM:-0}; seed < ${SEEDS_FROM:-0} + SEEDS; seed++)); do
    resume_or_start "$OUT/breakout-rr0.125-anneal-gap1-adv$coef-500k" unizero-minatar-rr0.125-anneal-gap1-adv$coef \
      "$seed" --preset breakout-minatar-500k --advantage-coef "$coef"
  done
fi
# breakout-500k-soft with a higher floor under the search's Q rescaling: FLOOR (default 3.0) bricks
# instead of 1, so the improved policy stays nearer the prior unless the actions' Q-values differ by
# several bricks (the floor of 1 took seed 0 from the 10-brick wall to 16, seed 1 only to 10;
# docs/unizero.md); resumable.
if [[ $what == breakout-500k-floor ]]; then
  floor=${FLOOR:-3.0}
  for ((seed = ${SEEDS_FROM:-0}; seed < ${SEEDS_FROM:-0} + SEEDS; seed++)); do
    resume_or_start "$OUT/breakout-rr0.125-anneal-floor$floor-500k" unizero-minatar-rr0.125-anneal-floor$floor \
      "$seed" --preset breakout-minatar-500k --q-rescale-min-gap "$floor"
  done
fi
# breakout-500k-soft with PPO's entropy bonus on the prior: ENTROPY_COEF (default 0.01, PPO's) times
# the policy head's entropy subtracted from the loss, so that where the search's targets equal the prior
# (Q-values within the floor) the prior drifts toward uniform, as PPO's policy does where its
# advantages tie, instead of keeping an old route's preference (docs/unizero.md, "Why the wall
# holds"); resumable.
if [[ $what == breakout-500k-entropy ]]; then
  coef=${ENTROPY_COEF:-0.01}
  for ((seed = ${SEEDS_FROM:-0}; seed < ${SEEDS_FROM:-0} + SEEDS; seed++)); do
    resume_or_start "$OUT/breakout-rr0.125-anneal-gap1-ent$coef-500k" unizero-minatar-rr0.125-anneal-gap1-ent$coef \
      "$seed" --preset breakout-minatar-500k --policy-entropy-coef "$coef"
  done
fi
# breakout-500k-soft with MuZero's absorbing state: TERMINAL_VALUE_COEF (default 0.5, the value loss's
# own weight) times a value cross-entropy toward 0 on the frame after each termination, which no
# value target reached before, so that the search stops valuing an imagined lost ball like a caught
# one (docs/unizero.md, "The lost ball's value"); resumable.
if [[ $what == breakout-500k-terminal ]]; then
  coef=${TERMINAL_VALUE_COEF:-0.5}
  for ((seed = ${SEEDS_FROM:-0}; seed < ${SEEDS_FROM:-0} + SEEDS; seed++)); do
    resume_or_start "$OUT/breakout-rr0.125-anneal-gap1-tv$coef-500k" unizero-minatar-rr0.125-anneal-gap1-tv$coef \
      "$seed" --preset breakout-minatar-500k --terminal-value-coef "$coef"
  done
fi
# breakout-500k-soft with MuZero's PUCT search instead of Gumbel MuZero, at the same 16 simulations:
# collection samples from visit counts at TEMPERATURE (default 1.0, MuZero's Atari setting for its first
# 500k training steps) with Dirichlet noise at the root, and the policy targets are visit counts, so
# collection varies its routes from the start, as PPO's stochastic policy does (docs/unizero.md, "Why the
# wall holds": Gumbel's sharp targets replay one route); resumable.
# The three PUCT modes share this loop; each keeps its own root and exp_name (TAG) so its runs resume.
puct_seeds() {  # TAG, then algos/unizero.py flags beyond the shared ones
  local tag=$1 seed
  shift
  for ((seed = ${SEEDS_FROM:-0}; seed < ${SEEDS_FROM:-0} + SEEDS; seed++)); do
    resume_or_start "$OUT/breakout-rr0.125-anneal-gap1-$tag-500k" unizero-minatar-rr0.125-anneal-gap1-$tag "$seed" \
      --preset breakout-minatar-500k --search-policy puct --num-simulations 16 --visit-temperature "$temperature" "$@"
  done
}
temperature=${TEMPERATURE:-1.0}
if [[ $what == breakout-500k-puct ]]; then
  puct_seeds "puct-t$temperature"
fi
# breakout-500k-puct with MuZero's visit temperature schedule: TEMPERATURE x 1, 0.5, 0.25 over the
# run's first half, third quarter and last quarter (`--visit-temperature-decay`), after temperature 1
# throughout left no wall but held the training return at 7 while the greedy policy reached 14.8 at
# 200k (docs/unizero.md); resumable. The documented seed 0 was forked from breakout-500k-puct's at
# 215k (identical until 250k, where the decay's first step falls; its FORKED.txt says how).
if [[ $what == breakout-500k-puct-decay ]]; then
  puct_seeds "puct-t$temperature-decay" --visit-temperature-decay
fi
# breakout-500k-puct-decay with MuZero's absorbing state: TERMINAL_VALUE_COEF (default 0.5) times a
# value cross-entropy toward 0 on the frame after each termination, after the decayed run collapsed at
# temperature 0.25 with half its episodes losing the first ball, a frame the model valued at 4.6, as a
# whole game (docs/unizero.md, "PUCT with visit-count sampling"); resumable. PRIORITY_EXPONENT (default
# 0, uniform replay) above 0 adds MuZero's prioritised replay (`--priority-exponent`; MuZero's Atari: 1)
# with importance weights at PRIORITY_CORRECTION (default 1, MuZero's; LightZero's: 0.6 and 0.4), in a
# root and exp_name of their own ("-per$PRIORITY_EXPONENT", "-b$PRIORITY_CORRECTION" unless 1): the walls
# are rare late-game steps whose search value misses the real return, which priorities by that miss
# replay more often. BUFFER_SIZE (unset: the preset's 50,000 steps, the last tenth of the run) sets
# the replay's size in its own root and exp_name ("-buf$BUFFER_SIZE"; 500000 keeps the whole run, as
# LightZero's 1e6 does): a replay of the current route alone holds no state off it for the model to
# learn the value of following the ball from. TD_STEPS_AGE (unset: off) adds EfficientZero's
# off-policy correction (`--td-steps-age`, "-age$TD_STEPS_AGE"): windows TD_STEPS_AGE env steps older
# sum one real reward fewer before bootstrapping (EfficientZero: 0.3 of the run, so 150000 for 500k),
# after the whole-run replay's value fell below the current play's return (5.20 against 8.32).
# DECAY_AT (unset: MuZero's "0.5 0.75") moves the schedule's two steps (`--visit-temperature-decay-at`,
# "-at$halve-$quarter"): every seed's training return jumped within 40k steps of the drop to 0.5 at 250k
# and gained about 1 after the drop to 0.25, so "0.25 0.5" asks whether the jump follows the temperature.
# TD_STEPS (unset: the preset's 5) sets n of the n-step value targets (`--td-steps`, "-td$TD_STEPS"): a
# catch near a wall pays its next brick about 10-12 steps after the moves that made it, beyond 5 real
# rewards, so with 5 the moves are valued by the model's value of the route ("Why the wall holds").
if [[ $what == breakout-500k-puct-decay-terminal ]]; then
  coef=${TERMINAL_VALUE_COEF:-0.5}
  per=${PRIORITY_EXPONENT:-0}
  beta=${PRIORITY_CORRECTION:-1}
  tag=puct-t$temperature-decay-tv$coef
  [[ $per == 0 ]] || tag+=-per$per
  [[ $beta == 1 ]] || tag+=-b$beta
  buffer=()
  [[ -z ${BUFFER_SIZE:-} ]] || { tag+=-buf$BUFFER_SIZE; buffer=(--buffer-size "$BUFFER_SIZE"); }
  age=()
  [[ -z ${TD_STEPS_AGE:-} ]] || { tag+=-age$TD_STEPS_AGE; age=(--td-steps-age "$TD_STEPS_AGE"); }
  td=()
  [[ -z ${TD_STEPS:-} ]] || { tag+=-td$TD_STEPS; td=(--td-steps "$TD_STEPS"); }
  decay_at=()
  if [[ -n ${DECAY_AT:-} ]]; then
    read -r halve quarter <<< "$DECAY_AT"
    tag+=-at$halve-$quarter
    decay_at=(--visit-temperature-decay-at "$halve" "$quarter")
  fi
  puct_seeds "$tag" --visit-temperature-decay --terminal-value-coef "$coef" --priority-exponent "$per" \
    --priority-correction "$beta" "${buffer[@]}" "${age[@]}" "${td[@]}" "${decay_at[@]}"
fi
# Once breakout-500k's (or breakout-500k-anneal's) seeds have finished: PPO's breakout-minatar preset
# on the same 500k steps and seeds (vmapped in one process; skipped if already there), the tables
# (training return per 20k window, greedy evaluations) and the figure, over whichever UniZero roots
# exist (each is one curve, by its exp_name).
if [[ $what == breakout-500k-report ]]; then
  if [[ ! -d $OUT/ppo-breakout-minatar-500k ]]; then
    $PY algos/ppo.py --preset breakout-minatar --total-timesteps 500000 --num-seeds "$SEEDS" \
      --run-root "$OUT/ppo-breakout-minatar-500k" --exp-name ppo-minatar
  fi
  runs=$(ls -d $OUT/breakout-rr0.125-500k/*/ $OUT/breakout-rr0.125-anneal-500k/*/ \
    $OUT/breakout-rr0.125-anneal-eps0.1-500k/*/ $OUT/breakout-rr0.125-anneal-gap1-500k/*/ \
    $OUT/breakout-rr0.125-anneal-gap1-td10-500k/*/ $OUT/breakout-rr0.125-anneal-gap1-adv[0-9]*-500k/*/ \
    $OUT/breakout-rr0.125-anneal-floor[0-9]*-500k/*/ $OUT/breakout-rr0.125-anneal-gap1-ent[0-9]*-500k/*/ $OUT/breakout-rr0.125-anneal-gap1-tv[0-9]*-500k/*/ \
    $OUT/breakout-rr0.125-anneal-gap1-puct-*-500k/*/ 2>/dev/null || true)
  $PY benchmarks/summarize.py --episode-windows 20000 $runs $OUT/ppo-breakout-minatar-500k/*/
  $PY benchmarks/summarize.py $runs $OUT/ppo-breakout-minatar-500k/*/
  # The figure: PPO, the preset (Gumbel MuZero with the floor) and the best variant so far, by exp_name
  # (whichever of the two UniZero roots exist).
  curves=$(ls -d $OUT/ppo-breakout-minatar-500k/*/ $OUT/breakout-rr0.125-anneal-gap1-500k/*/ \
    $OUT/breakout-rr0.125-anneal-gap1-puct-t1.0-decay-tv0.5-500k/*/ 2>/dev/null || true)
  $PY -m jaxzoo.plot $curves --out docs/img/unizero_vs_ppo_breakout_500k.png --smooth 10 \
    --title "Breakout-MinAtar, 500k: UniZero vs PPO (training return)"
fi
# Issue 29's Atari 100k on a CPU: the atari-100k-cpu preset (configs/unizero.toml: the paper's
# settings scaled to fit), seed SEEDS_FROM (default 0) only, resumable; needs the atari extra.
if [[ $what == atari-100k-cpu ]]; then
  resume_or_start "$OUT/atari-100k-cpu" unizero-atari-100k-cpu "${SEEDS_FROM:-0}" --preset atari-100k-cpu
fi
if [[ $what == cartpole-v0 || $what == all ]]; then
  rm -rf "$OUT/cartpole-v0"
  $PY algos/unizero.py --preset cartpole-v0 --num-seeds "$SEEDS" --run-root "$OUT/cartpole-v0" --eval-every 5
  $PY -m jaxzoo.plot $OUT/cartpole-v0/* --out docs/img/unizero_cartpole_v0.png \
    --title "UniZero on CartPole-v0 (200-step cap), $SEEDS seeds"
  $PY -m jaxzoo.plot $OUT/cartpole-v0/* --metric eval_return --out docs/img/unizero_cartpole_v0_eval.png \
    --title "UniZero on CartPole-v0, $SEEDS seeds: greedy evaluation with search during training"
fi
if [[ $what == cartpole || $what == all ]]; then
  rm -rf "$OUT/cartpole" "$OUT/ppo-cartpole"
  $PY algos/unizero.py --preset cartpole --num-seeds "$SEEDS" --run-root "$OUT/cartpole" --eval-every 10
  $PY algos/ppo.py --preset cartpole --total-timesteps 50000 --num-seeds "$SEEDS" --run-root "$OUT/ppo-cartpole" \
    --exp-name ppo
  $PY -m jaxzoo.plot $OUT/cartpole/* $OUT/ppo-cartpole/* --out docs/img/unizero_vs_ppo_cartpole.png \
    --title "CartPole-v1, $SEEDS seeds: UniZero vs PPO at equal env steps"
fi
if [[ $what == breakout || $what == all ]]; then
  rm -rf "$OUT/breakout-minatar" "$OUT/ppo-breakout-minatar"
  # BREAKOUT_STEPS (default the preset's 500k) shortens both runs alike.
  steps=${BREAKOUT_STEPS:-500000}
  one_process_per_seed "$OUT/breakout-minatar" --preset breakout-minatar-lr1e-4 --total-timesteps "$steps"
  $PY algos/ppo.py --preset breakout-minatar --total-timesteps "$steps" --num-seeds "$SEEDS" \
    --run-root "$OUT/ppo-breakout-minatar" --exp-name ppo-minatar
  $PY -m jaxzoo.plot $OUT/breakout-minatar/*/ $OUT/ppo-breakout-minatar/* --out docs/img/unizero_vs_ppo_breakout.png \
    --title "Breakout-MinAtar, $SEEDS seeds: UniZero vs PPO at equal env steps"
fi
if [[ $what == vs-lightzero || $what == all ]]; then
  # Against LightZero's UniZero (its side: benchmarks/lightzero_unizero.sh -> docs/data/).
  # A greedy evaluation every 5 updates (1,000 env steps); no compilation cache, so each
  # process's time includes its compilation as LightZero's includes its setup.
  rm -rf "$OUT/vs-lightzero"
  one_process_per_seed "$OUT/vs-lightzero" --preset cartpole-v0 --eval-every 5 --no-compile-cache
  $PY benchmarks/unizero_vs_lightzero.py $OUT/vs-lightzero/*/ --out docs/img/unizero_vs_lightzero_cartpole_v0.png
fi
if [[ $what == vs-lightzero-lr ]]; then
  # The vs-lightzero runs at LR (default 1e-3, ten times LightZero's: the breakout-minatar
  # preset's step), 10k env steps each; not part of `all`. FLAGS adds flags (issue 27: fewer
  # or smaller gradient steps, e.g. FLAGS="--replay-ratio 0.125"), TAG names those runs.
  # WARM=1 runs them with JAX's compilation cache warm instead of without it (the file's default
  # from the second run of the same settings on): a fresh cache in $OUT/<name>-cache, filled by
  # one 1,000-step run of the same settings first (docs/unizero.md, "Both sides again on one
  # machine, medians").
  lr=${LR:-1e-3}
  name=vs-lightzero-lr$lr${TAG:+-$TAG}${WARM:+-warm}
  rm -rf "$OUT/$name"
  cache_flags=(--no-compile-cache)
  if [[ -n ${WARM:-} ]]; then
    export JAXZOO_CACHE_DIR=$OUT/$name-cache
    rm -rf "$JAXZOO_CACHE_DIR" "$OUT/$name-fill"
    cache_flags=()
    # shellcheck disable=SC2086  # FLAGS is a list of flags
    $PY algos/unizero.py --preset cartpole-v0 --eval-every 5 --total-timesteps 1000 --learning-rate "$lr" \
      --run-root "$OUT/$name-fill" ${FLAGS:-}
  fi
  # shellcheck disable=SC2086  # FLAGS is a list of flags
  one_process_per_seed "$OUT/$name" --preset cartpole-v0 --eval-every 5 "${cache_flags[@]}" \
    --total-timesteps 10000 --learning-rate "$lr" --exp-name "unizero-v0-lr$lr${TAG:+-$TAG}${WARM:+-warm}" ${FLAGS:-}
  [[ -n ${TAG:-} ]] || $PY benchmarks/unizero_vs_lightzero.py $OUT/$name/*/ \
    --out docs/img/unizero_lr_vs_lightzero_cartpole_v0.png
fi
if [[ $what == vs-lightzero-interleaved ]]; then
  # Issue 27's side by side as interleaved blocks on one machine: LightZero seeds 0 and 1 (one core
  # each, benchmarks/lightzero_unizero.sh with PARALLEL=2, MAX_WALL_SECONDS caps an unlucky seed),
  # then ours seeds 0 and 1 (cold, one process each, lr 1e-3, half the replay ratio), then
  # LightZero 2 and 3, then ours 2 and 3. STEPS (default 10000) is each of our runs' length; the
  # run in docs/unizero.md gave seeds 0-2 3,000 (past their first evaluation >= 195) and seed 3
  # 10,000. Not part of `all`; needs LIGHTZERO_PYTHON (benchmarks/lightzero_unizero.sh, which
  # rewrites docs/data/lightzero_unizero_cartpole_v0.csv with the seeds it runs). LAYOUTS (default
  # "auto") runs each of our seeds once per `--parallel` value listed, in the same block (e.g.
  # LAYOUTS="data off": one seed's batch over every core, then one device), each in its own folder.
  name=vs-lightzero-interleaved
  rm -rf "$OUT/$name" benchmarks/out/lightzero_unizero
  for pair in "0 1" "2 3"; do
    SEEDS="$pair" PARALLEL=2 MAX_WALL_SECONDS=${MAX_WALL_SECONDS:-600} MAX_ENV_STEP=20000 \
      bash benchmarks/lightzero_unizero.sh
    for seed in $pair; do
      for layout in ${LAYOUTS:-auto}; do
        root=$OUT/$name${LAYOUTS:+/$layout}
        timed_unizero "$root" "$seed" --seed "$seed" --run-root "$root" --preset cartpole-v0 \
          --eval-every 5 --no-compile-cache --total-timesteps "${STEPS:-10000}" --learning-rate 1e-3 \
          --replay-ratio 0.125 --parallel "$layout" --exp-name unizero-v0-lr1e-3-rr0.125
      done
    done
  done
  for layout in ${LAYOUTS:-auto}; do
    root=$OUT/$name${LAYOUTS:+/$layout}
    $PY benchmarks/unizero_vs_lightzero.py "$root"/*/ --lightzero docs/data/lightzero_unizero_cartpole_v0.csv \
      --out "$root.png"
  done
fi
if [[ $what == vs-lightzero-kv ]]; then
  # Our side of vs-lightzero-interleaved alone, each seed once with --search-kv-cache and once
  # without, alternated (cold, lr 1e-3, half the replay ratio, STEPS default 4000), against
  # LightZero's set in LIGHTZERO_CSV (default: the interleaved set of 2026-12-06 12:03-12:37, the
  # same machine; not interleaved with this run). Not part of `all`.
  name=vs-lightzero-kv
  [[ -z ${SEEDS_FROM:-} ]] && rm -rf "${OUT:?}/$name"  # SEEDS_FROM adds seeds to an earlier run's
  for ((seed = ${SEEDS_FROM:-0}; seed < ${SEEDS_FROM:-0} + SEEDS; seed++)); do
    for search in kv window; do
      flags=()
      [[ $search == kv ]] && flags=(--search-kv-cache)
      timed_unizero "$OUT/$name/$search" "$seed" --seed "$seed" --run-root "$OUT/$name/$search" \
        --preset cartpole-v0 --eval-every 5 --no-compile-cache --total-timesteps "${STEPS:-4000}" \
        --learning-rate 1e-3 --replay-ratio 0.125 --exp-name "unizero-v0-lr1e-3-rr0.125-$search" "${flags[@]}"
    done
  done
  for search in kv window; do
    $PY benchmarks/unizero_vs_lightzero.py "$OUT/$name/$search"/*/ --out "$OUT/$name/$search.png" --lightzero \
      "${LIGHTZERO_CSV:-docs/data/lightzero_unizero_cartpole_v0_xeon207_20261206_interleaved_layouts.csv}"
  done
fi
if [[ $what == puct || $what == all ]]; then
  # PUCT with LightZero's 25 simulations, evaluated as the vs-lightzero runs (Gumbel, 16) are:
  # one seed per process, a greedy evaluation every 1,000 env steps. Compare with
  #   python benchmarks/summarize.py --reach 195 $OUT/cartpole-v0-puct/*/ $OUT/vs-lightzero/*/
  rm -rf "$OUT/cartpole-v0-puct"
  one_process_per_seed "$OUT/cartpole-v0-puct" --preset cartpole-v0-puct --eval-every 5
  $PY -m jaxzoo.plot $OUT/vs-lightzero/*/ $OUT/cartpole-v0-puct/*/ --metric eval_return \
    --out docs/img/unizero_gumbel_vs_puct_v0.png \
    --title "CartPole-v0, $SEEDS seeds: evaluation, Gumbel (16 sims) vs PUCT (25)"
fi
if [[ $what == search-cost || $what == all ]]; then
  $PY benchmarks/unizero_search_cost.py --out "$OUT/search_cost.json"
fi
if [[ $what == parts || $what == all ]]; then  # where an update's time goes, 1 / 2 / 4 seeds (docs: Speed)
  $PY benchmarks/unizero_update_parts.py --seeds 1 2 4 --repeats 5
fi
