"""algos/impala.py end to end: smoke, policy lag, determinism, one compile, resume, bad input."""

import dataclasses
import faulthandler
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import ROOT, assert_killed_run_resumes_exactly, assert_videos_show_first_episodes, run_copied_script
from flax import nnx

from jaxzoo import atari, checkpoint, cli, envs, logger, runner
from jaxzoo.algos import impala, ppo


def tiny(tmp_path, **overrides) -> impala.Args:
    args = cli.preset_args(impala.Args, "impala", "tiny")
    return dataclasses.replace(args, run_root=str(tmp_path), **overrides)


@pytest.fixture(scope="module")
def two_seed_run(tmp_path_factory):
    args = tiny(tmp_path_factory.mktemp("runs"), num_seeds=2)
    return args, impala.main(args)


def test_smoke_two_seeds(two_seed_run):
    args, result = two_seed_run
    assert result.chunk_traces == 1  # one compile for the whole run
    for name in ("policy_loss", "value_loss", "entropy", "behaviour_kl", "rho_mean", "rho_clip_fraction",
                 "vtrace_target_mean", "explained_variance", "learning_rate", "steps_per_second"):
        assert result.metrics[name].shape == (2, args.num_updates), name
        assert np.isfinite(result.metrics[name]).all(), name
    assert np.isfinite(result.metrics["episode_return"]).any()
    assert result.eval_returns.shape == (2, args.eval_episodes)
    columns = logger.read_metrics(result.run_dir)
    assert len(columns["update"]) == 2 * args.num_updates
    assert columns["global_step"].max() == args.num_updates * args.batch_size
    saved = json.loads(open(f"{result.run_dir}/args.json").read())
    assert saved["num_seeds"] == 2 and saved["policy_lag"] == args.policy_lag


def test_checkpoint_reloads_into_the_state(two_seed_run):
    args, result = two_seed_run
    assert checkpoint.latest_update(result.run_dir) == args.num_updates
    template = jax.eval_shape(jax.vmap(impala.make_train(args).init), jax.random.split(jax.random.key(0), 2))
    restored, _ = checkpoint.restore(result.run_dir, template)
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(result.state)):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(a, b)


def test_same_seed_gives_identical_metrics_and_state(two_seed_run, tmp_path):
    args, first = two_seed_run
    second = impala.main(dataclasses.replace(args, run_root=str(tmp_path)))
    for name, values in first.metrics.items():
        if name not in runner.CLOCK_COLUMNS:
            np.testing.assert_array_equal(values, second.metrics[name], err_msg=name)
    for a, b in zip(jax.tree.leaves(first.state.params), jax.tree.leaves(second.state.params)):
        np.testing.assert_array_equal(a, b)


def test_killed_and_resumed_run_matches_uninterrupted(two_seed_run, tmp_path, monkeypatch):
    # 16 updates, chunks of 4, a checkpoint every 8; the actors' parameter ring is in the state.
    args, full = two_seed_run
    assert_killed_run_resumes_exactly(impala, dataclasses.replace(args, run_root=str(tmp_path)), 12, 8, monkeypatch,
                                      full)


def test_the_actors_act_with_parameters_policy_lag_updates_old(tmp_path):
    """Update u rolls out with the learner's parameters after update u - k
    (the initial ones while u < k): the ring in the runner state is a real
    queue of past parameters, and the data is off-policy by that much."""
    lag = 3
    algo = impala.make_train(tiny(tmp_path, policy_lag=lag, learning_rate=0.01))
    update = jax.jit(algo.update)
    state = algo.init(jax.random.key(0))
    history = [state.params]  # history[u]: the learner's parameters after u updates
    for u in range(6):
        slot = int(state.actor_slot)
        acting = jax.tree.map(lambda ring: ring[slot], state.actor_params)
        expected = history[max(u - lag, 0)]
        for a, b in zip(jax.tree.leaves(acting), jax.tree.leaves(expected)):
            np.testing.assert_array_equal(a, b)
        state, metrics = update(state)
        history.append(state.params)
        if u == 0:
            assert metrics["behaviour_kl"] < 1e-6  # the first rollout is on-policy
    assert metrics["behaviour_kl"] > 1e-5  # three updates of lag at a large learning rate: off-policy
    # Lag 0 has no ring: the actors act with the learner's parameters.
    state0 = impala.make_train(tiny(tmp_path, policy_lag=0)).init(jax.random.key(0))
    assert state0.actor_params is None


