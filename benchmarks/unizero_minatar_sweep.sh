#!/usr/bin/env bash
# Issue 29, first step: what holds UniZero and UniZero-PPO back on Breakout-MinAtar.
# One short GPU call: every configuration below starts at once as its own process (one GPU,
# XLA_PYTHON_CLIENT_PREALLOCATE=false so they share its memory), one seed each (SEEDS=n vmaps n),
# 500k env steps each, all cut by `timeout` so that the whole script ends within the budget;
# metrics.csv is written as each run goes, so a cut run still reports how far it got.
#
#   bash benchmarks/unizero_minatar_sweep.sh [budget_s=280] [out_dir=benchmarks/out/unizero_minatar_sweep]
#
# Configurations: the `breakout-minatar` preset of each file (baseline) and one change at a
# time, each testing one hypothesis (docs/unizero_ppo.md); PPO's preset cut to
# 500k steps (its learning rate anneals over those 500k, as in docs/unizero_ppo.md) is the
# reference. EXTRA=1 adds four more (embed 128, no KL stop, replay ratio 0.5, 10-step windows).
# UniZero-PPO's preset was heads-only when docs/data/unizero_minatar_sweep/ was measured (its
# `uzppo_base` row); the preset is now end to end, so that row is `uzppo_heads_only` here and
# the other UniZero-PPO rows now test their change on top of the end-to-end preset. Since then
# the preset took PPO's step-size regime; these rows keep the one they were measured on,
# `breakout-minatar-lr3e-4`; UniZero's took lr 1e-3 later, and its rows keep `breakout-minatar-lr1e-4`.
# SMOKE=1 swaps every preset for `tiny` and 2,000 steps: a check that the script runs and
# prints, on any machine (its numbers mean nothing).
#
# Output in out_dir: summary.txt (the table printed at the end), all_metrics.csv (every run's
# metrics.csv with a `run` column in front), logs_tail.txt (the last lines of every log), and
# runs/<name>/ (run directories, <name>.log, <name>.rc). The top-level files are few and one
# folder down at most, so out_dir=$OUT brings them back from the device machine.
#
# If `jaxzoo` is not importable (a bare device machine), the wheels in .whl/ are installed into
# a temporary folder and `jaxzoo` is mapped onto this checkout (common/, algos/, configs/)
# without building anything. The machine lent on 2026-11-27 (Python 3.12, jax 0.11.2, flax,
# optax and chex already there) needed these 12 wheels, 9 MB, fetched here with
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl \
#     gymnax==1.0.1 mctx==0.0.71 distrax==0.1.9 tyro==1.0.17 gymnasium==1.3.0 tfp-nightly \
#     docstring-parser typeguard farama-notifications dm-tree gast decorator
# (the versions of this checkout's environment; .whl/ ignored through .git/info/exclude).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
start_all=$SECONDS
budget=${1:-280}
OUT=${2:-benchmarks/out/unizero_minatar_sweep}
PY=${PYTHON:-python}
command -v "$PY" > /dev/null || PY=python3
SEEDS=${SEEDS:-1}
mkdir -p "$OUT/runs"
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false

# ---- set-up on a bare machine --------------------------------------------------------------
if ! "$PY" -c "import jaxzoo.configs, gymnax, mctx, distrax, tyro" 2> /dev/null; then
  site=$(mktemp -d)
  if compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
      || echo "warning: installing .whl/*.whl failed" >&2
  fi
  if ! PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c "import jaxzoo.configs" 2> /dev/null; then
    # jaxzoo = common/, with jaxzoo.algos and jaxzoo.configs found in the checkout's root.
    mkdir -p "$site/jaxzoo"
    printf '"""jaxzoo mapped onto %s (benchmarks/unizero_minatar_sweep.sh)."""\n__path__ = ["%s", "%s"]\n' \
      "$REPO" "$REPO/common" "$REPO" > "$site/jaxzoo/__init__.py"
  fi
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" -c "import jax, jaxzoo.configs; print('jax', jax.__version__, jax.devices())" 2>&1 | tail -1 | tee "$OUT/device.txt"

