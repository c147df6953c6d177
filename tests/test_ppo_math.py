"""PPO's formulas against analytic values and slow reference loops."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxzoo.algos.ppo import Args, Batch, Hyperparams, adapt_kl_coef, compute_gae, explained_variance, ppo_loss


def gae_by_definition(rewards, values, next_values, terminated, truncated, gamma, lam):
    """A_t = sum_l (gamma lambda)^l delta_{t+l}, summed forward until the episode
    (or the rollout) ends; delta bootstraps from next_values unless terminated."""
    T, N = rewards.shape
    deltas = rewards + gamma * (1 - terminated) * next_values - values
    advantages = np.zeros((T, N))
    for n in range(N):
        for t in range(T):
            total, weight = 0.0, 1.0
            for k in range(t, T):
                total += weight * deltas[k, n]
                if terminated[k, n] or truncated[k, n]:
                    break
                weight *= gamma * lam
            advantages[t, n] = total
    return advantages


def random_rollout(seed, T=40, N=3):
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    values = rng.normal(size=(T, N)).astype(np.float32)
    next_values = rng.normal(size=(T, N)).astype(np.float32)
    ends = rng.random((T, N))
    terminated = ends < 0.1
    truncated = (ends >= 0.1) & (ends < 0.2)
    return rewards, values, next_values, terminated, truncated


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_definition_with_terminated_and_truncated(seed):
    rewards, values, next_values, terminated, truncated = random_rollout(seed)
    assert terminated.any() and truncated.any()
    advantages, returns = compute_gae(
        jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(next_values),
        jnp.asarray(terminated), jnp.asarray(truncated), 0.99, 0.95,
    )
    expected = gae_by_definition(rewards, values, next_values, terminated, truncated, 0.99, 0.95)
    np.testing.assert_allclose(advantages, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(returns, expected + values, rtol=1e-4, atol=1e-4)


def test_truncation_bootstraps_and_termination_does_not():
    # One env, 3 steps; the episode ends at step 1, then a new one starts.
    rewards = jnp.array([[1.0], [1.0], [1.0]])
    values = jnp.array([[0.5], [0.5], [0.5]])
    next_values = jnp.array([[0.5], [10.0], [0.5]])  # V(final observation) at step 1 is 10
    end = jnp.array([[False], [True], [False]])
    no_end = jnp.zeros_like(end)
    adv_truncated, _ = compute_gae(rewards, values, next_values, no_end, end, 0.9, 1.0)
    adv_terminated, _ = compute_gae(rewards, values, next_values, end, no_end, 0.9, 1.0)
    # Truncated: delta_1 = 1 + 0.9 * 10 - 0.5; terminated: delta_1 = 1 - 0.5.
    assert adv_truncated[1, 0] == pytest.approx(1 + 0.9 * 10 - 0.5)
    assert adv_terminated[1, 0] == pytest.approx(0.5)
    # Either way the trace is cut: step 2 (next episode) does not leak into step 1.
    delta_2 = 1 + 0.9 * 0.5 - 0.5
    assert adv_truncated[2, 0] == pytest.approx(delta_2)
    assert not np.allclose(adv_truncated, adv_terminated)


def make_batch(m=64, seed=0):
    rng = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)
    return Batch(obs=f(m, 4), action=jnp.zeros(m, jnp.int32), log_prob=f(m), value=f(m),
                 advantage=f(m), target_return=f(m))


HP = Hyperparams.from_args(Args())


def loss_of(new_log_prob, batch, norm_adv=False, clip_vloss=True, entropy=None, new_value=None, hp=HP, kl_coef=0.0):
    entropy = jnp.zeros_like(new_log_prob) if entropy is None else entropy
    new_value = batch.value if new_value is None else new_value
    return ppo_loss(new_log_prob, entropy, new_value, batch, hp, jnp.float32(kl_coef),
                    norm_adv=norm_adv, clip_vloss=clip_vloss, vf_clip_coef=0.2)


def test_ratio_one_gives_plain_policy_gradient():
    batch = make_batch()
    (loss, stats) = loss_of(batch.log_prob, batch)
    assert stats["policy_loss"] == pytest.approx(-float(batch.advantage.mean()), abs=1e-6)
    assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert stats["clip_fraction"] == 0.0
    grad = jax.grad(lambda lp: loss_of(lp, batch)[1]["policy_loss"])(batch.log_prob)
    np.testing.assert_allclose(grad, -batch.advantage / len(batch.advantage), rtol=1e-5)


def test_clipping_zeroes_gradient_only_on_the_optimistic_side():
    batch = make_batch()._replace(advantage=jnp.array([1.0, -1.0, 1.0, -1.0]), log_prob=jnp.zeros(4),
                                  value=jnp.zeros(4), target_return=jnp.zeros(4), obs=jnp.zeros((4, 4)),
                                  action=jnp.zeros(4, jnp.int32))
    # ratios: 1.5 (A>0: clipped, no gradient), 1.5 (A<0: unclipped), 0.5 (A>0: unclipped), 0.5 (A<0: clipped)
    new_log_prob = jnp.log(jnp.array([1.5, 1.5, 0.5, 0.5]))
    grad = jax.grad(lambda lp: loss_of(lp, batch)[1]["policy_loss"])(new_log_prob)
    assert grad[0] == 0.0 and grad[3] == 0.0
    assert grad[1] != 0.0 and grad[2] != 0.0
    assert loss_of(new_log_prob, batch)[1]["clip_fraction"] == 1.0


def test_value_clipping_takes_the_larger_error():
    batch = make_batch(4)._replace(value=jnp.zeros(4), target_return=jnp.ones(4))
    # Moving the value from 0 to 2 overshoots the target 1; clipped prediction 0.2 has error 0.64 > 1.
    new_value = jnp.full(4, 2.0)
    clipped = loss_of(batch.log_prob, batch, new_value=new_value, clip_vloss=True)[1]["value_loss"]
    unclipped = loss_of(batch.log_prob, batch, new_value=new_value, clip_vloss=False)[1]["value_loss"]
    assert unclipped == pytest.approx(0.5 * 1.0)
    assert clipped == pytest.approx(0.5 * max(1.0, (0.2 - 1.0) ** 2))


def test_entropy_bonus_and_kl_penalty_enter_the_loss():
    batch = make_batch()
    entropy = jnp.full(batch.log_prob.shape, 2.0)
    base = loss_of(batch.log_prob, batch)[0]
    with_entropy = loss_of(batch.log_prob, batch, entropy=entropy)[0]
    assert with_entropy == pytest.approx(float(base) - float(HP.ent_coef) * 2.0, rel=1e-5)
    shifted = batch.log_prob + 0.3
    no_penalty = loss_of(shifted, batch, kl_coef=0.0)
    penalty = loss_of(shifted, batch, kl_coef=0.5)
    assert penalty[0] == pytest.approx(float(no_penalty[0]) + 0.5 * float(no_penalty[1]["approx_kl"]), rel=1e-5)


def test_advantage_normalisation_is_per_minibatch():
    batch = make_batch()._replace(advantage=jnp.linspace(10.0, 20.0, 64))
    stats = loss_of(batch.log_prob, batch, norm_adv=True)[1]
    assert stats["policy_loss"] == pytest.approx(0.0, abs=1e-5)  # normalised advantages have mean 0


def test_approx_kl_estimates_true_kl():
    # KL(p || q) for categoricals p, q by Monte Carlo with the (r - 1) - log r estimator.
    p = jnp.array([0.7, 0.2, 0.1])
    q = jnp.array([0.5, 0.3, 0.2])
    actions = jax.random.categorical(jax.random.key(0), jnp.log(p), shape=(200_000,))
    old, new = jnp.log(p)[actions], jnp.log(q)[actions]
    m = len(actions)
    batch = Batch(jnp.zeros((m, 1)), actions, old, jnp.zeros(m), jnp.zeros(m), jnp.zeros(m))
    estimate = ppo_loss(new, jnp.zeros(m), jnp.zeros(m), batch, HP, jnp.float32(0), norm_adv=False,
                        clip_vloss=False, vf_clip_coef=0.2)[1]["approx_kl"]
    true_kl = float(jnp.sum(p * (jnp.log(p) - jnp.log(q))))
    assert estimate == pytest.approx(true_kl, rel=0.03)


def test_adaptive_kl_coefficient_follows_rllib_rule():
    coef = jnp.float32(0.2)
    assert adapt_kl_coef(coef, jnp.float32(0.05), 0.01) == pytest.approx(0.3)  # > 2 x target
    assert adapt_kl_coef(coef, jnp.float32(0.001), 0.01) == pytest.approx(0.1)  # < target / 2
    assert adapt_kl_coef(coef, jnp.float32(0.01), 0.01) == pytest.approx(0.2)


def test_explained_variance():
    target = jnp.arange(10.0)
    assert explained_variance(target, target) == pytest.approx(1.0)
    assert explained_variance(jnp.full(10, target.mean()), target) == pytest.approx(0.0, abs=1e-6)


def test_policies_are_the_paper_formulas_and_draw_as_distrax_does():
    """ActorCritic's policies (written out, not distrax's): log-probs and
    entropies are the textbook formulas, and samples, log-probs and entropies
    equal distrax's Categorical and MultivariateNormalDiag on the same inputs
    and keys (the distributions of earlier versions, so runs keep their
    actions)."""
    import distrax
    from flax import nnx

    from jaxzoo import envs
    from jaxzoo.algos.ppo import ActorCritic

    keys = jax.random.split(jax.random.key(0), 4)
    spec = envs.EnvSpec((4,), True, 3, None, None, 10)
    model = ActorCritic(spec, "mlp", (8,), "tanh", False, nnx.Rngs(0))
    obs = jax.random.normal(keys[0], (5, 4)) * 3.0
    dist = model.act(obs)
    logits = model.policy_head(model.actor_torso(obs))
    reference = distrax.Categorical(logits=logits)
    np.testing.assert_array_equal(dist.sample(seed=keys[1]), jax.random.categorical(keys[1], logits))
    np.testing.assert_array_equal(dist.sample(seed=keys[1]), reference.sample(seed=keys[1]))
    actions = jax.random.randint(keys[2], (5,), 0, 3)
    log_probs = jax.nn.log_softmax(logits)
    np.testing.assert_allclose(dist.log_prob(actions), log_probs[jnp.arange(5), actions], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dist.log_prob(actions), reference.log_prob(actions), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dist.entropy(), -(jnp.exp(log_probs) * log_probs).sum(-1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dist.entropy(), reference.entropy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(dist.mode(), jnp.argmax(logits, -1))

    spec = envs.EnvSpec((4,), False, 2, None, None, 10)
    model = ActorCritic(spec, "mlp", (8,), "tanh", False, nnx.Rngs(0))
    model.log_std[...] = jnp.array([-0.5, 0.3])
    dist = model.act(obs)
    mean, std = model.policy_head(model.actor_torso(obs)), jnp.exp(model.log_std[...])
    reference = distrax.MultivariateNormalDiag(mean, std * jnp.ones_like(mean))
    actions = mean + 0.7
    z = (actions - mean) / std
    np.testing.assert_allclose(dist.log_prob(actions), (-0.5 * z**2 - jnp.log(std) - 0.5 * jnp.log(2 * jnp.pi)).sum(-1),
                               rtol=1e-5)
    np.testing.assert_allclose(dist.log_prob(actions), reference.log_prob(actions), rtol=1e-5)
    np.testing.assert_allclose(dist.entropy(), jnp.full(5, (jnp.log(std) + 0.5 * (1 + jnp.log(2 * jnp.pi))).sum()),
                               rtol=1e-5)
    np.testing.assert_allclose(dist.entropy(), reference.entropy(), rtol=1e-6)
    np.testing.assert_array_equal(dist.mode(), mean)
    np.testing.assert_allclose(dist.sample(seed=keys[3]), reference.sample(seed=keys[3]), rtol=1e-6, atol=1e-6)
    samples = jax.vmap(lambda k: dist.sample(seed=k))(jax.random.split(keys[3], 20000))  # [20000, 5, 2]
    np.testing.assert_allclose(samples.mean(0), mean, atol=0.05)
    np.testing.assert_allclose(samples.std(0), jnp.broadcast_to(std, mean.shape), rtol=0.05)


@pytest.mark.parametrize("max_episode_steps", [6, 500])
def test_shared_torso_values_from_the_rollout_equal_the_batched_pass(max_episode_steps):
    """With a shared torso, V(s_t) comes from the acting pass and V(s'_t) from
    the next step's value, with V(final_obs) only at truncations (a rollout of
    CartPole cut every 6 steps has many; one of 500 steps has none, so the
    lax.cond branch that skips the pass runs). GAE's advantages and returns
    equal those of the batched pass over obs and final_obs."""
    from flax import nnx

    from jaxzoo.algos.ppo import ActorCritic, collect_rollout, make_envs, make_train, rollout_values

    args = Args(num_envs=4, num_steps=24, total_timesteps=96, shared_torso=True, max_episode_steps=max_episode_steps)
    env, env_params, _, spec, torso = make_envs(args)
    state = make_train(args).init(jax.random.key(1))
    model = ActorCritic(spec, torso, args.hidden_sizes, args.activation, True, nnx.Rngs(0))
    graphdef = nnx.graphdef(model)
    (_, last_obs, _), traj = collect_rollout(env, env_params, graphdef, state, args.num_steps)
    assert traj.value is not None
    assert bool(traj.truncated.any()) == (max_episode_steps == 6)
    assert bool(traj.terminated.any()) or max_episode_steps == 6  # 24 random CartPole steps end some episodes

    model = nnx.merge(graphdef, state.params)
    values, next_values = rollout_values(model, traj, last_obs)
    batched_values, batched_next = model.value(jnp.stack([traj.obs, traj.final_obs]))
    np.testing.assert_allclose(values, batched_values, rtol=1e-5, atol=1e-6)
    used = ~traj.terminated  # GAE multiplies V(s'_t) by 0 after a termination
    np.testing.assert_allclose(jnp.where(used, next_values, 0), jnp.where(used, batched_next, 0), rtol=1e-5, atol=1e-6)
    gae = lambda v, nv: compute_gae(traj.reward, v, nv, traj.terminated, traj.truncated, 0.99, 0.95)
    for ours, batched in zip(gae(values, next_values), gae(batched_values, batched_next)):
        np.testing.assert_allclose(ours, batched, rtol=1e-5, atol=1e-5)
