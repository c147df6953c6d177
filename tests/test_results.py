"""jaxzoo.results and benchmarks/results.py: the summary.json every run writes
(marl-eval / Stoix layout), its conversion from old run directories, rliable's
IQM against a plain one, and docs/results.md regenerated from the committed runs."""

import dataclasses
import importlib.util
import json
import shutil

import numpy as np
import pytest
from conftest import ROOT
from test_runner import ToyArgs, toy_algorithm

from jaxzoo import cli, logger, results, runner
from jaxzoo.algos import ppo

needs_rliable = pytest.mark.skipif(
    importlib.util.find_spec("rliable") is None, reason='the results extra: pip install -e ".[results]"'
)


def load_benchmark(name: str = "results"):
    """benchmarks/<name>.py as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    args = dataclasses.replace(
        cli.preset_args(ppo.Args, "ppo", "tiny"), run_root=str(tmp_path_factory.mktemp("runs")), num_seeds=2, seed=5
    )
    return args, ppo.main(args)


def test_a_run_writes_its_summary_in_the_marl_eval_layout(ppo_run):
    args, result = ppo_run
    summary = json.loads(open(f"{result.run_dir}/summary.json").read())
    evaluation = json.loads(open(f"{result.run_dir}/eval.json").read())
    rows = logger.read_metrics(result.run_dir)
    # {env: {task: {algorithm: {"seed_<seed>": {"step_<i>": ..., "absolute_metrics": ...}}}}}
    assert list(summary) == ["gymnax"] and list(summary["gymnax"]) == ["CartPole-v1"]
    runs = summary["gymnax"]["CartPole-v1"]["ppo"]
    assert list(runs) == ["seed_5", "seed_6"]
    for seed_index, run in enumerate(runs.values()):
        keys = list(run)
        assert keys[-1] == "absolute_metrics"  # marl-eval reads the last key as the absolute metrics
        assert keys[:-1] == [f"step_{i}" for i in range(len(keys) - 1)]
        assert run["absolute_metrics"] == {"episode_return": evaluation["returns"][seed_index]}
        # Without --eval-every the steps are the logged training returns (tiny: fewer rows than MAX_STEPS).
        mine = (rows["seed_index"] == seed_index) & np.isfinite(rows["episode_return"])
        steps = [run[k] for k in keys[:-1]]
        assert [s["step_count"] for s in steps] == rows["global_step"][mine].astype(int).tolist()
        np.testing.assert_allclose([s["episode_return"][0] for s in steps], rows["episode_return"][mine], atol=1e-4)
        assert all(set(s) == {"step_count", "elapsed_time", "episode_return"} for s in steps)
    info = json.loads(open(f"{result.run_dir}/run_info.json").read())
    assert info["algorithm"] == "ppo" and info["seeds"] == [5, 6] and info["env_steps"] == rows["global_step"].max()
    assert info["train_seconds"] == evaluation["train_seconds"] and info["machine"]["cpu_cores"] >= 1


def test_summarize_run_dir_rebuilds_what_the_run_wrote(ppo_run):
    _, result = ppo_run
    written = json.loads(open(f"{result.run_dir}/summary.json").read())
    assert results.summarize_run_dir(result.run_dir) == written
    (loaded,) = results.load_results([result.run_dir])
    np.testing.assert_allclose(loaded.final_returns, result.eval_returns.mean(1))
    assert loaded.seeds == [5, 6] and loaded.algorithm == "ppo" and loaded.task == "CartPole-v1"


def test_a_run_dir_made_before_summaries_loads_from_its_files(ppo_run, tmp_path):
    _, result = ppo_run
    old = tmp_path / "old-run"
    shutil.copytree(result.run_dir, old, ignore=shutil.ignore_patterns("summary.json", "run_info.json"))
    (loaded,) = results.load_results([tmp_path])
    np.testing.assert_allclose(loaded.final_returns, result.eval_returns.mean(1))
    assert loaded.info["algorithm"] == "ppo" and loaded.info["machine"] is None  # unknown: not recorded then


def test_periodic_evaluations_are_the_steps_when_logged(tmp_path):
    init, update, evaluate = toy_algorithm()
    result = runner.run(
        ToyArgs(run_root=str(tmp_path)), "toy", init, update, evaluate, num_updates=9, steps_per_update=10, eval_every=3
    )
    runs = json.loads(open(f"{result.run_dir}/summary.json").read())["gymnax"]["Toy"]["toy"]
    for seed_index, run in enumerate(runs.values()):
        steps = [v for k, v in run.items() if k != "absolute_metrics"]
        # Chunks of 2 updates: evaluations after updates 4, 6 and 9 (tests/test_runner.py).
        assert [s["step_count"] for s in steps] == [40, 60, 90]
        assert steps[-1]["episode_return"] == [pytest.approx(float(result.eval_returns[seed_index].mean()))]


def test_long_runs_are_thinned_to_max_steps(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "MAX_STEPS", 3)
    init, update, evaluate = toy_algorithm()
    result = runner.run(
        ToyArgs(run_root=str(tmp_path)), "toy", init, update, evaluate, num_updates=9, steps_per_update=10
    )
    run = json.loads(open(f"{result.run_dir}/summary.json").read())["gymnax"]["Toy"]["toy"]["seed_0"]
    # Updates 1..9 log returns 1..9: three windows of three, each at its last update.
    assert [run[f"step_{i}"]["step_count"] for i in range(3)] == [30, 60, 90]
    assert [run[f"step_{i}"]["episode_return"] for i in range(3)] == [[2.0], [5.0], [8.0]]


@pytest.mark.parametrize(
    "env_id, limit, expected",
    [
        ("CartPole-v1", 0, ("gymnax", "CartPole-v1")),
        ("CartPole-v1", 200, ("gymnax", "CartPole-v1 (max 200 steps)")),
        ("Breakout-MinAtar", 0, ("minatar", "Breakout-MinAtar")),
        ("dmc:cartpole-swingup", 0, ("dmc", "cartpole-swingup")),
    ],
)
def test_env_family_and_task(env_id, limit, expected):
    assert results.env_and_task(env_id, limit) == expected


def plain_iqm(scores):
    """Sort every score, drop the lowest and highest quarter (floor), average the rest."""
    values = np.sort(np.ravel(scores))
    cut = len(values) // 4
    return values[cut : len(values) - cut].mean()


@needs_rliable
def test_iqm_and_its_interval_agree_with_a_plain_iqm():
    scores = np.array([[10.0], [500.0], [480.0], [470.0], [30.0], [490.0], [450.0], [460.0]])  # [runs, tasks]
    estimate = results.interval_estimates({"a": scores}, reps=300)["a"]
    assert estimate["iqm"].value == pytest.approx(plain_iqm(scores))  # 465: the mean of 450, 460, 470, 480
    assert estimate["mean"].value == pytest.approx(scores.mean())
    assert estimate["iqm"].low <= estimate["iqm"].value <= estimate["iqm"].high
    assert estimate["mean"].value < 400 < estimate["iqm"].value  # the two outlier seeds drag the mean only
    assert results.interval_estimates({"a": scores}, reps=300) == results.interval_estimates({"a": scores}, reps=300)
    poi = results.probability_of_improvement({"a": scores, "b": scores - 1000}, [("a", "b")], reps=100)
    assert poi["a,b"].value == 1.0


@needs_rliable
def test_results_page_regenerates_from_the_committed_runs():
    """docs/results.md holds no hand-typed number: it is exactly what
    benchmarks/results.py makes of docs/data/runs/."""
    page = load_benchmark().committed_page()
    assert (ROOT / "docs" / "results.md").read_text() == page, "run `python benchmarks/results.py`"


def test_committed_run_files_are_small_summaries():
    files = sorted((ROOT / "docs" / "data" / "runs").rglob("*"))
    assert any(f.name == "summary.json" for f in files)
    for f in files:
        if f.is_file():
            assert f.name in ("summary.json", "run_info.json", "args.json"), f
            assert f.stat().st_size < 200_000, f


def test_summarize_window_means_pool_each_window_of_env_steps(ppo_run):
    """benchmarks/summarize.py --windows (docs/ppo.md's Breakout table): the mean
    of a metric over the rows whose global_step falls in (end - window, end],
    seeds pooled, against the same mean computed from metrics.csv by hand."""
    summarize = load_benchmark("summarize")
    _, result = ppo_run
    rows = logger.read_metrics(result.run_dir)
    steps, values = rows["global_step"], rows["episode_return"]
    window = int(np.ptp(steps) // 3) or 1
    ends, means = summarize.window_means(result.run_dir, "episode_return", window)
    assert ends[-1] >= steps.max() > ends[-1] - window
    for end, mean in zip(ends, means):
        inside = values[(steps > end - window) & (steps <= end)]
        np.testing.assert_allclose(mean, np.nanmean(inside) if inside.size else np.nan)
    with pytest.raises(ValueError, match="no 'game_score' column"):
        summarize.window_means(result.run_dir, "game_score", window)


def test_summarize_episode_windows_weight_each_update_by_its_finished_episodes(ppo_run):
    """benchmarks/summarize.py --episode-windows (docs/unizero.md's Breakout
    tables): per seed, the mean return of the episodes that ended in a window is
    the rows' episode_return weighted by episodes_finished, against the sum
    worked out row by row from metrics.csv."""
    summarize = load_benchmark("summarize")
    _, result = ppo_run
    rows = logger.read_metrics(result.run_dir)
    window = int(np.ptp(rows["global_step"]) // 3) or 1
    ends, seeds, means = summarize.episode_window_means(result.run_dir, window)
    assert list(seeds) == [5, 6] and means.shape == (2, len(ends))
    for i, seed in enumerate(seeds):
        for w, end in enumerate(ends):
            total, episodes = 0.0, 0.0
            for step, row_seed, ret, n in zip(
                rows["global_step"], rows["seed"], rows["episode_return"], rows["episodes_finished"]
            ):
                if row_seed == seed and end - window < step <= end and n > 0:
                    total, episodes = total + ret * n, episodes + n
            expected = total / episodes if episodes else np.nan
            np.testing.assert_allclose(means[i, w], expected, rtol=1e-6)
    assert np.isfinite(means).any()


def test_sweep_seeds_pools_runs_weights_episodes_and_reads_greedy(tmp_path):
    """benchmarks/sweep_seeds.py (docs/unizero_ppo.md's 16-seed Breakout tables):
    two calls' runs of one configuration pool their seeds; each window's mean is
    the rows' episode_return weighted by episodes_finished; the greedy returns
    come from the `per seed:` list under each run's `== name` header."""
    import gzip

    sweep_seeds = load_benchmark("sweep_seeds")
    header = "run,update,global_step,seed_index,seed,episode_return,episodes_finished\n"
    # Run "a" (seeds 0 and 1) to 240k; seed 1 has a row with no finished episode (NaN return).
    first = (
        header
        + "".join(
            f"a,{u},{step},{seed},{seed},{ret},{n}\n"
            for u, (step, ret, n) in enumerate(
                [(90_000, 2.0, 1), (100_000, 5.0, 3), (110_000, 50.0, 9), (230_000, 7.0, 2), (240_000, 9.0, 6)]
            )
            for seed in (0, 1)
        )
        + "a,5,235000,1,1,nan,0\n"
    )
    with gzip.open(tmp_path / "one_all_metrics.csv.gz", "wt") as f:
        f.write(first)
    (tmp_path / "one_logs_tail.txt").write_text(
        "== a (exit 0)\ngreedy evaluation, 10 episodes x 2 seed(s): 3.00 +- 1.41 (per seed: 2.0, 4.0); training loop 1.0s\n"
    )
    (tmp_path / "two_all_metrics.csv").write_text(header + "a_s2,0,90000,0,2,1.0,4\na_s2,1,240000,0,2,3.0,1\n")
    (tmp_path / "two_logs_tail.txt").write_text("== a_s2 (exit 0)\nx (per seed: 6.5); y\n")
    rows, greedy = sweep_seeds.read_runs(tmp_path)
    assert greedy == {"a": [2.0, 4.0], "a_s2": [6.5]}
    table = sweep_seeds.group_table(rows, greedy, ["a", "a_s2"])
    assert list(table) == [0, 1, 2]
    # (80k, 100k]: (2 * 1 + 5 * 3) / 4; the last 20k, (220k, 240k]: (7 * 2 + 9 * 6) / 8.
    np.testing.assert_allclose(table[0], ((2 * 1 + 5 * 3) / 4, (7 * 2 + 9 * 6) / 8, 2.0))
    np.testing.assert_allclose(table[1], ((2 * 1 + 5 * 3) / 4, (7 * 2 + 9 * 6) / 8, 4.0))
    np.testing.assert_allclose(table[2], (1.0, 3.0, 6.5))
    with pytest.raises(SystemExit, match="no run 'b'.*runs found: a, a_s2"):
        sweep_seeds.group_table(rows, greedy, ["b"])


def test_vs_lightzero_medians_count_an_unreached_seed_as_a_lower_bound():
    """benchmarks/unizero_vs_lightzero.py (issue 27's UniZero row): seconds from
    process start to the first evaluation >= 195 add each seed's offset (ours:
    the seconds outside the training loop); a seed that never reached gives its
    last evaluation's time, and a median is only a lower bound when such a
    seed sorts at or below the middle."""
    vs = load_benchmark("unizero_vs_lightzero")
    steps = np.array([1000.0, 2000.0, 3000.0])
    curves = [
        (steps, np.array([10.0, 20.0, 30.0]), np.array([50.0, 199.0, 200.0])),  # reached at 20 s
        (steps, np.array([12.0, 24.0, 36.0]), np.array([50.0, 60.0, 70.0])),  # never: 36 s, a lower bound
    ]
    assert vs.seconds_to_reach(curves, 195.0, [5.0, 1.0]) == [(25.0, True), (37.0, False)]
    # Four seeds: the middle two are reached, so the median is exact even though the slowest never was.
    assert vs.median_of_censored([(300.0, True), (1300.0, False), (850.0, True), (290.0, True)]) == (575.0, True)
    # An unreached seed among the middle two makes the median a lower bound.
    assert vs.median_of_censored([(300.0, True), (700.0, False), (1300.0, False), (290.0, True)]) == (500.0, False)
    # So does one below the middle: its true time may be above the middle two.
    assert vs.median_of_censored([(100.0, False), (300.0, True), (400.0, True), (500.0, True)]) == (350.0, False)
    assert vs.median_of_censored([(40.0, True), (60.0, True), (90.0, True)]) == (60.0, True)