# ---- the configurations: name | file | flags after the preset ----------------------------
# Rows: UniZero-PPO phases are 16 x 50 = 800 steps (log_every 10: a chunk per 8,000 steps),
# UniZero updates 8 x 25 = 200 (log_every 5: per 1,000), PPO updates 64 x 128 = 8,192 (log_every
# 2: per 16,384); metrics.csv has one row per update. Greedy evaluations every ~100k steps.
CONFIGS=(
  "ppo_ref|ppo|"
  "uzppo_heads_only|unizero_ppo|--ppo-heads-only"
  "uzppo_e2e|unizero_ppo|--no-ppo-heads-only"
  "uzppo_temp1|unizero_ppo|--sampling-temperature 1.0"
  "uzppo_lr1e-3|unizero_ppo|--learning-rate 1e-3"
  "uzppo_gamma0.99|unizero_ppo|--gamma 0.99"
  "uz_base|unizero|"
  "uz_lr3e-4|unizero|--learning-rate 3e-4"
  "uz_puct25|unizero|--search-policy puct --num-simulations 25"
)
# SET=search: UniZero alone, its search targets' sharpness (docs/unizero.md, "A lead for the
# plateau"): mctx's Q rescaling floor raised to LightZero's value_delta_max, a policy-entropy
# bonus at LightZero's Atari UniZero weight, and both; STEPS (default 500k) env steps each.
if [[ ${SET:-} == search ]]; then
  CONFIGS=(
    "uz_base|unizero|"
    "uz_gap0.01|unizero|--q-rescale-min-gap 0.01"
    "uz_entropy5e-3|unizero|--policy-entropy-coef 5e-3"
    "uz_gap0.01_entropy5e-3|unizero|--q-rescale-min-gap 0.01 --policy-entropy-coef 5e-3"
  )
fi
# SET=plateau: both halves of issue 29's MinAtar target in one GPU call. UniZero at 100k steps,
# 2 vmapped seeds per process: the preset against the two search-sharpness fixes together.
# UniZero-PPO at 500k, 4 vmapped seeds per process: the end-to-end preset and one change each
# (docs/unizero_ppo.md's "candidates for the rest of the gap"). PPO's preset cut to 100k and
# 500k (learning rate annealed over each), 4 seeds, as the references. A row's own flags come
# last on its command line, so its --num-seeds and --total-timesteps override SEEDS and STEPS.
if [[ ${SET:-} == plateau ]]; then
  CONFIGS=(
    "ppo_100k|ppo|--total-timesteps 100000 --num-seeds 4"
    "ppo_500k|ppo|--num-seeds 4"
    "uz_base|unizero|--total-timesteps 100000 --num-seeds 2"
    "uz_gap0.01_entropy5e-3|unizero|--q-rescale-min-gap 0.01 --policy-entropy-coef 5e-3 --total-timesteps 100000 --num-seeds 2"
    "uzppo_e2e|unizero_ppo|--num-seeds 4"
    "uzppo_nokl|unizero_ppo|--target-kl 0 --num-seeds 4"
    "uzppo_embed128|unizero_ppo|--embed-dim 128 --num-seeds 4"
    "uzppo_envs64|unizero_ppo|--num-envs 64 --num-seeds 4"
    "uzppo_temp1|unizero_ppo|--sampling-temperature 1.0 --num-seeds 4"
    "uzppo_unroll10|unizero_ppo|--num-unroll-steps 10 --num-seeds 4"
    "uzppo_lr1e-3_nokl|unizero_ppo|--learning-rate 1e-3 --target-kl 0 --num-seeds 4"
  )
fi
# SET=schedule: UniZero-PPO at 500k, 4 seeds, PPO's optimisation schedule one piece at a time
# (ppo.py's preset anneals its learning rate to 0 and clips gradients at 0.5).
if [[ ${SET:-} == schedule ]]; then
  CONFIGS=(
    "uzppo_anneal|unizero_ppo|--anneal-lr --num-seeds 4"
    "uzppo_lr1e-3_anneal|unizero_ppo|--learning-rate 1e-3 --anneal-lr --num-seeds 4"
    "uzppo_clip0.5|unizero_ppo|--max-grad-norm 0.5 --num-seeds 4"
  )
