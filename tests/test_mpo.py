"""algos/mpo.py end to end: smoke, determinism, resume, non-finite batches (diverged, or skipped
with --skip-nonfinite), bad input."""

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_killed_run_resumes_exactly

from jaxzoo import buffers, cli, logger
from jaxzoo.algos import mpo


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
    assert "skipped_updates" not in result.metrics  # skip_nonfinite is off by default
    assert (np.asarray(result.state.learner.skipped) == 0).all()
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
    B, n, O, A = args.batch_size, args.n_step, algo.spec.obs_shape[0], algo.spec.num_actions  # noqa: E741 (shape letters)
    w = mpo.Transition(obs=jnp.ones((B, n, O)), action=jnp.zeros((B, n, A)), log_prob=jnp.zeros((B, n)),
                       reward=jnp.full((B, n), reward), terminated=jnp.zeros((B, n), bool),
                       truncated=jnp.zeros((B, n), bool), final_obs=jnp.ones((B, n, O)))
    return algo, state.learner, w


def test_non_finite_batches_are_skipped_and_counted(tmp_path):
    algo, learner, windows = learner_and_windows(tiny(tmp_path, skip_nonfinite=True), reward=float("nan"))
    new, _ = jax.jit(algo.learner_step)(learner, windows, jax.random.key(1))
    assert int(new.skipped) == 1 and int(new.gradient_steps) == int(learner.gradient_steps)
    for a, b in zip(jax.tree.leaves(new.critic), jax.tree.leaves(learner.critic)):
        np.testing.assert_array_equal(a, b)


def test_without_skipping_a_non_finite_batch_is_applied(tmp_path):
    """The default: nothing is skipped or counted; the step is applied, so the state holds the NaN."""
    algo, learner, windows = learner_and_windows(tiny(tmp_path), reward=float("nan"))
    new, _ = jax.jit(algo.learner_step)(learner, windows, jax.random.key(1))
    assert int(new.skipped) == 0 and int(new.gradient_steps) == int(learner.gradient_steps) + 1
    assert not all(np.isfinite(x).all() for x in jax.tree.leaves(new.critic))


@pytest.fixture
def nan_rewards_in_replay(monkeypatch):
    """Every replayed window gets NaN rewards (the buffer itself stays finite)."""
    original = buffers.sample

    def sample_with_nan_rewards(*args, **kwargs):
        drawn = original(*args, **kwargs)
        return drawn._replace(windows=drawn.windows._replace(reward=jnp.full_like(drawn.windows.reward, jnp.nan)))

    monkeypatch.setattr(buffers, "sample", sample_with_nan_rewards)


def test_a_non_finite_batch_stops_the_run_as_diverged_by_default(tmp_path, nan_rewards_in_replay):
    args = tiny(tmp_path)
    with pytest.raises(cli.Diverged, match=r"seed index 0 \(seed 0\) at update 2: first non-finite value in "
                                           r"state.learner"):
        mpo.main(args)  # learning starts at 200 env steps, in update 2
    (run_dir,) = tmp_path.iterdir()
    assert not (run_dir / "eval.json").exists()


def test_with_skipping_on_the_run_finishes_and_reports_the_count(tmp_path, nan_rewards_in_replay, capsys):
    args = tiny(tmp_path, skip_nonfinite=True)
    result = mpo.main(args)
    # Every learner step was skipped: one per phase of train_frequency env steps, from the phase that
    # reaches learning_starts (200) to the end (600).
    learner_steps = (args.total_timesteps - args.learning_starts) // args.train_frequency * args.gradient_steps + 1
    assert (result.metrics["skipped_updates"][:, -1] == learner_steps).all()
    assert (result.metrics["learner_steps"][:, -1] == 0).all()
    assert json.loads((Path(result.run_dir) / "eval.json").read_text())["skipped_updates"] == learner_steps
    assert f"learner steps skipped for non-finite batches, all seeds: {learner_steps}" in capsys.readouterr().out


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


