"""algos/world_models.py math: MDN likelihood and sampling, VAE KL and free bits,
CMA-ES on a sphere and a rotated ellipsoid, the controller's layout, the
patch-based convolutions against lax."""

import dataclasses
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxzoo import cli, runner
from jaxzoo.algos import world_models as wm


def test_mdn_log_prob_matches_the_mixture_density_in_1d():
    rng = np.random.default_rng(0)
    logits, means, log_stds = rng.normal(size=(3, 4)), rng.normal(size=(3, 4)), rng.normal(scale=0.5, size=(3, 4))
    targets = rng.normal(size=3)
    got = wm.mdn_log_prob(jnp.asarray(targets)[:, None], *(jnp.asarray(a)[:, None] for a in (logits, means, log_stds)))
    assert got.shape == (3, 1)
    for i in range(3):  # p(x) = sum_k w_k N(x; mu_k, sigma_k^2), written out
        weights = np.exp(logits[i]) / np.exp(logits[i]).sum()
        sigma = np.exp(log_stds[i])
        density = np.sum(weights * np.exp(-0.5 * ((targets[i] - means[i]) / sigma) ** 2) / (sigma * np.sqrt(2 * np.pi)))
        np.testing.assert_allclose(got[i, 0], np.log(density), rtol=1e-5)


def test_mdn_log_prob_is_per_dimension_and_stable_far_from_every_mode():
    logits, means, log_stds = jnp.zeros((2, 5, 3)), jnp.zeros((2, 5, 3)), jnp.full((2, 5, 3), -3.0)
    far = wm.mdn_log_prob(jnp.full((2, 5), 50.0), logits, means, log_stds)
    assert far.shape == (2, 5) and np.isfinite(far).all()  # logsumexp: no log(0)
    np.testing.assert_allclose(far, -0.5 * (50.0 / math.exp(-3.0)) ** 2 + 3.0 - 0.5 * math.log(2 * math.pi), rtol=1e-5)


def test_sampling_at_temperature_to_zero_returns_the_most_likely_mode():
    logits = jnp.array([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])  # [Z=2, K=3]
    means = jnp.array([[-5.0, 1.5, 7.0], [4.0, -2.0, 0.0]])
    log_stds = jnp.zeros((2, 3))
    sample = jax.jit(jax.vmap(wm.mdn_sample, in_axes=(0, None, None, None, None)))
    samples = sample(jax.random.split(jax.random.key(0), 4000), logits, means, log_stds, 1e-6)
    np.testing.assert_allclose(samples, np.broadcast_to([1.5, 4.0], (4000, 2)), atol=1e-2)
    # At tau = 1 the other components are drawn too, with their weights.
    narrow = jnp.full((2, 3), -3.0)  # well-separated components: each sample is attributable
    hot = sample(jax.random.split(jax.random.key(1), 4000), logits, means, narrow, 1.0)
    weight = jax.nn.softmax(logits[1])[2]
    assert abs(float((np.abs(hot[:, 1] - 0.0) < 1.0).mean()) - float(weight)) < 0.05


def test_vae_kl_matches_the_closed_form_and_numerical_integration():
    mean, log_var = jnp.array([0.0, 1.0, -0.7, 2.0]), jnp.array([0.0, -1.0, 0.5, 1.2])
    kl = np.asarray(wm.gaussian_kl_to_standard(mean, log_var))
    std = np.exp(0.5 * np.asarray(log_var))
    np.testing.assert_allclose(kl, np.log(1.0 / std) + (std**2 + np.asarray(mean) ** 2) / 2 - 0.5, rtol=1e-6)
    x = np.linspace(-30, 30, 400_001)
    for m, s, k in zip(np.asarray(mean), std, kl):
        q = np.exp(-0.5 * ((x - m) / s) ** 2) / (s * np.sqrt(2 * np.pi))
        log_ratio = -0.5 * ((x - m) / s) ** 2 - np.log(s) + 0.5 * x**2
        np.testing.assert_allclose(np.trapezoid(q * log_ratio, x), k, rtol=1e-4, atol=1e-7)
    assert kl[0] == 0.0