fi
# The regime sets ran on 2026-11-27 on one H200 (docs/data/unizero_ppo_minatar_regime/; per-seed
# tables by benchmarks/sweep_seeds.py) in the order regime, regime-confirm, regime-latent,
# regime-100k, regime-ablate, each chosen from the one before; their UniZero-PPO rows run on the
# preset of then, `breakout-minatar-gamma0.997` (the preset took gamma 0.99 and latent weight 1 after).
# SET=regime: UniZero-PPO at 500k on its preset of then (PPO's step-size
# regime, docs/unizero_ppo.md), which tied PPO at 500k on the CPU: the preset and PPO with 8
# vmapped seeds each (the pair's spread), and one change each, 4 seeds, aimed at the rest of the
# gap: PPO's learning rate, more gradient steps per phase (epochs, minibatches), PPO's gamma,
# width 128, the latent loss's weight, 10-step windows, a smaller entropy bonus.
if [[ ${SET:-} == regime ]]; then
  CONFIGS=(
    "ppo_500k|ppo|--num-seeds 8"
    "uzppo_regime|unizero_ppo|--num-seeds 8"
    "uzppo_lr5e-3|unizero_ppo|--learning-rate 5e-3 --num-seeds 4"
    "uzppo_epochs8|unizero_ppo|--update-epochs 8 --num-seeds 4"
    "uzppo_minibatches8|unizero_ppo|--num-minibatches 8 --num-seeds 4"
    "uzppo_gamma0.99|unizero_ppo|--gamma 0.99 --num-seeds 4"
    "uzppo_embed128|unizero_ppo|--embed-dim 128 --num-seeds 4"
    "uzppo_latent1|unizero_ppo|--latent-coef 1 --num-seeds 4"
    "uzppo_unroll10|unizero_ppo|--num-unroll-steps 10 --num-seeds 4"
    "uzppo_ent5e-3|unizero_ppo|--ent-coef 5e-3 --num-seeds 4"
  )
fi
# SET=regime-confirm: the one change of SET=regime that moved the return (gamma 0.99, PPO's),
# on 12 more seeds (4-15), beside the preset and PPO on seeds 8-15, and gamma 0.99 with the
# two next-best changes (latent weight 1, entropy bonus 5e-3), 4 seeds each.
if [[ ${SET:-} == regime-confirm ]]; then
  CONFIGS=(
    "ppo_500k_s8|ppo|--seed 8 --num-seeds 8"
    "uzppo_regime_s8|unizero_ppo|--seed 8 --num-seeds 8"
    "uzppo_gamma0.99_s4|unizero_ppo|--gamma 0.99 --seed 4 --num-seeds 4"
    "uzppo_gamma0.99_s8|unizero_ppo|--gamma 0.99 --seed 8 --num-seeds 8"
    "uzppo_gamma0.99_latent1|unizero_ppo|--gamma 0.99 --latent-coef 1 --num-seeds 4"
    "uzppo_gamma0.99_ent5e-3|unizero_ppo|--gamma 0.99 --ent-coef 5e-3 --num-seeds 4"
  )
fi
# SET=regime-latent: gamma 0.99 with latent weight 1, the best pair of SET=regime-confirm, on
# seeds 4-15 (its seeds 0-3 ran there), and latent weight 1 alone on seeds 4-15.
if [[ ${SET:-} == regime-latent ]]; then
  CONFIGS=(
    "uzppo_gamma0.99_latent1_s4|unizero_ppo|--gamma 0.99 --latent-coef 1 --seed 4 --num-seeds 12"
    "uzppo_latent1_s4|unizero_ppo|--latent-coef 1 --seed 4 --num-seeds 12"
  )
fi
# SET=regime-100k: the same pair and PPO with budgets of 100k (each learning rate annealed over
# its 100k), 16 seeds each: issue 29's 100k target on the new settings.
if [[ ${SET:-} == regime-100k ]]; then
  CONFIGS=(
    "ppo_100k_16|ppo|--total-timesteps 100000 --num-seeds 16"
    "uzppo_gamma0.99_latent1_100k_16|unizero_ppo|--gamma 0.99 --latent-coef 1 --total-timesteps 100000 --num-seeds 16"
  )
fi
# SET=regime-ablate: the preset of then at 100k (16 seeds), and the pair without the world
# model's losses (latent and reward weights 0, PPO alone on the same transformer) at 500k, 16 seeds.
if [[ ${SET:-} == regime-ablate ]]; then
  CONFIGS=(
    "uzppo_regime_100k_16|unizero_ppo|--total-timesteps 100000 --num-seeds 16"
    "uzppo_gamma0.99_nowm_16|unizero_ppo|--gamma 0.99 --latent-coef 0 --reward-coef 0 --num-seeds 16"
  )
