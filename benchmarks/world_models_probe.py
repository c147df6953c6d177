"""How much of pixel CartPole's state V's latent keeps (issue 26): frames of
CartPole states rendered as the pixel env renders them, x uniform in [-0.6,
0.6] and the pole angle in [-0.25, 0.25] rad (the region where random play and
the evolved controllers end), velocities 0; V's posterior means z; then a
least-squares probe from z to x and to the angle (linear, and with z^2 added),
fitted on 3,000 frames and scored on 1,000 others. Per seed of a run:

    python benchmarks/world_models_probe.py RUN_DIR
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

from jaxzoo import pixels
from jaxzoo.algos import world_models as wm


def probe(features: np.ndarray, target: np.ndarray, fit: slice, score: slice) -> tuple[float, float]:
    """(R^2, residual std) of a least-squares fit with a bias, scored on held-out rows."""
    design = np.concatenate([features, np.ones((len(features), 1))], 1)
    weights, *_ = np.linalg.lstsq(design[fit], target[fit], rcond=None)
    residual = design[score] @ weights - target[score]
    return 1 - residual.var() / target[score].var(), float(residual.std())


def main(run_dir: str, frames_count: int = 4000) -> None:
    args, world_models, outputs = wm.load_run(run_dir)
    if args.env_id != "CartPole-v1":
        raise SystemExit(f"{run_dir}: a CartPole-v1 run is needed, not {args.env_id}")
    rng = np.random.default_rng(0)
    x, angle = rng.uniform(-0.6, 0.6, frames_count), rng.uniform(-0.25, 0.25, frames_count)
    states = jnp.asarray(np.stack([x, np.zeros(frames_count), angle, np.zeros(frames_count)], 1), jnp.float32)
    frames = wm.pixels_to_uint8(jax.vmap(lambda s: pixels.render_cartpole(s, args.image_size, args.grayscale))(states))
    fit, score = slice(0, 3 * frames_count // 4), slice(3 * frames_count // 4, frames_count)
    for seed in range(args.num_seeds):
        z = np.asarray(world_models.encode(jax.tree.map(lambda a: a[seed], outputs["vae"].params), frames)[0])
        x_r2, x_std = probe(z, x, fit, score)
        a_r2, a_std = probe(z, angle, fit, score)
        q_r2, q_std = probe(np.concatenate([z, z**2], 1), angle, fit, score)
        print(f"seed {args.seed + seed}: x R2 {x_r2:.3f} (residual {x_std:.3f}); angle R2 {a_r2:.3f} "
              f"(residual {np.degrees(a_std):.2f} deg), with z^2 R2 {q_r2:.3f} (residual {np.degrees(q_std):.2f} deg)")


if __name__ == "__main__":
    main(sys.argv[1])
