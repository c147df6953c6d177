"""Run summaries in the layout rliable, marl-eval and Stoix users aggregate, and
the statistics docs/results.md reports (interquartile mean, stratified bootstrap
confidence intervals).

At the end of every run, `jaxzoo.runner` writes two files into the run directory
(`write_summary`):

- `summary.json`: the run in marl-eval's raw-data layout, the JSON that Stoix's
  evaluation logger writes (marl-eval's README, "Data Structure for Raw
  Experiment data"; marl_eval/json_tools/json_logger.py, which Stoix's
  stoix/utils/logger.py `JsonLogger` wraps):

      {env_family: {task: {algorithm: {"seed_<seed>": {
          "step_0": {"step_count": env steps, "elapsed_time": s, "episode_return": [return]},
          ...
          "absolute_metrics": {"episode_return": [the final greedy evaluation's episode returns]}}}}}}

  Nothing else is in it, so marl-eval's `concatenate_files` and
  `data_process_pipeline` read a folder of them unchanged (they treat every key
  of a run as a step, and the last one as the absolute metrics). `algorithm` is
  the run's `exp_name` (by default the file's name: pass `--exp-name` to tell
  variants apart); the steps are the `--eval-every` evaluations (`eval_return`
  column of metrics.csv: each seed's mean over its evaluation episodes) or,
  without them, the logged training `episode_return`, averaged over at most
  `MAX_STEPS` equal windows of logged updates so the file stays small.
  `absolute_metrics` is the greedy evaluation of the final policy (eval.json),
  where marl-eval's protocol evaluates the best policy over 10x the episodes.
- `run_info.json`: what that layout has no place for: algorithm file, env id,
  seeds, env steps, evaluation episodes, compile and training-loop seconds,
  package versions, the machine and the date.

`summarize_run_dir` builds the same summary from any finished run directory
(args.json, metrics.csv, eval.json), so runs made before this module existed
convert too. `load_results` reads many of them, `score_dict` turns them into
the `{algorithm: [num_runs, num_tasks]}` arrays rliable takes, and
`interval_estimates` / `probability_of_improvement` / `performance_profiles`
compute Agarwal et al. (2021)'s statistics through rliable, with a fixed
bootstrap seed so a table regenerates byte for byte. rliable is an optional
extra (`pip install -e ".[results]"`), imported only by those three functions.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from jaxzoo import logger

SUMMARY = "summary.json"
RUN_INFO = "run_info.json"
METRIC = "episode_return"  # the metric name in summary.json, marl-eval's and Stoix's
MAX_STEPS = 100  # at most this many step entries per seed (windows of logged updates)
BOOTSTRAP_REPS = 2000  # rliable's default for performance profiles; Agarwal et al. use 2000-50000
BOOTSTRAP_SEED = 0

# gymnax's suites by the suffix of their env ids ("Breakout-MinAtar", "Catch-bsuite", "FourRooms-misc").
SUITES = {"MinAtar": "minatar", "bsuite": "bsuite", "misc": "misc"}


def env_and_task(env_id: str, max_episode_steps: int = 0) -> tuple[str, str]:
    """marl-eval's (environment name, task name) of an env id: the prefix of a
    host-side id ("dmc:cartpole-swingup" -> dmc), a gymnax suite from the
    suffix, else "gymnax" (classic control). A changed time limit is part of
    the task: CartPole-v1 cut at 200 steps is another task."""
    if ":" in env_id:
        family, task = env_id.split(":", 1)
    else:
        family, task = SUITES.get(env_id.rsplit("-", 1)[-1], "gymnax"), env_id
    if max_episode_steps:
        task = f"{task} (max {max_episode_steps} steps)"
    return family, task


def _windows(update: np.ndarray, values: np.ndarray, steps: np.ndarray, clock: np.ndarray) -> list[dict]:
    """One step entry per logged value, or per window of them when there are
    more than MAX_STEPS: the window's mean, at its last row's step and clock."""
    finite = np.isfinite(values)
    if not finite.any():
        return []
    order = np.argsort(update[finite], kind="stable")
    values, steps, clock = values[finite][order], steps[finite][order], clock[finite][order]
    entries = []
    for window in np.array_split(np.arange(len(values)), min(len(values), MAX_STEPS)):
        last = window[-1]
        entries.append(
            {
                "step_count": int(steps[last]),
                "elapsed_time": round(float(clock[last]), 3) if np.isfinite(clock[last]) else 0.0,
                METRIC: [round(float(values[window].mean()), 4)],
            }
        )
    return entries


def _read_rows(run_dir: Path) -> dict[str, np.ndarray]:
    return logger.read_metrics(run_dir) if (run_dir / "metrics.csv").exists() else {}


def summarize_run_dir(run_dir: str | Path, rows: dict[str, np.ndarray] | None = None) -> dict:
    """summary.json's content for a finished run directory (args.json,
    metrics.csv and eval.json; without metrics.csv, only the absolute metrics).
    `rows`: metrics.csv already read (`logger.read_metrics`)."""
    run_dir = Path(run_dir)
    args = json.loads((run_dir / "args.json").read_text())
    evaluation = json.loads((run_dir / "eval.json").read_text())
    family, task = env_and_task(args["env_id"], int(args.get("max_episode_steps") or 0))
    returns = np.asarray(evaluation["returns"], np.float64)  # [num_seeds, eval_episodes]
    rows = _read_rows(run_dir) if rows is None else rows
    column = "eval_return" if np.isfinite(rows.get("eval_return", [np.nan])).any() else METRIC
    runs = {}
    for seed_index, episode_returns in enumerate(returns):
        seed = int(args["seed"]) + seed_index
        run: dict[str, Any] = {}
        if column in rows:
            mine = rows["seed_index"] == seed_index
            clock = rows.get("wall_seconds", np.full(len(mine), np.nan))
            entries = _windows(rows["update"][mine], rows[column][mine], rows["global_step"][mine], clock[mine])
            run.update({f"step_{i}": entry for i, entry in enumerate(entries)})
        run["absolute_metrics"] = {METRIC: [float(r) for r in episode_returns]}
        runs[f"seed_{seed}"] = run
    return {family: {task: {args["exp_name"]: runs}}}


def machine_info() -> dict:
    """The machine a run ran on: CPU model and cores, accelerator, versions."""
    import jax

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    device = jax.devices()[0]
    return {
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "backend": jax.default_backend(),
        "devices": f"{jax.device_count()} x {device.device_kind}",
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": getattr(jax.lib, "__version__", None) or jax.__version__,
        # Runnable processes averaged over the last 15 minutes when the run ended: near or
        # above cpu_cores, the run shared the machine and its seconds overstate its cost.
        "load_average_15min": round(os.getloadavg()[2], 2),
    }


def run_info(run_dir: str | Path, machine: dict | None = None, rows: dict[str, np.ndarray] | None = None) -> dict:
    """run_info.json's content: the run's facts summary.json has no place for.
    `machine` is `machine_info()` when the run itself writes it, None (unknown)
    when an old run directory is converted on another day."""
    run_dir = Path(run_dir)
    args = json.loads((run_dir / "args.json").read_text())
    evaluation = json.loads((run_dir / "eval.json").read_text())
    rows = _read_rows(run_dir) if rows is None else rows
    has_eval = np.isfinite(rows.get("eval_return", [np.nan])).any()
    returns = np.asarray(evaluation["returns"])
    return {
        "algorithm": args.get("algorithm"),
        "exp_name": args["exp_name"],
        "env_id": args["env_id"],
        "seeds": [int(args["seed"]) + i for i in range(returns.shape[0])],
        "env_steps": int(rows["global_step"].max()) if len(rows.get("global_step", [])) else None,
        "eval_episodes": int(returns.shape[1]),
        "steps_metric": "eval_return (--eval-every)" if has_eval else f"training {METRIC} (logged updates)",
        "compile_seconds": evaluation.get("compile_seconds"),
        "train_seconds": evaluation.get("train_seconds"),
        "jaxzoo_version": args.get("jaxzoo_version"),
        "date": time.strftime("%Y-%m-%d", time.gmtime((run_dir / "eval.json").stat().st_mtime)),
        "machine": machine,
    }


def _dumps(value: Any, depth: int = 0) -> str:
    """JSON with the five nesting levels down to a run indented and each step
    entry on one line: readable, and a few times smaller than `indent=1`."""
    if isinstance(value, dict) and value and depth < 5:
        pad = " " * (depth + 1)
        items = [f"{pad}{json.dumps(k)}: {_dumps(v, depth + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * depth + "}"
    return json.dumps(value)


def write_summary(run_dir: str | Path, machine: dict | None = None) -> None:
    """Write summary.json and run_info.json into a finished run directory."""
    run_dir = Path(run_dir)
    rows = _read_rows(run_dir)  # once: a long run's metrics.csv takes seconds to parse
    (run_dir / SUMMARY).write_text(_dumps(summarize_run_dir(run_dir, rows)) + "\n")
    (run_dir / RUN_INFO).write_text(json.dumps(run_info(run_dir, machine, rows), indent=2) + "\n")


# Reading many runs.


@dataclass
class Result:
    """One algorithm on one task from one summary.json: `final_returns` [seeds]
    is each seed's mean greedy return at the end (its absolute metric)."""

    path: Path
    family: str
    task: str
    algorithm: str
    seeds: list[int]
    final_returns: np.ndarray
    env_steps: int | None
    info: dict = field(default_factory=dict)


