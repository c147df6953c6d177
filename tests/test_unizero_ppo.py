"""algos/unizero_ppo.py: transforms, the transformer's masks, the six bugs of
seed 000 (each pinned by a regression test), and the end-to-end run."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_killed_run_resumes_exactly, assert_videos_show_first_episodes, run_copied_script
from flax import nnx

from jaxzoo import cli
from jaxzoo.algos import unizero_ppo as uz


def tiny(tmp_path=None, **overrides) -> uz.Args:
    args = cli.preset_args(uz.Args, "unizero_ppo", "tiny")
    return dataclasses.replace(args, run_root=str(tmp_path or "/tmp"), **overrides)


# ----------------------------------------------------------------- transforms
def test_h_transform_round_trip_and_two_hot():
    x = jnp.array([-300.0, -7.5, -1.0, 0.0, 0.3, 1.0, 42.0, 333.0])
    np.testing.assert_allclose(uz.h_inverse(uz.h_transform(x)), x, rtol=1e-4, atol=1e-4)
    y = jnp.array([-3.7, 0.0, 2.25, 10.0])
    probs = uz.two_hot(y, 101)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(probs @ jnp.arange(-50, 51, dtype=jnp.float32), y, atol=1e-5)
    assert int((probs > 0).sum(-1).max()) <= 2
    # The scalar decoded from a (near) two-hot distribution is the original scalar.
    np.testing.assert_allclose(uz.logits_to_scalar(jnp.log(uz.scalar_to_probs(x, 101) + 1e-12)), x, rtol=1e-3, atol=1e-3)


# ------------------------------------------------------------ model and masks
def random_model(args, spec, key=0):
    """A model whose zero-initialised heads are replaced by random weights, so
    policies and values are not trivially uniform and zero."""
    model = uz.WorldModel(spec.obs_shape, spec.num_actions, args, nnx.Rngs(key))
    graphdef, params = nnx.split(model)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(key + 1), len(leaves))
    leaves = [x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
    return graphdef, jax.tree.unflatten(treedef, leaves)


def window(args, spec, seed=0, batch=3):
    K = args.num_unroll_steps
    obs = jax.random.normal(jax.random.key(seed), (batch, K) + spec.obs_shape)
    action = jax.random.randint(jax.random.key(seed + 1), (batch, K), 0, spec.num_actions)
    timestep = jnp.broadcast_to(jnp.arange(K) + 3, (batch, K))
    ones = jnp.ones((batch, K), bool)
    return uz.Window(obs, action, timestep, jnp.zeros((batch, K), jnp.int32), ones, ones)


@pytest.fixture(scope="module")
def model_and_window():
    """A randomly initialised tiny world model and a window of random steps."""
    args = tiny()
    algo = uz.make_train(args)
    graphdef, params = random_model(args, algo.spec)
    return nnx.merge(graphdef, params), window(args, algo.spec)


def test_causal_mask_later_tokens_never_change_earlier_outputs(model_and_window):
    model, w = model_and_window
    out = uz.forward_window(model, w)
    j = 3
    changed = w._replace(obs=w.obs.at[:, j].add(1.0), action=w.action.at[:, j].set((w.action[:, j] + 1) % 2))
    out2 = uz.forward_window(model, changed)
    for a, b in zip(out, out2):
        np.testing.assert_allclose(a[:, :j], b[:, :j], atol=1e-5)  # steps before j: unchanged
    assert not np.allclose(out[0][:, j], out2[0][:, j])  # step j's latent changed: its policy moves


def test_tokens_of_another_episode_are_invisible(model_and_window):
    model, w = model_and_window
    split = w._replace(segment=jnp.broadcast_to(jnp.array([0, 0, 1, 1, 1]), w.segment.shape))
    alone = w._replace(obs_valid=w.obs_valid.at[:, :2].set(False), action_valid=w.action_valid.at[:, :2].set(False))
    a, b = uz.forward_window(model, split), uz.forward_window(model, alone)
    np.testing.assert_allclose(a[0][:, 2:], b[0][:, 2:], atol=1e-5)  # steps 2-4 see only their own episode


def test_epochs_visit_every_window_once_per_epoch():
    """--update-epochs: each epoch is a permutation of the phase's windows cut into
    equal minibatches (no window twice in an epoch, the remainder sits out);
    the seed's schedule instead draws batch_size windows with replacement."""
    args = uz.Args(num_envs=8, num_steps=50, update_epochs=4, num_minibatches=3)  # 80 windows -> 3 x 26
    indices = np.asarray(uz.minibatch_indices(args, jax.random.key(0)))
    assert indices.shape == (12, 26) and args.gradient_steps == 12
    for epoch in indices.reshape(4, 78):
        assert len(set(epoch.tolist())) == 78 and epoch.min() >= 0 and epoch.max() < 80
    assert len({tuple(e) for e in indices.reshape(4, 78).tolist()}) == 4  # each epoch reshuffles
    seed_schedule = np.asarray(uz.minibatch_indices(cli.preset_args(uz.Args, "unizero_ppo", "seed"), jax.random.key(0)))
    assert seed_schedule.shape == (100, 256) and len(set(seed_schedule[0].tolist())) < 80  # with replacement
    with pytest.raises(ValueError, match="num_minibatches=81 exceeds the 80 5-step windows .*; accepted: in \\[1, 80\\]"):
        uz.Args(update_epochs=1, num_minibatches=81)


