"""MPO's dual variables and realised KLs against their bounds, from run directories.

    python benchmarks/plot_duals.py benchmarks/out/mpo/pendulum/* benchmarks/out/mpo/acme/* --out docs/img/mpo_duals.png
"""

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from jaxzoo.logger import read_metrics

PANELS = [
    ("kl_q_rel", "E-step KL(q || pi) / epsilon", 1.0, "log"),
    ("kl_mean", "M-step KL, mean part (per dim)", "epsilon_mean", "log"),
    ("kl_stddev", "M-step KL, std part (per dim)", "epsilon_stddev", "log"),
    ("temperature", "temperature eta", None, "log"),
    ("alpha_mean", "alpha_mu", None, "log"),
    ("alpha_stddev", "alpha_sigma", None, "log"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run_dirs", nargs="+")
    parser.add_argument("--out", required=True)
    ns = parser.parse_args()
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
    for i, run_dir in enumerate(ns.run_dirs):
        args = json.loads((Path(run_dir) / "args.json").read_text())
        columns = read_metrics(run_dir)
        color = f"C{i}"
        for ax, (name, title, bound, scale) in zip(axes.flat, PANELS):
            for seed in np.unique(columns["seed"]):
                mask = columns["seed"] == seed
                ax.plot(columns["global_step"][mask], columns[name][mask], color=color, alpha=0.6, lw=0.8,
                        label=args["exp_name"] if seed == columns["seed"].min() else None)
            value = args.get(bound) if isinstance(bound, str) else bound
            if value is not None:
                ax.axhline(value, color=color, ls="--", lw=1)
            ax.set(title=title, yscale=scale, xlabel="env steps")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle("MPO duals and realised KLs (dashed: the bounds)")
    fig.tight_layout()
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(ns.out, dpi=110)
    print(ns.out)


if __name__ == "__main__":
    main()
