"""common/logger.py and common/plot.py."""


import numpy as np
import pytest

from jaxzoo import logger, plot
from jaxzoo.algos.ppo import Args


def chunk(updates, seeds=2, value=1.0):
    updates = np.asarray(updates)
    return updates, updates * 10, {
        "episode_return": np.full((seeds, len(updates)), value),
        "loss": np.arange(seeds * len(updates), dtype=float).reshape(seeds, -1),
    }


def test_csv_has_one_row_per_update_per_seed_and_resume_truncates(tmp_path):
    args = Args(run_root=str(tmp_path), num_seeds=2, seed=5)
    run = logger.Run(args, total_steps=100, tensorboard=True)
    run.log(*chunk([1, 2, 3]))
    run.log(*chunk([4, 5]))
    run.close()
    columns = logger.read_metrics(run.dir)
    assert list(columns)[:4] == ["update", "global_step", "seed_index", "seed"]
    assert len(columns["update"]) == 10 and set(columns["seed"]) == {5.0, 6.0}
    assert list((run.dir / "tensorboard").glob("events.out.tfevents.*"))
    resumed = logger.Run(args, run.dir, total_steps=100, resume_from_update=3)
    resumed.log(*chunk([4, 5], value=2.0))
    resumed.close()
    columns = logger.read_metrics(run.dir)
    assert sorted(columns["update"]) == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert (columns["episode_return"][columns["update"] > 3] == 2.0).all()


def test_progress_line_reports_rate_and_return(tmp_path, capsys):
    run = logger.Run(Args(run_root=str(tmp_path)), total_steps=50)
    updates, steps, metrics = chunk([5], seeds=1, value=42.0)
    metrics["steps_per_second"] = np.full((1, 1), 1234.0)
    run.log(updates, steps, metrics)
    out = capsys.readouterr().out
    assert "1,234 steps/s" in out and "return 42.00" in out and "100.0%" in out


def test_plot_writes_png_with_band(tmp_path):
    args = Args(run_root=str(tmp_path), num_seeds=3)
    run = logger.Run(args, total_steps=100, quiet=True)
    rng = np.random.default_rng(0)
    for u in range(1, 11):
        returns = rng.normal(u, 1.0, size=(3, 1))
        returns[0, 0] = np.nan if u == 4 else returns[0, 0]  # a gap: no episode finished
        run.log(np.array([u]), np.array([u * 10]), {"episode_return": returns})
    run.close()
    steps, curves = plot.seed_curves(run.dir)
    assert len(curves) == 3 and np.isfinite(curves[0][3])  # the gap is filled forward
    out = plot.plot_runs([run.dir], tmp_path / "curve.png", title="test")
    assert out.exists() and out.stat().st_size > 1000
    mean, half = plot.mean_and_ci(curves)
    assert mean.shape == steps.shape and (half >= 0).all()


def test_plot_rejects_unknown_metric(tmp_path):
    run = logger.Run(Args(run_root=str(tmp_path)), total_steps=10, quiet=True)
    run.log(*chunk([1], seeds=1))
    run.close()
    with pytest.raises(ValueError, match="no column 'nope'"):
        plot.seed_curves(run.dir, "nope")


def test_trailing_mean_has_no_edge_dip_and_skips_nans():
    flat = np.full(10, 200.0)
    np.testing.assert_allclose(plot.trailing_mean(flat, 5), flat)  # "same"-mode convolution dipped to 120 at the ends
    y = np.array([np.nan, 1.0, 3.0, np.nan, 5.0])
    np.testing.assert_allclose(plot.trailing_mean(y, 2), [np.nan, 1.0, 2.0, 3.0, 5.0])
