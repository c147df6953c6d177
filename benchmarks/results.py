"""docs/results.md and its figures, from the run summaries committed under docs/data/runs/.

    python benchmarks/results.py            # docs/data/runs/ -> docs/results.md + docs/img/results_*.png
    python benchmarks/results.py --check    # exit 1 if docs/results.md differs from what the runs give
    python benchmarks/results.py --runs runs/ ~/other_runs --compare ppo my-ppo --img-dir /tmp/figs
                                            # your own runs: the table on stdout, figures where you say

Every run writes summary.json (marl-eval / Stoix layout) and run_info.json into
its run directory (jaxzoo.results); `--runs` takes those files, folders holding
them (searched recursively) or run directories made before they existed
(summarized from args.json, metrics.csv and eval.json). The runs in
docs/data/runs/<algorithm>/<name>/ come from `bash benchmarks/results.sh`,
which lists each command; adding a folder there and rerunning this script is
how a result enters the table. The statistics (interquartile mean, stratified
bootstrap confidence intervals, performance profiles, probability of
improvement) are rliable's (Agarwal et al. 2021), computed with a fixed
bootstrap seed, so the same run files give the same bytes.
"""

from __future__ import annotations

import argparse
import re
import sys
from itertools import combinations
from pathlib import Path

import numpy as np

from jaxzoo import results

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "docs" / "data" / "runs"
MARKDOWN = ROOT / "docs" / "results.md"
IMG = ROOT / "docs" / "img"
ALGORITHMS = sorted(p.stem for p in (ROOT / "algos").glob("*.py") if p.stem != "__init__")

# The comparisons the docs make: (file stem, title, pairs, members as (label,
# run folder under docs/data/runs)). `pairs`: "all" (every pair) or "first"
# (the first member against each other one). Figures are drawn for the members
# whose runs exist, when at least two do; the others are named as missing.
COMPARISONS = [
    (
        "unizero_family_cartpole_v0",
        "UniZero vs UniZero-PPO vs PPO: CartPole-v1 cut at 200 steps (CartPole-v0), 20k env steps (docs/unizero_ppo.md)",
        "all",
        [("UniZero", "unizero/cartpole-v0"), ("UniZero-PPO", "unizero_ppo/cartpole-v0"), ("PPO", "ppo/cartpole-v0")],
    ),
    (
        "unizero_ppo_vs_ppo_cartpole",
        "UniZero-PPO vs PPO: CartPole-v1, 100k env steps (docs/unizero_ppo.md)",
        "all",
        [("UniZero-PPO", "unizero_ppo/cartpole"), ("PPO", "ppo/cartpole-100k")],
    ),
    (
        "rainbow_ablation",
        "Rainbow's ablation: Rainbow minus one component, CartPole-v1, 500k env steps (docs/rainbow.md)",
        "first",
        [
            ("Rainbow", "rainbow/ablation-rainbow"),
            ("no double", "rainbow/ablation-no-double"),
            ("no dueling", "rainbow/ablation-no-dueling"),
            ("no prioritized", "rainbow/ablation-no-prioritized"),
            ("no noisy", "rainbow/ablation-no-noisy"),
            ("no distributional", "rainbow/ablation-no-distributional"),
            ("no n-step", "rainbow/ablation-no-n-step"),
        ],
    ),
    (
        "impala_vs_appo",
        "IMPALA vs APPO: CartPole-v1, 1M env steps, policy lag 2 (docs/impala.md)",
        "all",
        [("IMPALA", "impala/cartpole"), ("APPO", "impala/appo")],
    ),
]