def read_summary(path: str | Path) -> list[Result]:
    """The Results of one summary.json (or of a run directory: its summary.json,
    or one built from its args.json / metrics.csv / eval.json), with the
    run_info.json beside it (or, in an older run directory, one built from
    its files)."""
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    if path.is_dir():
        tree = json.loads((path / SUMMARY).read_text()) if (path / SUMMARY).exists() else summarize_run_dir(path)
    else:
        tree = json.loads(path.read_text())
    if (directory / RUN_INFO).exists():
        info = json.loads((directory / RUN_INFO).read_text())
    elif (directory / "args.json").exists() and (directory / "eval.json").exists():
        info = run_info(directory)  # a run directory made before run_info.json: its machine is unknown
    else:
        info = {}
    results = []
    for family, tasks in tree.items():
        for task, algorithms in tasks.items():
            for algorithm, runs in algorithms.items():
                seeds = [int(name.rsplit("_", 1)[-1]) for name in runs]
                finals = np.array([np.mean(run["absolute_metrics"][METRIC]) for run in runs.values()])
                steps = [
                    entry["step_count"] for run in runs.values() for k, entry in run.items() if k != "absolute_metrics"
                ]
                env_steps = info.get("env_steps") or (max(steps) if steps else None)
                results.append(Result(directory, family, task, algorithm, seeds, finals, env_steps, info))
    return results


