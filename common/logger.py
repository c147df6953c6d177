"""Run directories, `metrics.csv`, terminal progress and optional TensorBoard / W&B.

A run writes `runs/<env>__<exp>__<seed>__<time>/` holding
- `args.json`: the parsed `Args` (what `--resume` reads back),
- `metrics.csv`: one row per logged update per seed, with `update`,
  `global_step`, `seed_index` and `seed` columns before the algorithm's metrics,
- `checkpoints/` (see `common/checkpoint.py`).
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import json
import math
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

KEY_COLUMNS = ("update", "global_step", "seed_index", "seed")


def new_run_dir(root: str, env_id: str, exp_name: str, seed: int) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    # "dmc:cartpole-swingup", "gym:ALE/Pong-v5": no colon in a path (Windows, scp, PYTHONPATH), no folder
    env_id = env_id.replace(":", "-").replace("/", "-")
    path = Path(root) / f"{env_id}__{exp_name}__{seed}__{stamp}"
    suffix = 1
    while path.exists():  # two runs started in the same second
        path = Path(root) / f"{env_id}__{exp_name}__{seed}__{stamp}-{suffix}"
        suffix += 1
    path.mkdir(parents=True)
    return path


# Keys args.json holds besides the Args fields: which file wrote the run, and
# the package version (a resumed run is checked against both).
META_KEYS = ("algorithm", "jaxzoo_version")


def write_args_json(run_dir: Path, args: Any, meta: Mapping[str, Any] | None = None) -> None:
    """`args.json`: the Args fields, then `algorithm` and `jaxzoo_version`."""
    payload = {**dataclasses.asdict(args), **(meta or {})}
    tmp = Path(run_dir) / ".args.json.tmp"
    tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    os.replace(tmp, Path(run_dir) / "args.json")


class Run:
    """Owns one run directory: args.json, metrics.csv, progress line, TB / W&B.

    `log(update, global_step, metrics)` takes the host copy of a chunk of
    metrics, every leaf shaped `[num_seeds, num_updates_in_chunk]`, with
    `update` and `global_step` shaped `[num_updates_in_chunk]`.
    """

    def __init__(
        self,
        args: Any,
        run_dir: str | Path | None = None,
        *,
        total_steps: int,
        tensorboard: bool = False,
        track: bool = False,
        wandb_project: str = "jaxzoo",
        resume_from_update: int | None = None,
        quiet: bool = False,
        meta: Mapping[str, Any] | None = None,
    ):
        self.args = args
        self.total_steps = total_steps
        self.quiet = quiet
        if run_dir is None:
            run_dir = new_run_dir(args.run_root, args.env_id, args.exp_name, args.seed)
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        args_dict = dataclasses.asdict(args)
        write_args_json(self.dir, args, meta)
        self.csv_path = self.dir / "metrics.csv"
        if resume_from_update is not None:
            self._truncate_csv(resume_from_update)
        self._csv_file: Any = None  # open text file once the first chunk is logged
        self._csv_writer: Any = None  # its csv.writer
        self._columns: list[str] = []  # metrics.csv header, set when it is opened
        self._start = time.perf_counter()
        self._last_print = 0.0
        self._last_step = -1
        self.latest_return = math.nan
        self.latest_sps = math.nan
        self.tb = None
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter
            except ImportError as error:
                raise ImportError("--tensorboard needs tensorboardX: pip install -e '.[logging]'") from error
            self.tb = SummaryWriter(str(self.dir / "tensorboard"))
        self.wandb = None
        if track:
            try:
                import wandb
            except ImportError as error:
                raise ImportError("--track needs wandb: pip install -e '.[logging]'") from error
            self.wandb = wandb.init(project=wandb_project, name=self.dir.name, config=args_dict, dir=str(self.dir))

    def _truncate_csv(self, last_update: int) -> None:
        """On resume, drop rows logged after the checkpoint (they will be redone)."""
        if not self.csv_path.exists():
            return
        with open(self.csv_path, newline="") as f:
            rows = list(csv.reader(f))
        if not rows:
            return
        header, body = rows[0], rows[1:]
        column = header.index("update")
        kept = [r for r in _whole_rows(header, body) if int(r[column]) <= last_update]
        tmp = self.csv_path.with_name(".metrics.csv.tmp")
        with open(tmp, "w", newline="") as f:
            csv.writer(f).writerows([header, *kept])
        os.replace(tmp, self.csv_path)

    def log(self, update: np.ndarray, global_step: np.ndarray, metrics: Mapping[str, np.ndarray]) -> None:
        if self._csv_writer is None:
            self._open_csv(sorted(metrics))
        names = self._columns[len(KEY_COLUMNS) :]  # a column this chunk lacks is written as nan
        num_seeds = next(iter(metrics.values())).shape[0]
        for j in range(len(update)):
            for i in range(num_seeds):
                row = [int(update[j]), int(global_step[j]), i, self.args.seed + i]
                row += [_fmt(metrics[n][i, j]) if n in metrics else "nan" for n in names]
                self._csv_writer.writerow(row)
        self._csv_file.flush()
        # Mean over seeds of the last finite value of each metric in the chunk.
        summary = {n: _last_finite_mean(metrics[n]) for n in names}
        step = int(global_step[-1])
        if self.tb is not None:
            for n, v in summary.items():
                self.tb.add_scalar(n, v, step)
        if self.wandb is not None:
            self.wandb.log({**summary, "global_step": step}, step=step)
        if not math.isnan(summary.get("episode_return", math.nan)):
            self.latest_return = summary["episode_return"]
        self.latest_sps = summary.get("steps_per_second", math.nan)
        self.progress(step)

    def _open_csv(self, names: list[str]) -> None:
        """Open metrics.csv for appending. A resumed run whose metrics differ
        from the file's columns (a newer version logs another metric) keeps
        every row: the file is rewritten once with the union of the columns,
        old rows holding nan in the new ones."""
        columns = list(KEY_COLUMNS) + names
        if self.csv_path.exists() and self.csv_path.stat().st_size > 0:
            with open(self.csv_path, newline="") as f:
                rows = list(csv.reader(f))
            header = rows[0]
            if header != columns:
                columns = header + [n for n in names if n not in header]
                body = [row + ["nan"] * (len(columns) - len(header)) for row in _whole_rows(header, rows[1:])]
                tmp = self.csv_path.with_name(".metrics.csv.tmp")
                with open(tmp, "w", newline="") as f:
                    csv.writer(f).writerows([columns, *body])
                os.replace(tmp, self.csv_path)
        else:
            with open(self.csv_path, "w", newline="") as f:
                csv.writer(f).writerow(columns)
        self._columns = columns
        self._csv_file = open(self.csv_path, "a", newline="")
        self._csv_writer = csv.writer(self._csv_file)

    def progress(self, step: int, final: bool = False) -> None:
        """One progress line: at most once a second (in place on a terminal),
        and always once at the end of the run."""
        now = time.perf_counter()
        if self.quiet or (final and step == self._last_step):
            return
        last = step >= self.total_steps
        if not (final or last) and now - self._last_print < 1.0:
            return
        self._last_print, self._last_step = now, step
        fraction = min(step / max(self.total_steps, 1), 1.0)
        bar = "#" * int(20 * fraction) + "-" * (20 - int(20 * fraction))
        line = (
            f"[{bar}] {100 * fraction:5.1f}% step {step:,}/{self.total_steps:,} "
            f"| {self.latest_sps:,.0f} steps/s | return {self.latest_return:.2f} | {now - self._start:.0f}s"
        )
        end = "\r" if sys.stdout.isatty() and not (final or last) else "\n"
        print(line, end=end, flush=True)

    def print(self, message: str) -> None:
        if not self.quiet:
            print(message, flush=True)

    def write_json(self, name: str, payload: Any) -> None:
        (self.dir / name).write_text(json.dumps(payload, indent=2, default=_json_default) + "\n")

    def close(self) -> None:
        if self._csv_file is not None:
            self._csv_file.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


class Silent:
    """The logger of a process that does not write the run directory (process
    > 0 of a distributed run, jaxzoo.parallel): `Run`'s methods, doing nothing."""

    def __init__(self, args: Any, run_dir: str | Path | None = None, **_: Any):
        self.args = args
        self.dir = Path(run_dir) if run_dir is not None else Path(args.run_root)
        self.latest_return = self.latest_sps = math.nan

    def log(self, update: np.ndarray, global_step: np.ndarray, metrics: Mapping[str, np.ndarray]) -> None:
        pass

    def progress(self, step: int, final: bool = False) -> None:
        pass

    def print(self, message: str) -> None:
        pass

    def write_json(self, name: str, payload: Any) -> None:
        pass

    def close(self) -> None:
        pass


