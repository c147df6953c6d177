"""algos/unizero.py, the parts with a right answer: transforms, the search's
contract with mctx, the transformer's causal mask, the root, n-step targets."""

import dataclasses
import re
from functools import partial

import jax
import jax.numpy as jnp
import mctx
import numpy as np
import pytest
from flax import nnx

from jaxzoo import cli
from jaxzoo.algos import unizero as uz


def tiny(**overrides) -> uz.Args:
    return dataclasses.replace(cli.preset_args(uz.Args, "unizero", "tiny"), **overrides)


@pytest.fixture(scope="module")
def algo_and_params():
    """The tiny model with every weight (zero-initialised heads included)
    perturbed, so policies, values and rewards are not trivially uniform and zero."""
    args = tiny(context_steps=3)  # = num_unroll_steps: every window below has one shape, one compile
    algo = uz.make_train(args)

    @jax.jit  # eager op-by-op dispatch is the slow part on a busy CPU
    def random_params(key):
        params = nnx.split(uz.WorldModel(algo.spec.obs_shape, algo.spec.num_actions, args, nnx.Rngs(key)))[1]
        leaves, treedef = jax.tree.flatten(params)
        keys = jax.random.split(jax.random.key(1), len(leaves))
        return jax.tree.unflatten(treedef, [x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])

    forward = jax.jit(lambda params, window: uz.forward_window(nnx.merge(algo.graphdef, params), window))
    return args, algo, random_params(jax.random.key(0)), forward


def history(args, spec, batch=3, seed=0, valid=None) -> uz.History:
    C = args.context_steps
    obs = jax.random.normal(jax.random.key(seed), (batch, C) + spec.obs_shape)
    action = jax.random.randint(jax.random.key(seed + 1), (batch, C), 0, spec.num_actions)
    timestep = jnp.broadcast_to(jnp.arange(C) + 7, (batch, C))
    valid = jnp.ones((batch, C), bool) if valid is None else jnp.broadcast_to(valid, (batch, C))
    return uz.History(obs, action, timestep, valid)


# ----------------------------------------------------------------- transforms
def test_h_transform_round_trip_and_two_hot_mass():
    x = jnp.array([-300.0, -7.5, -1.0, 0.0, 0.3, 1.0, 42.0, 333.0])
    np.testing.assert_allclose(uz.h_inverse(uz.h_transform(x)), x, rtol=1e-4, atol=1e-4)
    y = jnp.array([-3.7, 0.0, 2.25, 10.0, 49.5])
    probs = uz.two_hot(y, 101)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(probs @ jnp.arange(-50, 51, dtype=jnp.float32), y, atol=1e-5)
    assert int((probs > 0).sum(-1).max()) <= 2 and float(probs.min()) >= 0.0
    # Beyond the support the mass sits on the edge bin.
    np.testing.assert_allclose(uz.two_hot(jnp.array([80.0]), 101)[0, -1], 1.0)
    # The scalar decoded from a (near) two-hot distribution is the original scalar.
    np.testing.assert_allclose(
        uz.logits_to_scalar(jnp.log(uz.scalar_to_probs(x, 101) + 1e-12)), x, rtol=1e-3, atol=1e-3
    )


# ------------------------------------------------------------ model and search
def test_entropy_is_distraxs_categorical_entropy_with_0_log_0_as_0():
    """The two logged entropies (search weights with pruned actions at exactly 0,
    and the policy's softmax) are written out; they equal distrax's."""
    import distrax

    logits = jax.random.normal(jax.random.key(0), (5, 4)) * 3.0
    weights = jax.nn.softmax(logits).at[:, 1].set(0.0)
    weights = weights / weights.sum(-1, keepdims=True)  # rows with one action pruned
    close = partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6)  # eager dispatch rounds each op alone
    close(uz.entropy(jnp.log(weights)), distrax.Categorical(probs=weights).entropy())
    close(uz.entropy(jax.nn.log_softmax(logits)), distrax.Categorical(logits=logits).entropy())
    assert float(uz.entropy(jnp.log(jnp.array([0.0, 1.0, 0.0])))) == 0.0  # certain: 0, not nan
    np.testing.assert_allclose(uz.entropy(jnp.log(jnp.full(4, 0.25))), np.log(4.0), rtol=1e-6)
    gradient = jax.grad(lambda x: uz.entropy(jax.nn.log_softmax(x)).sum())(logits.at[0, 0].set(-200.0))
    assert np.isfinite(np.asarray(gradient)).all()