def test_vae_loss_floors_the_kl_at_free_bits():
    vae = wm.VAE((16, 16, 1), 2, 3, nnx.Rngs(0))
    frames = jax.random.uniform(jax.random.key(0), (4, 16, 16, 1))
    graphdef, params = nnx.split(vae)

    def loss(params, free_bits, kl_weight=2.0):
        return wm.vae_loss(nnx.merge(graphdef, params), frames, jax.random.key(1), kl_weight, free_bits)

    @partial(jax.jit, compiler_options=runner.RUN_ONCE)  # compile time dominates
    def check(params):
        # d loss / d kl_weight is the KL term the loss uses: the KL above the floor, the floor below it.
        kl_term = lambda free_bits: jax.grad(lambda w: loss(params, free_bits, w)[0])(2.0)  # noqa: E731
        return loss(params, 0.0)[1], loss(params, 1e3), kl_term(0.0), kl_term(1e3)

    low, (value, high), kl_term_low, kl_term_floor = check(params)
    np.testing.assert_allclose(low["vae_loss"], low["reconstruction_loss"] + 2.0 * low["kl"], rtol=1e-5)
    np.testing.assert_allclose(kl_term_low, low["kl"], rtol=1e-5)
    np.testing.assert_allclose(value, high["reconstruction_loss"] + 2.0 * 1e3 * 3, rtol=1e-5)
    np.testing.assert_allclose(kl_term_floor, 1e3 * 3, rtol=1e-6)  # a constant: no gradient reaches the encoder


def run_cma(fitness, mean, sigma, population, generations, seed=0):
    @jax.jit
    def go(key):
        def generation(state, key):
            candidates = wm.cma_ask(state, key, population)
            return wm.cma_tell(state, candidates, jax.vmap(fitness)(candidates)), None

        return jax.lax.scan(generation, wm.cma_init(mean, sigma), jax.random.split(key, generations))[0]

    return go(jax.random.key(seed))


def test_cma_es_solves_a_10d_sphere():
    sphere = lambda x: -jnp.sum(jnp.square(x))  # fitness is maximised
    state = run_cma(sphere, jnp.full(10, 3.0), 1.0, 10, 250)
    assert float(-sphere(state.mean)) < 1e-8
    assert float(state.sigma) < 1e-3  # the step size shrank with the distance


def test_cma_es_solves_a_rotated_ellipsoid():
    n = 10
    rotation, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(n, n)))
    scales = jnp.asarray(10.0 ** (6.0 * np.arange(n) / (n - 1)))  # condition number 1e6
    ellipsoid = lambda x: -jnp.sum(scales * jnp.square(jnp.asarray(rotation) @ x))
    state = run_cma(ellipsoid, jnp.ones(n), 1.0, 10, 700)
    assert float(-ellipsoid(state.mean)) < 1e-6
    # The learned covariance lines up with the problem: its condition number is of the problem's order.
    assert float(state.eigvals.max() / state.eigvals.min()) > 1e4


def test_cma_weights_and_initial_distribution():
    weights = np.asarray(wm.cma_weights(16))
    assert weights.shape == (8,) and np.isclose(weights.sum(), 1.0) and (np.diff(weights) < 0).all()
    state = wm.cma_init(jnp.zeros(5), 0.5)
    samples = wm.cma_ask(state, jax.random.key(0), 20000)
    np.testing.assert_allclose(np.std(samples, 0), 0.5, rtol=0.03)


def test_controller_action_is_w_times_z_h_plus_b():
    z, h, action_size = jnp.arange(3.0), jnp.arange(4.0) - 2.0, 2
    weights = np.arange(14.0).reshape(2, 7) / 10
    bias = np.array([0.5, -0.5])
    theta = jnp.asarray(np.concatenate([weights.ravel(), bias]))
    np.testing.assert_allclose(wm.controller_action(theta, z, h, action_size),
                               weights @ np.concatenate([z, h]) + bias, rtol=1e-6)
    batched = wm.controller_action(jnp.stack([theta, 2 * theta]), jnp.stack([z, z]), jnp.stack([h, h]), action_size)
    np.testing.assert_allclose(batched[1], 2 * (weights @ np.concatenate([z, h]) + bias), rtol=1e-6)