def _fmt(value: Any) -> str:
    value = float(value)
    return "nan" if math.isnan(value) else f"{value:.6g}"


def _last_finite_mean(values: np.ndarray) -> float:
    """Per seed the last finite value of the chunk, then the mean over seeds."""
    values = np.asarray(values, np.float64)
    finite = np.isfinite(values)
    last = [row[mask][-1] for row, mask in zip(values, finite) if mask.any()]
    return float(np.mean(last)) if last else math.nan


def _json_default(value: Any):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def _whole_rows(header: list[str], body: list[list[str]]) -> list[list[str]]:
    """The rows of a metrics.csv body that were written whole: a process killed
    while writing leaves a last row with missing or cut-off fields, which is
    dropped (its update is redone on resume)."""
    whole = []
    for row in body:
        try:
            if len(row) == len(header):
                [float(value) for value in row]
                whole.append(row)
        except ValueError:
            pass
    return whole


def read_metrics(run_dir: str | Path) -> dict[str, np.ndarray]:
    """metrics.csv as columns of float arrays (a half-written last row is skipped);
    metrics.csv.gz where only that is there (the copies of runs kept in docs/data)."""
    path = Path(run_dir) / "metrics.csv"
    if not path.exists() and path.with_suffix(".csv.gz").exists():
        with gzip.open(path.with_suffix(".csv.gz"), "rt", newline="") as f:
            rows = list(csv.reader(f))
    else:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    if not rows:
        return {}
    header, body = rows[0], _whole_rows(rows[0], rows[1:])
    return {c: np.array([float(r[i]) for r in body]) for i, c in enumerate(header)}