def test_causal_mask_later_tokens_never_change_earlier_outputs(algo_and_params):
    args, algo, params, forward = algo_and_params
    K, batch = args.num_unroll_steps, 3
    obs = jax.random.normal(jax.random.key(0), (batch, K) + algo.spec.obs_shape)
    action = jax.random.randint(jax.random.key(1), (batch, K), 0, algo.spec.num_actions)
    ones = jnp.ones((batch, K), bool)
    w = uz.Window(
        obs, action, jnp.broadcast_to(jnp.arange(K) + 3, (batch, K)), jnp.zeros((batch, K), jnp.int32), ones, ones
    )
    out = forward(params, w)
    for j in range(1, K):
        changed = w._replace(obs=w.obs.at[:, j].add(1.0), action=w.action.at[:, j].set((w.action[:, j] + 1) % 2))
        out2 = forward(params, changed)
        for a, b in zip(out, out2):
            np.testing.assert_allclose(a[:, :j], b[:, :j], atol=1e-5)  # steps before j: unchanged
        assert not np.allclose(out[0][:, j], out2[0][:, j])  # step j's own latent changed: its policy moves
    # Only the action at j changed: the latent-token outputs of step j stay, its action-token outputs move.
    action_only = forward(params, w._replace(action=w.action.at[:, 1].set((w.action[:, 1] + 1) % 2)))
    np.testing.assert_allclose(out[0][:, :2], action_only[0][:, :2], atol=1e-5)
    assert not np.allclose(out[3][:, 1], action_only[3][:, 1])


def test_rope_rotates_each_pair_and_attention_scores_see_only_relative_positions():
    """Su et al. 2021: q and k keep their norms, and q . k after rotation depends
    on the positions' difference only."""
    q, k = jax.random.normal(jax.random.key(0), (2, 1, 1, 2, 8))  # [B=1, T=1, H=2, Dh=8] each
    rotated = lambda x, position: uz.rope(x, jnp.full((1, 1), position))
    np.testing.assert_allclose(jnp.linalg.norm(rotated(q, 37), axis=-1), jnp.linalg.norm(q, axis=-1), rtol=1e-5)
    score = lambda p_q, p_k: jnp.sum(rotated(q, p_q) * rotated(k, p_k), -1)
    np.testing.assert_allclose(score(12, 5), score(112, 105), rtol=1e-4, atol=1e-5)
    assert not np.allclose(score(12, 5), score(12, 6), atol=1e-3)
    np.testing.assert_array_equal(rotated(q, 0), q)  # position 0: no rotation


def test_recurrent_fn_matches_mctx_contract(algo_and_params):
    args, algo, params, forward = algo_and_params
    batch, A = 3, algo.spec.num_actions
    root = jax.eval_shape(algo.root_fn, params, history(args, algo.spec, batch))
    assert isinstance(root, mctx.RootFnOutput)
    assert root.prior_logits.shape == (batch, A) and root.value.shape == (batch,)
    action = jax.ShapeDtypeStruct((batch,), jnp.int32)
    out, embedding = jax.eval_shape(algo.recurrent_fn, params, jax.random.key(0), action, root.embedding)
    assert isinstance(out, mctx.RecurrentFnOutput)
    assert out.reward.shape == out.discount.shape == out.value.shape == (batch,)
    assert out.prior_logits.shape == (batch, A)
    # mctx stores embeddings in a fixed-shape tree: the node must keep shapes and dtypes.
    assert jax.tree.structure(embedding) == jax.tree.structure(root.embedding)
    for new, old in zip(jax.tree.leaves(embedding), jax.tree.leaves(root.embedding)):
        assert new.shape == old.shape and new.dtype == old.dtype
    assert root.embedding.tokens.shape == (batch, 2 * args.num_unroll_steps, args.embed_dim)


def test_cached_search_steps_are_the_recomputed_ones_while_only_padding_leaves_the_window(algo_and_params):
    """--search-kv-cache: the root and the imagined steps from cached keys and values
    equal the whole window recomputed, as long as the window drops only padding
    (1 real token in a window of 2K = 6: two steps of 2 tokens each); nodes keep
    their shapes, as mctx's fixed-shape tree needs."""
    args, algo, params, _ = algo_and_params
    h = history(dataclasses.replace(args, context_steps=1), algo.spec)
    action = jnp.array([0, 1, 1])
    width = 2 * args.num_unroll_steps

    @partial(jax.jit, static_argnums=0)
    def two_steps(cached, params):
        root = uz.root_fn(algo.graphdef, params, h, width, cached)
        first, node = uz.recurrent_fn(algo.graphdef, args.gamma, params, None, action, root.embedding)
        second, child = uz.recurrent_fn(algo.graphdef, args.gamma, params, None, 1 - action, node)
        for new, old in zip(jax.tree.leaves(child), jax.tree.leaves(root.embedding)):
            assert new.shape == old.shape and new.dtype == old.dtype
        return root.prior_logits, root.value, first, second

    recomputed, cached = two_steps(False, params), two_steps(True, params)
    assert isinstance(uz.root_fn(algo.graphdef, params, h, width, True).embedding, uz.CachedNode)
    for a, b in zip(jax.tree.leaves(recomputed), jax.tree.leaves(cached)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)
    assert not np.allclose(recomputed[2].value, recomputed[3].value)  # the steps compute something


