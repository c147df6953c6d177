"""Many devices, many hosts (jaxzoo.parallel, docs/scaling.md), proven on the CPU.

JAX fixes its device count when it starts, so every test runs a child process
(this file run as a script) with `--xla_force_host_platform_device_count`, or
two children joined by `jax.distributed` with CPU collectives (gloo). The
children compare runs of the algorithms' tiny presets:

- seeds mode on 4 devices against the same seeds on 1 device, every file;
- data mode on 4 devices against 1 device with the same total batch, every
  file that has a data mode (the others refuse it, tested);
- 2 processes x 2 devices against 1 process x 4 devices, with a SIGTERM that
  stops both processes at one chunk boundary, a resume by both, and one
  metrics.csv written.

The sharded programs differ from the single-device ones only in float
reassociation (a per-device program of 1 seed vs one of 4, partial sums plus an
all-reduce): the first two updates agree to 1e-4, and later updates may drift
by what that noise grows to (docs/scaling.md gives the measured differences).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, slow_except

ALGOS = ["impala", "mpo", "planet", "ppo", "rainbow", "unizero", "unizero_ppo", "world_models"]
CLOCK = ("steps_per_second", "wall_seconds")


# --------------------------------------------------------------------------- #
# The child processes
# --------------------------------------------------------------------------- #
def tiny_args(algo: str, run_root: str, **overrides):
    from jaxzoo import cli

    module = importlib.import_module(f"jaxzoo.algos.{algo}")
    args = cli.preset_args(module.Args, algo, "tiny")
    return module, dataclasses.replace(args, run_root=run_root, **overrides)


def metrics_of(result) -> dict[str, dict[str, list]]:
    """Every metrics.csv of a run (one per stage for world_models) as lists."""
    from jaxzoo import logger

    run_dir = Path(result["run_dir"] if isinstance(result, dict) else result.run_dir)
    files = sorted(run_dir.rglob("metrics.csv"))
    return {
        str(p.parent.relative_to(run_dir)): {k: v.tolist() for k, v in logger.read_metrics(p.parent).items()}
        for p in files
    }


def evaluation_of(result) -> list:
    return np.asarray(result["returns"] if isinstance(result, dict) else result.eval_returns).tolist()


def child_compare(algo: str, modes: list[str], out: str, overrides: dict) -> None:
    """Run the tiny preset with --parallel off and with each of `modes`; write
    every run's metrics and evaluation to `out` (JSON)."""
    runs = {}
    for parallel in ("off", *modes):
        module, args = tiny_args(algo, str(Path(out).parent / f"runs-{parallel}"), parallel=parallel, **overrides)
        result = module.main(args)
        traces = result["chunk_traces"] if isinstance(result, dict) else {"": result.chunk_traces}
        runs[parallel] = {"metrics": metrics_of(result), "eval": evaluation_of(result), "traces": traces}
    Path(out).write_text(json.dumps(runs))


def child_distributed(process_id: int, port: int, out: str, stop_after_first_log: bool, resume: str | None) -> None:
    """One of two processes of a PPO run over 2 x 2 devices, seeds mode.
    Process 0 may send itself SIGTERM after logging its first chunk."""
    from jaxzoo import logger

    module, args = tiny_args(
        "ppo",
        str(Path(out).parent / "runs-distributed"),
        num_seeds=4,
        log_every=1,
        checkpoint_every=1,
        parallel="seeds",
        distributed=True,
        coordinator_address=f"localhost:{port}",
        num_processes=2,
        process_id=process_id,
        distributed_timeout=60,
    )
    if resume is not None:
        args = module.Args(
            resume=resume,
            distributed=True,
            coordinator_address=f"localhost:{port}",
            num_processes=2,
            process_id=process_id,
        )
    if stop_after_first_log and process_id == 0:
        original = logger.Run.log

        def log_then_stop(self, update, global_step, metrics):
            original(self, update, global_step, metrics)
            os.kill(os.getpid(), signal.SIGTERM)
            logger.Run.log = original

        logger.Run.log = log_then_stop
    result = module.main(args)
    if process_id == 0:
        Path(out).write_text(json.dumps({"metrics": metrics_of(result), "eval": evaluation_of(result)}))