def test_ppo_heads_only_stops_the_ppo_gradient_at_the_heads(fresh_phase):
    """--ppo-heads-only (LightZero PR 498): the PPO and value losses move only the
    policy and value heads; the transformer and encoder get the world-model
    losses' gradient alone. With --no-ppo-heads-only the PPO terms reach the trunk."""
    args, _, state, _, _, batch = fresh_phase
    world_only = dict(policy_coef=0.0, value_coef=0.0, ent_coef=0.0)

    def grads(**flags):
        loss = uz.make_train(dataclasses.replace(args, **flags)).loss
        return jax.grad(lambda p: loss(p, state.target_encoder, batch, jax.random.key(0))[0])(state.params)

    heads, joint, world = grads(ppo_heads_only=True), grads(ppo_heads_only=False), grads(**world_only)
    trunk = lambda g: np.concatenate([np.ravel(x) for x in jax.tree.leaves((g["encoder"], g["blocks"]))])
    np.testing.assert_allclose(trunk(heads), trunk(world), rtol=1e-5, atol=1e-7)
    assert np.abs(trunk(joint) - trunk(world)).max() > 1e-4
    policy = lambda g: np.asarray(g["policy_head"]["layers"][2]["kernel"][...])
    np.testing.assert_allclose(policy(heads), policy(joint), rtol=1e-5, atol=1e-7)  # the heads still learn
    assert np.abs(policy(heads)).max() > 1e-5


# --------------------------------------------------------- the seed's six bugs
def gae_loop(rewards, values, next_values, terminated, truncated, gamma, lam):
    T, N = rewards.shape
    advantages = np.zeros((T, N))
    for n in range(N):
        running = 0.0
        for t in reversed(range(T)):
            if terminated[t, n] or truncated[t, n]:
                running = 0.0
            bootstrap = 0.0 if terminated[t, n] else next_values[t, n]
            delta = rewards[t, n] + gamma * bootstrap - values[t, n]
            running = delta + gamma * lam * running
            advantages[t, n] = running
    return advantages


