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

The other comparisons in docs/ (UniZero against LightZero, World Models and
PlaNet against their references) are measured by the scripts their pages name,
not yet by this one.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import statistics
import sys
import tempfile
from pathlib import Path

from time_commands import machine, run_once

ROOT = Path(__file__).resolve().parent.parent


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
    found = {}
    if purejaxrl is not None:
        folder = str(purejaxrl)
        found["ppo-1"] = (ppo, f"{python} ppo_nodebug.py", folder)
        found["ppo-8"] = (f"{ppo} --num-seeds 8", f"{python} ppo_vmap8.py", folder)
        if (purejaxrl / "run_dqn.py").exists() and importlib.util.find_spec("flashbax") is not None:
            dqn = f"{python} {ROOT / 'algos' / 'rainbow.py'} --preset dqn --no-compile-cache --run-root {run_root}"
            found["dqn-1"] = (dqn, f"{python} run_dqn.py 1", folder)
            found["dqn-8"] = (f"{dqn} --num-seeds 8", f"{python} run_dqn.py 8", folder)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--purejaxrl", type=Path, help="a PureJaxRL checkout (the repository or its purejaxrl/ folder)")
    parser.add_argument(
        "--pairs", nargs="*", help="run only these pairs (default: every pair whose reference is given)"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "speed.json")
    ns = parser.parse_args()
    if ns.repeats < 1:
        parser.error(f"--repeats {ns.repeats}: give at least 1")
    with tempfile.TemporaryDirectory(prefix="jaxzoo-speed-") as scratch:
        reference = prepare_purejaxrl(ns.purejaxrl, Path(scratch) / "purejaxrl") if ns.purejaxrl else None
        available = pairs(reference, Path(scratch) / "runs")
        chosen = ns.pairs or list(available)
        unknown = [name for name in chosen if name not in available]
        if unknown or not chosen:
            parser.error(
                f"pairs {unknown or chosen} cannot run: the pairs available with the references given are "
                f"{list(available) or 'none'} (--purejaxrl gives ppo-1 and ppo-8, and dqn-1 and dqn-8 "
                "where its checkout has dqn.py and flashbax is installed)"
            )
        date = datetime.date.today().isoformat()
        rows = []
        for name in chosen:
            ours, theirs, cwd = available[name]
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
    print(
        "\n| pair | ours, median wall (s) | reference (s) | reference / ours | CPU ratio | peak RSS ours / ref (MiB) | machine, date |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        wall, cpu, rss = row["median_wall"], row["median_cpu"], row["median_rss_mib"]
        print(
            f"| {row['pair']} | {wall['ours']:.2f} | {wall['reference']:.2f} | {wall['reference'] / wall['ours']:.2f} "
            f"| {cpu['reference'] / cpu['ours']:.2f} | {rss['ours']:.0f} / {rss['reference']:.0f} "
            f"| {row['machine']}, {row['date']} |"
        )
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