INTRO = """\
Every row is one command's run (all its seeds), read from the `summary.json`
each run writes; the commands are in
[benchmarks/results.sh](../benchmarks/results.sh) and the run files in
[docs/data/runs/](data/runs/). The per-algorithm pages (`docs/<algo>.md`)
hold the longer studies; this page reports the runs committed here the way
papers do, with their uncertainty.

- **Greedy return**: each seed's mean over its final greedy evaluation
  episodes (`eval.json`), then mean +- std over seeds, and the weakest seed.
- **IQM** (interquartile mean): the mean of the middle 50% of the per-seed
  scores (the lowest and highest quarter dropped), Agarwal et al. 2021, "Deep
  Reinforcement Learning at the Edge of the Statistical Precipice" (NeurIPS):
  less moved by one outlier seed than the mean, less wasteful than the median.
- **[95% CI]**: percentile interval of {reps:,} stratified bootstrap resamples
  (runs resampled with replacement within each task; here one task per row, so
  over seeds), computed by [rliable](https://github.com/google-research/rliable)
  with bootstrap seed {seed}. With 4-8 seeds these intervals are wide, and a
  seed count this small makes them optimistic: read them as "how much the
  seeds we ran disagree", not as a guarantee.
- **Performance profile**: the fraction of runs whose final greedy return
  exceeds each threshold tau, with a 95% bootstrap band. **Probability of
  improvement** P(X > Y): the chance that a run of X beats a run of Y
  (Mann-Whitney U / (n_X n_Y)), with a 95% CI.
- **Training loop**: wall seconds of the training loop for all seeds together
  (vmapped), compilation excluded; **compile**: tracing and compiling, less
  when JAX's persistent compilation cache already held the program (it is on
  by default). The machine and date are the run's own (`run_info.json`);
  "load" is the machine's 15-minute load average when the run ended (runs
  from before it was recorded show none): near or above the core count, the
  run shared the CPU with other jobs and its seconds overstate its cost.
"""

OWN_RUNS = """\
## Aggregating your own runs

Every run writes `summary.json` into its run directory, in the raw-data layout
of [marl-eval](https://github.com/instadeepai/marl-eval) that Stoix's
evaluation logger writes (`{env: {task: {algorithm: {"seed_<n>": {"step_<i>":
{"step_count", "elapsed_time", "episode_return"}, ..., "absolute_metrics":
{"episode_return": [...]}}}}}}`; the algorithm is the run's `--exp-name`), and
`run_info.json` beside it (machine, versions, seconds). To aggregate runs:

```bash
pip install -e ".[results]"     # rliable (and pandas < 3, which its arch dependency needs)
python benchmarks/results.py --runs runs/ --compare ppo my-ppo --img-dir figs/
```

prints this table for every run under `runs/` (run directories made before
`summary.json` existed are summarized from their `args.json`, `metrics.csv`
and `eval.json`) and draws the profile and probability of improvement of the
named `--exp-name`s. From Python, `jaxzoo.results.load_results(paths)` and
`score_dict(...)` give rliable's `{algorithm: [num_runs, num_tasks]}` arrays,
and `interval_estimates`, `probability_of_improvement` and
`performance_profiles` its statistics; marl-eval's `concatenate_files` and
`data_process_pipeline` read a folder of `summary.json` files as they are.
"""


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def group_runs(found: list[results.Result], root: Path | None) -> dict[str, list[results.Result]]:
    """Results pooled by run folder name (relative to `root` when under it):
    the rows of the table, in algorithm-file order then name."""
    groups: dict[str, list[results.Result]] = {}
    for r in found:
        try:
            name = r.path.resolve().relative_to(root.resolve()).as_posix() if root else str(r.path)
        except ValueError:
            name = str(r.path)
        name = r.path.name if name == "." else name
        groups.setdefault(f"{name}\t{r.task}", []).append(r)
    order = {a: i for i, a in enumerate(ALGORITHMS)}
    return dict(sorted(groups.items(), key=lambda kv: (order.get(kv[1][0].info.get("algorithm"), 99), kv[0])))


