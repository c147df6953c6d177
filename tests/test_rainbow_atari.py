"""algos/rainbow.py on Atari frames (envpool, common/atari.py): the Nature CNN
under Rainbow's heads (valid or "same" padding), the atari presets' networks,
the preprocessing flags reaching common/atari.py as ppo.py's do, and tiny-atari
through the CLI (game score logged, frames replayed as bytes)."""

import dataclasses
import importlib.util
import inspect
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import run_copied_script
from flax import nnx

from jaxzoo import atari, buffers, checkpoint, cli, envs, logger
from jaxzoo.algos import ppo, rainbow

needs_envpool = pytest.mark.skipif(
    importlib.util.find_spec("envpool") is None, reason='envpool is not installed (pip install -e ".[atari]")'
)

BREAKOUT = envs.EnvSpec((84, 84, 4), True, 4, None, None, 27_000)  # atari.spec("envpool:Breakout-v5")


def noisy_linear(fan_in: int, fan_out: int) -> int:
    """Parameters of a NoisyLinear layer: mu and sigma for the weights and the biases."""
    return 2 * (fan_in * fan_out + fan_out)


def q_network_parameter_count(padding: str, hidden: int | None, num_actions: int, num_atoms: int) -> int:
    """The Nature convolutions (4 -> 32 8x8, 32 -> 64 4x4, 64 -> 64 3x3; valid:
    84 -> 20 -> 9 -> 7, so 7 x 7 x 64 = 3136 features; same: 84 -> 21 -> 11 -> 11,
    so 11 x 11 x 64 = 7744), then `hidden` noisy units (or none), then the noisy
    dueling heads: advantage A x atoms, value atoms."""
    convs = (8 * 8 * 4 * 32 + 32) + (4 * 4 * 32 * 64 + 64) + (3 * 3 * 64 * 64 + 64)
    features = {"valid": 7 * 7 * 64, "same": 11 * 11 * 64}[padding]
    dense = noisy_linear(features, hidden) if hidden else 0
    width = hidden or features
    return convs + dense + noisy_linear(width, num_actions * num_atoms) + noisy_linear(width, num_atoms)


@pytest.mark.parametrize(
    "preset, padding, hidden, total", [("atari", "valid", 512, 3_551_902), ("rllib-breakout", "same", None, 4_027_934)]
)
def test_nature_q_network_output_shape_and_parameter_count(preset, padding, hidden, total):
    args = cli.preset_args(rainbow.Args, "rainbow", preset)
    assert args.noisy and args.dueling and args.num_atoms == 51 and args.conv_padding == padding
    build = lambda: rainbow.QNetwork(BREAKOUT, args, "nature", nnx.Rngs(0))
    graphdef, params = nnx.split(nnx.eval_shape(build))  # shapes only: no weights computed
    count = sum(x.size for x in jax.tree.leaves(params))
    assert count == q_network_parameter_count(padding, hidden, 4, 51) == total
    forward = lambda params, obs, key: nnx.merge(graphdef, params)(obs, key)
    frames = jax.random.randint(jax.random.key(0), (3, 84, 84, 4), 0, 256).astype(jnp.uint8)
    assert jax.eval_shape(forward, params, frames, jax.random.key(1)).shape == (3, 4, 51)  # [B, A, atoms]
    if hidden is None:  # computed once, on the network without a dense layer
        params = nnx.split(build())[1]
        # Frames are scaled by 1/255 inside: bytes and their float copy give the same logits.
        mean_net = jax.jit(lambda params, obs: forward(params, obs, None))
        np.testing.assert_allclose(mean_net(params, frames.astype(jnp.float32)), mean_net(params, frames), rtol=1e-5)


def test_same_padding_is_ppos_copy():
    """One form of RLlib's "same" padding (docs/glossary.md): the same text as ppo.py's."""
    assert inspect.getsource(rainbow.same_padding) == inspect.getsource(ppo.same_padding)