def test_appo_has_a_target_network_copied_every_target_copy_period_gradient_steps(tmp_path):
    algo = impala.make_train(tiny(tmp_path, appo=True, target_copy_period=3, num_minibatches=2,
                                  learning_rate=0.01))
    update = jax.jit(algo.update)
    state = algo.init(jax.random.key(0))
    previous_target = state.target_params
    for _ in range(3):  # 2 gradient steps per update: copies after steps 3 and 6
        state, metrics = update(state)
        same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(state.target_params),
                                                        jax.tree.leaves(state.params)))
        assert same == (int(state.gradient_steps) % 3 == 0), int(state.gradient_steps)
        if not same and int(state.gradient_steps) < 3:
            assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(state.target_params),
                                                            jax.tree.leaves(previous_target)))
        assert np.isfinite(metrics["target_kl"]) and np.isfinite(metrics["clip_fraction"])
    # An EMA target moves a fraction of the way after every step.
    algo = impala.make_train(tiny(tmp_path, appo=True, target_update_rate=0.5, learning_rate=0.01))
    state = algo.init(jax.random.key(0))
    new, _ = jax.jit(algo.update)(state)
    for t0, t1, p1 in zip(*(jax.tree.leaves(x) for x in (state.target_params, new.target_params, new.params))):
        np.testing.assert_allclose(t1, 0.5 * t0 + 0.5 * p1, rtol=1e-6, atol=1e-7)


def test_appo_kl_penalty_adapts_by_rllibs_rule(tmp_path):
    args = tiny(tmp_path, appo=True, kl_coef=0.2, target_copy_period=4, num_minibatches=2, learning_rate=0.01,
                log_every=8, save_model=False)
    result = impala.main(args)
    coef, kl = result.metrics["kl_coef"][0], result.metrics["target_kl"][0]
    assert (kl > 0).any()
    expected = np.where(kl > 2 * args.kl_target, coef * 1.5, np.where(kl < 0.5 * args.kl_target, coef * 0.5, coef))
    np.testing.assert_allclose(coef[1:], expected[:-1], rtol=1e-6)


def test_max_grad_norm_zero_turns_clipping_off(tmp_path):
    """0 is no clipping (the same update as an unreachable clip), not a clip to 0."""
    after = {}
    for max_grad_norm in (0.0, 1e9):
        algo = impala.make_train(tiny(tmp_path, max_grad_norm=max_grad_norm))
        state = algo.init(jax.random.key(0))
        after[max_grad_norm] = (state.params, jax.jit(algo.update)(state)[0].params)
    before, unclipped = after[0.0]
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(unclipped)))
    for a, b in zip(jax.tree.leaves(unclipped), jax.tree.leaves(after[1e9][1])):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_bad_values_name_the_field_the_value_and_what_is_accepted():
    for overrides, message in [
        (dict(num_envs=6, num_minibatches=4), r"num_envs=6 does not divide into num_minibatches=4 .*accepted"),
        (dict(rho_bar=0.0), r"rho_bar=0.0 is out of range; accepted: > 0"),
        (dict(vtrace_lambda=1.5), r"vtrace_lambda=1.5 is out of range; accepted: in \[0, 1\]"),
        (dict(policy_lag=-1), r"policy_lag=-1 is out of range; accepted: >= 0"),
        (dict(kl_coef=0.2), r"kl_coef=0.2 .*accepted: kl_coef=0 without --appo, or --appo"),
        (dict(total_timesteps=100), r"total_timesteps=100 is less than one batch .*accepted: total_timesteps >= 512"),
    ]:
        with pytest.raises(ValueError, match=message):
            impala.Args(**overrides)


def test_unknown_env_id(tmp_path):
    with pytest.raises(ValueError, match="unknown env_id 'Pong-v0'"):
        impala.main(tiny(tmp_path, env_id="Pong-v0"))


@pytest.mark.parametrize(
    "overrides",
    [
        dict(env_id="Pendulum-v1"),  # continuous, Gaussian
        dict(env_id="Breakout-MinAtar", hidden_sizes=(32,)),  # CNN torso
        dict(appo=True, policy_lag=0, update_epochs=2, num_minibatches=2, kl_coef=0.2, shared_torso=True,
             activation="relu", vtrace_lambda=0.9),
    ],
    ids=["pendulum", "minatar-cnn", "appo-options"],
)
def test_variants_run(tmp_path, overrides):
    result = impala.main(tiny(tmp_path, total_timesteps=512, log_every=2, **overrides))
    assert np.isfinite(result.metrics["policy_loss"]).all()
    assert np.isfinite(result.eval_returns).all()