def child_data_resume(out: str) -> None:
    """PPO's tiny preset in data mode on the 4 devices: straight, and stopped by
    SIGTERM after its first chunk then resumed; writes whether the final
    states are bit-identical."""
    import jax

    from jaxzoo import logger

    def tiny(root):
        return tiny_args(
            "ppo", str(Path(out).parent / root), num_envs=4, log_every=1, checkpoint_every=1, parallel="data"
        )

    module, args = tiny("straight")
    straight = module.main(args)
    _, args = tiny("stopped")
    original = logger.Run.log

    def log_then_stop(self, update, global_step, metrics):
        original(self, update, global_step, metrics)
        os.kill(os.getpid(), signal.SIGTERM)
        logger.Run.log = original

    logger.Run.log = log_then_stop
    try:
        module.main(args)
    except SystemExit as stopped:
        code = stopped.code
    (run_dir,) = (Path(out).parent / "stopped").iterdir()
    resumed = module.main(module.Args(resume=str(run_dir)))
    leaves = zip(jax.tree.leaves(straight.state), jax.tree.leaves(resumed.state))
    same = all(
        np.array_equal(
            *(jax.random.key_data(v) if jax.dtypes.issubdtype(v.dtype, jax.dtypes.prng_key) else v for v in pair)
        )
        for pair in leaves
    )
    Path(out).write_text(json.dumps({"code": code, "same": same, "sharding": str(resumed.state.obs.sharding.spec)}))


def child_one_process(out: str) -> None:
    module, args = tiny_args(
        "ppo", str(Path(out).parent / "runs-one"), num_seeds=4, log_every=1, checkpoint_every=1, parallel="seeds"
    )
    result = module.main(args)
    Path(out).write_text(json.dumps({"metrics": metrics_of(result), "eval": evaluation_of(result)}))


# --------------------------------------------------------------------------- #
# The tests
# --------------------------------------------------------------------------- #
def child_env(devices: int) -> dict[str, str]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    return env


def run_child(devices: int, *argv: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, __file__, *argv],
        env=child_env(devices),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def assert_close(one: dict, sharded: dict, label: str) -> None:
    """The first two updates agree to 1e-4; every later value within the drift
    float reassociation grows to over a tiny run (rtol 0.1, atol 1e-2: a
    replay sample or a CMA-ES ranking that flips on a last-bit difference
    changes a loss by percents; a wrong layout differs from the first update)."""
    assert one.keys() == sharded.keys(), label
    for stage in one:
        a, b = one[stage], sharded[stage]
        assert a.keys() == b.keys() and a["update"] == b["update"], (label, stage)
        early = np.asarray(a["update"]) <= 2
        for name in a:
            if name in CLOCK:
                continue
            x, y = np.asarray(a[name], float), np.asarray(b[name], float)
            np.testing.assert_allclose(
                y[early], x[early], rtol=1e-4, atol=1e-5, equal_nan=True, err_msg=f"{label} {stage} {name}"
            )
            np.testing.assert_allclose(y, x, rtol=0.1, atol=1e-2, equal_nan=True, err_msg=f"{label} {stage} {name}")


def test_a_data_mode_run_stopped_and_resumed_ends_as_an_uninterrupted_one(tmp_path):
    out = tmp_path / "resume.json"
    child = run_child(4, "data-resume", str(out))
    assert child.returncode == 0, child.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["code"] == 143 and result["same"], result
    assert "data" in result["sharding"]  # the restored state is placed sharded again


def data_mode_algos() -> tuple[list[str], list[str]]:
    """(files with a data mode, files that refuse it), read from their `main`."""
    supported, refused = [], []
    for algo in ALGOS:
        source = (ROOT / "algos" / f"{algo}.py").read_text()
        (supported if "data_axes=" in source else refused).append(algo)
    return supported, refused


