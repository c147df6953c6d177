"""Open-loop video predictions of a trained PlaNet against the real frames, from
a run directory's newest checkpoint (benchmarks/planet.sh, group `video`).

For every seed, the episode the run collected last (after the last model
update, so the model never trained on it) is cut into windows of
`context + horizon` agent steps. The model filters the first `context` frames
with the posterior, then predicts the next `horizon` frames open loop with the
prior from the recorded actions alone (algos/planet.py:
`open_loop_prediction`, prior means). Writes

    docs/img/planet_open_loop.png        real frames above the model's, per seed
    docs/img/planet_open_loop_error.png  squared error per open-loop step
    <out>/open_loop.json                 the numbers behind the second figure
    <out>/learning.json                  per seed: episodes, training returns, evaluations

    python benchmarks/planet_figures.py benchmarks/out/planet/cpu/Pendulum-v1__planet-cpu__0__*
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from jaxzoo import checkpoint, cli, logger, runner  # noqa: E402
from jaxzoo.algos import planet  # noqa: E402

IMG = Path(__file__).resolve().parent.parent / "docs" / "img"


def load(run_dir: str):
    """(args, algo, state with leaves [num_seeds, ...], update) from the newest checkpoint."""
    args = cli.load_run_args(planet.Args, run_dir)
    algo = planet.make_train(args)
    seeds = args.seed + np.arange(args.num_seeds, dtype=np.int32)
    template = jax.eval_shape(lambda s: runner.init_seeds(algo.init, s), seeds)
    state, update = checkpoint.restore(run_dir, template)
    return args, algo, state, update


def last_episode(args, state, seed: int) -> planet.Step:
    """The newest complete episode in one seed's replay: leaves [L + 1, ...]
    (first frame, then one row per agent step)."""
    buffer = jax.tree.map(lambda x: np.asarray(x[seed]), state.buffer)
    slots = args.episode_steps + 1
    size, position = int(buffer.size), int(buffer.position)
    if size < slots:
        raise ValueError(f"seed {seed}: replay holds {size} rows, less than one episode ({slots})")
    rows = (position - slots + np.arange(slots)) % buffer.rows
    episode = jax.tree.map(lambda x: x[rows, 0], buffer.data)
    if not episode.first[0] or episode.first[1:].any():
        raise ValueError(f"seed {seed}: the last {slots} replay rows are not one episode")
    return planet.Step(*episode)


def predict(args, algo, params, windows: planet.Step, context: int, key):
    """windows: leaves [B, T, ...]. Returns (target [T, B, S, S, C], decoded
    [T, B, ...], predicted reward [T, B] in environment units, true reward [T, B])."""
    model = nnx.merge(algo.graphdef, params)
    time_major = jax.tree.map(lambda x: jnp.swapaxes(jnp.asarray(x), 0, 1), windows)
    images = planet.preprocess_obs(time_major.obs, args.bit_depth, key)
    noise = jnp.zeros((*time_major.first.shape, args.state_size))  # prior and posterior means
    decoded, reward = planet.open_loop_prediction(model, images, time_major.action, time_major.first, context, noise)
    return images, decoded, reward / args.reward_scale, time_major.reward


def learning_summary(run_dir: str) -> dict:
    """Per seed, from metrics.csv (a finished or a killed run): episodes done,
    the first and last 10 training returns (with exploration noise), every
    evaluation (planner without noise) and the training-loop seconds."""
    m = logger.read_metrics(run_dir)
    seeds = []
    for seed in np.unique(m["seed_index"]):
        rows = m["seed_index"] == seed
        returns, evals = m["episode_return"][rows], m.get("eval_return", np.full(rows.sum(), np.nan))[rows]
        has_eval = np.isfinite(evals)
        seeds.append({"seed": int(m["seed"][rows][0]), "episodes": int(m["update"][rows].max()),
                      "first10": float(returns[:10].mean()), "last10": float(returns[-10:].mean()),
                      "best_episode": float(returns.max()),
                      "evaluations": {int(u): float(e) for u, e in zip(m["update"][rows][has_eval], evals[has_eval])}})
    return {"seeds": seeds, "train_seconds": float(np.nanmax(m["wall_seconds"]))}


def show(ax, image, title=None):
    image = np.clip(np.asarray(image, np.float32) + 0.5, 0.0, 1.0)
    ax.imshow(image[..., 0] if image.shape[-1] == 1 else image, cmap="gray", vmin=0, vmax=1)
    ax.set_xticks([]), ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir")
    parser.add_argument("--context", type=int, default=5, help="frames filtered with the posterior")
    parser.add_argument("--horizon", type=int, default=25, help="frames predicted open loop")
    parser.add_argument("--every", type=int, default=2, help="show every this many frames in the video figure")
    parser.add_argument("--out", default=None, help="directory for open_loop.json (default: the run's parent)")
    parser.add_argument("--prefix", default="planet", help="figure names: docs/img/<prefix>_open_loop*.png")
    cli_args = parser.parse_args()
    args, algo, state, update = load(cli_args.run_dir)
    context, horizon = cli_args.context, cli_args.horizon
    length = context + horizon
    if length > args.episode_steps + 1:
        raise ValueError(f"context + horizon = {length} exceeds an episode's {args.episode_steps + 1} frames")
    run = jax.jit(lambda params, windows, key: predict(args, algo, params, windows, context, key))

    errors, copy_errors, reward_errors, videos = [], [], [], []
    for seed in range(args.num_seeds):
        params = jax.tree.map(lambda x: x[seed], state.params)
        episode = last_episode(args, state, seed)
        starts = np.arange(0, args.episode_steps + 2 - length)
        windows = jax.tree.map(lambda x: np.stack([x[s: s + length] for s in starts]), episode)
        target, decoded, reward, true_reward = jax.device_get(run(params, windows, jax.random.key(seed)))
        # Squared error summed over pixels, per open-loop step, mean over windows [horizon].
        errors.append(np.square(decoded[context:] - target[context:]).sum((-3, -2, -1)).mean(1))
        # Baseline: the last context frame held still.
        copy_errors.append(np.square(target[context - 1][None] - target[context:]).sum((-3, -2, -1)).mean(1))
        reward_errors.append(np.abs(reward[context:] - true_reward[context:]).mean(1))
        videos.append((target[:, 0], decoded[:, 0], reward[:, 0], true_reward[:, 0]))
    errors, copy_errors, reward_errors = map(np.stack, (errors, copy_errors, reward_errors))

    # Figure 1: per seed, the real frames above the model's.
    shown = list(range(0, length, cli_args.every))
    fig, axes = plt.subplots(2 * args.num_seeds, len(shown), figsize=(0.62 * len(shown), 1.3 * args.num_seeds + 0.6),
                             squeeze=False)
    for seed, (target, decoded, _, _) in enumerate(videos):
        for c, t in enumerate(shown):
            label = f"t={t}" if t < context else f"+{t - context + 1}"
            show(axes[2 * seed, c], target[t], label if seed == 0 else None)
            show(axes[2 * seed + 1, c], decoded[t])
            if t >= context:
                for side in axes[2 * seed + 1, c].spines.values():
                    side.set_edgecolor("tab:red")
        axes[2 * seed, 0].set_ylabel(f"seed {seed}\nreal", fontsize=7)
        axes[2 * seed + 1, 0].set_ylabel("model", fontsize=7)
    fig.suptitle(f"PlaNet ({args.exp_name}, after {update} planned episodes) on pixel {args.env_id}, each seed's last "
                 f"episode:\n{context} context frames filtered, then {horizon} predicted open loop from the actions "
                 f"alone (red frames); one step = {args.action_repeat} env steps", fontsize=8)
    fig.tight_layout(pad=0.3)
    IMG.mkdir(parents=True, exist_ok=True)
    fig.savefig(IMG / f"{cli_args.prefix}_open_loop.png", dpi=110)
    plt.close(fig)

    # Figure 2: error per open-loop step, and one episode's rewards.
    steps = np.arange(1, horizon + 1)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
    for seed in range(args.num_seeds):
        axes[0].plot(steps, errors[seed], color="tab:blue", alpha=0.35, lw=1)
    axes[0].plot(steps, errors.mean(0), color="tab:blue", lw=2, label="model, open loop (each seed, mean)")
    axes[0].plot(steps, copy_errors.mean(0), color="tab:gray", lw=2, ls="--", label="last context frame held")
    axes[0].set_xlabel("open-loop step (agent steps)")
    axes[0].set_ylabel("squared error, summed over pixels")
    axes[0].legend(fontsize=7)
    axes[0].set_title(f"{errors.shape[0]} seeds x {len(starts)} windows of each seed's last episode", fontsize=8)
    _, _, reward, true_reward = videos[0]
    axes[1].plot(np.arange(1, length), true_reward[1:], "k", label="real")
    axes[1].plot(np.arange(1, length), reward[1:], "tab:red", label="model")
    axes[1].axvline(context - 0.5, color="gray", ls=":")
    axes[1].set_xlabel("agent step (left of the dotted line: filtered)")
    axes[1].set_ylabel(f"reward per agent step ({args.action_repeat} env steps)")
    axes[1].legend(fontsize=7)
    axes[1].set_title("seed 0, first window: rewards", fontsize=8)
    fig.tight_layout()
    fig.savefig(IMG / f"{cli_args.prefix}_open_loop_error.png", dpi=110)
    plt.close(fig)

    summary = {
        "run_dir": str(cli_args.run_dir), "update": update, "context": context, "horizon": horizon,
        "windows_per_seed": len(starts),
        "image_error_per_step": errors.mean(0).tolist(), "image_error_per_step_per_seed": errors.tolist(),
        "held_frame_error_per_step": copy_errors.mean(0).tolist(),
        "reward_abs_error_per_step": reward_errors.mean(0).tolist(),
    }
    out = Path(cli_args.out) if cli_args.out else Path(cli_args.run_dir).parent
    out.mkdir(parents=True, exist_ok=True)
    (out / "open_loop.json").write_text(json.dumps(summary, indent=1) + "\n")
    curves = learning_summary(cli_args.run_dir)
    (out / "learning.json").write_text(json.dumps(curves, indent=1) + "\n")
    for seed in curves["seeds"]:
        print(f"seed {seed['seed']}: {seed['episodes']} episodes, training return first 10 {seed['first10']:.1f}, "
              f"last 10 {seed['last10']:.1f}, best {seed['best_episode']:.1f}; evaluations "
              + ", ".join(f"{u}: {e:.1f}" for u, e in seed["evaluations"].items()))
    print(f"training loop {curves['train_seconds']:.0f} s")
    for k in (1, 5, 10, horizon):
        if k <= horizon:
            print(f"open-loop step {k:2d}: image error {errors[:, k - 1].mean():7.2f} (per seed "
                  + ", ".join(f"{e:.2f}" for e in errors[:, k - 1])
                  + f"); held frame {copy_errors[:, k - 1].mean():7.2f}; |reward error| "
                  f"{reward_errors[:, k - 1].mean():.2f}")


if __name__ == "__main__":
    main()