def test_bug1_gae_uses_the_value_head_as_baseline():
    """Seed bug 1: the stored root value was 0, so A = G. Here A is the GAE of
    the value head's predictions, matched against a loop."""
    rng = np.random.default_rng(0)
    T, N = 120, 3
    rewards = np.ones((T, N), np.float32)
    values = rng.uniform(5, 20, (T, N)).astype(np.float32)
    next_values = np.roll(values, -1, axis=0)
    terminated = np.zeros((T, N), bool)
    terminated[70, 0] = True
    truncated = np.zeros((T, N), bool)
    truncated[99, 1] = True
    adv, returns = uz.compute_gae(*map(jnp.asarray, (rewards, values, next_values, terminated, truncated)), 0.99, 0.95)
    expected = gae_loop(rewards, values, next_values, terminated, truncated, 0.99, 0.95)
    np.testing.assert_allclose(adv, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(returns, expected + values, rtol=1e-4, atol=1e-4)
    zero_baseline, _ = uz.compute_gae(*map(jnp.asarray, (rewards, 0 * values, 0 * next_values, terminated, truncated)), 0.99, 0.95)
    assert not np.allclose(adv, zero_baseline)


@pytest.fixture(scope="module")
def fresh_phase():
    """A collected rollout of a randomly initialised model, its GAE and windows."""
    args = tiny(num_envs=3, num_steps=40, max_episode_steps=8)  # short: truncations happen
    algo = uz.make_train(args)
    state = algo.init(jax.random.key(0))
    graphdef, params = random_model(args, algo.spec, key=3)
    state = state.replace(params=params, target_encoder=params["encoder"])
    state, traj = jax.jit(algo.collect)(state)
    adv, returns = uz.compute_gae(traj.reward, traj.value, traj.next_value, traj.terminated, traj.truncated,
                                  args.gamma, args.gae_lambda)
    batch = algo.make_windows(traj, adv, returns)
    return args, algo, state, traj, adv, batch


def test_bug2_entropy_bonus_reaches_the_gradient(fresh_phase):
    """Seed bug 2: entropy_coef was configured but the loss was rebuilt from
    fixed weights without it. Here the total's gradient is the weighted sum of
    the parts' gradients minus ent_coef times the entropy's, and the entropy's
    gradient on the policy head is not zero."""
    args, _, state, _, _, batch = fresh_phase
    args = dataclasses.replace(args, ent_coef=1.0)  # large enough to see next to the other terms
    loss = uz.make_train(args).loss

    def parts(params):
        total, stats = loss(params, state.target_encoder, batch, jax.random.key(0))
        without_entropy = (args.latent_coef * stats["latent_loss"] + args.reward_coef * stats["reward_loss"]
                           + args.policy_coef * stats["policy_loss"] + args.value_coef * stats["value_loss"])
        return jnp.stack([total, without_entropy, stats["entropy"]])

    grads = jax.jit(jax.jacrev(parts))(state.params)  # one compile, three gradients
    policy_kernel = np.asarray(grads["policy_head"]["layers"][2]["kernel"][...])  # [3, ...]
    assert np.abs(policy_kernel[2]).max() > 1e-5
    np.testing.assert_allclose(policy_kernel[0], policy_kernel[1] - args.ent_coef * policy_kernel[2], rtol=0, atol=2e-6)
    assert np.abs(policy_kernel[0] - policy_kernel[1]).max() > 1e-5  # well above the rounding tolerance
    reward_kernel = np.asarray(grads["reward_head"]["layers"][2]["kernel"][...])
    np.testing.assert_allclose(reward_kernel[2], 0.0, atol=1e-8)  # the entropy moves only the policy path


def test_bug3_stored_log_prob_is_of_the_tempered_distribution(fresh_phase):
    """Seed bug 3: actions sampled at T = 0.25 but log-probs taken at T = 1."""
    args, algo, state, traj, _, batch = fresh_phase
    model = nnx.merge(algo.graphdef, state.params)
    logits = uz.forward_window(model, batch.window)[0]
    action = batch.window.action[..., None]
    tempered = jnp.take_along_axis(jax.nn.log_softmax(logits / args.sampling_temperature), action, -1)[..., 0]
    untempered = jnp.take_along_axis(jax.nn.log_softmax(logits), action, -1)[..., 0]
    np.testing.assert_allclose(batch.log_prob, tempered, atol=1e-5)
    assert np.abs(np.asarray(batch.log_prob - untempered)).max() > 1e-2


def test_bug4_first_ppo_ratio_is_one(fresh_phase):
    """Seed bug 4: collection used up to ~3 steps of earlier history while
    training windows started without it, so the ratio was not 1 before any
    update. With one chunk rule for both, every ratio of the fresh data is 1."""
    args, algo, state, _, _, batch = fresh_phase
    _, stats = algo.loss(state.params, state.target_encoder, batch, jax.random.key(0))
    assert float(stats["ratio_max_deviation"]) < 1e-5
    assert float(stats["clip_fraction"]) == 0.0


def test_bug5_windows_carry_the_rollout_advantages_in_order(fresh_phase):
    """Seed bug 5: padding at segment cuts shifted advantages against steps.
    Windows are aligned chunks of the rollout and keep each step's advantage,
    action and observation together, across episodes longer than a window."""
    args, algo, state, traj, adv, batch = fresh_phase
    N, T = args.num_envs, args.num_steps
    back = lambda x: jnp.swapaxes(x.reshape((N, T) + x.shape[2:]), 0, 1)
    np.testing.assert_array_equal(back(batch.advantage), adv)
    np.testing.assert_array_equal(back(batch.window.action), traj.action)
    np.testing.assert_array_equal(back(batch.window.obs), traj.obs)


def test_bug6_truncation_bootstraps_from_the_final_observation(fresh_phase):
    """Seed bug 6: a time limit was treated as termination (next value 0)."""
    args, algo, state, traj, _, _ = fresh_phase
    truncated = np.asarray(traj.truncated & ~traj.terminated)  # time limit reached, pole still up
    assert truncated.any()
    assert np.abs(np.asarray(traj.next_value)[truncated]).min() > 1e-3  # V(final obs), not 0
    # Inside a chunk, the next value of a step that did not end is the next step's value.
    K = args.num_unroll_steps
    same_chunk = (np.arange(args.num_steps - 1) % K != K - 1)[:, None] & ~np.asarray(traj.truncated[:-1] | traj.terminated[:-1])
    np.testing.assert_allclose(np.asarray(traj.next_value[:-1])[same_chunk], np.asarray(traj.value[1:])[same_chunk], atol=1e-5)
    r = jnp.array([[1.0]])
    v, nv = jnp.array([[0.5]]), jnp.array([[10.0]])
    trunc_adv, _ = uz.compute_gae(r, v, nv, jnp.array([[False]]), jnp.array([[True]]), 0.9, 0.95)
    term_adv, _ = uz.compute_gae(r, v, nv, jnp.array([[True]]), jnp.array([[False]]), 0.9, 0.95)
    assert float(trunc_adv[0, 0]) == pytest.approx(1 + 0.9 * 10 - 0.5) and float(term_adv[0, 0]) == pytest.approx(0.5)


# ------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    args = tiny(tmp_path_factory.mktemp("runs"), num_seeds=2)
    return args, uz.main(args)


def test_smoke_two_seeds(tiny_run):
    args, result = tiny_run
    assert result.chunk_traces == 1
    for name in ("loss", "latent_loss", "reward_loss", "policy_loss", "value_loss", "entropy", "approx_kl",
                 "clip_fraction", "explained_variance", "first_ratio_max_deviation"):
        assert result.metrics[name].shape == (2, args.num_updates) and np.isfinite(result.metrics[name]).all(), name
    assert (result.metrics["first_ratio_max_deviation"] < 1e-5).all()
    assert result.eval_returns.shape == (2, args.eval_episodes)


def test_same_seed_gives_identical_metrics(tiny_run, tmp_path):
    args, first = tiny_run
    second = uz.main(dataclasses.replace(args, run_root=str(tmp_path)))
    for name in ("loss", "policy_loss", "episode_return"):
        np.testing.assert_array_equal(first.metrics[name], second.metrics[name], err_msg=name)


def test_killed_and_resumed_run_matches_uninterrupted(tiny_run, tmp_path, monkeypatch):
    # 5 updates, chunks of 2, a checkpoint every 2: dies logging update 4, before its checkpoint
    args, full = tiny_run
    assert_killed_run_resumes_exactly(uz, dataclasses.replace(args, run_root=str(tmp_path)), 4, 2, monkeypatch, full)


def test_a_hyperparameter_sweep_reproduces_the_unswept_run():
    """vmap of `train` over a 2-member sweep of the learning rate on the tiny
    preset (one compile): the member at the args' value is the plain
    `train(key)`; a 30x larger rate trains a measurably different model."""
    args = tiny()
    algo = uz.make_train(args)
    base = uz.Hyperparams.from_args(args)
    rates = np.array([args.learning_rate, 30 * args.learning_rate], np.float32)
    sweep = jax.tree.map(lambda x: np.stack([x, x]), base).replace(learning_rate=rates)
    key = jax.random.key(0)
    _, swept = jax.jit(jax.vmap(algo.train, in_axes=(None, 0)))(key, sweep)
    _, plain = jax.jit(algo.train)(key)
    for name in ("episode_return", "latent_loss", "reward_loss", "value_loss", "policy_loss", "entropy"):
        np.testing.assert_allclose(swept[name][0], plain[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert np.abs(swept["latent_loss"][1, -1] - plain["latent_loss"][-1]) > 1e-3


def test_search_evaluation_runs_with_mctx(tmp_path):
    args = tiny(tmp_path, eval_search=4)
    algo = uz.make_train(args)
    state = jax.jit(algo.init)(jax.random.key(0))
    returns = jax.jit(algo.evaluate_search)(state, jax.random.key(1))
    assert returns.shape == (args.eval_episodes,) and (np.asarray(returns) > 0).all()


def test_bad_input(tmp_path):
    with pytest.raises(ValueError, match="num_steps=12 is not a multiple of num_unroll_steps=5 .*; accepted: a multiple of 5"):
        uz.Args(num_steps=12)
    with pytest.raises(ValueError, match="update_epochs=-1 is out of range; accepted: >= 0"):
        uz.Args(update_epochs=-1)
    with pytest.raises(ValueError, match="target_kl=nan is not a finite number"):
        uz.Args(target_kl=float("nan"))
    with pytest.raises(ValueError, match="continuous action space"):
        uz.make_train(tiny(tmp_path, env_id="Pendulum-v1"))


def test_max_grad_norm_zero_turns_clipping_off():
    """--max-grad-norm 0 means no clipping (docs/glossary.md), not a clip to
    norm 0 that zeroes every update: one phase's gradient steps move the
    parameters by Adam's step size (weight decay off, so only gradients move them)."""
    args = tiny(max_grad_norm=0.0, weight_decay=0.0)
    algo = uz.make_train(args)
    state = algo.init(jax.random.key(0))
    after, metrics = jax.jit(algo.update)(state)
    steps = int(metrics["gradient_steps_run"])
    assert steps >= 1 and float(metrics["loss"]) > 0
    moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(after.params)))
    assert args.learning_rate / 2 < moved <= steps * args.learning_rate * 1.01


def test_cli_tiny_run(tmp_path):
    out = run_copied_script("unizero_ppo", ["--preset", "tiny", "--num-seeds", "2", "--run-root", str(tmp_path), "--capture-video",
                                            "--eval-search", "2",
                                            # the seed's schedule and joint loss, end to end (the other runs use the defaults)
                                            "--update-epochs", "0", "--batch-size", "8", "--replay-ratio", "0.05",
                                            "--no-ppo-heads-only"])
    assert out.returncode == 0, out.stderr
    assert "greedy evaluation" in out.stdout and "Gumbel search" in out.stdout
    (run_dir,) = tmp_path.iterdir()
    assert_videos_show_first_episodes(run_dir, 2)