# 4 seeds and 4 envs: the 4 devices divide the seed axis and the data axis.
OVERRIDES = {
    # data mode splits tiny's 16 rollouts, V's 8 frames, M's 4 rollouts, C's 4 x 2 episodes and 4 eval episodes
    "world_models": {"num_seeds": 4},
    "planet": {"num_seeds": 4},  # its data axis is the tiny preset's batch_size, 4
    "mpo": {"num_seeds": 4, "num_envs": 4, "train_frequency": 4},  # env steps per learner step: a multiple of num_envs
    "unizero": {"num_seeds": 4, "num_envs": 4, "buffer_size": 160, "total_timesteps": 160},
}


@pytest.mark.parametrize("algo", slow_except(("ppo",), ALGOS))
def test_seeds_and_data_mode_on_4_devices_match_1_device(algo, tmp_path):
    """Every file in seeds mode, and the files with a data mode in data mode
    (the same 4 seeds, vmapped, with their environments split over devices)."""
    out = tmp_path / "runs.json"
    modes = ["seeds", "data"] if algo in data_mode_algos()[0] else ["seeds"]
    overrides = OVERRIDES.get(algo, {"num_seeds": 4, "num_envs": 4})
    child = run_child(4, "compare", algo, ",".join(modes), str(out), json.dumps(overrides))
    assert child.returncode == 0, child.stderr[-3000:]
    runs = json.loads(out.read_text())
    for mode in modes:
        if algo != "world_models":  # its stages print their own lines
            assert f"{mode} sharded over 4 cpu devices" in child.stdout, child.stdout[-2000:]
        assert set(runs[mode]["traces"].values()) <= {0, 1}, runs[mode]["traces"]  # one compile per program
        assert_close(runs["off"]["metrics"], runs[mode]["metrics"], f"{algo} {mode}")
        np.testing.assert_allclose(runs[mode]["eval"], runs["off"]["eval"], rtol=0.1, atol=1e-2)


@pytest.mark.parametrize("algo", data_mode_algos()[0])
def test_each_data_mode_names_its_axis_once_in_its_args(algo):
    """`Args.DATA_AXIS`, read by runner.prepare (CPU devices) and runner.run
    (the layout), names a field of the Args whose size is the data axis."""
    from jaxzoo import runner

    args = importlib.import_module(f"jaxzoo.algos.{algo}").Args()
    axis = runner.data_axis(args)  # None without DATA_AXIS; AttributeError if it names no field
    assert axis is not None, algo
    size, name = axis
    assert isinstance(size, int) and size >= 1, (algo, name, size)


def test_data_axes_without_a_named_data_axis_is_refused_before_anything_runs():
    """A file that passes `data_axes` to runner.run must name the axis in its Args."""
    from jaxzoo import runner

    args = types.SimpleNamespace(parallel="data", num_seeds=1)  # no DATA_AXIS
    assert runner.data_axis(args) is None
    with pytest.raises(TypeError, match="SimpleNamespace has no DATA_AXIS"):
        runner.run(args, "x", None, None, None, num_updates=1, steps_per_update=1, data_axes=lambda state: state)


def test_data_mode_is_refused_with_a_reason_where_a_file_has_none():
    """Every file has a data mode today; a file without one (no `data_axes`) is
    refused before anything is built, with its reason."""
    from jaxzoo import parallel

    assert data_mode_algos()[1] == []
    with pytest.raises(
        ValueError, match="--parallel data is not supported by this algorithm: a reason; accepted: seeds"
    ):
        parallel.make_layout("data", 1, None, why_no_data="a reason")