def test_cli_tiny_run(tmp_path):
    out = run_copied_script("impala", ["--preset", "tiny", "--appo", "--run-root", str(tmp_path), "--capture-video"])
    assert out.returncode == 0, out.stderr
    assert "greedy evaluation" in out.stdout and "steps/s" in out.stdout
    (run_dir,) = tmp_path.iterdir()
    assert (run_dir / "metrics.csv").exists() and (run_dir / "eval.json").exists()
    assert json.loads((run_dir / "args.json").read_text())["appo"] is True
    assert_videos_show_first_episodes(run_dir, 1)


def test_a_hyperparameter_sweep_reproduces_the_unswept_run(tmp_path):
    """vmap of `train` over a 2-member sweep of the learning rate on the tiny
    preset: the member at the args' value is the plain `train(key)`; a 20x
    larger rate is a real effect (the policy leaves uniform sooner)."""
    args = tiny(tmp_path)
    algo = impala.make_train(args)
    base = impala.Hyperparams.from_args(args)
    rates = np.array([args.learning_rate, 20 * args.learning_rate], np.float32)
    sweep = jax.tree.map(lambda x: np.stack([x, x]), base).replace(learning_rate=rates)
    key = jax.random.key(0)
    _, swept = jax.jit(jax.vmap(algo.train, in_axes=(None, 0)))(key, sweep)
    _, plain = jax.jit(algo.train)(key)
    for name in ("episode_return", "policy_loss", "value_loss", "entropy", "behaviour_kl"):
        np.testing.assert_allclose(swept[name][0], plain[name], rtol=1e-5, atol=1e-7, err_msg=name)
    assert swept["entropy"][1, -1] < plain["entropy"][-1] - 0.05, (swept["entropy"][:, -1], plain["entropy"][-1])


def test_documented_presets_exist():
    """The presets docs/impala.md and benchmarks/impala.sh use."""
    import tomllib

    presets = tomllib.loads((ROOT / "configs" / "impala.toml").read_text())
    for name in ("cartpole", "rllib-impala", "rllib-appo", "tiny", "breakout-minatar", "atari", "tiny-atari"):
        assert name in presets, name
        cli.preset_args(impala.Args, "impala", name)  # every key is an Args field
    # The cartpole preset is the file's defaults, spelled out.
    assert cli.preset_args(impala.Args, "impala", "cartpole") == impala.Args()
    assert cli.preset_args(impala.Args, "impala", "rllib-appo").max_grad_norm == 30.0  # the notebook's grad_clip
    # breakout-minatar sits beside ppo.py's preset: the same envs, rollout length, network and env steps.
    ours, ppos = cli.preset_args(impala.Args, "impala", "breakout-minatar"), cli.preset_args(ppo.Args, "ppo",
                                                                                              "breakout-minatar")
    for name in ("env_id", "total_timesteps", "num_envs", "num_steps", "torso", "hidden_sizes", "activation",
                 "shared_torso", "gamma", "max_grad_norm", "log_every"):
        assert getattr(ours, name) == getattr(ppos, name), name
    # Its learner differs (configs/impala.toml says why): each sample once, in as many gradient steps as PPO's.
    assert ours.update_epochs * ours.num_minibatches == ppos.update_epochs * ppos.num_minibatches == 32
    assert (ours.update_epochs, ours.ent_coef) == (1, 0.03)


# --------------------------------------------------------------------------- #
# Atari through envpool (common/atari.py), the Nature CNN
# --------------------------------------------------------------------------- #
needs_envpool = pytest.mark.skipif(
    importlib.util.find_spec("envpool") is None, reason='envpool is not installed (pip install -e ".[atari]")'
)


