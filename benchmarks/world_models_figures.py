"""Figures and the results table of docs/world_models.md from the runs of
benchmarks/world_models.sh: reconstructions, dream rollouts, CMA-ES curves,
V and M losses, and benchmarks/out/world_models/summary.md.

    python benchmarks/world_models_figures.py benchmarks/out/world_models
    python benchmarks/world_models_figures.py --carracing RUN_DIR [RUN_DIR ...]   # CarRacing runs, one per seed
    python benchmarks/world_models_figures.py --keep-carracing RUN_DIR NAME       # only keep its small files as NAME

With --carracing: V's reconstructions of real frames and a dream of M
decoded by V (the first run's seed), every seed's CMA-ES curve in one panel
each, and the first run's evaluation video (--capture-video) as a GIF:
docs/img/world_models_carracing_*. Each run's small files (args, evaluation,
summary, each stage's metrics.csv) are kept in docs/data/world_models_carracing/seed<N>/
(a seed takes hours, so each session's seed is committed there and the curves
are drawn from every seed kept, not only the runs on this machine).
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from jaxzoo import logger  # noqa: E402
from jaxzoo.algos import world_models as wm  # noqa: E402

IMG = Path(__file__).resolve().parent.parent / "docs" / "img"
CARRACING_DATA = IMG.parent / "data" / "world_models_carracing"


def first_seed(tree):
    return jax.tree.map(lambda x: x[0], tree)


def show(ax, frame, title=None):
    frame = np.asarray(frame, np.float32)
    frame = frame / 255.0 if frame.max() > 1.5 else frame
    ax.imshow(frame[..., 0] if frame.shape[-1] == 1 else frame, cmap="gray", vmin=0, vmax=1)
    ax.set_xticks([]), ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=8)


def reconstructions(world_models, outputs, path, count=8, env="pixel CartPole"):
    data, params = first_seed(outputs["collect"]), first_seed(outputs["mdn"]).params
    lengths = np.asarray(data.valid.sum(1))
    rng = np.random.default_rng(0)
    rollouts = rng.choice(len(lengths), count, replace=False)
    frames = jnp.stack([data.frames[i, rng.integers(0, lengths[i] + 1)] for i in rollouts])
    mean, _ = world_models.encode(params, frames)
    decoded = world_models.merge(params).vae.decode(mean)
    fig, axes = plt.subplots(2, count, figsize=(1.3 * count, 2.9))
    for j in range(count):
        show(axes[0, j], frames[j], "real" if j == 0 else None)
        show(axes[1, j], decoded[j], "V(z) decoded" if j == 0 else None)
    fig.suptitle(f"V on {env}: real frames (top) and their reconstructions from z = mean of q(z|x)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def dreams(world_models, args, outputs, theta, path, steps=24, every=2):
    """Dreams from one real first frame at two temperatures under C, and under
    C = 0 (a constant action), each z decoded by V."""
    data, params = first_seed(outputs["collect"]), first_seed(outputs["mdn"]).params
    first = data.frames[3, 0]
    z0, _ = world_models.encode(params, first[None])
    rows = {}
    for label, controller, tau in (("C, tau 0.5", theta, 0.5), (f"C, tau {args.dream_temperature}", theta, args.dream_temperature),
                                   ("C = 0, tau 1.0", jnp.zeros_like(theta), 1.0)):
        dream = world_models.dream(params, controller, z0[0], jax.random.key(1), steps, tau)
        rows[label] = (world_models.merge(params).vae.decode(dream[0]), np.asarray(dream[1]))
    fig, axes = plt.subplots(len(rows), steps // every + 1, figsize=(0.9 * (steps // every + 1), 1.2 * len(rows) + 0.5))
    for r, (label, (frames, done)) in enumerate(rows.items()):
        for c, t in enumerate(range(0, steps + 1, every)):
            show(axes[r, c], frames[t], f"t={t}" if r == 0 else None)
            if t > 0 and done[:t].any():
                axes[r, c].set_facecolor("red")
                for side in axes[r, c].spines.values():
                    side.set_color("red")
        axes[r, 0].set_ylabel(label, fontsize=8)
    fig.suptitle("Dreams from a real first frame, decoded by V: under the real-trained C, and under C = 0 (always "
                 "action 0: pushes left, the pole falls right). Red frame: M's done head has fired", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def carracing_dream(world_models, args, outputs, theta, path, steps=48, every=4):
    """M's dreams from a real first frame under the evolved C at two
    temperatures, each z decoded by V, beside the real frames of that rollout
    (random actions: not the dream's, a reference for what the track looks like)."""
    data, params = first_seed(outputs["collect"]), first_seed(outputs["mdn"]).params
    z0, _ = world_models.encode(params, data.frames[0, 0][None])
    rows = {"real (random actions)": data.frames[0, : steps + 1]}
    for tau in (1.0, args.dream_temperature):
        dream = world_models.dream(params, theta, z0[0], jax.random.key(1), steps, tau)
        rows[f"dream, C, tau {tau}"] = world_models.merge(params).vae.decode(dream[0])
    columns = steps // every + 1
    fig, axes = plt.subplots(len(rows), columns, figsize=(0.9 * columns, 1.2 * len(rows) + 0.5))
    for r, (label, frames) in enumerate(rows.items()):
        for c, t in enumerate(range(0, steps + 1, every)):
            show(axes[r, c], frames[t], f"t={t}" if r == 0 else None)
        axes[r, 0].set_ylabel(label, fontsize=7)
    fig.suptitle("CarRacing-v3: M's dreams from a real first frame, decoded by V", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def carracing(run_dirs: list[Path]):
    """docs/img/world_models_carracing_{reconstructions,dream,cmaes}.png and _agent.gif."""
    args, world_models, outputs = wm.load_run(run_dirs[0])
    theta = first_seed(outputs["controller"]).cma.mean
    reconstructions(world_models, outputs, IMG / "world_models_carracing_reconstructions.png", env="CarRacing-v3")
    carracing_dream(world_models, args, outputs, theta, IMG / "world_models_carracing_dream.png")
    for run_dir in run_dirs:
        keep_carracing_run(run_dir)
    runs = {}
    for kept in sorted(CARRACING_DATA.glob("seed*")):
        summary = json.loads((kept / "eval.json").read_text())
        seed = json.loads((kept / "args.json").read_text())["seed"]
        runs[f"seed {seed}: {summary['mean']:.1f} +- {summary['std']:.1f} over 100 real episodes"] = kept
    cma_curves(runs, IMG / "world_models_carracing_cmaes.png")
    videos = sorted((run_dirs[0] / "videos").glob("*-seed*.mp4"))
    if videos:
        from jaxzoo import video

        video.main([str(videos[0]), str(IMG / "world_models_carracing_agent.gif"), "--every", "4", "--width", "96",
                    "--max-frames", "100"])
    else:
        print(f"no evaluation video in {run_dirs[0] / 'videos'} (run with --capture-video): no GIF")


def keep_carracing_run(run_dir: Path, name: str | None = None):
    """A finished CarRacing run's small files (args, evaluation, summary, run
    info, each stage's metrics.csv it has) -> docs/data/world_models_carracing/<name>/,
    by default seed<N>."""
    name = name or f"seed{json.loads((run_dir / 'args.json').read_text())['seed']}"
    kept = CARRACING_DATA / name
    files = ["args.json", "eval.json", "summary.json", "run_info.json"]
    files += [f"{stage}/metrics.csv" for stage in ("vae", "mdn", "controller")]
    for file in files:
        if (run_dir / file).exists():
            (kept / file).parent.mkdir(parents=True, exist_ok=True)
            (kept / file).write_bytes((run_dir / file).read_bytes())
    print(f"kept {run_dir} -> {kept}")


def controller_panels(runs: dict[str, Path], path, ylabel: str, draw):
    """One panel per run of its controller stage's metrics: draw(ax, run_dir, metrics) adds the lines."""
    fig, axes = plt.subplots(1, len(runs), figsize=(5.2 * len(runs), 3.4), squeeze=False)
    for ax, (label, run_dir) in zip(axes[0], runs.items()):
        draw(ax, run_dir, logger.read_metrics(run_dir / "controller"))
        ax.set_xlabel("CMA-ES generation")
        ax.set_ylabel(ylabel)
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cma_curves(runs: dict[str, Path], path):
    def draw(ax, run_dir, m):
        ax.plot(m["update"], m["fitness_best"], label="best of generation")
        ax.plot(m["update"], m["episode_return"], label="population mean")
        ax.plot(m["update"], m["best_ever"], "--", label="best so far")

    controller_panels(runs, path, "fitness (mean return over trials)", draw)


def seed_curves(runs: dict[str, Path], path):
    """CMA-ES population-mean fitness per generation, one line per seed, for
    multi-seed runs (the `seeds` part of benchmarks/world_models.sh)."""
    def draw(ax, run_dir, m):
        per_seed = json.loads((run_dir / "eval.json").read_text())["per_seed"]
        for index in np.unique(m["seed_index"]).astype(int):
            rows = m["seed_index"] == index
            ax.plot(m["update"][rows], m["episode_return"][rows],
                    label=f"seed {int(m['seed'][rows][0])}: real eval {per_seed[index][0]:.1f}")

    controller_panels(runs, path, "population mean fitness", draw)


def seeds_table(runs: dict[str, Path]) -> list[str]:
    lines = ["| run | seeds | return over 100 real episodes per seed (mean +- std) | mean over seeds +- std of seed means | "
             "seconds: collect / V / M / C / eval (all seeds) |", "| --- | --- | --- | --- | --- |"]
    for label, run_dir in runs.items():
        summary = json.loads((run_dir / "eval.json").read_text())
        means = np.array([mean for mean, _ in summary["per_seed"]])
        sec = summary["stage_seconds"]
        cells = " / ".join(f"{sec[k]:.0f}" if k in sec else "(reused)" for k in (*wm.STAGES, "evaluate"))
        per_seed = ", ".join(f"{mean:.1f} +- {std:.1f}" for mean, std in summary["per_seed"])
        lines.append(f"| {label} | {len(means)} | {per_seed} | {means.mean():.1f} +- {means.std():.1f} | {cells} |")
    return lines


def losses(run_dir: Path, path):
    vae, mdn = logger.read_metrics(run_dir / "vae"), logger.read_metrics(run_dir / "mdn")
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
    axes[0].plot(vae["update"], vae["reconstruction_loss"], label="reconstruction (sum of squares)")
    axes[0].plot(vae["update"], vae["kl"], label="KL (nats)")
    axes[0].set_title("V", fontsize=9)
    axes[1].plot(mdn["update"], mdn["z_nll"], label="z NLL (nats per dimension)")
    axes[1].set_title("M: mixture density", fontsize=9)
    for name in ("done_loss", "reward_loss", "done_accuracy"):
        if name in mdn:
            axes[2].plot(mdn["update"], mdn[name], label=name)
    axes[2].set_title("M: reward and done heads", fontsize=9)
    for ax in axes:
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()}, jax {jax.__version__}"


def main(out: Path):
    real_dir = next((out / "real").iterdir())
    dream_dir = next((out / "dream").iterdir()) if (out / "dream").exists() else None
    args, world_models, outputs = wm.load_run(real_dir)
    theta = first_seed(outputs["controller"]).cma.mean
    IMG.mkdir(parents=True, exist_ok=True)
    reconstructions(world_models, outputs, IMG / "world_models_reconstructions.png")
    dreams(world_models, args, outputs, theta, IMG / "world_models_dreams.png")
    runs = {"C evolved in the real env (fitness: real returns)": real_dir}
    if dream_dir is not None:
        saved = json.loads((dream_dir / "args.json").read_text())
        tau = saved.get("dream_temperature", saved.get("temperature"))  # runs before the rename: "temperature"
        runs[f"C evolved in M's dream, tau {tau} (fitness: dreamed returns)"] = dream_dir
    cma_curves(runs, IMG / "world_models_cmaes.png")
    losses(real_dir, IMG / "world_models_losses.png")

    lines = [f"machine: {machine()}", ""]
    time_file = out / "real.time"
    if time_file.exists():
        text = time_file.read_text()
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
        wall = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", text)
        lines.append(f"real run, whole process: wall {wall.group(1) if wall else '?'}, "
                     f"max RSS {int(rss.group(1)) / 1e6:.2f} GB" if rss else "")
        lines.append("")
    lines += ["| run | controller trained in | return over 100 real episodes (mean +- std) | last generation mean fitness | "
              "seconds: collect / V / M / C / eval |", "| --- | --- | --- | --- | --- |"]
    rows = [("pixel-cartpole", real_dir), ("pixel-cartpole-dream (tau 2.0)", dream_dir)]
    for sweep in sorted(out.glob("dream-tau-*")):
        rows.append((f"pixel-cartpole-dream, tau {sweep.name.removeprefix('dream-tau-')}", next(sweep.iterdir())))
    for label, run_dir in rows:
        if run_dir is None:
            continue
        summary = json.loads((run_dir / "eval.json").read_text())
        sec = summary["stage_seconds"]
        cells = " / ".join(f"{sec[k]:.0f}" if k in sec else "(reused)" for k in (*wm.STAGES, "evaluate"))
        fitness = logger.read_metrics(run_dir / "controller")["episode_return"][-1]
        lines.append(f"| {label} | {summary['controller_env']} | {summary['mean']:.1f} +- {summary['std']:.1f} | "
                     f"{fitness:.1f} | {cells} |")
    if (out / "real-seeds").exists():
        seed_runs = {"C evolved in the real env": next((out / "real-seeds").iterdir())}
        if (out / "dream-seeds").exists():
            seed_runs["C evolved in M's dream (tau 2.0)"] = next((out / "dream-seeds").iterdir())
        seed_curves(seed_runs, IMG / "world_models_seeds.png")
        lines += ["", *seeds_table(seed_runs)]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--carracing"]:
        carracing([Path(p) for p in sys.argv[2:]])
    elif sys.argv[1:2] == ["--keep-carracing"] and len(sys.argv) == 4:  # a run that is not one seed's, e.g. the dream's
        keep_carracing_run(Path(sys.argv[2]), sys.argv[3])
    else:
        main(Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/out/world_models"))