fi
if [[ ${EXTRA:-0} == 1 ]]; then
  CONFIGS+=(
    "uzppo_embed128|unizero_ppo|--embed-dim 128"
    "uzppo_nokl|unizero_ppo|--target-kl 0"
    "uz_rr0.5|unizero|--replay-ratio 0.5"
    "uz_unroll10|unizero|--num-unroll-steps 10"
  )
fi
# UniZero-PPO's rows ran on its preset before PPO's step-size regime (configs/unizero_ppo.toml).
declare -A PRESET=([ppo]=breakout-minatar [unizero_ppo]=breakout-minatar-lr3e-4 [unizero]=breakout-minatar-lr1e-4)
[[ ${SET:-} == regime* ]] && PRESET[unizero_ppo]=breakout-minatar-gamma0.997
declare -A DEFAULT_FLAGS=(
  [ppo]="--log-every 2 --eval-every 12"
  [unizero_ppo]="--log-every 10 --eval-every 125"
  [unizero]="--log-every 5 --eval-every 500"
)

# ---- launch everything at once -----------------------------------------------------------
reserve=25 # the summary, and the 10 s between SIGTERM (checkpoint-free stop at a chunk boundary) and SIGKILL
run_limit=$(( budget - (SECONDS - start_all) - reserve ))
(( run_limit >= 20 )) || { echo "budget $budget s leaves only $run_limit s for the runs" >&2; exit 2; }
echo "== ${#CONFIGS[@]} runs at once, ${run_limit} s each at most, SEEDS=$SEEDS${SMOKE:+, SMOKE}" | tee "$OUT/summary.txt"
for config in "${CONFIGS[@]}"; do
  IFS='|' read -r name algo flags <<< "$config"
  if [[ ${SMOKE:-0} == 1 ]]; then
    preset_flags="--preset tiny --env-id Breakout-MinAtar --total-timesteps 2000 --log-every 2"
  else
    preset_flags="--preset ${PRESET[$algo]} --total-timesteps ${STEPS:-500000} ${DEFAULT_FLAGS[$algo]}"
  fi
  cmd="$PY algos/$algo.py $preset_flags --exp-name sweep-$name --num-seeds $SEEDS --no-save-model --run-root $OUT/runs/$name $flags"
  [[ ${SMOKE:-0} == 1 ]] && cmd+=" --total-timesteps 2000"   # over a row's own budget too
  echo "$name: $cmd" >> "$OUT/summary.txt"
  (
    echo "$cmd"
    timeout -k 10 "$run_limit" $cmd
    echo $? > "$OUT/runs/$name.rc"
  ) > "$OUT/runs/$name.log" 2>&1 &
done
wait

# ---- summary -----------------------------------------------------------------------------
for config in "${CONFIGS[@]}"; do
  name=${config%%|*}
  echo "== $name (exit $(cat "$OUT/runs/$name.rc" 2> /dev/null || echo '?'))"
  tail -n 8 "$OUT/runs/$name.log"
done > "$OUT/logs_tail.txt" 2>&1

names=$(for config in "${CONFIGS[@]}"; do printf '%s ' "${config%%|*}"; done)
"$PY" - "$OUT" $names << 'EOF' | tee -a "$OUT/summary.txt"
"""One line per run: how far it got, its training returns near 100k steps and over its last
20k steps (means over the episodes that ended there), its greedy evaluations, and the
diagnostics that the hypotheses predict (means over the last 20k steps)."""
import csv, glob, json, math, os, sys

out, names = sys.argv[1], sys.argv[2:]


def num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def episode_mean(rows, lo, hi):
    """Episode-weighted mean return of the rows with lo < global_step <= hi."""
    total = count = 0.0
    for r in rows:
        if lo < r["global_step"] <= hi and not math.isnan(r.get("episode_return", math.nan)):
            n = r.get("episodes_finished", 1.0)
            n = 1.0 if math.isnan(n) else n
            total, count = total + n * r["episode_return"], count + n
    return total / count if count else math.nan


