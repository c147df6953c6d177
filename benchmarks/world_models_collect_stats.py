"""What a World Models run's random rollouts show V: per run, the episodes'
lengths and returns, and how much of each 64 x 64 frame is road or grass, on
the CarRacing runs of docs/world_models.md (uniform against the authors'
random controller, `--collect-policy`).

    python benchmarks/world_models_collect_stats.py RUN_DIR [RUN_DIR ...]

Road: grey pixels (R, G, B within 12 of each other, R in 80-140); grass: G
at least 30 above R. A frame "without road" has under 1% road pixels.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from jaxzoo import cli
from jaxzoo.algos import world_models as wm


def frame_stats(frames: np.ndarray, valid: np.ndarray) -> dict[str, float]:
    """frames [N, T + 1, S, S, 3] uint8, valid [N, T] -> the share of road and
    grass pixels over the episodes' frames (each episode's T_i + 1)."""
    lengths = valid.sum(1)
    seen = np.concatenate([valid, np.zeros_like(valid[:, :1])], 1)
    seen[np.arange(len(lengths)), lengths] = True  # the frame each episode ended on
    pixels = frames[seen].astype(np.int16)  # [frames, S, S, 3]
    r, g, b = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    road = ((abs(r - g) < 12) & (abs(g - b) < 12) & (r > 80) & (r < 140)).mean((1, 2))
    grass = (g > r + 30).mean((1, 2))
    return {
        "episodes": len(lengths),
        "mean_length": float(lengths.mean()),
        "frames": int(seen.sum()),
        "road": float(road.mean()),
        "grass": float(grass.mean()),
        "frames_without_road": float((road < 0.01).mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+")
    for run in parser.parse_args().runs:
        args = cli.load_run_args(wm.Args, run)
        world = wm.make_train(args)
        seeds = args.seed + np.arange(args.num_seeds, dtype=np.int32)
        rollouts = wm.load_stage(Path(run), "collect", world.collect, seeds, None, world)
        for j in range(args.num_seeds):
            valid = np.asarray(rollouts.valid[j])
            stats = frame_stats(np.asarray(rollouts.frames[j]), valid)
            returns = np.asarray(rollouts.rewards[j]).sum(1)[valid.any(1)]
            print(
                f"{run} seed {int(seeds[j])} collect_policy={args.collect_policy}: {stats['episodes']} episodes, "
                f"mean length {stats['mean_length']:.1f}, return {returns.mean():.1f}, {stats['frames']} frames: "
                f"road {stats['road']:.3f}, grass {stats['grass']:.3f} of the pixels, "
                f"{stats['frames_without_road']:.3f} of the frames without road"
            )


if __name__ == "__main__":  # CarRacingHost's fork server re-imports this module
    main()
