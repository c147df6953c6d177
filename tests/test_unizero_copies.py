"""algos/unizero.py and algos/unizero_ppo.py each carry their own copy of the
transformer world model (so each file reads alone). These tests pin that the two
copies compute the same functions: same weights in, same outputs out."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxzoo.algos import unizero, unizero_ppo

SIZES = dict(embed_dim=16, num_layers=2, num_heads=2, support_size=21)
OBS_SHAPE, NUM_ACTIONS, B, K = (4,), 2, 3, 5


@pytest.fixture(scope="module")
def both_models():
    search_model = unizero.WorldModel(OBS_SHAPE, NUM_ACTIONS, unizero.Args(**SIZES), nnx.Rngs(0))
    graphdef, params = nnx.split(search_model)
    ppo_graphdef, ppo_params = nnx.split(
        unizero_ppo.WorldModel(OBS_SHAPE, NUM_ACTIONS, unizero_ppo.Args(**SIZES), nnx.Rngs(1))
    )
    assert jax.tree.structure(params) == jax.tree.structure(ppo_params), "the two copies have different parameters"
    return (graphdef, params), (ppo_graphdef, params)


def run(fn, model, *inputs):
    """fn(model, *inputs), compiled (op-by-op NNX calls take seconds each on CPU)."""
    graphdef, params = model
    return jax.jit(lambda p, *x: fn(nnx.merge(graphdef, p), *x))(params, *inputs)


def random_window(module, key):
    obs_key, action_key, valid_key = jax.random.split(key, 3)
    timestep = jnp.broadcast_to(jnp.arange(K) + 7, (B, K))
    segment = jnp.broadcast_to((jnp.arange(K) >= 3).astype(jnp.int32), (B, K))  # an episode ends after step 2
    valid = jax.random.bernoulli(valid_key, 0.8, (B, K))
    return module.Window(jax.random.normal(obs_key, (B, K) + OBS_SHAPE),
                         jax.random.randint(action_key, (B, K), 0, NUM_ACTIONS), timestep, segment, valid, valid)


def test_forward_window_is_the_same_function(both_models):
    search_model, ppo_model = both_models
    key = jax.random.key(3)
    outputs = run(unizero.forward_window, search_model, random_window(unizero, key))
    ppo_outputs = run(unizero_ppo.forward_window, ppo_model, random_window(unizero_ppo, key))
    for a, b in zip(outputs, ppo_outputs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_imagine_step_is_the_same_function(both_models):
    search_model, ppo_model = both_models
    width = 2 * K
    tokens = jax.random.normal(jax.random.key(4), (B, width, SIZES["embed_dim"]))
    positions = jnp.broadcast_to(jnp.arange(width), (B, width))
    valid = jnp.broadcast_to(jnp.arange(width) >= 3, (B, width))
    action = jnp.array([0, 1, 1])
    out = run(unizero.imagine_step, search_model, unizero.SearchNode(tokens, positions, valid), action)
    ppo_out = run(unizero_ppo.imagine_step, ppo_model, unizero_ppo.SearchNode(tokens, positions, valid), action)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ppo_out), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Catch-bsuite", "SimpleBandit-bsuite", "FrozenLake-misc",
                                    "BernoulliBandit-misc", "Breakout-MinAtar", "Pong-misc"])
def test_env_options_is_the_same_function(env_id):
    """Both files see an env's observations alike: only [H, W, C] images stay
    unflattened."""
    for max_episode_steps in (0, 12):
        options = unizero.env_options(env_id, max_episode_steps)
        assert options == unizero_ppo.env_options(env_id, max_episode_steps)
        assert options["flatten_obs"] == (env_id not in ("Breakout-MinAtar", "Pong-misc"))
        assert ("max_episode_steps" in options) == bool(max_episode_steps)