@needs_envpool
def test_tiny_atari_runs_through_the_cli_and_logs_game_score(tmp_path):
    out = run_copied_script("impala", ["--preset", "tiny-atari", "--run-root", str(tmp_path)])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "envpool:Breakout-v5: 1 seed(s) x 4 updates x 32 steps" in out.stdout, out.stdout[-2000:]
    (run_dir,) = tmp_path.iterdir()
    rows = logger.read_metrics(run_dir)
    assert list(rows["update"]) == [1, 2, 3, 4] and np.isfinite(rows["policy_loss"]).all()
    # The whole game's unclipped score under a name that says so (and as episode_return, which the tools read).
    np.testing.assert_array_equal(rows["game_score"], rows["episode_return"])
    np.testing.assert_array_equal(rows["game_length"], rows["episode_length"])
    assert np.isfinite(rows["game_score"]).any() and np.nanmax(rows["game_length"]) == 50  # the preset's time limit
    evaluation = json.loads((run_dir / "eval.json").read_text())
    assert len(evaluation["returns"][0]) == 2 and np.isfinite(evaluation["mean"])


def test_nature_cnn_output_shape_and_parameter_count():
    """The atari preset's network (Nature CNN, 512 units, one torso) on a
    [T, M] batch of frames, from shapes only: ppo.py's count for the same
    network (tests/test_atari.py counts it by hand), and its text is ppo.py's."""
    import inspect

    spec = envs.EnvSpec((84, 84, 4), True, 4, None, None, 27_000)
    build = lambda: impala.ActorCritic(spec, "nature", (512,), "relu", True, nnx.Rngs(0))
    graphdef, params = nnx.split(nnx.eval_shape(build))
    assert sum(x.size for x in jax.tree.leaves(params)) == 1_686_693
    frames = jax.ShapeDtypeStruct((5, 3, 84, 84, 4), np.uint8)  # [T, M, H, W, C]: the learner's batch
    dist, value = jax.eval_shape(lambda p, obs: nnx.merge(graphdef, p)(obs), params, frames)
    assert dist.logits.shape == (5, 3, 4) and value.shape == (5, 3)
    for name in ("NatureCNN", "same_padding"):
        assert inspect.getsource(getattr(impala, name)) == inspect.getsource(getattr(ppo, name)), name
    # RLlib's "same" padding (84 -> 21 -> 11 -> 11) and separate torsos: ppo.py's count again.
    count = lambda module: sum(x.size for x in jax.tree.leaves(nnx.split(nnx.eval_shape(
        lambda: module.ActorCritic(spec, "nature", (64,), "relu", False, nnx.Rngs(0), "same")))[1]))
    assert count(impala) == count(ppo) == 2 * (77_984 + 11 * 11 * 64 * 64 + 64) + (64 * 4 + 4) + 65


def test_preprocessing_flags_reach_common_atari_as_ppos_do(monkeypatch):
    """The same flags give the same atari.make calls as ppo.py's (training and
    evaluation pools); sebulba's actor pools get the same preprocessing, role 2 + i."""
    flags = dict(frame_skip=2, frame_stack=3, noop_max=1, episodic_life=False, fire_reset=False, reward_clip=False,
                 image_size=64, grayscale=False, max_episode_steps=50)
    calls: dict[str, list[dict]] = {"ppo": [], "impala": []}
    spec = envs.EnvSpec((64, 64, 9), True, 4, None, None, 50)
    for name, module in (("ppo", ppo), ("impala", impala)):

        def fake_make(env_id, num_envs, *, seed, role=0, **preprocessing):
            calls[name].append(dict(env_id=env_id, num_envs=num_envs, seed=seed, role=role, **preprocessing))
            return type("Env", (), {"spec": spec})(), None

        monkeypatch.setattr(atari, "make", fake_make)
        args = dataclasses.replace(cli.preset_args(module.Args, name, "tiny-atari"), **flags)
        envs_and_torso = module.make_envs(args)
        assert envs_and_torso[4] == "nature"
    assert len(calls["impala"]) == 2 and calls["impala"] == calls["ppo"]
    assert {k: calls["impala"][0][k] for k in flags} == flags
    args = dataclasses.replace(cli.preset_args(impala.Args, "impala", "tiny-atari"), **flags, architecture="sebulba")
    make_actor_env = impala.make_envs(args)[5]
    make_actor_env(1)
    assert calls["impala"][-1] == {**calls["ppo"][0], "num_envs": args.envs_per_actor, "role": 3}


