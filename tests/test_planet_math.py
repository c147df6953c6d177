"""PlaNet's pieces against closed forms, slow reference loops and toy problems."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxzoo.algos.planet import (
    RSSM,
    Args,
    Latent,
    StridedConv,
    StridedConvTranspose,
    WorldModel,
    cem_plan,
    kl_with_free_nats,
    open_loop_prediction,
    overshooting_kl,
    preprocess_obs,
    rssm_imagine,
    rssm_observe,
    rssm_observe_step,
)

SMALL = dataclasses.replace(Args(), belief_size=6, state_size=3, hidden_size=5, embedding_size=4)


def test_kl_with_free_nats_closed_form_and_clamp():
    rng = np.random.default_rng(0)
    mq, mp = rng.normal(size=(2, 4, 3)).astype(np.float32)
    sq, sp = rng.uniform(0.2, 2.0, size=(2, 4, 3)).astype(np.float32)
    expected = np.sum(np.log(sp / sq) + (sq**2 + (mq - mp) ** 2) / (2 * sp**2) - 0.5, axis=-1)
    loss, kl = kl_with_free_nats(mq, sq, mp, sp, free_nats=0.0)
    np.testing.assert_allclose(kl, expected, rtol=1e-5)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    # One dimension by hand: KL(N(0.3, 0.5^2) || N(-0.2, 0.8^2)) = 0.3606286.
    one = kl_with_free_nats(jnp.array([0.3]), jnp.array([0.5]), jnp.array([-0.2]), jnp.array([0.8]), 0.0)[1]
    assert float(one) == pytest.approx(0.3606286, rel=1e-5)
    free = float(np.median(expected))
    loss, kl = kl_with_free_nats(mq, sq, mp, sp, free_nats=free)
    np.testing.assert_allclose(loss, np.maximum(expected, free), rtol=1e-5)
    # Below the free nats the KL gets no gradient; above it, the KL's gradient.
    grad = jax.grad(lambda m: kl_with_free_nats(m, sq, mp, sp, free)[0].sum())(jnp.asarray(mq))
    below = expected < free
    assert np.all(np.asarray(grad)[below] == 0.0) and np.all(np.abs(np.asarray(grad)[~below]).sum(-1) > 0)
    np.testing.assert_allclose(np.asarray(grad)[~below], ((mq - mp) / sp**2)[~below], rtol=1e-5)


def test_cem_finds_the_minimum_of_a_quadratic():
    horizon, action_dim = 4, 2
    target = jnp.asarray(np.random.default_rng(1).uniform(-0.8, 0.8, (horizon, action_dim)), jnp.float32)
    returns_fn = lambda actions, key: -jnp.sum(jnp.square(actions - target), axis=(1, 2))
    plan = jax.jit(lambda key: cem_plan(returns_fn, key, horizon, action_dim, 10, 500, 50))
    mean, std, best = plan(jax.random.key(0))
    np.testing.assert_allclose(mean, target, atol=0.03)
    assert float(std.max()) < 0.1 and float(best) > -0.01
    # Bounds: a minimum outside [-1, 1] is found at the boundary.
    outside = lambda actions, key: -jnp.sum(jnp.square(actions - 3.0), axis=(1, 2))
    mean, _, _ = cem_plan(outside, jax.random.key(1), horizon, action_dim, 6, 200, 20)
    assert float(mean.min()) > 0.9


def test_planning_with_a_perfect_model_picks_the_right_first_action():
    # Double integrator x' = x + v, v' = v + a, reward -x'^2: the first action moves
    # x only two steps later, so only a multi-step planner finds its sign.
    def perfect_model(start):
        def returns_fn(actions, key):  # [N, H, 1] -> [N]
            def rollout(sequence):
                def step(carry, a):
                    x, v = carry
                    x, v = x + v, v + a[0]
                    return (x, v), -x**2
                return jax.lax.scan(step, start, sequence)[1].sum()
            return jax.vmap(rollout)(actions)
        return returns_fn

    plan = jax.jit(lambda start, key: cem_plan(perfect_model(start), key, 8, 1, 8, 300, 30)[0][0, 0])
    assert float(plan((0.6, 0.0), jax.random.key(0))) < -0.3  # push back towards 0
    assert float(plan((-0.6, 0.0), jax.random.key(1))) > 0.3
    assert float(plan((0.0, 0.5), jax.random.key(2))) < -0.3  # moving right: brake


def small_rssm_inputs(T=7, B=3, A=2):
    rng = np.random.default_rng(2)
    rssm = RSSM(A, SMALL, nnx.Rngs(0))
    actions = jnp.asarray(rng.normal(size=(T, B, A)), jnp.float32)
    embeddings = jnp.asarray(rng.normal(size=(T, B, SMALL.embedding_size)), jnp.float32)
    firsts = jnp.zeros((T, B), bool).at[0].set(True).at[4, 1].set(True)
    noise = jnp.asarray(rng.normal(size=(T, B, SMALL.state_size)), jnp.float32)
    init = Latent(jnp.ones((B, SMALL.belief_size)), jnp.ones((B, SMALL.state_size)))
    return rssm, init, actions, embeddings, firsts, noise


def test_rssm_scan_equals_a_python_loop():
    rssm, init, actions, embeddings, firsts, noise = small_rssm_inputs()
    outputs = rssm_observe(rssm, init, actions, embeddings, firsts, noise)
    graphdef, params = nnx.split(rssm)
    step_fn = jax.jit(lambda params, *inputs: rssm_observe_step(nnx.merge(graphdef, params), *inputs))
    latent = init
    for t in range(actions.shape[0]):
        latent, step = step_fn(params, latent, actions[t], embeddings[t], firsts[t], noise[t])
        for name, value in step._asdict().items():
            np.testing.assert_allclose(getattr(outputs, name)[t], value, rtol=1e-5, atol=1e-6, err_msg=f"{name} t={t}")
    assert float(outputs.prior_std.min()) >= SMALL.min_std and float(outputs.posterior_std.min()) >= SMALL.min_std


def test_a_first_frame_restarts_the_rssm_from_zeros():
    rssm, init, actions, embeddings, firsts, noise = small_rssm_inputs()
    outputs = rssm_observe(rssm, init, actions, embeddings, firsts, noise)
    # Sequence 1 has an episode start at t = 4: from there on it must equal a
    # fresh filter of frames 4.. started from any latent.
    other = Latent(init.belief * -3.0, init.state * 5.0)
    fresh = rssm_observe(rssm, other, actions[4:], embeddings[4:], firsts[4:].at[0].set(True), noise[4:])
    np.testing.assert_allclose(outputs.belief[4:, 1], fresh.belief[:, 1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outputs.state[4:, 1], fresh.state[:, 1], rtol=1e-5, atol=1e-6)
    assert not np.allclose(outputs.belief[4:, 0], fresh.belief[:, 0])  # no reset in sequence 0


def test_imagine_with_posterior_noise_free_prior_matches_observe_prior():
    rssm, init, actions, embeddings, firsts, noise = small_rssm_inputs()
    outputs = rssm_observe(rssm, init, actions, embeddings, jnp.zeros_like(firsts), noise)
    start = Latent(outputs.belief[2], outputs.state[2])
    predicted, mean, std = rssm_imagine(rssm, start, actions[3:4], noise[3:4])
    np.testing.assert_allclose(predicted.belief[0], outputs.belief[3], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(mean[0], outputs.prior_mean[3], rtol=1e-5, atol=1e-6)


def test_overshooting_distance_one_is_the_one_step_kl():
    rssm, init, actions, embeddings, firsts, noise = small_rssm_inputs()
    outputs = rssm_observe(rssm, init, actions, embeddings, firsts, noise)
    free = 0.5
    loss, _ = kl_with_free_nats(outputs.posterior_mean, outputs.posterior_std, outputs.prior_mean, outputs.prior_std,
                                free)
    # d = 1 from t predicts t + 1 with the same belief the filter computed (prior
    # noise is irrelevant: the belief depends on the posterior sample s_t).
    valid = ~np.asarray(firsts[1:])
    expected = np.asarray(loss[1:])[valid].mean()
    got = overshooting_kl(rssm, outputs, actions, firsts, 1, free, jax.random.key(0))
    assert float(got) == pytest.approx(float(expected), rel=1e-5)
    assert np.isfinite(float(overshooting_kl(rssm, outputs, actions, firsts, 10, free, jax.random.key(0))))


def test_strided_convolutions_match_references():
    rng = np.random.default_rng(3)
    conv = StridedConv(3, 5, 4, nnx.Rngs(0))
    x = jnp.asarray(rng.normal(size=(2, 14, 14, 3)), jnp.float32)
    reference = jax.lax.conv_general_dilated(x, conv.kernel[...], (2, 2), "VALID",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC")) + conv.bias[...]
    np.testing.assert_allclose(conv(x), reference, rtol=1e-4, atol=1e-5)
    for k, h in ((5, 1), (5, 5), (6, 13)):
        deconv = StridedConvTranspose(3, 2, k, nnx.Rngs(1))
        x = rng.normal(size=(2, h, h, 3)).astype(np.float32)
        kernel = np.asarray(deconv.kernel[...])
        reference = np.zeros((2, 2 * (h - 1) + k, 2 * (h - 1) + k, 2), np.float32)
        for i in range(h):
            for j in range(h):
                reference[:, 2 * i : 2 * i + k, 2 * j : 2 * j + k] += np.einsum("bc,xyco->bxyo", x[:, i, j], kernel)
        np.testing.assert_allclose(deconv(jnp.asarray(x)), reference, rtol=1e-4, atol=1e-5)


def test_bit_depth_reduction_and_dequantisation_noise():
    obs = jnp.arange(256, dtype=jnp.uint8).reshape(16, 16, 1)
    x = np.asarray(preprocess_obs(obs, 5, jax.random.key(0)))
    assert x.min() >= -0.5 and x.max() < 0.5
    levels = np.floor(np.asarray(obs, np.float32) / 8) / 32 - 0.5
    noise = x - levels
    assert noise.min() >= 0.0 and noise.max() < 1 / 32 and noise.std() > 0.005
    assert len(np.unique(levels)) == 32


def test_open_loop_prediction_filters_the_context_then_uses_only_actions():
    # Context frames are the posterior's reconstructions; after them the
    # prediction depends on the actions and not on the frames it predicts.
    args = dataclasses.replace(SMALL, image_size=16, grayscale=True, cnn_depth=2, embedding_size=8)
    model = WorldModel(2, args, nnx.Rngs(0))
    rng = np.random.default_rng(4)
    T, B, context = 7, 2, 3
    images = jnp.asarray(rng.uniform(-0.5, 0.5, (T, B, 16, 16, 1)), jnp.float32)
    actions = jnp.asarray(rng.normal(size=(T, B, 2)), jnp.float32)
    firsts = jnp.zeros((T, B), bool).at[0].set(True)
    noise = jnp.asarray(rng.normal(size=(T, B, args.state_size)), jnp.float32)
    decoded, reward = open_loop_prediction(model, images, actions, firsts, context, noise)
    assert decoded.shape == images.shape and reward.shape == (T, B)
    outputs = rssm_observe(model.rssm, Latent(jnp.zeros((B, 6)), jnp.zeros((B, 3))), actions, model.encoder(images),
                           firsts, noise)
    feats = jnp.concatenate([outputs.belief, outputs.state], -1)
    np.testing.assert_allclose(decoded[:context], model.decoder(feats)[:context], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(reward[:context], model.reward(feats)[:context], rtol=1e-5, atol=1e-6)
    start = Latent(outputs.belief[context - 1], outputs.state[context - 1])
    predicted, _, _ = rssm_imagine(model.rssm, start, actions[context:], noise[context:])
    expected = model.decoder(jnp.concatenate([predicted.belief, predicted.state], -1))
    np.testing.assert_allclose(decoded[context:], expected, rtol=1e-5, atol=1e-6)
    other_frames = images.at[context:].set(-images[context:])
    same, _ = open_loop_prediction(model, other_frames, actions, firsts, context, noise)
    np.testing.assert_allclose(same, decoded, rtol=1e-6, atol=1e-6)
    other_actions, _ = open_loop_prediction(model, images, actions.at[context:].multiply(-1.0), firsts, context, noise)
    assert not np.allclose(other_actions[context + 1:], decoded[context + 1:])
    assert not np.allclose(decoded[context:], model.decoder(feats)[context:])  # not the filtered reconstruction
