"""Shared test setup: a private JAX compilation cache and small helpers."""

import ast
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# The tests run tiny programs, whose cost is compiling them, not running them:
# XLA's backend optimisation passes off and the older CPU code generator roughly
# halve the suite's time (tests/test_unizero_ppo.py: 240-268 s -> 125-172 s,
# measured interleaved). Set before JAX creates its backend; subprocesses and the
# notebook kernels inherit it. Results are unchanged in kind: every comparison in
# the tests is between programs compiled the same way.
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false"]
).strip()

ROOT = Path(__file__).resolve().parent.parent
# The tests import the installed package (`pip install -e ".[dev]"`): `jaxzoo`,
# `jaxzoo.algos`, never the folders by their own names.


# Modules whose tests share no fixture: their tests go to whichever worker is free.
SPREAD_MODULES = ("test_notebooks", "test_fault_injection", "test_registry", "test_scaling")


def pytest_configure(config):
    """In-process runs (a test calling an algorithm's `main`) keep JAX's one CPU
    device: the backend is created here, in pytest's process and each worker's,
    before any test, so runner.prepare's split_cpu (one CPU device per core for
    multi-seed runs) cannot change the device count for the rest of a session
    depending on which test ran first. A hook, not an import-time call: child
    scripts that import this file (tests/test_scaling.py's) must still be able to
    call jax.distributed.initialize before JAX starts. Subprocess runs (the CLI
    tests) split as a user's runs do."""
    import jax

    jax.devices()


def pytest_collection_modifyitems(items):
    """Group each module's tests on one pytest-xdist worker (`--dist loadgroup`
    in pyproject.toml), so a module-scoped fixture runs once; the notebook
    tests share nothing and go to whichever worker is free."""
    for item in items:
        if item.module.__name__ not in SPREAD_MODULES:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


@pytest.fixture(scope="session", autouse=True)
def _compile_cache(tmp_path_factory):
    os.environ["JAXZOO_CACHE_DIR"] = str(tmp_path_factory.mktemp("jax-cache"))
    yield


def slow_except(keep: tuple, values: list) -> list:
    """The values of a check parametrized over every algorithm (or notebook):
    those in `keep` run in the default `pytest`, the others are marked `slow`
    and run with `pytest -m slow` (everything: `pytest -m ""`). The default
    tier so runs each shared mechanism (sharding, multi-process, fault
    injection, notebooks, videos) on its cheapest file and the rest of the
    files' own checks in full, within minutes on 2 cores (README, Quick start)."""
    return [value if value in keep else pytest.param(value, marks=pytest.mark.slow) for value in values]


def is_args_field(node: ast.stmt) -> bool:
    """An annotated statement of an `Args` class that is a dataclass field, a
    command-line flag (a ClassVar such as DATA_AXIS is not)."""
    return isinstance(node, ast.AnnAssign) and not ast.unparse(node.annotation).startswith("ClassVar")


def run_copied_script(algo: str, argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    """Copy `algos/<algo>.py` alone into a fresh directory outside the repository
    and run it there as a user who copied one file would: only the installed
    package on the path (presets included), no PYTHONPATH."""
    workdir = Path(tempfile.mkdtemp(prefix=f"copied-{algo}-"))
    shutil.copy(ROOT / "algos" / f"{algo}.py", workdir)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        return subprocess.run([sys.executable, f"{algo}.py", *argv], cwd=workdir, env=env, capture_output=True,
                              text=True, timeout=timeout)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class Killed(Exception):
    """Raised from inside a run to simulate the process dying."""


def assert_killed_run_resumes_exactly(module, args, kill_after_update: int, checkpoint_update: int, monkeypatch,
                                      full=None):
    """Run `args` to the end (or take `full`, the result of such a run); run it again but die right after logging update
    `kill_after_update` (after the checkpoint at `checkpoint_update`, before the
    next); resume from that run directory; the resumed run must end with a
    bit-identical runner state (parameters, optimizer, env states, replay, keys)
    and logs every update exactly once."""
    import dataclasses

    import jax
    import numpy as np

    from jaxzoo import checkpoint, logger

    full = module.main(args) if full is None else full
    original_log = logger.Run.log

    def log_then_die(self, update, global_step, metrics):
        original_log(self, update, global_step, metrics)
        if update[-1] == kill_after_update:
            raise Killed()

    killed_root = Path(args.run_root) / "killed"
    monkeypatch.setattr(logger.Run, "log", log_then_die)
    with pytest.raises(Killed):
        module.main(dataclasses.replace(args, run_root=str(killed_root)))
    monkeypatch.setattr(logger.Run, "log", original_log)
    (run_dir,) = killed_root.iterdir()
    assert checkpoint.latest_update(run_dir) == checkpoint_update
    resumed = module.main(module.Args(resume=str(run_dir)))
    for a, b in zip(jax.tree.leaves(full.state), jax.tree.leaves(resumed.state)):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(a, b)
    rows = logger.read_metrics(run_dir)
    per_seed = rows["update"][rows["seed_index"] == 0]
    assert sorted(per_seed) == list(range(1, args.num_updates + 1))
    np.testing.assert_array_equal(full.eval_returns, resumed.eval_returns)


def assert_videos_show_first_episodes(run_dir: Path, num_seeds: int) -> None:
    """A `--capture-video` run wrote one MP4 per seed of its final evaluation,
    each with as many frames as that seed's first evaluation episode had steps:
    CartPole pays 1 per step (the return is the length), Pendulum always runs
    its 200 steps (tests/test_video.py)."""
    import json

    import imageio.v3 as iio

    args = json.loads((run_dir / "args.json").read_text())
    returns = json.loads((run_dir / "eval.json").read_text())["returns"]
    labels = {path: path.name.rsplit("-seed", 1)[0] for path in (run_dir / "videos").glob("*.mp4")}
    # update<N>-seed<S>.mp4 (the runner's files) or final-seed<S>.mp4 (world_models): the last evaluation's
    order = lambda label: float("inf") if label == "final" else int(label.removeprefix("update"))
    last = max(labels.values(), key=order)
    final = sorted(path for path, label in labels.items() if label == last)
    assert [v.name.rsplit("-", 1)[1] for v in final] == [f"seed{args['seed'] + i}.mp4" for i in range(num_seeds)]
    for seed_index, path in enumerate(final):
        expected = {"CartPole-v1": round(returns[seed_index][0]), "Pendulum-v1": 200}[args["env_id"]]
        assert iio.imread(path).shape[0] == expected, (path, expected)
