"""This project's files against their reference implementations, side by side on
this machine (issue 27; the table of docs/performance.md).

    python benchmarks/speed.py --purejaxrl /path/to/purejaxrl --repeats 5

Each pair is two whole processes (imports, compilation, training, and for this
project's file its evaluation, checkpoints and logs), cold (no persistent
compilation cache on either side), run interleaved (A B A B ...) so that a
drift of the machine affects both alike; the table gives medians, the ratio
reference / ours (above 1: ours is faster), and each row's machine and date.

Pairs run by this script so far:

- `ppo-1`, `ppo-8`: `algos/ppo.py --preset cartpole` (CartPole-v1, 500k steps,
  PureJaxRL's settings) against PureJaxRL's `purejaxrl/ppo.py`, 1 seed and 8
  seeds vmapped. PureJaxRL is run from copies this script makes
  (`prepare_purejaxrl`): its `wrappers.py` without the brax and navix imports
  (unused by `ppo.py`) and with gymnax 1.0's six-value `step`, its `ppo.py` with
  `DEBUG = False` (as shipped it prints every episode from inside the jit) and
  a `jax.block_until_ready` on the result, and an 8-seed copy that vmaps its
  `train` over 8 keys.
- `dqn-1`, `dqn-8`: `algos/rainbow.py --preset dqn` (CartPole-v1, 500k steps,
  PureJaxRL's DQN settings, docs/rainbow.md) against PureJaxRL's
  `purejaxrl/dqn.py`, unchanged, run by a harness this script writes
  (`RUN_DQN`): it aliases `jax.tree_map` (gone from jax), makes gymnax 1.0's
  `LogWrapper.step` return PureJaxRL's five values (done = terminated or
  truncated), stands in for wandb and sets the seed count. dqn.py needs
  flashbax (`pip install --no-deps flashbax==0.1.3`, as in docs/rainbow.md).

The other pairs of issue 27 are compared on a figure each side reports,
lower is better, not on whole processes (each side's command is in the JSON
this script writes):

- `mpo-update` (`--stoix`, a work tree of Stoix, and `--stoix-python`, an
  environment set up as benchmarks/stoix_mpo_cost.py's docstring says):
  milliseconds per MPO learner update at equal work, 64-64 networks and the
  target critic on 128 x 10 sampled actions: ours `benchmarks/mpo_cost.py
  --sizes pendulum` (the `pendulum` preset, batch 128), Stoix's
  `benchmarks/stoix_mpo_cost.py --layers 64 64 --batch-size 64` (64 sequences
  of 2 steps, its pre-sampled row).
- `planet-plan` (`--kaixhin`, a work tree of Kaixhin/PlaNet, and
  `--kaixhin-python`, a python with torch): milliseconds per CEM plan at the
  `cpu` preset's settings, `benchmarks/planet_cost.py --presets cpu
  --no-episode` against `benchmarks/kaixhin_planet_cost.py --threads 1` (one
  torch thread, Kaixhin's faster setting on 2 cores: 14.0 against 15.5 ms
  per plan with two, docs/planet.md).
- `unizero-195` (`--lightzero-python`, an environment set up as
  benchmarks/lightzero_unizero.sh says): seconds from process start to the
  first evaluation with a mean return >= 195 on CartPole-v0, repeat r being
  seed r of each side: ours `algos/unizero.py --preset cartpole-v0`
  with `UNIZERO_FLAGS` (evaluated every 1,000 env steps, run to 4,000 env
  steps) and LightZero's evaluation, 3 greedy episodes
  (`--unizero-eval-episodes`; the sets of 2026-12-07 and before used 10),
  cold unless `--unizero-warm-cache` (JAX's compilation cache, the file's
  default, filled by one untimed run before the first timed one), its
  time the seconds outside the training loop (imports, compiling, final
  writes) plus the loop's seconds at the crossing; LightZero's
  `benchmarks/lightzero_unizero.py` (its own stop rule: 3 greedy episodes
  every 250 training iterations, about 1,000 env steps, capped at 20,000 env
  steps and at its first evaluation past `--lightzero-cap` seconds, 600 by
  default, one torch thread). A seed that never reaches counts as its whole
  time, a lower bound, and a median it can move is printed as one (">=").
  The JSON row also gives each side's env steps at its crossing
  (`env_steps_at_reach`, None where unreached): the issue allows no loss of
  sample efficiency.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import unizero_vs_lightzero as vs_lightzero
from stoix_mpo_cost import row_label as stoix_row_label
from time_commands import machine, run_once

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
# Our side of `unizero-195`: the flags of docs/unizero.md's side-by-side with LightZero
# (benchmarks/unizero.sh vs-lightzero-interleaved), to 4,000 env steps; `unizero_side` adds
# --no-compile-cache (cold) unless --unizero-warm-cache.
UNIZERO_FLAGS = "--preset cartpole-v0 --eval-every 5 --total-timesteps 4000 --learning-rate 1e-3 --replay-ratio 0.125"
# LightZero's evaluator plays 3 greedy episodes (`n_evaluator_episode` of its CartPole
# config): by default ours plays as many, so both sides pass 195 by the same test.
LIGHTZERO_EVAL_EPISODES = 3
LIGHTZERO_CAP_SECONDS = 600  # LightZero's side stops at its first evaluation past this (--lightzero-cap)
REACH = 195.0  # CartPole-v0's solved return (issue 27)
MPO_ROW = "64-64 networks, batch 128 x 10 samples (`pendulum` preset)"  # benchmarks/mpo_cost.py's label of that row


RUN_DQN = '''"""PureJaxRL's dqn.py, unchanged, on gymnax >= 1.0 (written by jaxzoo's benchmarks/speed.py).

    python run_dqn.py NUM_SEEDS