def test_recurrent_fn_steps_the_model_and_discounts_by_gamma(algo_and_params):
    """One imagined step = the window forward on [history, action, predicted latent]."""
    args, algo, params, forward = algo_and_params
    h = history(args, algo.spec)
    action = jnp.array([0, 1, 1])

    @jax.jit
    def step(params, h, action):
        root = algo.root_fn(params, h)
        return algo.recurrent_fn(params, jax.random.key(0), action, root.embedding)

    out, node = step(params, h, action)
    np.testing.assert_allclose(out.discount, args.gamma)
    C = args.context_steps
    # The same step through forward_window: history with the action, then the predicted latent as a token.
    full = uz.Window(h.obs, h.action.at[:, -1].set(action), h.timestep, jnp.zeros_like(h.timestep), h.valid, h.valid)
    _, _, next_latent, reward_logits = forward(params, full)
    np.testing.assert_allclose(out.reward, uz.logits_to_scalar(reward_logits[:, C - 1]), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(node.tokens[:, -1], next_latent[:, C - 1], atol=1e-5)
    assert (node.positions[:, -1] == 2 * (h.timestep[:, -1] + 1)).all()


@pytest.mark.parametrize("first_valid", [0, 1], ids=["full-history", "episode-started-inside"])
def test_root_value_equals_the_value_head(algo_and_params, first_valid):
    """RootFnOutput.value is inverse-h of the value head at the current latent,
    read from the same history as a training window would present it (steps of
    an earlier episode invisible)."""
    args, algo, params, forward = algo_and_params
    C = args.context_steps
    valid = jnp.arange(C) >= first_valid
    h = history(args, algo.spec, valid=valid)
    root = jax.jit(algo.root_fn)(params, h)
    w = uz.Window(h.obs, h.action, h.timestep, jnp.zeros_like(h.timestep), h.valid, h.valid & (jnp.arange(C) < C - 1))
    policy_logits, value_logits, _, _ = forward(params, w)
    np.testing.assert_allclose(root.value, uz.logits_to_scalar(value_logits[:, -1]), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(root.prior_logits, policy_logits[:, -1], atol=1e-4)
    assert np.abs(np.asarray(root.value)).min() > 1e-3  # a real value, not the zero of an untrained head


@pytest.mark.parametrize("search_policy", ["gumbel", "puct"])
def test_search_explores_in_collection_and_is_greedy_in_evaluation(algo_and_params, search_policy):
    """Collection: noise (Gumbel, or Dirichlet plus sampling at temperature 0.25)
    makes the action depend on the key. Evaluation: the same action for every key."""
    args, algo, _, _ = algo_and_params
    args = dataclasses.replace(args, search_policy=search_policy, num_simulations=8)
    algo = uz.make_train(args)
    params = algo_and_params[2]
    h = history(args, algo.spec, batch=16)

    @partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})  # compiled to run once
    def actions(key):
        keys = jax.random.split(key)
        explore = algo.search(params, h, keys[0], explore=True)
        greedy = algo.search(params, h, keys[1], explore=False)
        return explore.action, greedy.action, explore.action_weights

    runs = [actions(jax.random.key(i)) for i in range(4)]
    assert any((runs[0][0] != r[0]).any() for r in runs[1:])
    for r in runs[1:]:
        np.testing.assert_array_equal(runs[0][1], r[1])
    weights = np.asarray(runs[0][2])
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    if search_policy == "puct":  # the policy target is the visit distribution
        np.testing.assert_allclose(weights * 8, np.round(weights * 8), atol=1e-4)


def test_history_forgets_ended_episodes():
    h = uz.History(
        jnp.zeros((2, 3, 1)), jnp.zeros((2, 3), jnp.int32), jnp.zeros((2, 3), jnp.int32), jnp.zeros((2, 3), bool)
    )
    h = uz.observe(h, jnp.ones((2, 1)), jnp.array([0, 0]))
    h = uz.record_action(h, jnp.array([1, 1]), jnp.array([False, True]))
    h = uz.observe(h, 2 * jnp.ones((2, 1)), jnp.array([1, 0]))
    np.testing.assert_array_equal(h.valid, [[False, True, True], [False, False, True]])
    np.testing.assert_array_equal(h.action[:, 1], [1, 1])
    np.testing.assert_array_equal(h.obs[:, :, 0], [[0, 1, 2], [0, 1, 2]])


# -------------------------------------------------------------------- targets
def value_targets_loop(rewards, terminated, truncated, window_values, final_values, gamma, n):
    B, K = window_values.shape
    targets = np.zeros((B, K))
    for b in range(B):
        for t in range(K):
            total, bootstrap = 0.0, gamma**n * window_values[b, t]
            for i in range(n):
                total += gamma**i * rewards[b, t + i]
                if terminated[b, t + i]:
                    bootstrap = 0.0
                    break
                if truncated[b, t + i]:
                    bootstrap = gamma ** (i + 1) * final_values[b, t + i]
                    break
            targets[b, t] = total + bootstrap
    return targets


def random_target_inputs(rng, B: int, K: int, n: int):
    """Rewards, episode ends (8% each), bootstrap values [B, K] and final-observation values [B, K + n]."""
    L = K + n
    rewards = rng.normal(size=(B, L)).astype(np.float32)
    terminated = rng.uniform(size=(B, L)) < 0.08
    truncated = (rng.uniform(size=(B, L)) < 0.08) & ~terminated
    window_values = rng.uniform(-10, 10, (B, K)).astype(np.float32)
    final_values = rng.uniform(-10, 10, (B, L)).astype(np.float32)
    return rewards, terminated, truncated, window_values, final_values


