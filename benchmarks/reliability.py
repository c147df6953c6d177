"""The fault table of docs/reliability.md: each fault injected into every
algorithm file through its command line (the tiny preset), with what the file
did: exit code, the line it printed, and what the run directory holds after.

    python benchmarks/reliability.py faults   --out benchmarks/out/reliability_faults.md
    python benchmarks/reliability.py registry --out benchmarks/out/reliability_registry.md
    python benchmarks/reliability.py latency  --out benchmarks/out/reliability_latency.md

`faults` runs each script as a user would (a subprocess from the repository
root, JAX's compilation cache shared between runs); `registry` builds every
(file, gymnax env) pair on the file's tiny preset and runs its few updates
for real (compiled and executed, in this process), which is what
tests/test_registry.py traces without compiling. Both print a markdown table
and write it to `--out`.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import importlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
ALGOS = ["ppo", "rainbow", "mpo", "world_models", "planet", "unizero", "unizero_ppo", "impala"]
LEARNING_RATES = {"mpo": ("policy-lr", "critic-lr"), "world_models": ("vae-learning-rate", "mdn-learning-rate")}
CONTINUOUS_ONLY = ("mpo", "planet")


def script(algo: str, *flags: str, tiny: bool = True) -> list[str]:
    return [sys.executable, str(ROOT / "algos" / f"{algo}.py"), *(["--preset", "tiny"] if tiny else []), *flags]


def run(command: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def said(process: subprocess.CompletedProcess, *markers: str) -> str:
    """The first line of the output holding one of `markers` (the error line
    otherwise), without tyro's box drawing, temporary paths or a warning's
    source location, shortened for a table cell."""
    text = (process.stdout or "") + "\n" + (process.stderr or "")
    text = re.sub(r"/\S*/(reliability|latency)-[^/\s]+", "<tmp>", text)  # the temporary work directory
    text = re.sub(r"\S+\.py:\d+: (\w+Warning)", r"\1", text)  # where a warning was raised
    text = text.replace("Error parsing Args: ", "")
    lines = [" ".join(line.replace("│", " ").split()) for line in text.splitlines()]
    lines = [line for line in lines if line and not set(line) <= set("─╭╮╰╯ ")]
    hit = next((line for line in lines if any(m in line for m in markers)), None)
    hit = hit or next((line for line in lines if line.startswith(("error:", "diverged:", "Error"))), lines[-1] if lines else "")
    return hit if len(hit) <= 120 else hit[:117] + "..."


def cell(code: int, text: str) -> str:
    return f"exit {code}: `{text.replace('|', '/').replace('`', '')}`"


def only_run_dir(root: Path) -> Path:
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    return run_dir


def foreign_run(workdir: Path, algo: str) -> Path:
    """A finished tiny run of another algorithm file."""
    other = "rainbow" if algo == "ppo" else "ppo"
    root = workdir / f"foreign-{other}"
    if not root.exists():
        run(script(other, "--run-root", str(root)))
    return only_run_dir(root)


def wait_for_rows(run_dir_root: Path, process: subprocess.Popen, timeout: float = 600) -> bool:
    """Wait until some metrics.csv under `run_dir_root` has a data row."""
    end = time.time() + timeout
    while time.time() < end and process.poll() is None:
        for path in run_dir_root.rglob("metrics.csv"):
            if len(path.read_text().splitlines()) >= 2:
                return True
        time.sleep(0.05)
    return False


def faults_of(algo: str, workdir: Path) -> dict[str, str]:
    rows: dict[str, str] = {}
    root = workdir / algo
    root.mkdir()

    # Divergence.
    blow_up = [f for field in LEARNING_RATES.get(algo, ("learning-rate",)) for f in (f"--{field}", "1e30")]
    out = run(script(algo, *blow_up, "--run-root", str(root / "diverge")))
    run_dir = only_run_dir(root / "diverge")
    rows["learning rate 1e30 (diverges)"] = cell(out.returncode, said(out, "diverged:")) + (
        "; no eval.json" if not (run_dir / "eval.json").exists() else "; eval.json WRITTEN")

    # Arguments checked before anything is built.
    rate = LEARNING_RATES.get(algo, ("learning-rate",))[0]
    out = run(script(algo, f"--{rate}", "nan"))
    rows["a learning rate of nan"] = cell(out.returncode, f"--{rate} nan: " + said(out, "nan"))
    out = run(script(algo, "--eval-episodes", "0"))
    rows["--eval-episodes 0"] = cell(out.returncode, said(out, "eval_episodes"))
    typo = "Pendulum-v2" if algo in CONTINUOUS_ONLY else "CartPole-v2"
    out = run(script(algo, "--env-id", typo))
    rows["an unknown --env-id (CartPole-v2, or Pendulum-v2 where continuous only)"] = cell(
        out.returncode, said(out, "did you mean", typo))
    (root / "a-file").write_text("")
    out = run(script(algo, "--run-root", str(root / "a-file" / "runs")))
    rows["--run-root under a file"] = cell(out.returncode, said(out, "run_root"))

    # Run directories.
    out = run(script(algo, "--resume", str(foreign_run(workdir, algo)), tiny=False))
    rows["--resume another file's run"] = cell(out.returncode, said(out, "written by"))

    # SIGTERM once the first metrics row is written, then resume; the resumed
    # directory then gets a damaged newest checkpoint and a half-written row.
    long_flags = ["--log-every", "1", "--checkpoint-every", "1", "--run-root", str(root / "term")]
    process = subprocess.Popen(script(algo, *long_flags), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=ROOT)
    (root / "term").mkdir(exist_ok=True)
    started = wait_for_rows(root / "term", process)
    sent = time.time()
    if started:
        process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=900)
    answered = time.time() - sent
    term = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    run_dir = only_run_dir(root / "term")
    checkpoints = sorted(run_dir.rglob("update_*.npz"))
    rows["SIGTERM during training"] = (cell(term.returncode, said(term, "stopped by")) + f"; answered in "
                                       f"{answered:.1f} s; {len(checkpoints)} checkpoint(s)") if started else \
        "finished before the first row (not signalled)"

    # Two processes on one run directory: hold its lock as a running process does.
    with open(run_dir / ".lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write(f"process {os.getpid()}\n")
        held.flush()
        out = run(script(algo, "--resume", str(run_dir), tiny=False))
    rows["a second process on a running run's directory"] = cell(out.returncode, said(out, "in use"))

    out = run(script(algo, "--resume", str(run_dir), "--seed", "7", tiny=False))
    rows["--resume with a different --seed"] = cell(out.returncode, said(out, "flags differ"))

    out = run(script(algo, "--resume", str(run_dir), tiny=False))
    rows["--resume after SIGTERM"] = cell(out.returncode, said(out, "greedy evaluation", "controller", "resumed"))

    checkpoints = sorted(run_dir.rglob("update_*.npz"))
    newest = checkpoints[-1]
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    metrics = sorted(run_dir.rglob("metrics.csv"))[-1]
    with open(metrics, "a") as f:
        f.write("999,1")  # a row cut off mid-write
    out = run(script(algo, "--resume", str(run_dir), tiny=False))
    rows["newest checkpoint bit-flipped + half-written metrics row, then --resume"] = cell(
        out.returncode, said(out, "skipping damaged checkpoint"))
    return rows


def faults(out_path: Path) -> str:
    os.environ.setdefault("JAXZOO_CACHE_DIR", str(Path(tempfile.gettempdir()) / "jaxzoo-reliability-cache"))
    results = {}
    with tempfile.TemporaryDirectory(prefix="reliability-") as workdir:
        for algo in ALGOS:
            start = time.time()
            results[algo] = faults_of(algo, Path(workdir))
            print(f"{algo}: {time.time() - start:.0f} s", file=sys.stderr, flush=True)
    lines = ["| fault | " + " | ".join(f"{a}.py" for a in ALGOS) + " |", "|---" * (len(ALGOS) + 1) + "|"]
    for fault in results[ALGOS[0]]:
        lines.append(f"| {fault} | " + " | ".join(results[a].get(fault, "n/a") for a in ALGOS) + " |")
    return "\n".join(lines)


def registry(out_path: Path, algos: list[str]) -> str:
    """Every gymnax env on every file's tiny preset: built, then its whole
    `train` compiled and run (a refusal is a ValueError from `make_train`)."""
    import jax

    from jaxzoo import cli, envs

    lines = ["| file | ran (tiny preset, compiled and run) | refused at start-up | crashed |", "|---|---|---|---|"]
    for algo in algos:
        module = importlib.import_module(f"jaxzoo.algos.{algo}")
        base = cli.preset_args(module.Args, algo, "tiny")
        ran, refused, crashed = [], [], []
        for env_id in envs.ENV_IDS:
            start = time.time()
            try:  # a refusal is a ValueError at start-up, naming the env
                functions = module.make_train(dataclasses.replace(base, env_id=env_id))
            except ValueError as error:
                refused.append(env_id if env_id in str(error) else f"{env_id} (unnamed: {error})")
                continue
            try:  # every file's train(key) runs the whole (tiny) run; World Models' fuses its stages
                outputs = jax.block_until_ready(jax.jit(functions.train)(jax.random.key(0)))
                finite = all(bool(jax.numpy.isfinite(x).all()) for x in jax.tree.leaves(outputs)
                             if jax.numpy.issubdtype(x.dtype, jax.numpy.inexact))
                ran.append(env_id if finite else f"{env_id} (NON-FINITE)")
            except Exception as error:  # noqa: BLE001
                crashed.append(f"{env_id}: {type(error).__name__}: {str(error)[:80]}")
            print(f"{algo} {env_id}: {time.time() - start:.1f} s", file=sys.stderr, flush=True)
        lines.append(f"| {algo}.py | {len(ran)}: {', '.join(ran)} | {len(refused)}: {', '.join(refused)} | "
                     f"{len(crashed)}{': ' + ', '.join(crashed) if crashed else ''} |")
    return "\n".join(lines)


def latency(out_path: Path) -> str:
    """Seconds from SIGTERM to exit on each file's default run (not the tiny
    preset): started, signalled once its third metrics row is written (past
    the first, timed chunk), with the time per update read from metrics.csv."""
    lines = ["| file (default run) | seconds per update | SIGTERM to exit | exit code | checkpoint at |",
             "|---|---|---|---|---|"]
    for algo in ("ppo", "unizero"):
        with tempfile.TemporaryDirectory(prefix=f"latency-{algo}-") as root:
            process = subprocess.Popen(script(algo, "--run-root", root, tiny=False), stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, cwd=ROOT)
            end = time.time() + 900
            while time.time() < end and process.poll() is None:
                rows = [p.read_text().splitlines() for p in Path(root).rglob("metrics.csv")]
                if rows and len({line.split(",")[0] for line in rows[0][1:]}) >= 3:
                    break
                time.sleep(0.05)
            sent = time.time()
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=900)
            answered = time.time() - sent
            from jaxzoo import checkpoint, logger

            run_dir = only_run_dir(Path(root))
            metrics = logger.read_metrics(run_dir)
            mine = metrics["seed_index"] == 0
            ends, sizes = np.unique(metrics["wall_seconds"][mine], return_counts=True)  # one value per chunk
            per_update = float(np.median(np.diff(ends) / sizes[1:])) if len(ends) > 1 else float("nan")
            lines.append(f"| {algo}.py | {per_update:.3f} s | {answered:.1f} s | {process.returncode} | "
                         f"update {checkpoint.latest_update(run_dir)} |")
            print(lines[-1], file=sys.stderr, flush=True)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", choices=["faults", "registry", "latency"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--algos", nargs="+", choices=ALGOS, default=ALGOS, help="registry: these files only")
    args = parser.parse_args()
    start = time.time()
    if args.table == "registry":
        table = registry(args.out, args.algos)
    else:
        table = {"faults": faults, "latency": latency}[args.table](args.out)
    import platform

    only = f" --algos {' '.join(args.algos)}" if args.table == "registry" and args.algos != ALGOS else ""
    header = (f"<!-- python benchmarks/reliability.py {args.table}{only}; {time.strftime('%Y-%m-%d')}, "
              f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
              f"{time.time() - start:.0f} s -->")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(header + "\n" + table + "\n")
    print(header + "\n" + table)


if __name__ == "__main__":
    main()