def mean_of(rows, key, lo):
    vals = [r[key] for r in rows if r["global_step"] > lo and key in r and not math.isnan(r[key])]
    return sum(vals) / len(vals) if vals else math.nan


fmt = lambda x, p=2: "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{p}f}"
diagnostics = ["entropy", "policy_entropy", "search_entropy", "explained_variance", "gradient_steps_run",
               "approx_kl", "clip_fraction", "latent_loss", "value_loss", "grad_norm"]
all_rows, columns = [], ["run"]
header = f"{'run':16} {'exit':>4} {'steps':>7} {'wall_s':>6} {'sps':>7} {'R80-100k':>8} {'R_last20k':>9} {'eval~100k':>9} {'eval_last(step)':>16} {'final':>6}"
print(header)
details = []
for name in names:
    rc = open(f"{out}/runs/{name}.rc").read().strip() if os.path.exists(f"{out}/runs/{name}.rc") else "?"
    paths = sorted(glob.glob(f"{out}/runs/{name}/*/metrics.csv"))
    if not paths:
        print(f"{name:16} {rc:>4} no metrics.csv (see logs_tail.txt)")
        continue
    run_dir = os.path.dirname(paths[-1])
    with open(paths[-1], newline="") as f:
        raw = list(csv.DictReader(f))
    for r in raw:
        all_rows.append({"run": name, **r})
        columns += [c for c in r if c not in columns]
    # Several seeds (SEEDS > 1): average the seeds' rows of each update.
    by_step = {}
    for r in raw:
        by_step.setdefault(int(r["global_step"]), []).append({k: num(v) for k, v in r.items()})
    rows = []
    for step in sorted(by_step):
        group = by_step[step]
        merged = {}
        for k in group[0]:
            vals = [g[k] for g in group if not math.isnan(g[k])]
            merged[k] = sum(vals) / len(vals) if vals else math.nan
        merged["global_step"] = step
        if "episode_return" in merged and "episodes_finished" in merged:
            finished = [g for g in group if not math.isnan(g.get("episode_return", math.nan))]
            n = sum(g.get("episodes_finished", 1.0) for g in finished)
            merged["episode_return"] = (
                sum(g.get("episodes_finished", 1.0) * g["episode_return"] for g in finished) / n if n else math.nan
            )
            merged["episodes_finished"] = n
        rows.append(merged)
    last = rows[-1]["global_step"]
    evals = [(r["global_step"], r["eval_return"]) for r in rows if not math.isnan(r.get("eval_return", math.nan))]
    near = [e for s, e in evals if 90_000 <= s <= 110_000]
    final = math.nan
    if os.path.exists(f"{run_dir}/eval.json"):
        final = json.load(open(f"{run_dir}/eval.json")).get("mean", math.nan)
    sps = mean_of(rows, "steps_per_second", last - 20_000)
    print(
        f"{name:16} {rc:>4} {last:>7} {fmt(rows[-1].get('wall_seconds'), 0):>6} {fmt(sps, 0):>7} "
        f"{fmt(episode_mean(rows, 80_000, 100_000) if last >= 100_000 else math.nan):>8} "
        f"{fmt(episode_mean(rows, last - 20_000, last)):>9} {fmt(near[0] if near else math.nan):>9} "
        f"{(fmt(evals[-1][1]) + f'({evals[-1][0]})') if evals else '-':>16} {fmt(final):>6}"
    )
    # Training return along the way (per 50k steps; per 20k for runs of 150k steps or less) and
    # the diagnostics over the last 20k.
    span = 20_000 if last <= 150_000 else 50_000
    curve = " ".join(f"{k // 1000}k:{fmt(episode_mean(rows, k - span, k), 1)}" for k in range(span, last + 1, span))
    diag = " ".join(f"{k}={fmt(mean_of(rows, k, last - 20_000), 3)}" for k in diagnostics if k in rows[-1])
    details.append(f"{name}: {curve or '(under 20k steps)'}\n    {diag}")
print("\n".join(details))
if all_rows:
    with open(f"{out}/all_metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, columns, restval="")
        writer.writeheader()
        writer.writerows(all_rows)
EOF
echo "whole script: $(( SECONDS - start_all )) s of a $budget s budget" | tee -a "$OUT/summary.txt"