def test_n_step_value_targets_against_a_loop():
    rng = np.random.default_rng(0)
    B, K, n = 64, 5, 5
    rewards, terminated, truncated, window_values, final_values = random_target_inputs(rng, B, K, n)
    assert terminated[:, : K + n - 1].any() and truncated[:, : K + n - 1].any()
    stop = np.asarray(uz.stop_rows(jnp.asarray(terminated), jnp.asarray(truncated), K, n))
    at_stop = np.take_along_axis(final_values, stop, 1)  # the loss computes V(final obs) only at these rows
    got = uz.n_step_value_targets(*map(jnp.asarray, (rewards, terminated, truncated, window_values, at_stop)), 0.997, n)
    np.testing.assert_allclose(
        got,
        value_targets_loop(rewards, terminated, truncated, window_values, final_values, 0.997, n),
        rtol=1e-5,
        atol=1e-4,
    )


def test_truncation_bootstraps_from_the_final_observation_termination_does_not():
    zeros = jnp.zeros((1, 3), bool)
    rewards, window_values = jnp.ones((1, 3)), jnp.full((1, 2), 100.0)
    final_values = jnp.array([[10.0, 30.0]])  # V(final obs) of the rows where the sums stop: 0 (ended) and 2
    ended_first = zeros.at[0, 0].set(True)
    np.testing.assert_array_equal(uz.stop_rows(zeros, ended_first, 2, 2), [[0, 2]])
    truncated = uz.n_step_value_targets(rewards, zeros, ended_first, window_values, final_values, 0.9, 2)
    terminated = uz.n_step_value_targets(rewards, ended_first, zeros, window_values, final_values, 0.9, 2)
    running = uz.n_step_value_targets(rewards, zeros, zeros, window_values, final_values, 0.9, 2)
    assert float(truncated[0, 0]) == pytest.approx(1 + 0.9 * 10)
    assert float(terminated[0, 0]) == pytest.approx(1)
    assert float(running[0, 0]) == pytest.approx(1 + 0.9 + 0.81 * 100)
    assert float(truncated[0, 1]) == float(terminated[0, 1]) == pytest.approx(1 + 0.9 + 0.81 * 100)  # a new episode



def test_value_horizons_shorten_with_age_as_efficientzero():
    """EfficientZero's off-policy correction: td = clip(n - age // td_steps_age, 1, n)."""
    age = jnp.array([0, 29_999, 30_000, 59_999, 60_000, 120_000, 10**7])
    np.testing.assert_array_equal(uz.value_horizons(age, 5, 30_000), [5, 5, 4, 4, 3, 1, 1])


def test_window_ages_count_env_steps_since_a_row_was_written():
    from jaxzoo import buffers

    buffer = buffers.init(jnp.zeros(()), capacity=12, num_envs=3)  # 4 rows of 3 envs
    for _ in range(6):  # wraps: the newest row is 1, then 0, 3, 2
        buffer = buffers.add(buffer, jnp.zeros(3))
    np.testing.assert_array_equal(uz.window_ages(buffer, jnp.array([1, 0, 3, 2])), [0, 3, 6, 9])


def test_n_step_value_targets_with_a_horizon_per_window_against_a_loop():
    """Window b with horizon h sums h rewards (an end after them does not stop
    it) and bootstraps from window_values[b, t] = V_{t+h}: the loop with n = h,
    window by window; horizon n everywhere is the plain target."""
    rng = np.random.default_rng(1)
    B, K, n = 64, 5, 5
    rewards, terminated, truncated, window_values, final_values = random_target_inputs(rng, B, K, n)
    horizon = rng.integers(1, n + 1, B)
    assert set(horizon) == set(range(1, n + 1))
    arrays = tuple(map(jnp.asarray, (rewards, terminated, truncated)))
    stop = np.asarray(uz.stop_rows(*arrays[1:], K, n, jnp.asarray(horizon)))
    at_stop = jnp.asarray(np.take_along_axis(final_values, stop, 1))
    got = uz.n_step_value_targets(*arrays, jnp.asarray(window_values), at_stop, 0.997, n, jnp.asarray(horizon))
    expected = np.concatenate([
        value_targets_loop(*(x[b : b + 1] for x in (rewards, terminated, truncated, window_values, final_values)),
                           0.997, int(h))
        for b, h in enumerate(horizon)
    ])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
    full = jnp.full(B, n)
    plain_stop = uz.stop_rows(*arrays[1:], K, n)
    np.testing.assert_array_equal(uz.stop_rows(*arrays[1:], K, n, full), plain_stop)
    at_plain_stop = jnp.asarray(np.take_along_axis(final_values, np.asarray(plain_stop), 1))
    np.testing.assert_allclose(
        uz.n_step_value_targets(*arrays, jnp.asarray(window_values), at_plain_stop, 0.997, n, full),
        uz.n_step_value_targets(*arrays, jnp.asarray(window_values), at_plain_stop, 0.997, n),
        rtol=1e-6,
    )