def machine(info: dict) -> str:
    m = info.get("machine")
    if not m:
        return "unknown"
    cpu = re.sub(r"\((R|TM)\)|\s+Processor|\s+CPU", "", m["cpu"]).strip()
    device = "" if m["backend"] == "cpu" else f", {m['devices']}"
    load = f", load {m['load_average_15min']:.1f}" if "load_average_15min" in m else ""
    return f"{m['cpu_cores']}-core {cpu}{device}, jax {m['jax']}{load}"


def table(groups: dict[str, list[results.Result]], reps: int) -> list[str]:
    lines = [
        "| algorithm (`--exp-name`) | run | env | task | seeds | env steps / seed | greedy return | worst seed "
        "| IQM [95% CI] | mean [95% CI] | training loop (s) | compile (s) | machine | date |",
        "| " + " | ".join(["---"] * 14) + " |",
    ]
    for key, members in groups.items():
        name = key.split("\t")[0]
        first = members[0]
        finals = np.concatenate([r.final_returns for r in members])
        estimate = results.interval_estimates({first.algorithm: finals[:, None]}, reps=reps)[first.algorithm]
        iqm, mean = estimate["iqm"], estimate["mean"]
        seconds = [r.info.get("train_seconds") for r in members]
        compile_seconds = [r.info.get("compile_seconds") for r in members]
        fmt = lambda xs: " + ".join(f"{x:.0f}" for x in xs if x is not None) or "-"
        steps = f"{first.env_steps:,}" if first.env_steps is not None else "-"
        lines.append(
            f"| {first.info.get('algorithm', '?')} (`{first.algorithm}`) | {name} | {first.family} | {first.task} "
            f"| {len(finals)} | {steps} | {finals.mean():.1f} +- {finals.std():.1f} | {finals.min():.1f} "
            f"| {iqm.value:.1f} [{iqm.low:.1f}, {iqm.high:.1f}] | {mean.value:.1f} [{mean.low:.1f}, {mean.high:.1f}] "
            f"| {fmt(seconds)} | {fmt(compile_seconds)} | {machine(first.info)} | {first.info.get('date', '-')} |"
        )
    return lines


def comparison_scores(
    members: list[tuple[str, str]], groups: dict[str, list[results.Result]]
) -> tuple[dict[str, np.ndarray], list[str]]:
    """`{label: scores [seeds, 1]}` of the members whose runs exist, and the run folders that do not."""
    by_name = {key.split("\t")[0]: rs for key, rs in groups.items()}
    scores, missing = {}, []
    for label, folder in members:
        if folder in by_name:
            scores[label] = np.concatenate([r.final_returns for r in by_name[folder]])[:, None]
        else:
            missing.append(folder)
    return scores, missing


def pair_list(labels: list[str], pairs: str) -> list[tuple[str, str]]:
    return list(combinations(labels, 2)) if pairs == "all" else [(labels[0], other) for other in labels[1:]]


def comparison_section(
    stem: str, title: str, pairs: str, scores: dict, missing: list[str], reps: int, img_link: str
) -> list[str]:
    lines = [f"### {title}", ""]
    if len(scores) < 2:
        lines.append(
            "Not drawn: no committed runs for "
            + ", ".join(f"`{m}`" for m in missing)
            + (f" (present: {', '.join(scores)})" if scores else "")
            + "."
        )
        return lines + [""]
    if missing:
        lines += ["Without " + ", ".join(f"`{m}`" for m in missing) + " (no committed runs yet).", ""]
    lines += [
        f"![performance profile]({img_link}results_{stem}_profile.png)",
        f"![probability of improvement]({img_link}results_{stem}_poi.png)",
        "",
        "| X | Y | P(X > Y) [95% CI] |",
        "| --- | --- | --- |",
    ]
    for key, estimate in results.probability_of_improvement(scores, pair_list(list(scores), pairs), reps=reps).items():
        x, y = key.split(",")
        lines.append(f"| {x} | {y} | {estimate.value:.2f} [{estimate.low:.2f}, {estimate.high:.2f}] |")
    return lines + [""]