def test_bad_layouts_fail_at_once_naming_the_value(tmp_path):
    child = run_child(
        4,
        "cli",
        "ppo",
        "--preset",
        "tiny",
        "--parallel",
        "seeds",
        "--num-seeds",
        "3",
        "--run-root",
        str(tmp_path),
        timeout=300,
    )
    assert child.returncode == 2 and "num_seeds=3 is not a multiple of the 4" in child.stderr, child.stderr[-2000:]
    child = run_child(
        4,
        "cli",
        "ppo",
        "--preset",
        "tiny",
        "--parallel",
        "data",
        "--num-envs",
        "6",
        "--run-root",
        str(tmp_path),
        timeout=300,
    )
    assert child.returncode == 2 and "num_envs = 6 is not a multiple of the 4" in child.stderr, child.stderr[-2000:]
    assert not list(tmp_path.iterdir())  # refused before any run directory was made


def test_a_process_id_outside_the_process_count_is_refused_before_joining():
    from types import SimpleNamespace

    from jaxzoo import parallel

    args = SimpleNamespace(
        distributed=True, coordinator_address="localhost:1234", num_processes=2, process_id=2, distributed_timeout=5
    )
    with pytest.raises(ValueError, match=r"process_id=2 is outside 0 \.\.\. num_processes - 1 = 1"):
        parallel.initialize_distributed(args)
    with pytest.raises(ValueError, match="needs --num-processes and --process-id too"):
        parallel.initialize_distributed(SimpleNamespace(**{**vars(args), "process_id": None}))
    with pytest.raises(ValueError, match="--coordinator-address needs --distributed"):
        parallel.initialize_distributed(SimpleNamespace(**{**vars(args), "distributed": False}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_an_unreachable_coordinator_fails_in_seconds_not_a_hang(tmp_path):
    child = run_child(
        1,
        "cli",
        "ppo",
        "--preset",
        "tiny",
        "--distributed",
        "--coordinator-address",
        f"localhost:{free_port()}",
        "--num-processes",
        "2",
        "--process-id",
        "1",
        "--distributed-timeout",
        "5",
        "--run-root",
        str(tmp_path),
        timeout=120,
    )
    assert child.returncode == 2, child.stderr[-2000:]
    assert "did not answer within distributed_timeout=5s" in child.stderr


def start_pair(port: int, out: Path, *flags: str) -> list[subprocess.Popen]:
    env = child_env(2)
    return [
        subprocess.Popen(
            [sys.executable, __file__, "distributed", str(i), str(port), str(out), *flags],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for i in range(2)
    ]


def finish(processes: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    results = []
    for p in processes:
        try:
            stdout, stderr = p.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            for q in processes:
                q.kill()
            raise
        results.append((p.returncode, stdout, stderr))
    return results


def test_two_processes_of_two_devices_match_one_process_of_four_and_resume_together(tmp_path):
    one = tmp_path / "one" / "runs.json"
    one.parent.mkdir()
    child = run_child(4, "one", str(one))
    assert child.returncode == 0, child.stderr[-3000:]

    out = tmp_path / "two" / "runs.json"
    out.parent.mkdir()
    # Process 0 gets SIGTERM after its first chunk: both stop at one boundary with a checkpoint.
    stopped = finish(start_pair(free_port(), out, "--stop"))
    assert [code for code, _, _ in stopped] == [143, 143], [e[-2000:] for _, _, e in stopped]
    (run_dir,) = (tmp_path / "two" / "runs-distributed").iterdir()  # process 1 wrote nothing of its own
    assert "stopped by SIGTERM" in stopped[0][1] and "stopped" not in stopped[1][1]
    resumed = finish(start_pair(free_port(), out, "--resume", str(run_dir)))
    assert [code for code, _, _ in resumed] == [0, 0], [e[-2000:] for _, _, e in resumed]
    assert "sharded over 4 cpu devices on 2 processes" in resumed[0][1]
    assert list((tmp_path / "two" / "runs-distributed").iterdir()) == [run_dir]

    a, b = json.loads(one.read_text()), json.loads(out.read_text())
    rows = b["metrics"]["."]
    assert sorted(zip(rows["update"], rows["seed_index"])) == sorted(
        zip(a["metrics"]["."]["update"], a["metrics"]["."]["seed_index"])
    )  # every update of every seed logged once across the stop and resume
    assert_close(a["metrics"], b["metrics"], "2 processes")
    np.testing.assert_allclose(b["eval"], a["eval"], rtol=0.1, atol=1e-2)


# --------------------------------------------------------------------------- #
# Seeds on every core of a CPU (parallel.split_cpu)
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize(
    "parallel, num_seeds, distributed, cores, data_size, expected",
    [
        ("auto", 8, False, 2, 8, 2),
        ("auto", 4, False, 16, 8, 4),  # no more devices than seeds
        ("auto", 6, False, 4, 8, 2),  # the largest count dividing the seeds
        ("seeds", 4, False, 2, 8, 2),
        ("auto", 1, False, 16, 8, 1),  # one seed: one device, the program as before
        ("auto", 3, False, 2, 8, 1),
        ("off", 8, False, 2, 8, 1),
        ("data", 1, False, 2, 8, 2),  # data mode: the cores that divide the data axis
        ("data", 1, False, 16, 8, 8),  # no more devices than the data axis holds
        ("data", 4, False, 4, 6, 2),  # the largest count dividing the data axis, whatever the seeds
        ("data", 1, False, 2, 5, 1),
        ("data", 1, False, 2, None, 1),  # a file without a data mode: left to make_layout to refuse
        ("auto", 8, True, 2, 8, 1),  # a cluster's device count is the cluster's
        ("data", 1, True, 2, 8, 1),
    ],
)
def test_cpu_split_is_the_largest_core_count_dividing_the_seeds_or_the_data(
    parallel, num_seeds, distributed, cores, data_size, expected
):
    from jaxzoo import parallel as parallel_module

    assert parallel_module.cpu_split(parallel, num_seeds, distributed, cores, data_size) == expected


SPLIT_CHILD = """
import sys, types
from jaxzoo import parallel
import jax
if sys.argv[1] == "initialized":
    jax.devices()
asked = parallel.split_cpu(types.SimpleNamespace(parallel=sys.argv[2], num_seeds=4, distributed=False), data_size=4)
print(asked, len(jax.devices("cpu")))
"""


def split_child(xla_flags: str, *argv: str) -> tuple[int, int]:
    env = dict(os.environ, XLA_FLAGS=xla_flags)
    done = subprocess.run(
        [sys.executable, "-c", SPLIT_CHILD, *argv], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    asked, devices = (int(v) for v in done.stdout.split()[-2:])
    return asked, devices


def test_split_cpu_gives_a_fresh_process_one_device_per_core_unless_told_otherwise():
    from jaxzoo import parallel

    cores = math.gcd(4, parallel.available_cores())
    assert split_child("", "fresh", "auto") == ((cores, cores) if cores > 1 else (1, 1))
    assert split_child("", "fresh", "off") == (1, 1)  # --parallel off: one device
    assert split_child("", "fresh", "data") == ((cores, cores) if cores > 1 else (1, 1))  # a data axis of 4
    # A device count the user set wins, and a backend that exists is left alone.
    assert split_child("--xla_force_host_platform_device_count=1", "fresh", "auto") == (1, 1)
    assert split_child("--xla_force_host_platform_device_count=3", "fresh", "auto") == (1, 3)
    assert split_child("", "initialized", "auto") == (1, 1)


THREADS_CHILD = """
import collections, os, sys
from jaxzoo import parallel
import jax
if sys.argv[1] == "initialized":
    jax.devices()
cores = os.sched_getaffinity(0)
cut = parallel.start_cpu_backend(int(sys.argv[2]))
jax.numpy.ones(3).sum().block_until_ready()
tasks = os.listdir("/proc/self/task")
names = collections.Counter(open(f"/proc/self/task/{t}/comm").read().strip() for t in tasks)
masks = {frozenset(os.sched_getaffinity(int(t))) for t in tasks}
print(int(cut), names["tf_XLAEigen"], int(masks == {frozenset(cores)}))
"""


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or not Path("/proc/self/task").is_dir() or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux affinity masks and 2 or more cores",
)
def test_start_cpu_backend_cuts_the_intra_op_pool_and_gives_every_thread_its_cores_back():
    """`--cpu-threads 1` (PPO's cartpole presets): XLA:CPU's intra-op pool
    (its `tf_XLAEigen` threads, one per core by default) is started with one
    thread, and every thread of the process may run on every core after it.
    Nothing is cut for 0, for a backend that already exists or for a CPU split
    into several devices."""

    def child(xla_flags: str, *argv: str) -> tuple[int, int, int]:
        env = dict(os.environ, XLA_FLAGS=xla_flags)
        done = subprocess.run(
            [sys.executable, "-c", THREADS_CHILD, *argv], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]
        cut, pool, cores_back = (int(v) for v in done.stdout.split()[-3:])
        return cut, pool, cores_back

    cores = len(os.sched_getaffinity(0))
    assert child("", "fresh", "1") == (1, 1, 1)
    assert child("", "fresh", "0") == (0, cores, 1)
    assert child("", "initialized", "1") == (0, cores, 1)
    assert child("--xla_force_host_platform_device_count=2", "fresh", "1") == (0, cores, 1)


def run_cli_as_a_user(*argv: str) -> str:
    """An algorithm file's command in a fresh process with no device count set
    (as a user runs it, so `split_cpu` decides); returns its stdout and stderr."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f)
    done = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout + done.stderr


def test_a_multi_seed_cli_run_shards_its_seeds_over_the_cores(tmp_path):
    """A user's command, unchanged: 2 seeds on a CPU of 2 or more cores run on 2 devices."""
    from jaxzoo import parallel

    output = run_cli_as_a_user("algos/ppo.py", "--preset", "tiny", "--num-seeds", "2", "--run-root", str(tmp_path))
    expected = "seeds sharded over 2 cpu devices" if parallel.available_cores() >= 2 else "on 1 device (cpu)"
    assert expected in output


@pytest.mark.slow
def test_a_one_seed_data_mode_cli_run_splits_its_environments_over_the_cores(tmp_path):
    """`--parallel data` with one seed on a CPU of 2 or more cores runs its
    environments' searches and its gradient steps on 2 devices (UniZero, whose
    evaluation's searches are split too), and learns as on one device: the
    same greedy returns after the tiny preset's 100 steps (float
    reassociation aside, which does not move them)."""
    from jaxzoo import parallel

    outputs = {
        mode: run_cli_as_a_user(
            "algos/unizero.py",
            "--preset",
            "tiny",
            "--parallel",
            mode,
            "--no-save-model",
            "--run-root",
            str(tmp_path / mode),
        )
        for mode in ("data", "off")
    }
    expected = "data sharded over 2 cpu devices" if parallel.available_cores() >= 2 else "on 1 device (cpu)"
    assert expected in outputs["data"]
    returns = {mode: re.search(r"greedy evaluation[^;]*", out).group(0) for mode, out in outputs.items()}
    assert returns["data"] == returns["off"]


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "compare":
        child_compare(sys.argv[2], sys.argv[3].split(","), sys.argv[4], json.loads(sys.argv[5]))
    elif role == "distributed":
        rest = sys.argv[5:]
        child_distributed(
            int(sys.argv[2]),
            int(sys.argv[3]),
            sys.argv[4],
            "--stop" in rest,
            rest[rest.index("--resume") + 1] if "--resume" in rest else None,
        )
    elif role == "one":
        child_one_process(sys.argv[2])
    elif role == "data-resume":
        child_data_resume(sys.argv[2])
    elif role == "cli":
        from jaxzoo import cli

        module = importlib.import_module(f"jaxzoo.algos.{sys.argv[2]}")
        with cli.user_errors():
            module.main(cli.parse(module.Args, sys.argv[2], sys.argv[3:]))