def test_td_steps_age_shortens_the_value_targets_of_old_windows_only(algo_and_params):
    """compute_targets with --td-steps-age A: windows younger than A env steps
    keep the td_steps-step target, older ones get the 1-step target of a
    td_steps=1 run (the tiny preset's td_steps is 2), bootstrapped from the
    target model's value one row later."""
    args, algo, params, _ = algo_and_params
    assert args.td_steps == 2
    windows = random_windows(args, algo, seed=9)
    windows = windows._replace(truncated=windows.truncated.at[1, 2].set(True))  # one sum cut short by a truncation
    segment = uz.episode_segments(windows)

    def targets(a, age=None):
        world = nnx.merge(algo.graphdef, params)
        return jax.jit(lambda: uz.compute_targets(world, windows, segment, 0.9, a, age)[1])()

    plain, one_step = targets(args), targets(dataclasses.replace(args, td_steps=1))
    aged = targets(dataclasses.replace(args, td_steps_age=100), jnp.array([0, 99, 100, 10**6]))  # horizons 2, 2, 1, 1
    np.testing.assert_allclose(aged[:2], plain[:2], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(aged[2:], one_step[2:], rtol=1e-5, atol=1e-5)
    assert np.abs(np.asarray(plain[2:]) - np.asarray(one_step[2:])).min() > 1e-3  # the horizons differ

# ------------------------------------------------------ search-target sharpness
def test_q_rescale_min_gap_keeps_small_q_gaps_small(algo_and_params):
    """mctx rescales a node's Q-values by (q - min) / max(max - min, epsilon):
    with mctx's epsilon 1e-8 any gap becomes 0 and 1, and Gumbel MuZero's policy
    target moves far from the prior; with a gap floor far above the Q-values'
    spread (q_rescale_min_gap, LightZero's value_delta_max) the rescaled
    Q-values are about 0 and the target is the prior."""
    args, _, params, _ = algo_and_params
    h = history(args, uz.make_train(args).spec, batch=16)

    def weights_and_prior(min_gap):
        algo = uz.make_train(dataclasses.replace(args, q_rescale_min_gap=min_gap))
        out = jax.jit(lambda p, k: algo.search(p, h, k, False))(params, jax.random.key(0))
        prior = jax.nn.softmax(uz.root_fn(algo.graphdef, params, h, 2 * args.num_unroll_steps).prior_logits)
        return np.asarray(out.action_weights), np.asarray(prior)

    sharp, prior = weights_and_prior(1e-8)
    soft, same_prior = weights_and_prior(1e6)
    np.testing.assert_allclose(prior, same_prior)
    np.testing.assert_allclose(soft, prior, atol=1e-4)
    assert np.abs(sharp - prior).max() > 0.1


def random_windows(args, algo, seed=3, B=4) -> uz.Transition:
    """B replayed windows of random observations, actions, rewards and search policies."""
    L = args.window_length
    keys = jax.random.split(jax.random.key(seed), 4)
    obs = jax.random.normal(keys[0], (B, L) + algo.spec.obs_shape)
    return uz.Transition(
        obs=obs,
        action=jax.random.randint(keys[1], (B, L), 0, algo.spec.num_actions),
        reward=jax.random.normal(keys[2], (B, L)),
        terminated=jnp.zeros((B, L), bool),
        truncated=jnp.zeros((B, L), bool),
        final_obs=jnp.roll(obs, -1, axis=1),
        timestep=jnp.broadcast_to(jnp.arange(L), (B, L)),
        search_policy=jax.nn.softmax(jax.random.normal(keys[3], (B, L, algo.spec.num_actions))),
        root_value=jnp.zeros((B, L)),
    )


def test_policy_entropy_bonus_is_subtracted_from_the_loss(algo_and_params):
    """unizero_loss with policy_entropy_coef c is the loss without it minus c x
    the policy head's mean entropy, which the metrics report."""
    args, algo, params, _ = algo_and_params
    windows = random_windows(args, algo)
    hparams = uz.Hyperparams.from_args(args)
    world = lambda: nnx.merge(algo.graphdef, params)
    loss = jax.jit(lambda hp: uz.unizero_loss(world(), world(), windows, hp, jax.random.key(4), args))
    plain, metrics = loss(hparams)
    bonus, _ = loss(hparams.replace(policy_entropy_coef=jnp.float32(0.5)))
    assert 0 < float(metrics["policy_entropy"]) <= np.log(algo.spec.num_actions) + 1e-6
    np.testing.assert_allclose(bonus, plain - 0.5 * metrics["policy_entropy"], rtol=1e-6, atol=1e-6)


def test_advantage_weighted_regression_against_numpy_and_its_minimiser():
    """-mean(w log pi(a)), w = min(exp(A_hat), 20) with A_hat the batch-normalised
    advantage; with one prior for all replayed steps of a state its minimiser
    is the weighted frequency of the actions taken (AWR's pi ~ mu exp(A)), and
    equal advantages (w = 1) give the plain negative log-likelihood."""
    logits = jax.random.normal(jax.random.key(0), (2, 3, 4))
    actions = jnp.array([[0, 1, 2], [3, 0, 1]])
    advantages = jnp.array([[2.0, -1.0, 0.5], [0.0, 30.0, -2.0]])  # 30: a weight clipped at 20
    a = np.asarray(advantages)
    weights = np.minimum(np.exp((a - a.mean()) / (a.std() + 1e-8)), 20.0)
    log_probs = np.asarray(jax.nn.log_softmax(logits))
    taken = np.take_along_axis(log_probs, np.asarray(actions)[..., None], -1)[..., 0]
    np.testing.assert_allclose(
        uz.advantage_weighted_nll(logits, actions, advantages), -np.mean(weights * taken), rtol=1e-5
    )
    np.testing.assert_allclose(
        uz.advantage_weighted_nll(logits, actions, jnp.full((2, 3), 1.7)), -np.mean(taken), rtol=1e-5
    )

    replayed = jnp.array([[0], [0], [1], [2], [2], [2]])  # six replayed steps of one state, three actions
    advantages = jnp.array([[1.0], [-0.5], [2.0], [-1.0], [0.0], [-2.0]])
    a = np.asarray(advantages)[:, 0]
    w = np.exp((a - a.mean()) / a.std())
    weighted_frequency = np.array([w[:2].sum(), w[2], w[3:].sum()]) / w.sum()
    shared = lambda prior_logits: uz.advantage_weighted_nll(
        jnp.broadcast_to(prior_logits, (6, 1, 3)), replayed, advantages
    )
    np.testing.assert_allclose(jax.grad(shared)(jnp.log(jnp.asarray(weighted_frequency))), 0.0, atol=1e-6)
    assert np.abs(jax.grad(shared)(jnp.zeros(3))).max() > 0.01  # the uniform prior is not the minimiser


def loss_and_metrics(algo, params, args, windows):
    """unizero_loss of the same parameters as online and target model, jitted."""
    world = lambda: nnx.merge(algo.graphdef, params)
    hparams = uz.Hyperparams.from_args(args)
    return jax.jit(lambda: uz.unizero_loss(world(), world(), windows, hparams, jax.random.key(4), args))()


def test_advantage_coef_adds_its_term_and_leaves_the_loss_alone_at_zero(algo_and_params):
    """unizero_loss with advantage_coef c is the loss at 0 plus c x the
    advantage term it reports; at 0 no term is computed or reported."""
    args, algo, params, _ = algo_and_params
    windows = random_windows(args, algo, seed=5)
    plain, plain_metrics = loss_and_metrics(algo, params, args, windows)
    with_term, metrics = loss_and_metrics(algo, params, dataclasses.replace(args, advantage_coef=0.5), windows)
    assert "advantage_loss" not in plain_metrics
    assert float(metrics["advantage_loss"]) != 0.0
    np.testing.assert_allclose(with_term, plain + 0.5 * metrics["advantage_loss"], rtol=1e-6, atol=1e-6)


def test_terminal_value_coef_trains_the_frame_after_a_termination_toward_zero(algo_and_params):
    """With terminal_value_coef c the loss is the loss at 0 plus c x the reported
    term: the value cross-entropy toward 0 of the final observations of the
    terminated rows among the first K, each read alone (its timestep + 1), and
    nothing of the others; at 0 no term is computed or reported."""
    args, algo, params, _ = algo_and_params
    K = args.num_unroll_steps
    windows = random_windows(args, algo, seed=6)
    terminated = jnp.zeros_like(windows.terminated).at[0, 1].set(True).at[2, K - 1].set(True).at[3, K].set(True)
    windows = windows._replace(terminated=terminated)  # row K of window 3: past the trained rows, not counted
    plain, plain_metrics = loss_and_metrics(algo, params, args, windows)
    with_term, metrics = loss_and_metrics(algo, params, dataclasses.replace(args, terminal_value_coef=0.5), windows)
    assert "terminal_value_loss" not in plain_metrics
    np.testing.assert_allclose(with_term, plain + 0.5 * metrics["terminal_value_loss"], rtol=1e-6, atol=1e-6)

    model = nnx.merge(algo.graphdef, params)
    zero = np.asarray(uz.scalar_to_probs(jnp.zeros(()), args.support_size))
    expected = []
    for b, t in [(0, 1), (2, K - 1)]:
        logits = uz.lone_value_logits(
            model, windows.final_obs[b : b + 1, t : t + 1], windows.timestep[b : b + 1, t : t + 1] + 1
        )
        expected.append(-np.sum(zero * np.asarray(jax.nn.log_softmax(logits[0, 0]))))
    np.testing.assert_allclose(metrics["terminal_value_loss"], np.mean(expected), rtol=1e-5)
    np.testing.assert_allclose(
        uz.lone_values(model, windows.final_obs[:1, :2], windows.timestep[:1, :2]),
        uz.logits_to_scalar(uz.lone_value_logits(model, windows.final_obs[:1, :2], windows.timestep[:1, :2])),
    )


def test_prioritised_replay_weights_each_window_and_reports_muzero_priorities(algo_and_params):
    """With importance weights [B] every loss term is the weighted mean over
    windows of each window's mean: all ones give the uniform loss, one window
    weighted B and the rest 0 give that window's loss alone; the new priority of
    each window is MuZero's |search value - n-step value target| of its first step."""
    args, algo, params, _ = algo_and_params
    args = dataclasses.replace(args, dropout=0.0)  # no dropout mask that depends on the batch's shape
    B = 4
    windows = random_windows(args, algo, seed=7, B=B)
    windows = windows._replace(root_value=jax.random.normal(jax.random.key(8), windows.reward.shape))
    world = lambda: nnx.merge(algo.graphdef, params)
    hparams = uz.Hyperparams.from_args(args)
    loss = jax.jit(lambda w, weights: uz.unizero_loss(world(), world(), w, hparams, jax.random.key(4), args, weights))
    plain, plain_metrics = loss_and_metrics(algo, params, args, windows)
    ones, metrics = loss(windows, jnp.ones(B))
    np.testing.assert_allclose(ones, plain, rtol=1e-5)
    assert "priority" not in plain_metrics

    _, value_targets = uz.compute_targets(world(), windows, uz.episode_segments(windows), hparams.gamma, args)
    np.testing.assert_allclose(
        metrics["priority"], np.abs(np.asarray(windows.root_value[:, 0] - value_targets[:, 0])), rtol=1e-5
    )
    first_only, _ = loss(windows, jnp.zeros(B).at[0].set(B))
    alone, _ = loss_and_metrics(algo, params, args, jax.tree.map(lambda x: x[:1], windows))
    np.testing.assert_allclose(first_only, alone, rtol=1e-5)
    assert abs(float(first_only) - float(plain)) > 1e-3  # the windows differ: the weights matter


def test_importance_weights_are_rainbows_copy():
    """importance_weights is the text of rainbow.py's (one formula, one form:
    docs/glossary.md; tests/test_rainbow_math.py checks its values)."""
    import inspect

    from jaxzoo.algos import rainbow

    assert inspect.getsource(uz.importance_weights) == inspect.getsource(rainbow.importance_weights)


@pytest.mark.parametrize("anneal", [False, True])
def test_learning_rate_decays_linearly_over_the_updates_with_anneal_lr(anneal):
    """--anneal-lr: update k = 0 .. N-1 (its collection brings env_steps to
    (k + 1) x steps_per_update) trains at lr x (1 - k / N), PPO's schedule;
    without it, the rate is the constant given."""
    args = tiny(anneal_lr=anneal)
    n, per_update = args.num_updates, args.steps_per_update
    env_steps = jnp.arange(1, n + 1) * per_update
    rates = jax.vmap(lambda steps: uz.learning_rate_at(args, jnp.float32(0.01), steps))(env_steps)
    expected = 0.01 * (1 - np.arange(n) / n) if anneal else np.full(n, 0.01)
    np.testing.assert_allclose(rates, expected, rtol=1e-6)


def test_explore_epsilon_replaces_the_search_action_with_a_uniform_one(algo_and_params):
    """collect_step acts with the search's action (here forced to 0), except with
    probability explore_epsilon a uniformly random one; replay stores the action
    taken, and the policy target stays the search's weights."""
    args, algo, params, _ = algo_and_params
    args = dataclasses.replace(
        args, num_envs=64, buffer_size=64 * (args.window_length + 1), total_timesteps=64 * args.num_steps
    )
    algo = uz.make_train(args)
    state = algo.init(jax.random.key(0)).replace(params=params)
    search_zero = lambda *a: (lambda out: out.replace(action=jnp.zeros_like(out.action)))(algo.search(*a))

    @partial(jax.jit, static_argnums=0, compiler_options={"xla_backend_optimization_level": 0})
    def stored(epsilon):
        state_after, _ = uz.collect_step(algo_env[0], algo_env[1], search_zero, epsilon, state)
        rows = state_after.buffer.data
        return rows.action[0], rows.search_policy[0]

    algo_env = uz.make_envs(args)[:2]
    taken, weights = {}, {}
    for epsilon in (0.0, 0.5, 1.0):
        taken[epsilon], weights[epsilon] = map(np.asarray, stored(epsilon))
    assert (taken[0.0] == 0).all()
    assert set(taken[1.0].tolist()) == set(range(algo.spec.num_actions))  # 64 uniform draws over 2 actions
    assert 0 < (taken[0.5] != 0).mean() < 1  # about a quarter: half the steps, half of those draw a non-zero action
    for epsilon in (0.5, 1.0):
        np.testing.assert_allclose(weights[epsilon], weights[0.0], atol=1e-6)


@pytest.mark.parametrize("decay", [False, True])
def test_visit_temperature_follows_muzero_schedule_with_decay(decay):
    """--visit-temperature-decay: x 1 / 0.5 / 0.25 while under 1/2 / 3/4 / all of
    the run's env steps are done (MuZero's Atari visit_softmax_temperature);
    without it, the constant given. Gumbel MuZero has no visit temperature: refused."""
    args = tiny(search_policy="puct", visit_temperature_decay=decay)
    total = args.num_updates * args.steps_per_update
    assert total % 4 == 0  # the tiny preset's 100 steps: the quarters are whole env steps
    env_steps = np.array([0, total // 4, total // 2 - 1, total // 2, 3 * total // 4 - 1, 3 * total // 4, total - 1])
    temperatures = jax.vmap(lambda steps: uz.visit_temperature_at(args, jnp.float32(2.0), steps))(
        jnp.asarray(env_steps)
    )
    expected = np.array([2, 2, 2, 1, 1, 0.5, 0.5]) if decay else np.full(env_steps.shape, 2.0)
    np.testing.assert_allclose(temperatures, expected)
    with pytest.raises(ValueError, match="visit_temperature_decay=True with search_policy='gumbel'"):
        tiny(search_policy="gumbel", visit_temperature_decay=True)


def test_visit_temperature_decay_at_moves_the_schedule_s_two_steps():
    """--visit-temperature-decay-at 0.25 0.5: the temperature halves once a
    quarter of the run is done and quarters at half; fractions out of order or
    outside [0, 1], or given without the decay, are refused by name."""
    args = tiny(search_policy="puct", visit_temperature_decay=True, visit_temperature_decay_at=(0.25, 0.5))
    total = args.num_updates * args.steps_per_update
    env_steps = np.array([0, total // 4 - 1, total // 4, total // 2 - 1, total // 2, total - 1])
    temperatures = jax.vmap(lambda steps: uz.visit_temperature_at(args, jnp.float32(2.0), steps))(
        jnp.asarray(env_steps)
    )
    np.testing.assert_allclose(temperatures, [2, 2, 1, 1, 0.5, 0.5])
    for bad in [(0.75, 0.5), (-0.1, 0.5), (0.5, 1.5)]:
        with pytest.raises(ValueError, match=re.escape(f"visit_temperature_decay_at={bad} are not two fractions")):
            tiny(search_policy="puct", visit_temperature_decay=True, visit_temperature_decay_at=bad)
    with pytest.raises(ValueError, match="without --visit-temperature-decay"):
        tiny(search_policy="puct", visit_temperature_decay_at=(0.25, 0.5))


def test_collect_step_hands_the_search_the_scheduled_temperature(algo_and_params):
    """collect_step's `visit_temperature` replaces the state's for its search (the
    decay's), and without it the search sees the state's own."""
    args, algo, params, _ = algo_and_params
    args = dataclasses.replace(args, search_policy="puct")
    algo = uz.make_train(args)
    state = algo.init(jax.random.key(0)).replace(params=params)
    state = state.replace(hparams=state.hparams.replace(visit_temperature=jnp.float32(1.0)))

    def search_acting_on_temperature(params, history, key, explore, hparams):  # action = the temperature it was given
        out = algo.search(params, history, key, explore, hparams)
        return out.replace(action=jnp.full_like(out.action, hparams.visit_temperature.astype(out.action.dtype)))

    @partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})
    def taken(temperature):
        after, _ = uz.collect_step(env, env_params, search_acting_on_temperature, 0.0, state, temperature)
        return after.buffer.data.action[0]

    env, env_params = uz.make_envs(args)[:2]
    assert (np.asarray(taken(jnp.float32(0.0))) == 0).all()
    own = uz.collect_step(env, env_params, search_acting_on_temperature, 0.0, state)[0].buffer.data.action[0]
    assert (np.asarray(own) == 1).all()


@pytest.mark.parametrize("rows", [[], [0], [5, 9], [0, 3, 7, 8, 9, 12, 15]])
def test_on_rows_matches_every_row_and_computes_only_few(algo_and_params, rows):
    """on_rows gives fn's values (and gradients) on the selected rows and 0 on the
    others, as computing every row does; up to B T / 8 rows it runs fn on
    a [1, B T / 8] batch of them alone (row 0 selected or not: the padding
    repeats row 0), past that on all rows."""
    args, algo, params, _ = algo_and_params
    batch, steps = 8, 4  # capacity 4
    obs = jax.random.uniform(jax.random.key(2), (batch, steps, *algo.spec.obs_shape))
    timestep = jnp.arange(batch * steps, dtype=jnp.int32).reshape(batch, steps) % 7
    mask = jnp.zeros(batch * steps, bool).at[jnp.asarray(rows, jnp.int32)].set(True).reshape(batch, steps)

    def logits(params, obs, timestep):
        return uz.lone_value_logits(nnx.merge(algo.graphdef, params), obs, timestep)

    def squares(params, sparse):
        out = uz.on_rows(partial(logits, params), mask, obs, timestep) if sparse else logits(params, obs, timestep)
        return jnp.sum(jnp.where(mask[..., None], out, 0.0) ** 2), out

    (_, got), got_grads = jax.jit(jax.value_and_grad(partial(squares, sparse=True), has_aux=True))(params)
    (_, dense), dense_grads = jax.jit(jax.value_and_grad(partial(squares, sparse=False), has_aux=True))(params)
    selected = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(got)[selected], np.asarray(dense)[selected], rtol=1e-5, atol=1e-6)
    assert (np.asarray(got)[~selected] == 0).all()
    for g, d in zip(jax.tree.leaves(got_grads), jax.tree.leaves(dense_grads)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(d), rtol=1e-4, atol=1e-5 * np.abs(d).max() + 1e-7)

    # Which batch fn ran on: a row's value is the number of rows of its call.
    batch_rows = lambda x: jnp.full(x.shape[:2], x.shape[0] * x.shape[1], jnp.float32)
    ran_on = np.asarray(jax.jit(lambda m: uz.on_rows(batch_rows, m, obs))(mask))[selected]
    assert (ran_on == (batch * steps // 8 if len(rows) <= batch * steps // 8 else batch * steps)).all()