@pytest.mark.parametrize("padding", ["valid", "same"])
def test_nature_conv_is_the_convolution_with_that_padding(padding):
    """patches @ kernel with rainbow's padding equals lax.conv with VALID / SAME padding
    (XLA's SAME pads as RLlib: total max((ceil(in / s) - 1) s + k - in, 0), the extra pixel after)."""
    conv = rainbow.NatureConv((84, 84, 4), padding, nnx.Rngs(0))
    frames = jax.random.randint(jax.random.key(2), (2, 84, 84, 4), 0, 256).astype(jnp.uint8)
    expected = frames.astype(jnp.float32) / 255.0
    for kernel, (channels, kernel_size, stride) in zip(conv.kernels, rainbow.NatureConv.FILTERS):
        weights = kernel.kernel[...].reshape(kernel_size, kernel_size, -1, channels)  # HWIO
        expected = jax.nn.relu(
            jax.lax.conv_general_dilated(
                expected,
                weights,
                (stride, stride),
                padding.upper(),
                dimension_numbers=("NHWC", "HWIO", "NHWC"),
                precision=jax.lax.Precision.HIGHEST,
            )
            + kernel.bias[...]
        )
    side = {"valid": 7, "same": 11}[padding]
    assert expected.shape == (2, side, side, 64) and conv.out_features == side * side * 64
    np.testing.assert_allclose(jax.jit(conv)(frames), expected.reshape(2, -1), rtol=1e-4, atol=1e-5)


def test_preprocessing_flags_reach_common_atari_as_ppos_do(monkeypatch):
    """Both files hand common/atari.py the same preprocessing for the same flags (ppo.py
    also passes image_size and grayscale, which rainbow.py leaves at atari.make's 84, True)."""
    flags = dict(
        frame_skip=2,
        frame_stack=3,
        noop_max=1,
        episodic_life=False,
        fire_reset=False,
        reward_clip=False,
        max_episode_steps=50,
    )
    calls: dict[str, list[dict]] = {"ppo": [], "rainbow": []}
    for name, module in (("ppo", ppo), ("rainbow", rainbow)):

        def fake_make(env_id, num_envs, *, seed, role=0, **preprocessing):
            calls[name].append(dict(env_id=env_id, num_envs=num_envs, seed=seed, role=role, **preprocessing))
            return type("Env", (), {"spec": BREAKOUT})(), None

        monkeypatch.setattr(atari, "make", fake_make)
        args = dataclasses.replace(cli.preset_args(module.Args, name, "tiny-atari"), **flags)
        *_, torso = module.make_envs(args)
        assert torso == "nature"
    assert len(calls["rainbow"]) == 2  # training and evaluation pools
    for ppo_call, rainbow_call in zip(calls["ppo"], calls["rainbow"], strict=True):
        ppo_call = {k: v for k, v in ppo_call.items() if k not in ("image_size", "grayscale")}
        # rainbow.py also has the stacks built in jit, for its single-frame replay (frame_stacks).
        assert rainbow_call == {**ppo_call, "num_envs": rainbow_call["num_envs"], "stack_in_jit": True}
        assert {k: rainbow_call[k] for k in flags} == flags