def test_envpool_ids_refuse_what_they_cannot_do():
    for overrides, message in [
        (dict(num_seeds=2), r"num_seeds must be 1, got 2: envpool's XLA calls cannot be vmapped"),
        (dict(parallel="data"), r"--parallel data is not supported"),
        (dict(torso="cnn"), r"torso='cnn' is not for Atari frames; accepted: auto, nature"),
    ]:
        with pytest.raises(ValueError, match=message):
            dataclasses.replace(cli.preset_args(impala.Args, "impala", "tiny-atari"), **overrides)
    with pytest.raises(ValueError, match=r"torso='nature' needs images of at least 36 x 36 pixels"):
        impala.make_train(impala.Args(env_id="Breakout-MinAtar", torso="nature"))


# --------------------------------------------------------------------------- #
# --architecture sebulba: actor threads, a bounded queue, a learner
# --------------------------------------------------------------------------- #
def sebulba(tmp_path, **overrides) -> impala.Args:
    return tiny(tmp_path, architecture="sebulba", **overrides)


def actor_threads_alive() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("impala-actor-")]


@pytest.fixture(scope="module")
def sebulba_run(tmp_path_factory):
    """4 actor threads, a queue of 2 blocks, 16 updates of 4 blocks each; a
    watchdog ends the process with every thread's traceback if it hangs."""
    args = sebulba(tmp_path_factory.mktemp("sebulba"), num_actor_threads=4, queue_size=2)
    faulthandler.dump_traceback_later(300, exit=True)
    try:
        result = impala.main(args)
    finally:
        faulthandler.cancel_dump_traceback_later()
    return args, result


def test_sebulba_queue_neither_drops_nor_duplicates_a_trajectory(sebulba_run):
    """Every block an actor put in the queue is (actor id, sequence number);
    the learner consumed each exactly once, 4 per update, and nothing is left."""
    args, result = sebulba_run
    ledger = result.ledger
    produced = [tuple(p) for p in ledger["produced"]]
    consumed = [tuple(c[:2]) for c in ledger["consumed"]]
    assert len(produced) == len(set(produced)) == args.num_updates * args.num_actor_threads == 64
    assert sorted(consumed) == sorted(produced) and len(set(consumed)) == len(consumed)
    assert ledger["unused"] == []
    for actor in {a for a, _ in produced}:  # each actor numbered its blocks 0, 1, 2, ... without gaps
        assert sorted(s for a, s in produced if a == actor) == list(range(sum(a == actor for a, _ in produced)))
    per_update = np.bincount([c[2] for c in ledger["consumed"]], minlength=args.num_updates + 1)
    assert (per_update[1:] == args.num_actor_threads).all() and per_update[0] == 0
    (line,) = (Path(result.run_dir) / "queue_ledger.jsonl").read_text().splitlines()
    assert json.loads(line) == ledger  # the same bookkeeping is in the run directory


def test_sebulba_run_ends_cleanly_and_logs_lag_and_queue(sebulba_run):
    args, result = sebulba_run
    assert actor_threads_alive() == []  # every actor thread was joined
    assert result.chunk_traces == 1  # the learner's step compiled once
    assert (Path(result.run_dir) / "eval.json").exists() and result.eval_returns.shape == (1, args.eval_episodes)
    assert checkpoint.latest_update(result.run_dir) == args.num_updates
    rows = logger.read_metrics(result.run_dir)
    assert list(rows["update"]) == list(range(1, args.num_updates + 1))
    for name in ("policy_loss", "value_loss", "entropy", "rho_mean", "steps_per_second", "policy_lag_mean",
                 "policy_lag_max", "queue_fill", "learner_wait_seconds"):
        assert np.isfinite(rows[name]).all(), name
    lag_mean, lag_max = rows["policy_lag_mean"], rows["policy_lag_max"]
    assert (lag_mean >= 0).all() and (lag_max >= lag_mean).all() and lag_max.max() >= 1  # the actors lag
    assert ((rows["queue_fill"] >= 0) & (rows["queue_fill"] <= 1)).all()
    # The learner starts from the in-jit mode's parameters for the same seed.
    anakin = impala.make_train(dataclasses.replace(args, architecture="anakin"))
    first = anakin.init(jax.random.key(args.seed)).params
    learner = impala.make_train(args).learner_init(jax.random.key(args.seed)).params
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(learner)):
        np.testing.assert_array_equal(a, b)


