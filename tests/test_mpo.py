"""algos/mpo.py end to end: smoke, determinism, resume, non-finite skipping, bad input."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxzoo.algos import mpo
from jaxzoo import cli, logger
from conftest import assert_killed_run_resumes_exactly


def tiny(tmp_path, **overrides) -> mpo.Args:
    return dataclasses.replace(cli.preset_args(mpo.Args, "mpo", "tiny"), run_root=str(tmp_path), **overrides)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    args = tiny(tmp_path_factory.mktemp("runs"), num_seeds=2)
    return args, mpo.main(args)


def test_smoke_two_seeds(tiny_run):
    args, result = tiny_run
    assert result.chunk_traces == 1
    for name in ("critic_loss", "policy_loss", "temperature", "alpha_mean", "alpha_stddev", "kl_mean", "kl_stddev",
                 "kl_q_rel", "q_weight_entropy", "policy_std_min"):
        assert np.isfinite(result.metrics[name][:, -1]).all(), name
    assert (result.metrics["skipped_updates"] == 0).all()
    assert np.isfinite(result.eval_returns).all()
    assert len(logger.read_metrics(result.run_dir)["update"]) == 2 * args.num_updates


def test_same_seed_gives_identical_metrics(tiny_run, tmp_path):
    args, first = tiny_run
    second = mpo.main(dataclasses.replace(args, run_root=str(tmp_path)))
    for name in ("critic_loss", "temperature", "episode_return"):
        np.testing.assert_array_equal(first.metrics[name], second.metrics[name], err_msg=name)


def test_killed_and_resumed_run_matches_uninterrupted(tiny_run, tmp_path, monkeypatch):
    # 6 updates, chunks of 2, a checkpoint every 4
    args, full = tiny_run
    assert_killed_run_resumes_exactly(mpo, dataclasses.replace(args, run_root=str(tmp_path)), 6, 4, monkeypatch, full)


def learner_and_windows(args, reward=0.0):
    algo = mpo.make_train(args)
    state = jax.jit(algo.init)(jax.random.key(0))
    B, n, O, A = args.batch_size, args.n_step, algo.spec.obs_shape[0], algo.spec.num_actions
    w = mpo.Transition(obs=jnp.ones((B, n, O)), action=jnp.zeros((B, n, A)), log_prob=jnp.zeros((B, n)),
                       reward=jnp.full((B, n), reward), terminated=jnp.zeros((B, n), bool),
                       truncated=jnp.zeros((B, n), bool), next_obs=jnp.ones((B, n, O)))
    return algo, state.learner, w


def test_non_finite_batches_are_skipped_and_counted(tmp_path):
    algo, learner, windows = learner_and_windows(tiny(tmp_path), reward=float("nan"))
    new, _ = jax.jit(algo.learner_step)(learner, windows, jax.random.key(1))
    assert int(new.skipped) == 1 and int(new.steps) == int(learner.steps)
    for a, b in zip(jax.tree.leaves(new.critic), jax.tree.leaves(learner.critic)):
        np.testing.assert_array_equal(a, b)


def test_truncation_bootstraps_and_termination_does_not(tmp_path):
    args = tiny(tmp_path)
    algo, learner, windows = learner_and_windows(args, reward=1.0)
    metrics_for = {}
    for name, term, trunc in (("terminated", True, False), ("truncated", False, True)):
        w = windows._replace(terminated=jnp.full_like(windows.terminated, term),
                             truncated=jnp.full_like(windows.truncated, trunc))
        _, metrics_for[name] = jax.jit(algo.learner_step)(learner, w, jax.random.key(1))
    # Same batch but the bootstrap: the critic's error differs.
    assert float(metrics_for["terminated"]["critic_loss"]) != float(metrics_for["truncated"]["critic_loss"])


def test_duals_are_projected_not_frozen(tmp_path):
    algo, learner, windows = learner_and_windows(tiny(tmp_path))
    learner = learner.replace(duals=learner.duals.replace(temperature=jnp.float32(-30.0)))
    new, _ = jax.jit(algo.learner_step)(learner, windows, jax.random.key(1))
    assert float(new.duals.temperature) >= -18.0


def test_discrete_action_space_is_refused(tmp_path):
    with pytest.raises(ValueError, match="discrete action space"):
        mpo.make_train(tiny(tmp_path, env_id="CartPole-v1"))


def test_retrace_variant_runs(tmp_path):
    algo = mpo.make_train(tiny(tmp_path, critic_target="retrace", n_step=3))
    state, metrics = jax.jit(algo.train)(jax.random.key(0))
    assert np.isfinite(np.asarray(metrics["critic_loss"])[-1]) and int(state.learner.skipped) == 0


def test_penalty_and_polyak_variant_traces(tmp_path):
    """Action penalisation with Polyak targets: the whole run traces with the
    same shapes (jax.eval_shape, no compile; the penalty's math is in test_mpo_math)."""
    args = tiny(tmp_path, action_penalization=True, tau=0.05)
    state, metrics = jax.eval_shape(mpo.make_train(args).train, jax.random.key(0))
    assert metrics["critic_loss"].shape == (args.num_updates,)
    assert jax.tree.structure(state) == jax.tree.structure(jax.eval_shape(mpo.make_train(tiny(tmp_path)).init, jax.random.key(0)))