def test_patch_convolutions_match_lax_and_a_reference_loop():
    x = jax.random.normal(jax.random.key(0), (2, 13, 13, 3))
    conv = wm.StridedConv(3, 5, 4, nnx.Rngs(0))  # the encoder's 4 x 4
    expected = jax.lax.conv_general_dilated(x, conv.kernel[...], (2, 2), "VALID",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC")) + conv.bias[...]
    run_once = partial(jax.jit, compiler_options=runner.RUN_ONCE)
    np.testing.assert_allclose(run_once(lambda x: conv(x))(x), expected, atol=1e-4)
    small = x[:, :4, :4]
    for kernel_size in (5, 6):  # the decoder's kernels
        deconv = wm.StridedConvTranspose(3, 5, kernel_size, nnx.Rngs(1))
        # out[2i + a, 2j + b] += x[i, j] @ kernel[a, b], as a slow reference loop
        reference = np.zeros((2, 2 * 3 + kernel_size, 2 * 3 + kernel_size, 5))
        k = np.asarray(deconv.kernel[...])
        for i in range(4):
            for j in range(4):
                reference[:, 2 * i : 2 * i + kernel_size, 2 * j : 2 * j + kernel_size] += np.einsum(
                    "bc,hwco->bhwo", np.asarray(small[:, i, j]), k)
        np.testing.assert_allclose(run_once(lambda x: deconv(x))(small), reference + np.asarray(deconv.bias[...]),
                                   atol=1e-4)


def test_balanced_done_loss_weighs_ends_as_much_as_the_rest():
    """balance_done: the done cross-entropy is (mean over ending steps + mean over
    the others) / 2, invalid steps excluded; without it, the mean over valid steps."""
    args = dataclasses.replace(cli.preset_args(wm.Args, "world_models", "tiny"), predict_done=True)
    mdn = wm.MDNRNN(args.z_size, 2, args, nnx.Rngs(0))
    T, B = 6, 3
    keys = jax.random.split(jax.random.key(0), 2)
    z = jax.random.normal(keys[0], (T + 1, B, args.z_size))
    actions = jax.nn.one_hot(jax.random.randint(keys[1], (T, B), 0, 2), 2)
    terminated = jnp.zeros((T, B), bool).at[2, 0].set(True).at[5, 1].set(True)
    valid = jnp.ones((T, B), bool).at[3:, 0].set(False)
    rewards = jnp.ones((T, B))
    _, plain = wm.mdn_sequence_loss(mdn, z, actions, rewards, terminated, valid)
    _, balanced = wm.mdn_sequence_loss(mdn, z, actions, rewards, terminated, valid, balance_done=True)
    # The done logits by hand, from M's LSTM over the same inputs.
    carry = (jnp.zeros((B, args.rnn_size)), jnp.zeros((B, args.rnn_size)))
    _, out = jax.lax.scan(lambda c, x: mdn.step(c, *x), carry, (z[:-1], actions))
    bce = np.asarray(optax.sigmoid_binary_cross_entropy(out.done_logit, terminated.astype(jnp.float32)))
    v, d = np.asarray(valid), np.asarray(terminated)
    np.testing.assert_allclose(plain["done_loss"], bce[v].mean(), rtol=1e-5)
    np.testing.assert_allclose(balanced["done_loss"], 0.5 * (bce[v & d].mean() + bce[v & ~d].mean()), rtol=1e-5)
    np.testing.assert_allclose(plain["done_recall"], (np.asarray(out.done_logit)[v & d] > 0).mean())


def test_done_head_with_a_hidden_layer_is_relu_mlp_on_h():
    """--done-hidden W: M's done logit is w2 . relu(W1 h + b1) + b2 on the LSTM's output h."""
    args = dataclasses.replace(cli.preset_args(wm.Args, "world_models", "tiny"), predict_done=True, done_hidden=5)
    mdn = wm.MDNRNN(args.z_size, 2, args, nnx.Rngs(0))
    B = 3
    carry = (jnp.zeros((B, args.rnn_size)), jnp.zeros((B, args.rnn_size)))
    z, action = jax.random.normal(jax.random.key(0), (B, args.z_size)), jax.nn.one_hot(jnp.array([0, 1, 1]), 2)
    (_, h), out = mdn.step(carry, z, action)
    first, last = mdn.done.layers[0], mdn.done.layers[2]
    assert first.kernel.shape == (args.rnn_size, 5) and last.kernel.shape == (5, 1)
    by_hand = jax.nn.relu(h @ first.kernel[...] + first.bias[...]) @ last.kernel[...] + last.bias[...]
    np.testing.assert_allclose(out.done_logit, by_hand[:, 0], rtol=1e-5, atol=1e-6)


def test_dream_done_rules_threshold_sample_and_expected():
    """--dream-done: with M's done head fixed at p and its reward at 1, a dreamed
    return is `steps` under 'threshold' when p < 0.5 and 1 when p > 0.5 (the
    ending step counts), sum_t (1 - p)^t under 'expected', and on average the
    same under 'sample' (Bernoulli ends, a truncated geometric length)."""
    base = dataclasses.replace(cli.preset_args(wm.Args, "world_models", "tiny"), predict_done=True, predict_reward=True)
    steps, batch = 20, 4000

    def dreamed(rule, p):
        args = dataclasses.replace(base, dream_done=rule)
        models = wm.Models(args, 2, nnx.Rngs(0))
        for head, bias in ((models.mdn.done, math.log(p / (1 - p))), (models.mdn.reward, 1.0)):
            head.kernel[...] = jnp.zeros_like(head.kernel[...])
            head.bias[...] = jnp.full_like(head.bias[...], bias)
        params = wm.Params(*nnx.split(models, wm.VAE_PART, ...)[1:])
        world = wm.make_train(args)
        thetas = jnp.zeros((batch, world.num_params))
        latents = jnp.zeros((3, 2, args.z_size))
        return np.asarray(jax.jit(world.dream_returns, static_argnums=4)(params, thetas, latents, jax.random.key(1), steps))

    np.testing.assert_allclose(dreamed("threshold", 0.1), steps)
    np.testing.assert_allclose(dreamed("threshold", 0.6), 1.0)
    geometric = sum(0.9**t for t in range(steps))  # 8.78
    np.testing.assert_allclose(dreamed("expected", 0.1), geometric, rtol=1e-5)
    sampled = dreamed("sample", 0.1)
    assert set(np.unique(sampled)) <= set(range(1, steps + 1))
    assert abs(sampled.mean() - geometric) < 4 * sampled.std() / math.sqrt(batch)
    with pytest.raises(ValueError, match=r"dream_done must be one of \['threshold', 'sample', 'expected'\], got 'soft'"):
        dataclasses.replace(base, dream_done="soft")


def test_stop_rule_picks_each_seeds_first_judged_round(tmp_path, monkeypatch, capsys):
    """benchmarks/world_models_stop_rule.py: a seed stops at the first round
    whose controller's judged return (the next collect stage's
    controller_episode_return) reaches the threshold, and reports that
    round's evaluation; a seed never reaching it keeps the last round's."""
    import importlib.util
    import json

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("stop_rule", ROOT / "benchmarks" / "world_models_stop_rule.py")
    stop_rule = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stop_rule)

    def run(name, judged=None, evaluated=None):
        path = tmp_path / name
        (path / "collect").mkdir(parents=True)
        if judged is not None:
            rows = [f"1,{i},{r}" for i, r in enumerate(judged)]
            (path / "collect" / "metrics.csv").write_text("\n".join(["update,seed_index,controller_episode_return", *rows]))
        summary = {"per_seed": [[r, 0.0] for r in evaluated]} if evaluated is not None else {}
        (path / "eval.json").write_text(json.dumps(summary))
        return str(path)

    round0 = run("round0", evaluated=[300.0, 500.0, 480.0])
    round1 = run("round1", judged=[310.0, 499.0, 470.0], evaluated=[490.0, 200.0, 100.0])
    check2 = run("check2", judged=[495.0, 180.0, 90.0])
    out = tmp_path / "chosen.json"
    monkeypatch.setattr("sys.argv", ["stop_rule", round0, round1, "--checks", round1, check2, "--out", str(out)])
    stop_rule.main()
    chosen = json.loads(out.read_text())["seeds"]
    assert [(c["round"], c["eval"]) for c in chosen] == [(1, 490.0), (0, 500.0), (None, 100.0)]
    assert "363.3 (mean), 2 of 3 above 475" in capsys.readouterr().out