def test_sebulba_sigterm_checkpoints_and_resumes_to_the_end(tmp_path, monkeypatch, capsys):
    """SIGTERM after the first logged updates: the actors stop, the learner
    writes a checkpoint at the update it stopped after and exits 143; the
    resumed run learns the remaining updates, each logged once."""
    args = sebulba(tmp_path, total_timesteps=128 * 40, log_every=2, checkpoint_every=100)
    original_log = logger.Run.log

    def log_then_signal(self, update, global_step, metrics):
        original_log(self, update, global_step, metrics)
        if update[-1] == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(logger.Run, "log", log_then_signal)
    with pytest.raises(SystemExit) as stopped:
        impala.main(args)
    monkeypatch.setattr(logger.Run, "log", original_log)
    assert stopped.value.code == 143 and actor_threads_alive() == []
    (run_dir,) = tmp_path.iterdir()
    kept = checkpoint.latest_update(run_dir)
    assert "stopped by SIGTERM" in capsys.readouterr().out and kept is not None and 2 <= kept < 40
    assert not (run_dir / "eval.json").exists()
    resumed = impala.main(impala.Args(resume=str(run_dir)))
    assert (run_dir / "eval.json").exists() and checkpoint.latest_update(run_dir) == 40
    assert sorted(logger.read_metrics(run_dir)["update"]) == list(range(1, 41))
    assert resumed.ledger["resumed_at_update"] == kept and len(resumed.ledger["consumed"]) == (40 - kept) * 2