def load_results(paths: Iterable[str | Path]) -> list[Result]:
    """The runs under `paths`: summary.json files, or folders searched
    recursively for directories holding a summary.json, or args.json and
    eval.json (a run made before summaries existed, summarized from its
    files); in path order."""
    loaded = []
    for path in map(Path, paths):
        if path.is_file():
            loaded += read_summary(path)
            continue
        found = {p.parent for p in path.rglob(SUMMARY)}
        found |= {p.parent for p in path.rglob("eval.json") if (p.parent / "args.json").exists()}
        if not found:
            raise FileNotFoundError(
                f"{path}: no {SUMMARY}, and no finished run directory (args.json, eval.json) under it"
            )
        for directory in sorted(found):
            loaded += read_summary(directory)
    return loaded


def score_dict(results: Iterable[Result], tasks: list[str] | None = None) -> dict[str, np.ndarray]:
    """rliable's input: `{algorithm: scores [num_runs, num_tasks]}`, the final
    greedy returns, tasks in the order of `tasks` (default: every task of the
    results, sorted). Results of one algorithm and task (several run
    directories) are pooled; every algorithm needs the same number of runs on
    each task (the columns of one array)."""
    results = list(results)
    tasks = sorted({r.task for r in results}) if tasks is None else tasks
    pooled: dict[str, dict[str, list[float]]] = {}
    for r in results:
        if r.task in tasks:
            pooled.setdefault(r.algorithm, {}).setdefault(r.task, []).extend(r.final_returns.tolist())
    scores = {}
    for algorithm, by_task in pooled.items():
        counts = {task: len(by_task.get(task, [])) for task in tasks}
        if len(set(counts.values())) != 1 or 0 in counts.values():
            raise ValueError(f"{algorithm}: runs per task {counts}; rliable needs the same number on every task")
        scores[algorithm] = np.array([by_task[task] for task in tasks]).T
    return scores


