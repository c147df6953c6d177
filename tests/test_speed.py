"""benchmarks/speed.py: how its figure pairs (MPO against Stoix, PlaNet against
Kaixhin's, UniZero against LightZero) read each side's figure, alternate the
sides and take censored medians. The references' own environments are not
installed here, so their side runs a stub that prints or writes what the real
script does; our side's readers run on files made like a real run's."""

import argparse
import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def speed(monkeypatch):
    """benchmarks/speed.py as a module, its folder on sys.path as when run as a script."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("benchmarks_speed", ROOT / "benchmarks" / "speed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_figure_is_the_last_cell_of_the_row_its_script_prints(speed):
    stdout = (
        "machine: x\n\n| learner step | ms |\n| --- | --- |\n| 64-64 networks, a | 1.5 |\n| 64-64 networks | 2.25 |\n"
    )
    assert speed.table_cell(stdout, "| 64-64 networks |", "cmd") == 2.25
    with pytest.raises(RuntimeError, match="'cmd' printed no row starting with '| 8-8 |'"):
        speed.table_cell(stdout, "| 8-8 |", "cmd")
    # Our MPO side's row is the one mpo_cost.py --sizes pendulum prints.
    spec = importlib.util.spec_from_file_location("benchmarks_mpo_cost", ROOT / "benchmarks" / "mpo_cost.py")
    mpo_cost = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mpo_cost)
    assert mpo_cost.SIZES[-1][0] == speed.MPO_ROW


def write_run(run_dir: Path, evaluations: list[tuple[int, float, float]], train_seconds: float):
    """A one-seed run's metrics.csv (rows every 200 env steps; an evaluation
    (env steps, loop seconds, return) on some) and eval.json."""
    run_dir.mkdir(parents=True)
    lines = ["global_step,seed,wall_seconds,eval_return"]
    evaluated = {step: (seconds, ret) for step, seconds, ret in evaluations}
    for step in range(200, max(evaluated) + 1, 200):
        seconds, ret = evaluated.get(step, (step / 100, float("nan")))
        lines.append(f"{step},0,{seconds},{ret}")
    (run_dir / "metrics.csv").write_text("\n".join(lines) + "\n")
    (run_dir / "eval.json").write_text(json.dumps({"train_seconds": train_seconds}))


def test_seconds_to_reach_add_the_time_outside_the_loop_to_the_loops_at_the_crossing(speed, tmp_path):
    write_run(tmp_path / "a", [(1000, 12.0, 150.0), (2000, 25.0, 196.5), (3000, 38.0, 200.0)], train_seconds=30.0)
    # 40 s of process, 30 s of loop: 10 s outside it, plus 25 s of loop at the first 195.
    assert speed.seconds_to_reach(tmp_path / "a", 40.0) == (35.0, True)
    assert speed.env_steps_to_reach(tmp_path / "a") == 2000
    write_run(tmp_path / "b", [(1000, 12.0, 150.0), (2000, 25.0, 194.9)], train_seconds=30.0)
    assert speed.seconds_to_reach(tmp_path / "b", 40.0) == (40.0, False)  # never reached: the whole process, a bound
    assert speed.env_steps_to_reach(tmp_path / "b") is None


def test_our_unizero_side_runs_cold_or_fills_a_cache_once_before_its_timed_runs(speed, tmp_path, monkeypatch):
    calls = []

    def fake_run(command, cwd=None, env=None):  # stands in for a unizero.py process: writes a run like its
        root = Path(command.split("--run-root ")[1])
        calls.append((root.name, "--no-compile-cache" in command, env))
        write_run(root / "run", [(1000, 12.0, 150.0), (2000, 25.0, 196.5)], train_seconds=30.0)
        return 40.0, ""

    monkeypatch.setattr(speed, "run_capture", fake_run)
    steps: list = []
    command, side = speed.unizero_side(tmp_path / "cold", 3, steps)
    assert side(0) == (35.0, True) and steps == [2000]
    assert "--no-compile-cache" in command and calls == [("seed0", True, None)]
    calls.clear()
    command, side = speed.unizero_side(tmp_path / "warm", 3, None, tmp_path / "cache")
    side(0), side(1)
    cache = {"JAXZOO_CACHE_DIR": str(tmp_path / "cache")}
    # One untimed run fills the cache, then every timed run reads it; none turns the cache off.
    assert calls == [("fill_cache", False, cache), ("seed0", False, cache), ("seed1", False, cache)]
    assert command.startswith(f"JAXZOO_CACHE_DIR={tmp_path / 'cache'} ") and "--no-compile-cache" not in command


def test_a_figure_pair_alternates_its_sides_and_bounds_a_censored_median(speed):
    calls = []

    def side(name, values):
        def run(repeat):
            calls.append((name, repeat))
            return values[repeat]

        return run

    ours = [(40.0, True), (30.0, True), (70.0, False)]
    theirs = [(300.0, True), (500.0, False), (250.0, True)]
    pair = speed.FigurePair("s", "ours --seed S", "ref --seed S", side("ours", ours), side("ref", theirs))
    row = speed.run_figure_pair("unizero-195", pair, 3)
    assert calls == [("ours", 0), ("ref", 0), ("ours", 1), ("ref", 1), ("ours", 2), ("ref", 2)]
    # Ours: 30, 40, >= 70: the bound is above the middle, so the median 40 is exact.
    # LightZero: 250, 300, >= 500: the same, 300.
    assert row["median"] == {"ours": 40.0, "reference": 300.0}
    assert row["median_exact"] == {"ours": True, "reference": True}
    assert row["figures"]["reference"][1] == [500.0, False]
    with_extra = pair._replace(extra={"env_steps_at_reach": {"ours": [2000], "reference": [None]}})
    assert speed.run_figure_pair("y", with_extra, 1)["env_steps_at_reach"] == {"ours": [2000], "reference": [None]}
    censored = speed.FigurePair("s", "o", "r", side("ours", [(60.0, False)] * 3), side("ref", theirs))
    assert speed.run_figure_pair("x", censored, 3)["median_exact"]["ours"] is False


STUB = '''\
    """Stands in for a reference's python: runs no reference, does what its script's output would."""
    import json, sys
    argv = sys.argv[3:] if sys.argv[1] == "-W" else sys.argv[1:]  # python's own -W ignore
    script, args = argv[0], argv[1:]
    flag = lambda name: args[args.index(name) + 1]
    if script.endswith("stoix_mpo_cost.py"):
        print("machine: stub\\n\\n| learner step | ms per step (1 seed) |\\n| --- | --- |")
        print("| Stoix ff_mpo_continuous `_update_epoch`: 64-64 networks, batch 64 x 10 samples, sequences of 2, "
              "pre-sampled batch | 1.2 |")
        print("| Stoix ff_mpo_continuous `_update_epoch`: 64-64 networks, batch 64 x 10 samples, sequences of 2, "
              "flashbax sample included | 9.9 |")
    elif script.endswith("kaixhin_planet_cost.py"):
        json.dump({"rows": [{"plan_ms": 3.5}]}, open(flag("--out"), "w"))
    elif script.endswith("lightzero_unizero.py"):
        seed = int(flag("--seed"))
        reached = seed != 1
        meta = {"reached": reached, "wall_seconds_to_reach": 200.0 + seed if reached else None, "total_seconds": 600.5,
                "env_steps_to_reach": 4000 + seed if reached else None}
        json.dump(meta, open(flag("--out-dir") + f"/seed{seed}.json", "w"))
    else:
        sys.exit(f"stub: unexpected script {script}")
'''


def test_each_reference_side_reads_the_figure_its_script_reports(speed, tmp_path):
    stub = tmp_path / "stub_python"
    stub.write_text(f"#!{sys.executable}\n" + textwrap.dedent(STUB))
    stub.chmod(0o755)
    (tmp_path / "lightzero").mkdir()
    ns = argparse.Namespace(
        stoix=tmp_path,
        stoix_python=str(stub),
        kaixhin=tmp_path,
        kaixhin_python=str(stub),
        lightzero_python=str(stub),
        unizero_eval_episodes=3,
        unizero_warm_cache=False,
        lightzero_cap=900,
    )
    found = speed.figure_pairs(ns, tmp_path)
    assert list(found) == ["mpo-update", "planet-plan", "unizero-195"]
    assert found["mpo-update"].reference(0) == (1.2, True)  # the pre-sampled row, not the flashbax one
    assert found["planet-plan"].reference(0) == (3.5, True)
    assert found["unizero-195"].reference(0) == (200.0, True)
    assert found["unizero-195"].reference(1) == (600.5, False)  # unreached: its whole time, a lower bound
    # Sample efficiency beside the time: each side's env steps at its crossing land in the row.
    assert found["unizero-195"].extra == {"env_steps_at_reach": {"ours": [], "reference": [4000, None]}}
    assert "--seed S" in found["unizero-195"].ours_command and "--no-compile-cache" in found["unizero-195"].ours_command
    # Both sides pass 195 by LightZero's test (3 greedy episodes); LightZero stops past the cap given.
    assert "--eval-episodes 3" in found["unizero-195"].ours_command
    assert "--max-wall-seconds 900" in found["unizero-195"].reference_command
    none = argparse.Namespace(stoix=None, stoix_python=None, kaixhin=None, kaixhin_python=None, lightzero_python=None)
    assert speed.figure_pairs(none, tmp_path) == {}


def test_speed_names_the_references_a_pair_needs(speed, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["speed.py", "--pairs", "unizero-195"])
    with pytest.raises(SystemExit) as stopped:
        speed.main()
    assert stopped.value.code == 2
    assert "--lightzero-python gives unizero-195" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["speed.py", "--stoix", "/tmp"])
    with pytest.raises(SystemExit):
        speed.main()
    assert "give --stoix with --stoix-python" in capsys.readouterr().err
    for flag in ("--unizero-eval-episodes", "--lightzero-cap"):
        monkeypatch.setattr(sys, "argv", ["speed.py", flag, "0"])
        with pytest.raises(SystemExit):
            speed.main()
        assert f"{flag} 0: give" in capsys.readouterr().err