@needs_envpool
def test_the_single_frame_replay_gives_back_the_stacks_breakout_showed():
    """Breakout with episodic life (a stack restarts at every lost life) and a short
    time limit: its newest frames in replay, sampled with frame_stack - 1 rows of
    history and rebuilt by frame_stacks, equal the stacked observations and final
    observations the env (stacks built in jit) returned, and the env's frames are
    envpool's own."""
    steps, num_envs, n = 300, 2, 3
    env, _ = atari.make("envpool:Breakout-v5", num_envs, seed=1, stack_in_jit=True, max_episode_steps=120)
    stacked_by_envpool, _ = atari.make("envpool:Breakout-v5", num_envs, seed=1, max_episode_steps=120)
    actions = jnp.asarray(np.random.default_rng(0).integers(0, 4, (steps, num_envs)), jnp.int32)

    @jax.jit
    def rollout(state, obs):
        def step(carry, action):
            state, obs = carry
            next_obs, state, reward, terminated, truncated, info = env.step(None, state, action)
            final = info["final_observation"]
            return (state, next_obs), rainbow.Transition(obs, action, reward, terminated, truncated, final)

        return jax.lax.scan(step, (state, obs), actions)[1]

    obs, state = env.reset(None)
    steps_taken = jax.tree.map(np.asarray, rollout(state, obs))  # leaves [T, N, ...], full stacks
    done = steps_taken.terminated | steps_taken.truncated
    assert steps_taken.terminated.sum() >= 4 and steps_taken.truncated.sum() >= 2  # lives lost, time limits
    first_of_episode = np.concatenate([np.ones((1, num_envs), bool), done[:-1]])
    starts = steps_taken.obs[first_of_episode]
    assert (starts == starts[..., :1]).all()  # every episode (life) starts with one frame in all slots

    # The same games stacked by envpool: the same newest frames and the same ends.
    _, reference_state = stacked_by_envpool.reset(None)
    reference = stacked_by_envpool.step
    for t in range(20):
        _, reference_state, _, terminated, _, info = reference(None, reference_state, actions[t])
        np.testing.assert_array_equal(np.asarray(info["final_observation"])[..., -1], steps_taken.final_obs[t, ..., -1])
        np.testing.assert_array_equal(np.asarray(terminated), steps_taken.terminated[t])

    newest = lambda x: rainbow.newest_frame(jnp.asarray(x), 4)
    buffer = buffers.init(
        jax.tree.map(lambda x: x[0, 0], steps_taken._replace(obs=None, final_obs=None))._replace(
            obs=newest(steps_taken.obs[0, 0]), final_obs=newest(steps_taken.obs[0, 0])
        ),
        steps * num_envs,
        num_envs,
    )
    for t in range(steps):
        row = jax.tree.map(lambda x: jnp.asarray(x[t]), steps_taken)
        buffer = buffers.add(buffer, row._replace(obs=newest(row.obs), final_obs=newest(row.final_obs)))
    sample = buffers.sample(buffer, jax.random.key(0), 1024, length=n, history=3)
    rebuilt = jax.jit(rainbow.frame_stacks, static_argnums=1)(sample.windows, 4)
    rows = np.asarray(sample.rows)[:, None] + np.arange(n)
    envs_ = np.asarray(sample.envs)[:, None]
    np.testing.assert_array_equal(rebuilt.obs, steps_taken.obs[rows, envs_])
    np.testing.assert_array_equal(rebuilt.final_obs, steps_taken.final_obs[rows, envs_])


def test_args_refuse_what_an_envpool_id_cannot_do():
    for overrides, message in [
        (dict(num_seeds=2), r"num_seeds must be 1, got 2: envpool's XLA calls cannot be vmapped"),
        (dict(parallel="data"), r"--parallel data is not supported"),
        (dict(torso="cnn"), r"torso='cnn' is not for Atari frames; accepted: auto, nature"),
    ]:
        with pytest.raises(ValueError, match=message):
            dataclasses.replace(cli.preset_args(rainbow.Args, "rainbow", "tiny-atari"), **overrides)


@needs_envpool
def test_tiny_atari_runs_through_the_cli_logs_the_game_score_and_replays_bytes(tmp_path):
    out = run_copied_script("rainbow", ["--preset", "tiny-atari", "--run-root", str(tmp_path)])
    assert out.returncode == 0, out.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    args = json.loads((run_dir / "args.json").read_text())
    metrics = logger.read_metrics(run_dir)
    assert np.isfinite(metrics["loss"][-1])
    # The whole game's unclipped score, under names that say so (and as episode_return, which the tools read).
    np.testing.assert_array_equal(metrics["game_score"], metrics["episode_return"])
    np.testing.assert_array_equal(metrics["game_length"], metrics["episode_length"])
    ended = np.isfinite(metrics["game_score"])
    assert ended.any() and (metrics["game_length"][ended] == args["max_episode_steps"]).all()  # the time limit
    evaluation = json.loads((run_dir / "eval.json").read_text())
    assert len(evaluation["returns"][0]) == args["eval_episodes"] and evaluation["chunk_traces"] == 1
    # Replay holds one frame per step as bytes [seeds, rows, num_envs, 84, 84, 1]: real screens, not zeros.
    saved = np.load(checkpoint.list_checkpoints(run_dir)[-1])
    rows = args["buffer_size"] // args["num_envs"]
    for name in (".buffer.data.obs", ".buffer.data.final_obs"):
        frames = saved[name]
        assert frames.dtype == np.uint8 and frames.shape == (1, rows, args["num_envs"], 84, 84, 1), name
        assert 0 < frames.mean() < 255, name