def test_bad_values_name_the_field_the_value_and_what_is_accepted(tmp_path):
    for overrides, message in [
        (dict(eval_episodes=0), r"eval_episodes=0 is out of range; accepted: >= 1"),
        (dict(target_update_rate=1.5), r"target_update_rate=1.5 is out of range; accepted: in \[0, 1\]"),
        (dict(epsilon=0.0), r"epsilon=0.0 is out of range; accepted: > 0"),
        (dict(critic_layers=(16, 0)), r"critic_layers=\(16, 0\) \(element 0\) is out of range; accepted: >= 1"),
        (dict(init_temperature=float("inf")), r"init_temperature=inf is not a finite number"),
        (dict(log_std_min=2.0, log_std_max=-20.0), r"log_std_min=2.0 is not below log_std_max=-20.0"),
        (dict(train_frequency=3), r"train_frequency=3 must be a multiple of num_envs=2; accepted: a multiple of 2"),
    ]:
        with pytest.raises(ValueError, match=message):
            tiny(tmp_path, **overrides)


def test_a_run_that_would_never_learn_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"learning_starts=600 is not below total_timesteps=600: no learner step "
                                         r"would be taken; accepted: learning_starts < 600"):
        tiny(tmp_path, learning_starts=600)
    with pytest.raises(ValueError, match=r"learning_starts=600 is not below the 600 env steps per seed the run takes "
                                         r"\(total_timesteps=650"):
        tiny(tmp_path, total_timesteps=650, learning_starts=600)


def test_max_grad_norm_zero_turns_clipping_off(tmp_path):
    """0 is no clipping (the same step as an unreachable clip), not a clip to 0."""
    after = {}
    for max_grad_norm in (0.0, 1e9):
        algo, learner, windows = learner_and_windows(tiny(tmp_path, max_grad_norm=max_grad_norm), reward=1.0)
        after[max_grad_norm] = (learner, jax.jit(algo.learner_step)(learner, windows, jax.random.key(1))[0])
    before, unclipped = after[0.0]
    for part in ("policy", "critic", "duals"):
        old, new = jax.tree.leaves(getattr(before, part)), jax.tree.leaves(getattr(unclipped, part))
        assert any(not np.array_equal(a, b) for a, b in zip(old, new)), part
    for a, b in zip(jax.tree.leaves(unclipped), jax.tree.leaves(after[1e9][1])):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_retrace_variant_runs(tmp_path):
    algo = mpo.make_train(tiny(tmp_path, critic_target="retrace", n_step=3))
    state, metrics = jax.jit(algo.train)(jax.random.key(0))
    assert np.isfinite(np.asarray(metrics["critic_loss"])[-1]) and int(state.learner.skipped) == 0


def test_penalty_and_polyak_variant_traces(tmp_path):
    """Action penalisation with Polyak targets: the whole run traces with the
    same shapes (jax.eval_shape, no compile; the penalty's math is in test_mpo_math)."""
    args = tiny(tmp_path, action_penalization=True, target_update_rate=0.05)
    state, metrics = jax.eval_shape(mpo.make_train(args).train, jax.random.key(0))
    assert metrics["critic_loss"].shape == (args.num_updates,)
    assert jax.tree.structure(state) == jax.tree.structure(jax.eval_shape(mpo.make_train(tiny(tmp_path)).init, jax.random.key(0)))


def test_train_is_vmappable_over_hyperparameters(tmp_path):
    """A 2-member sweep of the temperature's learning rate in one compile: the member at
    the args' value is the unswept run, and a 100x larger rate moves eta much further."""
    args = tiny(tmp_path)
    algo = mpo.make_train(args)
    base = mpo.Hyperparams.from_args(args)
    lrs = np.array([args.temperature_lr, 100 * args.temperature_lr], np.float32)
    sweep = jax.tree.map(lambda x: np.stack([x, x]), base).replace(temperature_lr=lrs)
    key = jax.random.key(0)
    _, swept = jax.jit(jax.vmap(algo.train, in_axes=(None, 0)))(key, sweep)
    _, alone = jax.jit(algo.train)(key)
    # Batched (vmapped) matmuls round differently: kl_q_rel, a KL of near-uniform weights, moves by ~1e-4.
    for name, values in alone.items():
        np.testing.assert_allclose(swept[name][0], values, rtol=1e-4, atol=1e-5, err_msg=name)
    initial = float(mpo.positive(jnp.float32(args.init_temperature)))
    moved = np.abs(swept["temperature"][:, -1] - initial)
    assert moved[1] > 10 * moved[0], moved
