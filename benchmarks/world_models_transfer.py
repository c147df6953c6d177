"""Issue 26: why does a controller evolved in M's dream fail in the real env on
some seeds? (docs/world_models.md, "Dream training that transfers".)

For every seed of a pixel-CartPole run (its controller stage evolved in the
dream or in the real env; V and M from the run or its --source-run):

- **real episodes** of the evolved controller (the CMA-ES mean, as the run's
  evaluation), CartPole-v1 stepped by hand without autoreset and rendered as
  the pixel env renders it: the return, and what ended each episode: the pole
  (|theta| > 12 degrees), the cart leaving the track (|x| > 2.4), or the
  time limit;
- **M's done head along those real episodes** (fed V's posterior means of
  the real frames and the controller's actions, as M runs while acting):
  p(done) at the step that really ended the episode, and the share of earlier
  steps where it fired (p > 0.5, the dream's rule);
- **dreamed episodes** of the same controller at the run's dream temperature,
  started as the controller stage starts them: length and return;
- **random play**, the policy the rollouts M learned from came from (fresh
  episodes of it, the same distribution): what ended them and how far the
  cart went.

    python benchmarks/world_models_transfer.py RUN_DIR [--episodes 100] [--out FILE.json]

CartPole-v1 only (the termination causes are CartPole's). Prints one block per
seed and writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxzoo import pixels
from jaxzoo.algos import world_models as wm
from jaxzoo.envs import import_gymnax

X_LIMIT, THETA_LIMIT = 2.4, 12 * 2 * np.pi / 360  # gymnax CartPole-v1's termination bounds


def real_episodes(args, world_models, params, theta, key, episodes: int, steps: int, random: bool = False):
    """`episodes` real episodes of controller theta [P] (`random`: of uniformly
    random actions, the rollouts' policy) without autoreset ->
    dict of [steps, episodes] arrays: the state (x, theta) after each step,
    reward, done (the pole, the cart or the time limit), and M's done logit
    for that step."""
    models = world_models.merge(params)
    gymnax = import_gymnax()
    env, env_params = gymnax.make("CartPole-v1")
    render = jax.vmap(lambda obs: pixels.render_cartpole(obs, args.image_size, args.grayscale))
    num_actions = env.action_space(env_params).n
    reset_keys = jax.random.split(key, episodes)
    obs, state = jax.vmap(env.reset_env, in_axes=(0, None))(reset_keys, env_params)
    carry = (jnp.zeros((episodes, args.rnn_size)), jnp.zeros((episodes, args.rnn_size)))

    def step(loop, key):
        obs, state, carry, alive = loop
        z, _ = models.vae.encode(wm.to_float(wm.pixels_to_uint8(render(obs))))
        action = jnp.argmax(wm.controller_action(theta[None], z, carry[1], num_actions), axis=-1)
        action_key, key = jax.random.split(key)
        if random:
            action = jax.random.randint(action_key, (episodes,), 0, num_actions)
        carry, out = models.mdn.step(carry, z, jax.nn.one_hot(action, num_actions))
        keys = jax.random.split(key, episodes)
        obs, state, reward, done, _ = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))(keys, state, action, env_params)
        record = {
            "x": state.x,
            "theta": state.theta,
            "reward": reward * alive,
            "done": done & alive,
            "alive": alive,
            "done_logit": out.done_logit,
            "z": z,
            "action": action,
        }
        return (obs, state, carry, alive & ~done), record

    _, records = jax.lax.scan(step, (obs, state, carry, jnp.ones(episodes, bool)), jax.random.split(key, steps))
    return records


def random_play(key, episodes: int, steps: int):
    """How episodes of the uniformly random policy end: (share ended by the pole,
    by the cart, by the limit; mean length; quantiles of the largest |x| reached)."""
    gymnax = import_gymnax()
    env, env_params = gymnax.make("CartPole-v1")
    obs, state = jax.vmap(env.reset_env, in_axes=(0, None))(jax.random.split(key, episodes), env_params)

    def step(loop, key):
        state, alive, far = loop
        action_key, step_key = jax.random.split(key)
        action = jax.random.randint(action_key, (episodes,), 0, 2)
        _, state, _, done, _ = jax.vmap(env.step_env, in_axes=(0, 0, 0, None))(
            jax.random.split(step_key, episodes), state, action, env_params
        )
        far = jnp.where(alive, jnp.maximum(far, jnp.abs(state.x)), far)
        return (state, alive & ~done, far), (done & alive, state.x, state.theta)

    (_, _, far), (done, x, theta) = jax.lax.scan(
        step, (state, jnp.ones(episodes, bool), jnp.zeros(episodes)), jax.random.split(key, steps)
    )
    done, x, theta, far = (np.asarray(a) for a in (done, x, theta, far))
    return summarize_ends(done, x, theta, steps) | {
        "max_abs_x_quantiles_50_90_99": np.quantile(far, [0.5, 0.9, 0.99]).round(3).tolist()
    }


def summarize_ends(done, x, theta, steps):
    """done, x, theta [steps, episodes] -> shares of episodes ended by the pole,
    the cart, the limit, and their mean length."""
    ended = done.any(0)
    end = np.where(ended, done.argmax(0), steps - 1)
    index = np.arange(done.shape[1])
    by_cart = ended & (np.abs(x[end, index]) > X_LIMIT)
    by_pole = ended & (np.abs(theta[end, index]) > THETA_LIMIT)
    return {
        "ended_by_pole": float(by_pole.mean()),
        "ended_by_cart": float(by_cart.mean()),
        "reached_limit": float((~(by_cart | by_pole)).mean()),
        "mean_length": float((end + 1).mean()),
    }


def done_head(records, world_models, params, warmup: int = 20) -> dict:
    """M's done head along real episodes (records of `real_episodes`): its mean
    p(done) and how often it fired (p > 0.5) at the step that really ended an
    episode (pole or cart, not the time limit), and how often before it; then
    the same end scored by M started afresh (zero LSTM state) `warmup` steps
    before it, fed the same frames and actions: if M fires then and not after
    the whole episode, its LSTM state drifted over the long history."""
    p_done = 1 / (1 + np.exp(-records["done_logit"]))
    steps, episodes = records["done"].shape
    failed = records["done"].any(0) & (records["reward"].sum(0) < steps)
    end = np.where(failed, records["done"].argmax(0), steps - 1)
    at_end = p_done[end, np.arange(episodes)][failed]
    before_end = records["alive"] & ~records["done"]
    # The last `warmup` steps up to each end: [warmup, episodes, ...] (clipped at the start).
    rows = np.clip(end[None] - np.arange(warmup)[::-1, None], 0, None)
    z = records["z"][rows, np.arange(episodes)]
    action = records["action"][rows, np.arange(episodes)]
    models = world_models.merge(params)
    num_actions = world_models.spec.num_actions
    carry = (jnp.zeros((episodes, models.mdn.lstm.hidden_features)),) * 2
    _, outs = jax.lax.scan(lambda c, x: models.mdn.step(c, x[0], jax.nn.one_hot(x[1], num_actions)), carry, (z, action))
    fresh = (1 / (1 + np.exp(-np.asarray(outs.done_logit[-1]))))[failed]
    return {
        "p_done_at_end": float(at_end.mean()) if failed.any() else None,
        "fired_at_end": float((at_end > 0.5).mean()) if failed.any() else None,
        "false_alarms": float((p_done > 0.5)[before_end].mean()),
        f"fired_at_end_fresh_{warmup}": float((fresh > 0.5).mean()) if failed.any() else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--out", default=None, help="JSON file (default: RUN_DIR/transfer.json)")
    options = parser.parse_args()
    args, world_models, outputs = wm.load_run(options.run_dir)
    if args.env_id != "CartPole-v1":
        raise SystemExit(f"this diagnosis is CartPole-v1's; the run's env_id is {args.env_id!r}")
    steps = args.controller_max_steps or 500
    params, means = outputs["mdn"].params, outputs["controller"].cma.mean
    latents = jax.vmap(world_models.initial_latents)(params, outputs["collect"])  # [seeds, N, 2, Z]
    report = {"run_dir": str(options.run_dir), "controller_env": args.controller_env, "seeds": {}}
    report["random_play"] = random_play(jax.random.key(10_000), 1000, steps)
    for j in range(args.num_seeds):
        seed = args.seed + j
        seed_params = jax.tree.map(lambda x: x[j], params)
        key = jax.random.key(1_000 + seed)
        episodes = jax.jit(lambda p, th, k: real_episodes(args, world_models, p, th, k, options.episodes, steps))
        real = jax.tree.map(np.asarray, episodes(seed_params, means[j], key))
        ends = summarize_ends(real["done"], real["x"], real["theta"], steps)
        random_episodes = jax.jit(
            lambda p, th, k: real_episodes(args, world_models, p, th, k, options.episodes, steps, random=True)
        )
        played = jax.tree.map(np.asarray, random_episodes(seed_params, means[j], jax.random.key(3_000 + seed)))
        thetas = jnp.broadcast_to(means[j], (options.episodes, means.shape[-1]))
        dreamed = jax.jit(world_models.dream_returns, static_argnums=4)(
            seed_params, thetas, latents[j], jax.random.key(2_000 + seed), steps
        )
        report["seeds"][seed] = {
            "real_return": float(real["reward"].sum(0).mean()),
            **{f"real_{k}": v for k, v in ends.items()},
            **{f"m_on_controller_{k}": v for k, v in done_head(real, world_models, seed_params).items()},
            **{f"m_on_random_{k}": v for k, v in done_head(played, world_models, seed_params).items()},
            "max_abs_x_real_mean": float(np.where(real["alive"], np.abs(real["x"]), 0).max(0).mean()),
            "dream_return_mean": float(np.asarray(dreamed).mean()),
        }
        print(f"seed {seed}: " + ", ".join(f"{k} {v:.3g}" for k, v in report["seeds"][seed].items() if v is not None))
    print("random play:", report["random_play"])
    out = Path(options.out or Path(options.run_dir) / "transfer.json")
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