# Statistics through rliable (Agarwal et al. 2021).


def _rliable():
    try:
        from rliable import library, metrics
    except ImportError as error:
        raise ImportError(
            f'the IQM and bootstrap confidence intervals need rliable ({error}): pip install -e ".[results]"'
        ) from error
    return library, metrics


def _seeded(seed: int):
    """rliable's bootstraps draw from numpy's global generator (np.random.choice),
    whatever `random_state` is passed (and arch deprecates passing one): seed
    it, and restore it afterwards."""

    class Seeded:
        def __enter__(self):
            self.saved = np.random.get_state()
            np.random.seed(seed)

        def __exit__(self, *exc):
            np.random.set_state(self.saved)

    return Seeded()


@dataclass(frozen=True)
class Estimate:
    """A point estimate and its 95% stratified bootstrap confidence interval."""

    value: float
    low: float
    high: float


def interval_estimates(
    scores: dict[str, np.ndarray], reps: int = BOOTSTRAP_REPS, seed: int = BOOTSTRAP_SEED
) -> dict[str, dict[str, Estimate]]:
    """`{algorithm: {"iqm": Estimate, "mean": Estimate}}` of `{algorithm:
    scores [num_runs, num_tasks]}`: the interquartile mean (the mean of the
    middle 50% of all run x task scores, scipy's 25% trimmed mean) and the
    mean, with percentile 95% CIs from `reps` stratified bootstrap resamples
    (runs resampled within each task; Agarwal et al. 2021, section 4)."""
    library, metrics = _rliable()
    aggregate = lambda x: np.array([metrics.aggregate_iqm(x), metrics.aggregate_mean(x)])
    out = {}
    for algorithm in scores:  # one at a time, each from the same seed: a row does not depend on the others
        with _seeded(seed):
            points, intervals = library.get_interval_estimates(
                {algorithm: np.asarray(scores[algorithm], np.float64)}, aggregate, reps=reps
            )
        out[algorithm] = {
            name: Estimate(
                float(points[algorithm][i]), float(intervals[algorithm][0, i]), float(intervals[algorithm][1, i])
            )
            for i, name in enumerate(("iqm", "mean"))
        }
    return out


def probability_of_improvement(
    scores: dict[str, np.ndarray], pairs: list[tuple[str, str]], reps: int = BOOTSTRAP_REPS, seed: int = BOOTSTRAP_SEED
) -> dict[str, Estimate]:
    """`{"X,Y": Estimate}`: P(X > Y), the probability that a run of X scores
    above a run of Y on a task (Mann-Whitney U / (n_x n_y), averaged over
    tasks), with a 95% CI from resampling each algorithm's runs independently."""
    library, metrics = _rliable()
    pair_scores = {f"{x},{y}": (scores[x], scores[y]) for x, y in pairs}
    with _seeded(seed):
        points, intervals = library.get_interval_estimates(pair_scores, metrics.probability_of_improvement, reps=reps)
    bounds = {k: np.ravel(intervals[k]) for k in pair_scores}  # [2, 1]: low, high
    return {k: Estimate(float(points[k]), float(bounds[k][0]), float(bounds[k][1])) for k in pair_scores}


def performance_profiles(
    scores: dict[str, np.ndarray], taus: np.ndarray, reps: int = BOOTSTRAP_REPS, seed: int = BOOTSTRAP_SEED
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Score distributions: per algorithm the fraction of runs scoring above
    each tau [len(taus)], and its 95% bootstrap band [2, len(taus)]."""
    library, _ = _rliable()
    with _seeded(seed):
        return library.create_performance_profile(scores, taus, reps=reps)