def savefig(fig, path: Path) -> None:
    fig.savefig(path, dpi=100, bbox_inches="tight", metadata={"Software": None})  # no version stamp: same bytes


def draw_comparison(stem: str, title: str, pairs: str, scores: dict, reps: int, img_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rliable import plot_utils

    high = max(float(s.max()) for s in scores.values())
    low = min(0.0, min(float(s.min()) for s in scores.values()))
    taus = np.linspace(low, high, 101)
    profiles, bands = results.performance_profiles(scores, taus, reps=reps)
    fig, ax = plt.subplots(figsize=(7, 4))
    plot_utils.plot_performance_profiles(
        profiles, taus, performance_profile_cis=bands, ax=ax, xlabel=r"final greedy return ($\tau$)", legend=False
    )
    ax.legend(loc="lower left")
    ax.set_title(title, fontsize=9)
    savefig(fig, img_dir / f"results_{stem}_profile.png")
    plt.close(fig)
    estimates = results.probability_of_improvement(scores, pair_list(list(scores), pairs), reps=reps)
    fig = plot_utils.plot_probability_of_improvement(
        {k: e.value for k, e in estimates.items()},
        {k: np.array([e.low, e.high]) for k, e in estimates.items()},
        figsize=(4, 0.6 + 0.4 * len(estimates)),
    )
    savefig(fig if hasattr(fig, "savefig") else fig.figure, img_dir / f"results_{stem}_poi.png")
    plt.close("all")


def draw_intervals(task: str, rows: dict[str, np.ndarray], reps: int, img_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from rliable import plot_utils

    estimates = {label: results.interval_estimates({label: s}, reps=reps)[label] for label, s in rows.items()}
    points = {k: np.array([e["iqm"].value, e["mean"].value]) for k, e in estimates.items()}
    intervals = {
        k: np.array([[e["iqm"].low, e["mean"].low], [e["iqm"].high, e["mean"].high]]) for k, e in estimates.items()
    }
    row_height = 0.5  # inches per row; the x label sits below the tick labels, about 0.6 inch down
    fig, _ = plot_utils.plot_interval_estimates(
        points,
        intervals,
        metric_names=["IQM", "Mean"],
        xlabel=f"final greedy return, {task}",
        subfigure_width=4.5,
        row_height=row_height,
        xlabel_y_coordinate=-0.6 / (row_height * max(len(rows), 2)),
    )
    savefig(fig, img_dir / f"results_intervals_{slug(task)}.png")
    plt.close(fig)


def interval_rows(groups: dict[str, list[results.Result]]) -> dict[str, dict[str, np.ndarray]]:
    """Per task, `{row label: scores [seeds, 1]}` for the interval-estimate figure."""
    per_task: dict[str, dict[str, np.ndarray]] = {}
    for key, members in groups.items():
        name, task = key.split("\t")
        label = f"{members[0].algorithm} ({name})"
        per_task.setdefault(task, {})[label] = np.concatenate([r.final_returns for r in members])[:, None]
    return per_task


def render(
    groups: dict[str, list[results.Result]],
    comparisons: list,
    reps: int,
    source: str,
    img_link: str = "img/",
    committed: bool = True,
) -> str:
    """The whole markdown page (figures are drawn separately, by `draw`)."""
    present = {r.info.get("algorithm") for members in groups.values() for r in members}
    lines = [
        "# Results",
        "",
        f"Generated by `python benchmarks/results.py` from {source}; do not edit by hand: every number below",
        "is computed from the run files.",
        "",
        INTRO.format(reps=reps, seed=results.BOOTSTRAP_SEED),
        "## Final greedy returns",
        "",
        *table(groups, reps),
        "",
    ]
    absent = [a for a in ALGORITHMS if a not in present]
    if absent and committed:
        lines += [
            "No committed runs yet for: "
            + ", ".join(f"[{a}]({a}.md)" for a in absent)
            + ". Their results so far are in their own pages (measured with `benchmarks/summarize.py`, "
            "not in this table's format).",
            "",
        ]
    per_task = interval_rows(groups)
    if per_task:
        lines += ["## IQM and mean with 95% CIs, per task", ""]
        lines += [f"![{task}]({img_link}results_intervals_{slug(task)}.png)" for task in per_task] + [""]
    if comparisons:
        lines += ["## Comparisons the docs make", ""]
        for stem, title, pairs, members in comparisons:
            scores, missing = comparison_scores(members, groups)
            lines += comparison_section(stem, title, pairs, scores, missing, reps, img_link)
    lines.append(OWN_RUNS)
    return "\n".join(lines).rstrip() + "\n"


def draw(groups: dict[str, list[results.Result]], comparisons: list, reps: int, img_dir: Path) -> list[Path]:
    img_dir.mkdir(parents=True, exist_ok=True)
    for stale in img_dir.glob("results_*.png"):  # figures of runs or comparisons that are gone
        stale.unlink()
    for task, rows in interval_rows(groups).items():
        draw_intervals(task, rows, reps, img_dir)
    for stem, title, pairs, members in comparisons:
        scores, _ = comparison_scores(members, groups)
        if len(scores) >= 2:
            draw_comparison(stem, title.split(" (docs/")[0], pairs, scores, reps, img_dir)
    return sorted(img_dir.glob("results_*.png"))


def committed_page(reps: int = results.BOOTSTRAP_REPS) -> str:
    """docs/results.md as the committed run files give it."""
    groups = group_runs(results.load_results([RUNS]), RUNS)
    return render(groups, COMPARISONS, reps, "the run summaries in [docs/data/runs/](data/runs/)")


def user_comparisons(groups: dict[str, list[results.Result]], labels: list[str]) -> list:
    """One comparison per task of the named exp_names' runs."""
    out = []
    for task in sorted({key.split("\t")[1] for key in groups}):
        members = [
            (f"{rs[0].algorithm}", key.split("\t")[0])
            for key, rs in groups.items()
            if key.split("\t")[1] == task and rs[0].algorithm in labels
        ]
        if len(members) >= 2:
            out.append((f"compare_{slug(task)}", f"{' vs '.join(m[0] for m in members)}: {task}", "all", members))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", type=Path, help="summary.json files or folders (default docs/data/runs/)")
    parser.add_argument("--compare", nargs="+", default=[], help="with --runs: exp_names to draw profiles for")
    parser.add_argument("--img-dir", type=Path, help="with --runs: where to draw the figures (default: none)")
    parser.add_argument("--reps", type=int, default=results.BOOTSTRAP_REPS, help="bootstrap resamples")
    parser.add_argument("--check", action="store_true", help="only compare docs/results.md with the committed runs")
    args = parser.parse_args(argv)
    if args.runs:
        root = args.runs[0] if len(args.runs) == 1 and args.runs[0].is_dir() else None
        groups = group_runs(results.load_results(args.runs), root)
        comparisons = user_comparisons(groups, args.compare)
        link = f"{args.img_dir}/" if args.img_dir else "img/"
        print(render(groups, comparisons, args.reps, " ".join(map(str, args.runs)), link, committed=False), end="")
        if args.img_dir:
            for path in draw(groups, comparisons, args.reps, args.img_dir):
                print(f"wrote {path}", file=sys.stderr)
        return 0
    page = committed_page(args.reps)
    if args.check:
        same = MARKDOWN.exists() and MARKDOWN.read_text() == page
        print("docs/results.md is up to date" if same else "docs/results.md differs from the committed runs")
        return 0 if same else 1
    MARKDOWN.write_text(page)
    groups = group_runs(results.load_results([RUNS]), RUNS)
    for path in draw(groups, COMPARISONS, args.reps, IMG):
        print(f"wrote {path.relative_to(ROOT)}")
    print(f"wrote {MARKDOWN.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