def test_sebulba_sigint_in_a_subprocess_exits_130_with_a_checkpoint(tmp_path):
    """Ctrl-C in the middle of a command-line run: exit 130, a checkpoint, no
    thread keeps the process alive; `--resume` then runs to the end."""
    command = [sys.executable, str(ROOT / "algos" / "impala.py"), "--preset", "tiny", "--architecture", "sebulba",
               "--total-timesteps", str(128 * 100_000), "--checkpoint-every", "1000", "--run-root", str(tmp_path)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 240
        while not list(tmp_path.glob("*/metrics.csv")) or len(next(tmp_path.glob("*/metrics.csv")).read_text()
                                                                   .splitlines()) < 3:
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()[1][-2000:]
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 130, err[-2000:]
    (run_dir,) = tmp_path.glob("CartPole-v1__*")
    kept = checkpoint.latest_update(run_dir)
    assert "stopped by SIGINT" in out and kept is not None and not (run_dir / "eval.json").exists()
    resumed = impala.main(impala.Args(resume=str(run_dir), total_timesteps=128 * (kept + 4)))
    assert resumed.eval_returns.shape == (1, 2) and (run_dir / "eval.json").exists()
    assert sorted(logger.read_metrics(run_dir)["update"]) == list(range(1, kept + 5))


def test_sebulba_on_4_devices_acts_on_two_and_learns_on_the_other_two(tmp_path):
    """Forced host devices in a child process: actors on cpu:0 and cpu:1, the
    learner's batch split over cpu:2 and cpu:3 (jaxzoo.parallel's data mode)."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4".strip()
    out = subprocess.run(
        [sys.executable, str(ROOT / "algos" / "impala.py"), "--preset", "tiny", "--architecture", "sebulba",
         "--num-actor-threads", "4", "--num-envs", "8", "--total-timesteps", "4096", "--actor-device-ids", "0", "1",
         "--learner-device-ids", "2", "3", "--run-root", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert ("4 actor thread(s) on cpu:0, cpu:1, learner on cpu:2, cpu:3 (data sharded over 2 cpu devices)"
            in out.stdout), out.stdout[-2000:]
    (run_dir,) = tmp_path.iterdir()
    ledger = json.loads((run_dir / "queue_ledger.jsonl").read_text())
    assert sorted(c[:2] for c in ledger["consumed"]) == sorted(ledger["produced"]) and len(ledger["produced"]) == 64
    assert np.isfinite(json.loads((run_dir / "eval.json").read_text())["mean"])


def test_sebulba_bad_flags_exit_2_naming_the_value(tmp_path, capsys):
    for argv, message in [
        (["--distributed"], "distributed=True is not accepted with architecture='sebulba'"),
        (["--num-seeds", "2"], "num_seeds=2 is not accepted with architecture='sebulba'"),
        (["--parallel", "data"], "parallel='data' is not accepted with architecture='sebulba'"),
        (["--num-actor-threads", "3"], "num_envs=4 does not split evenly over num_actor_threads=3"),
        (["--num-actor-threads", "0"], "num_actor_threads=0 is out of range; accepted: >= 1"),
        (["--queue-size", "0"], "queue_size=0 is out of range; accepted: >= 1"),
        (["--learner-device-ids", "0", "0"], "learner_device_ids=(0, 0) must name at least one device, each once"),
        (["--num-actor-threads", "4", "--learner-device-ids", "0", "1"],
         "num_envs / num_actor_threads = 1 trajectories do not split over the 2 learner devices"),
        (["--architecture", "podracer"], "podracer"),
    ]:
        with pytest.raises(SystemExit) as refused, cli.user_errors():
            impala.main(cli.parse(impala.Args, "impala", ["--preset", "tiny", "--architecture", "sebulba", *argv]))
        assert refused.value.code == cli.EXIT_USAGE, argv
        assert message in " ".join(capsys.readouterr().err.replace("│", " ").split()), argv
    # A device that does not exist is found when the run starts, before a run directory is made.
    out = subprocess.run([sys.executable, str(ROOT / "algos" / "impala.py"), "--preset", "tiny", "--architecture",
                          "sebulba", "--actor-device-ids", "3", "--run-root", str(tmp_path / "runs")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2 and "actor_device_ids=(3,) names a device that does not exist: 1 visible" in out.stderr
    assert not (tmp_path / "runs").exists()


def test_pack_round_trips_a_rollout_and_the_parameters_exactly(tmp_path):
    """What crosses between actor and learner threads is one float32 array;
    unpacking gives back every field bit for bit (ints, bools, floats), also
    for blocks concatenated along the environment axis."""
    rng = np.random.default_rng(0)
    T, N = 5, 3

    def block():
        return impala.Transition(
            obs=rng.normal(size=(T, N, 4)).astype(np.float32), action=rng.integers(0, 7, (T, N)).astype(np.int32),
            behaviour_log_prob=rng.normal(size=(T, N)).astype(np.float32),
            reward=rng.normal(size=(T, N)).astype(np.float32), terminated=rng.random((T, N)) < 0.3,
            truncated=rng.random((T, N)) < 0.3, final_obs=rng.normal(size=(T, N, 4)).astype(np.float32),
            episode_done=rng.random((T, N)) < 0.3, episode_return=rng.normal(size=(T, N)).astype(np.float32),
            episode_length=rng.integers(0, 500_000, (T, N)).astype(np.int32))

    blocks = [block(), block()]
    packed = np.concatenate([impala.pack(b, 2) for b in blocks], axis=1)
    assert packed.shape == (T, 2 * N, 4 + 1 + 1 + 1 + 1 + 1 + 4 + 1 + 1 + 1) and packed.dtype == np.float32
    whole = impala.unpack(packed, blocks[0], 2)
    for name, field in whole._asdict().items():
        expected = np.concatenate([getattr(b, name) for b in blocks], axis=1)
        assert field.dtype == expected.dtype, name
        np.testing.assert_array_equal(field, expected, err_msg=name)
    # The algorithm's own round trips: parameters [P], and an actor's rollout [T, envs_per_actor, F].
    algo = impala.make_train(sebulba(tmp_path))
    params = algo.learner_init(jax.random.key(0)).params
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(impala.unpack(impala.pack(params, 0), params, 0))):
        np.testing.assert_array_equal(a, b)
    obs, env_state = algo.actor_reset(jax.random.key(1))
    _, rollout = algo.actor_rollout(impala.pack(params, 0), env_state, obs, jax.random.key(2))
    traj = algo.unpack_rollout(rollout)
    assert traj.obs.shape == (32, 2, 4) and traj.action.dtype == np.int32 and traj.terminated.dtype == bool
    np.testing.assert_array_equal(traj.obs[0], obs)  # the rollout starts where the reset left the envs


@needs_envpool
def test_sebulba_steps_atari_with_an_envpool_pool_per_actor_thread(tmp_path):
    """tiny-atari with 2 actor threads: envpool's XLA calls run inside the
    threads' jitted rollouts, each thread on a pool of its own; every block
    is learned from once, the game score is logged, the threads are joined."""
    args = dataclasses.replace(cli.preset_args(impala.Args, "impala", "tiny-atari"), run_root=str(tmp_path),
                               architecture="sebulba")
    result = impala.main(args)
    assert actor_threads_alive() == [] and result.chunk_traces == 1
    produced, consumed = result.ledger["produced"], result.ledger["consumed"]
    assert len(produced) == 8 and sorted(c[:2] for c in consumed) == sorted(produced)
    rows = logger.read_metrics(result.run_dir)
    assert list(rows["update"]) == [1, 2, 3, 4] and np.isfinite(rows["policy_lag_mean"]).all()
    np.testing.assert_array_equal(rows["game_score"], rows["episode_return"])
    assert np.isfinite(rows["game_score"]).any()  # 128 steps on 2 envs: a game reached the 50-step limit
    assert np.isfinite(json.loads((Path(result.run_dir) / "eval.json").read_text())["mean"])
    # A pool is a stateful emulator, so each thread has its own programs; gymnax threads share theirs.
    algo = impala.make_train(args)
    assert algo.actors(1)[1] is not algo.actors(0)[1] is algo.actor_rollout
    gymnax = impala.make_train(sebulba(tmp_path))
    assert gymnax.actors(1) is gymnax.actors(0)


def test_sebulba_divergence_stops_the_run_with_every_thread_joined(tmp_path):
    with pytest.raises(cli.Diverged, match=r"seed index 0 \(seed 0\) at update \d+: first non-finite value"):
        impala.main(sebulba(tmp_path, learning_rate=1e30))
    assert actor_threads_alive() == []
    (run_dir,) = tmp_path.iterdir()
    assert not (run_dir / "eval.json").exists() and checkpoint.latest_update(run_dir) is None


# --------------------------------------------------------------------------- #
# gymnasium envs stepped on the host (gym: ids, common/host.py)
# --------------------------------------------------------------------------- #
def test_gym_id_runs_sebulba_with_2_actor_threads_through_the_cli(tmp_path):
    """Both actor threads step host envs through the bridge's io_callbacks; every block is learned from once."""
    out = run_copied_script("impala", ["--preset", "tiny", "--env-id", "gym:CartPole-v1", "--architecture", "sebulba",
                                       "--num-actor-threads", "2", "--total-timesteps", "1024", "--log-every", "2",
                                       "--eval-episodes", "1", "--run-root", str(tmp_path)])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "gym:CartPole-v1: sebulba, 2 actor thread(s)" in out.stdout, out.stdout[-2000:]
    (run_dir,) = tmp_path.iterdir()
    rows = logger.read_metrics(run_dir)
    assert list(rows["update"]) == list(range(1, 9)) and np.isfinite(rows["policy_loss"]).all()
    assert np.nanmin(rows["episode_length"]) >= 1  # CartPole episodes of 9+ steps end in 8 x 32 steps
    (ledger,) = [json.loads(line) for line in (run_dir / "queue_ledger.jsonl").read_text().splitlines()]
    assert sorted(c[:2] for c in ledger["consumed"]) == sorted(ledger["produced"])
    assert {actor for actor, _ in ledger["produced"]} == {0, 1}
    assert np.isfinite(json.loads((run_dir / "eval.json").read_text())["mean"])


def test_gym_id_runs_in_jit_and_gives_each_actor_thread_envs_of_its_own(tmp_path):
    from jaxzoo import host

    result = impala.main(tiny(tmp_path, env_id="gym:CartPole-v1", total_timesteps=512, log_every=2, eval_episodes=1))
    assert np.isfinite(result.metrics["policy_loss"]).all() and np.isfinite(result.eval_returns).all()
    # sebulba: each thread's gymnasium envs are objects of its own, stepped by programs of its own
    # (gymnax threads share theirs: test_sebulba_steps_atari_with_an_envpool_pool_per_actor_thread).
    algo = impala.make_train(sebulba(tmp_path, env_id="gym:CartPole-v1"))
    first, second = (algo.actors(i).env.unwrapped for i in range(2))
    assert isinstance(first, host.GymnasiumEnv) and first is not second
    assert len(first.envs) == len(second.envs) == 2 and not {id(e) for e in first.envs} & {id(e) for e in second.envs}
    assert algo.actors(1).rollout is not algo.actors(0).rollout is algo.actor_rollout


def test_gym_ids_refuse_what_ppo_refuses():
    for overrides, message in [
        (dict(num_seeds=2), r"num_seeds must be 1, got 2: a gym: env is stepped on the host"),
        (dict(parallel="data"), r"--parallel data is not supported: the envs live on the host"),
    ]:
        for algo in (impala, ppo):  # one check (host.check_args), the same refusals in both files
            with pytest.raises(ValueError, match=message):
                algo.Args(env_id="gym:CartPole-v1", **overrides)