"""

import sys
import types

import jax
import gymnax.wrappers.purerl as purerl

jax.tree_map = jax.tree.map  # dqn.py calls jax.tree_map, which jax has removed


class FiveValueLogWrapper(purerl.LogWrapper):
    """gymnax 1.0 steps return (obs, state, reward, terminated, truncated, info); dqn.py unpacks five."""

    def step(self, key, state, action, params=None):
        obs, state, reward, terminated, truncated, info = super().step(key, state, action, params)
        return obs, state, reward, jax.numpy.logical_or(terminated, truncated), info


purerl.LogWrapper = FiveValueLogWrapper
num_seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 1


def init(config=None, **_):
    config["NUM_SEEDS"] = num_seeds  # main() reads it after wandb.init, when it splits the seed keys


sys.modules["wandb"] = types.SimpleNamespace(init=init, log=lambda *_, **__: None)
import dqn  # noqa: E402

dqn.main()
'''


def edit(text: str, old: str, new: str, what: str) -> str:
    """`text` with `old` replaced once; a PureJaxRL version without `old` is an error, not a silent skip."""
    if old not in text:
        raise SystemExit(f"prepare_purejaxrl: {what}: the expected text is not in this PureJaxRL checkout:\n{old}")
    return text.replace(old, new, 1)


def prepare_purejaxrl(checkout: Path, into: Path) -> Path:
    """Copy PureJaxRL's ppo.py and wrappers.py into `into` with the edits listed in
    the module docstring; returns `into` (holding ppo_nodebug.py, ppo_vmap8.py and
    wrappers.py)."""
    source = checkout / "purejaxrl" if (checkout / "purejaxrl" / "ppo.py").exists() else checkout
    if not (source / "ppo.py").exists() or not (source / "wrappers.py").exists():
        raise SystemExit(f"--purejaxrl {checkout}: no ppo.py and wrappers.py there or in its purejaxrl/ folder")
    wrappers = (source / "wrappers.py").read_text()
    for line in (
        "from brax import envs\n",
        "from brax.envs.wrappers.training import EpisodeWrapper, AutoResetWrapper\n",
        "import navix as nx\n",
    ):
        wrappers = edit(wrappers, line, "", "drop an import ppo.py does not use")
    wrappers = edit(
        wrappers,
        "        obs, state, reward, done, info = self._env.step(key, state, action, params)\n"
        "        obs = jnp.reshape(obs, (-1,))",
        "        obs, state, reward, terminated, truncated, info = self._env.step(key, state, action, params)\n"
        "        done = jnp.logical_or(terminated, truncated)  # gymnax >= 1.0 returns six values\n"
        "        obs = jnp.reshape(obs, (-1,))",
        "FlattenObservationWrapper.step on gymnax 1.0",
    )
    ppo = (source / "ppo.py").read_text()
    ppo = edit(ppo, '"DEBUG": True,', '"DEBUG": False,', "turn off the per-episode printing")
    ppo = edit(
        ppo,
        "    out = train_jit(rng)\n",
        "    out = train_jit(rng)\n    jax.block_until_ready(out)\n",
        "wait for the result before exiting",
    )
    vmapped = edit(
        ppo,
        "    train_jit = jax.jit(make_train(config))\n    out = train_jit(rng)\n",
        "    train_jit = jax.jit(jax.vmap(make_train(config)))\n    out = train_jit(jax.random.split(rng, 8))\n",
        "vmap train over 8 keys",
    )
    into.mkdir(parents=True, exist_ok=True)
    (into / "wrappers.py").write_text(wrappers)
    (into / "ppo_nodebug.py").write_text(ppo)
    (into / "ppo_vmap8.py").write_text(vmapped)
    if (source / "dqn.py").exists():
        (into / "dqn.py").write_text((source / "dqn.py").read_text())
        (into / "run_dqn.py").write_text(RUN_DQN)
    return into


def pairs(purejaxrl: Path | None, run_root: Path) -> dict[str, tuple[str, str, str | None]]:
    """name -> (our command, the reference's command, the reference's working directory)."""
    python = sys.executable
    ppo = f"{python} {ROOT / 'algos' / 'ppo.py'} --preset cartpole --no-compile-cache --run-root {run_root}"
    found: dict[str, tuple[str, str, str | None]] = {}
    if purejaxrl is not None:
        folder = str(purejaxrl)
        found["ppo-1"] = (ppo, f"{python} ppo_nodebug.py", folder)
        found["ppo-8"] = (f"{ppo} --num-seeds 8", f"{python} ppo_vmap8.py", folder)
        if (purejaxrl / "run_dqn.py").exists() and importlib.util.find_spec("flashbax") is not None:
            dqn = f"{python} {ROOT / 'algos' / 'rainbow.py'} --preset dqn --no-compile-cache --run-root {run_root}"
            found["dqn-1"] = (dqn, f"{python} run_dqn.py 1", folder)
            found["dqn-8"] = (f"{dqn} --num-seeds 8", f"{python} run_dqn.py 8", folder)
    return found


class FigurePair(NamedTuple):
    """A pair compared on a figure each side reports, lower is better. Each
    side is called with the repeat's index (`unizero-195`: the seed) and returns
    (figure, exact); exact is False for a lower bound (a seed that never reached)."""

    unit: str
    ours_command: str
    reference_command: str
    ours: Callable[[int], tuple[float, bool]]
    reference: Callable[[int], tuple[float, bool]]
    # What else the sides record per repeat, written into the pair's JSON row under
    # its key (unizero-195: "env_steps_at_reach", each side's list, None where unreached).
    extra: dict[str, dict[str, list]] | None = None


def run_capture(command: str, cwd: str | Path | None = None, env: dict[str, str] | None = None) -> tuple[float, str]:
    """(wall seconds, standard output) of one run of `command` (with `env`, the
    environment variables added to this process's); a failed run is an error."""
    start = time.perf_counter()
    done = subprocess.run(
        shlex.split(command), cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{command!r} exited with {done.returncode}: {done.stderr[-2000:]}")
    return wall, done.stdout


def table_cell(stdout: str, row_start: str, command: str) -> float:
    """The number in the last cell of the markdown row of `stdout` that starts with `row_start`."""
    for line in stdout.splitlines():
        if line.startswith(row_start):
            return float(line.rstrip().rstrip("|").rsplit("|", 1)[1])
    raise RuntimeError(f"{command!r} printed no row starting with {row_start!r}; it printed:\n{stdout[-2000:]}")


def printed_figure(command: str, row_start: str) -> Callable[[int], tuple[float, bool]]:
    """A side whose figure is the last cell of one row of the table its command prints."""
    return lambda _repeat: (table_cell(run_capture(command, ROOT)[1], row_start, command), True)


def json_figure(command: str, out: Path, key: str) -> Callable[[int], tuple[float, bool]]:
    """A side whose figure is `key` of the first row of the JSON its command writes to `out`."""

    def side(_repeat: int) -> tuple[float, bool]:
        run_capture(command, ROOT)
        return float(json.loads(out.read_text())["rows"][0][key]), True

    return side


def seconds_to_reach(run_dir: Path, process_wall: float, reach: float = REACH) -> tuple[float, bool]:
    """Seconds from process start to a one-seed run's first evaluation >= `reach`:
    the seconds its process spent outside the training loop (`process_wall`
    less eval.json's train_seconds) plus the loop's seconds at that evaluation
    (benchmarks/unizero_vs_lightzero.py's count, by its own functions), or
    (process_wall, False) if no evaluation reached it."""
    (curve,) = vs_lightzero.ours(run_dir)
    outside = process_wall - json.loads((run_dir / "eval.json").read_text())["train_seconds"]
    ((seconds, reached),) = vs_lightzero.seconds_to_reach([curve], reach, [outside])
    return (seconds, True) if reached else (process_wall, False)


def env_steps_to_reach(run_dir: Path, reach: float = REACH) -> int | None:
    """Env steps of a one-seed run at its first evaluation >= `reach` (None: never)."""
    ((env_steps, _, returns),) = vs_lightzero.ours(run_dir)
    at = vs_lightzero.crossing(returns, reach)
    return None if at is None else int(env_steps[at])


def unizero_side(
    run_root: Path,
    eval_episodes: int = LIGHTZERO_EVAL_EPISODES,
    env_steps: list | None = None,
    warm_cache: Path | None = None,
) -> tuple[str, Callable[[int], tuple[float, bool]]]:
    """Our side of `unizero-195`: (its command for seed S, the side), each
    evaluation `eval_episodes` greedy episodes; each seed's env steps at its
    crossing (None: never) are appended to `env_steps`. Cold unless
    `warm_cache`: then JAX's persistent compilation cache in that folder (the
    file's default, `--compile-cache`), filled by one untimed run of the same
    command before the first timed one, as a user's second run finds it."""
    command = f"{sys.executable} {ROOT / 'algos' / 'unizero.py'} {UNIZERO_FLAGS} --eval-episodes {eval_episodes}"
    env = None
    if warm_cache is None:
        command += " --no-compile-cache"
    else:
        env = {"JAXZOO_CACHE_DIR": str(warm_cache)}
    cache_filled = False

    def side(seed: int) -> tuple[float, bool]:
        nonlocal cache_filled
        if env is not None and not cache_filled:
            run_capture(f"{command} --seed {seed} --run-root {run_root / 'fill_cache'}", ROOT, env)
            cache_filled = True
        root = run_root / f"seed{seed}"
        wall, _ = run_capture(f"{command} --seed {seed} --run-root {root}", ROOT, env)
        (run_dir,) = root.iterdir()
        if env_steps is not None:
            env_steps.append(env_steps_to_reach(run_dir))
        return seconds_to_reach(run_dir, wall)

    if env is None:
        return f"{command} --seed S", side
    return f"JAXZOO_CACHE_DIR={warm_cache} {command} --seed S, after one untimed run", side


def lightzero_side(
    python: str, out_dir: Path, cap_seconds: int = LIGHTZERO_CAP_SECONDS, env_steps: list | None = None
) -> tuple[str, Callable[[int], tuple[float, bool]]]:
    """LightZero's side of `unizero-195`: (its command for seed S, the side),
    read from the seedS.json that benchmarks/lightzero_unizero.py writes; a
    seed stops at its first evaluation past `cap_seconds`, and its env steps
    at the crossing (None: never) are appended to `env_steps`."""
    command = (
        f"{python} {BENCHMARKS / 'lightzero_unizero.py'} --out-dir {out_dir} --max-env-step 20000 "
        f"--max-wall-seconds {cap_seconds} --eval-freq 250 --threads 1"
    )

    def side(seed: int) -> tuple[float, bool]:
        run_capture(f"{command} --seed {seed}", ROOT)
        meta = json.loads((out_dir / f"seed{seed}.json").read_text())
        if env_steps is not None:
            env_steps.append(meta["env_steps_to_reach"])
        if meta["reached"]:
            return float(meta["wall_seconds_to_reach"]), True
        return float(meta["total_seconds"]), False

    return f"{command} --seed S", side


def figure_pairs(ns: argparse.Namespace, scratch: Path) -> dict[str, FigurePair]:
    """The pairs compared on a reported figure whose references were given."""
    python = sys.executable
    found = {}
    if ns.stoix and ns.stoix_python:
        ours = f"{python} {BENCHMARKS / 'mpo_cost.py'} --sizes pendulum"  # the row MPO_ROW names
        theirs = (
            f"{ns.stoix_python} {BENCHMARKS / 'stoix_mpo_cost.py'} --stoix {ns.stoix} --layers 64 64 --batch-size 64"
        )
        found["mpo-update"] = FigurePair(
            "ms per learner update",
            ours,
            theirs,
            printed_figure(ours, f"| {MPO_ROW} |"),
            printed_figure(theirs, f"| {stoix_row_label([64, 64], 64, 10, 2)}, pre-sampled batch |"),
        )
    if ns.kaixhin and ns.kaixhin_python:
        ours_out, theirs_out = scratch / "planet_ours.json", scratch / "planet_kaixhin.json"
        ours = f"{python} {BENCHMARKS / 'planet_cost.py'} --presets cpu --no-episode --out {ours_out}"
        theirs = (
            f"{ns.kaixhin_python} -W ignore {BENCHMARKS / 'kaixhin_planet_cost.py'} --planet {ns.kaixhin} "
            f"--threads 1 --out {theirs_out}"
        )
        found["planet-plan"] = FigurePair(
            "ms per CEM plan",
            ours,
            theirs,
            json_figure(ours, ours_out, "plan_ms"),
            json_figure(theirs, theirs_out, "plan_ms"),
        )
    if ns.lightzero_python:
        # Issue 27 asks for no loss of sample efficiency: each side's env steps at its crossing.
        env_steps: dict[str, list] = {"ours": [], "reference": []}
        cache = scratch / "compile_cache" if ns.unizero_warm_cache else None
        ours, our_side = unizero_side(scratch / "unizero", ns.unizero_eval_episodes, env_steps["ours"], cache)
        theirs, their_side = lightzero_side(
            ns.lightzero_python, scratch / "lightzero", ns.lightzero_cap, env_steps["reference"]
        )
        found["unizero-195"] = FigurePair(
            f"s from process start to an evaluation >= {REACH:g}",
            ours,
            theirs,
            our_side,
            their_side,
            {"env_steps_at_reach": env_steps},
        )
    return found


def run_figure_pair(name: str, pair: FigurePair, repeats: int) -> dict:
    """Both sides `repeats` times, alternated; the JSON row of the pair."""
    figures: dict[str, list[tuple[float, bool]]] = {"ours": [], "reference": []}
    for repeat in range(repeats):
        figures["ours"].append(pair.ours(repeat))
        figures["reference"].append(pair.reference(repeat))
        print(
            f"[{name} {repeat + 1}/{repeats}] ours {figures['ours'][-1][0]:.2f}, "
            f"reference {figures['reference'][-1][0]:.2f} ({pair.unit})",
            flush=True,
        )
    medians = {side: vs_lightzero.median_of_censored(values) for side, values in figures.items()}
    return {
        "pair": name,
        "unit": pair.unit,
        "ours": pair.ours_command,
        "reference": pair.reference_command,
        "repeats": repeats,
        "median": {side: m[0] for side, m in medians.items()},
        "median_exact": {side: m[1] for side, m in medians.items()},
        "figures": {side: [list(v) for v in values] for side, values in figures.items()},
        **(pair.extra or {}),
        "machine": machine(),
        "date": datetime.date.today().isoformat(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--purejaxrl", type=Path, help="a PureJaxRL checkout (the repository or its purejaxrl/ folder)")
    parser.add_argument("--stoix", type=Path, help="a Stoix work tree (mpo-update, with --stoix-python)")
    parser.add_argument("--stoix-python", help="the python of an environment with Stoix's dependencies")
    parser.add_argument("--kaixhin", type=Path, help="a Kaixhin/PlaNet work tree (planet-plan, with --kaixhin-python)")
    parser.add_argument("--kaixhin-python", help="a python with torch")
    parser.add_argument("--lightzero-python", help="the python of an environment with lightzero (unizero-195)")
    parser.add_argument(
        "--unizero-eval-episodes",
        type=int,
        default=LIGHTZERO_EVAL_EPISODES,
        help="greedy episodes per evaluation of our side of unizero-195 (default: LightZero's 3; "
        "the sets of 2026-12-07 and before used 10)",
    )
    parser.add_argument(
        "--unizero-warm-cache",
        action="store_true",
        help="run our side of unizero-195 with JAX's compilation cache (the file's default), filled by one "
        "untimed run first; default: cold, --no-compile-cache",
    )
    parser.add_argument(
        "--lightzero-cap",
        type=int,
        default=LIGHTZERO_CAP_SECONDS,
        help="seconds after which LightZero's side stops at its next evaluation (unizero-195)",
    )
    parser.add_argument(
        "--pairs", nargs="*", help="run only these pairs (default: every pair whose reference is given)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="runs of each side (unizero-195: seeds 0 .. N-1)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "speed.json")
    ns = parser.parse_args()
    for flag, value in (("--repeats", ns.repeats), ("--unizero-eval-episodes", ns.unizero_eval_episodes)):
        if value < 1:
            parser.error(f"{flag} {value}: give at least 1")
    if ns.lightzero_cap < 1:
        parser.error(f"--lightzero-cap {ns.lightzero_cap}: give a number of seconds, at least 1")
    for path, python in ((ns.stoix, ns.stoix_python), (ns.kaixhin, ns.kaixhin_python)):
        if (path is None) != (python is None):
            parser.error("give --stoix with --stoix-python, and --kaixhin with --kaixhin-python")
    with tempfile.TemporaryDirectory(prefix="jaxzoo-speed-") as scratch:
        reference = prepare_purejaxrl(ns.purejaxrl, Path(scratch) / "purejaxrl") if ns.purejaxrl else None
        processes = pairs(reference, Path(scratch) / "runs")
        figures = figure_pairs(ns, Path(scratch))
        available = [*processes, *figures]
        chosen = ns.pairs or available
        unknown = [name for name in chosen if name not in available]
        if unknown or not chosen:
            parser.error(
                f"pairs {unknown or chosen} cannot run: the pairs available with the references given are "
                f"{available or 'none'} (--purejaxrl gives ppo-1 and ppo-8, and dqn-1 and dqn-8 where its "
                "checkout has dqn.py and flashbax is installed; --stoix and --stoix-python give mpo-update; "
                "--kaixhin and --kaixhin-python give planet-plan; --lightzero-python gives unizero-195)"
            )
        date = datetime.date.today().isoformat()
        rows, figure_rows = [], []
        for name in chosen:
            if name in figures:
                figure_rows.append(run_figure_pair(name, figures[name], ns.repeats))
                continue
            ours, theirs, cwd = processes[name]
            times: dict[str, list[tuple[float, float, float]]] = {"ours": [], "reference": []}
            for repeat in range(ns.repeats):
                times["ours"].append(run_once(ours, None))
                times["reference"].append(run_once(theirs, cwd))
                print(
                    f"[{name} {repeat + 1}/{ns.repeats}] ours {times['ours'][-1][0]:.2f} s, "
                    f"reference {times['reference'][-1][0]:.2f} s",
                    flush=True,
                )
            median = {side: [statistics.median(t[i] for t in runs) for i in range(3)] for side, runs in times.items()}
            rows.append(
                {
                    "pair": name,
                    "ours": ours,
                    "reference": theirs,
                    "repeats": ns.repeats,
                    "median_wall": {side: m[0] for side, m in median.items()},
                    "median_cpu": {side: m[1] for side, m in median.items()},
                    "median_rss_mib": {side: m[2] for side, m in median.items()},
                    "wall": {side: [t[0] for t in runs] for side, runs in times.items()},
                    "machine": machine(),
                    "date": date,
                }
            )
    if rows:
        print(
            "\n| pair | ours, median wall (s) | reference (s) | reference / ours | CPU ratio "
            "| peak RSS ours / ref (MiB) | machine, date |"
        )
        print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        wall, cpu, rss = row["median_wall"], row["median_cpu"], row["median_rss_mib"]
        print(
            f"| {row['pair']} | {wall['ours']:.2f} | {wall['reference']:.2f} | {wall['reference'] / wall['ours']:.2f} "
            f"| {cpu['reference'] / cpu['ours']:.2f} | {rss['ours']:.0f} / {rss['reference']:.0f} "
            f"| {row['machine']}, {row['date']} |"
        )
    if figure_rows:
        print("\n| pair | figure | ours, median | reference, median | reference / ours | machine, date |")
        print("| --- | --- | --- | --- | --- | --- |")
    for row in figure_rows:
        cells = {
            side: f"{'' if row['median_exact'][side] else '>= '}{row['median'][side]:.2f}"
            for side in ("ours", "reference")
        }
        ratio = row["median"]["reference"] / row["median"]["ours"]
        # A lower bound on the reference's side bounds the ratio from below; one on ours, from above.
        bound = ">= " if not row["median_exact"]["reference"] else "<= " if not row["median_exact"]["ours"] else ""
        if not row["median_exact"]["reference"] and not row["median_exact"]["ours"]:
            bound = "~ "  # both sides censored: neither bound holds
        print(
            f"| {row['pair']} | {row['unit']} | {cells['ours']} | {cells['reference']} | {bound}{ratio:.2f} "
            f"| {row['machine']}, {row['date']} |"
        )
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(rows + figure_rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
