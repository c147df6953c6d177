"""What a Breakout-MinAtar UniZero run's replay says about its values, read-only
(docs/unizero.md, "The 10-brick trap").

    python benchmarks/unizero_breakout_replay.py RUN_DIR [--samples 20000] [--episode-tail 12] [--last 50000]

From the newest checkpoint's replay (the last buffer_size transitions of each
seed, or with `--last N` its newest N), grouped by the bricks left on the
screen (channel 3 of the 10x10x4 observation; 30 at the start, one fewer per
reward):

- steps: replayed transitions with that many bricks left;
- return-to-go: the discounted return that actually followed in replay (gamma
  of the run; only transitions whose episode ended inside replay);
- V(model): the trained model's value of the observation alone
  (`unizero.lone_values`), on up to --samples of those transitions;
- root value: the search's value at collection time;
- top weight: the largest of the search's action weights (the policy target);
  1/3 is uniform over Breakout's 3 actions;
- toward ball: how often the action moved the paddle toward the ball's column
  (or stayed under it);

then how many bricks were left when each replayed episode ended; `--before-end`
(default 1 2 3 4 6 8 12) the steps k before each replayed loss of the ball: the
ball's row, how far the paddle is from the ball's column, the model's value of
the root (its real context, as in collection), the model's one-step Q-values
r + gamma V of each action, the gap Q(toward the ball) - Q(away from it), how
often the top Q moves toward the ball, the search's weight on that action and
how often it was taken; the model's value of the frame where the ball has passed
the paddle (the terminal observation, which no value target reaches: an
imagined loss is worth what the value head makes of that frame); and, for
scale, the return of a scripted paddle that moves toward the ball's column
(from both of the game's two start states). `--episode-tail N` also plays one
greedy episode of the checkpoint with the noise-free search and prints its
last N steps: ball and paddle, bricks left, the prior, the search's Q-values
and the action.
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxzoo import envs
from jaxzoo.algos import unizero

HERE = Path(__file__).resolve().parent


def tracker_returns() -> list[float]:
    """Return of the scripted paddle (move toward the ball's column, else stay)
    from each of Breakout-MinAtar's two start states (the ball enters from the
    left or the right), one episode each, to the env's time limit."""
    env, env_params = gymnax.make("Breakout-MinAtar")

    def body(carry):
        env_state, total, done, key = carry
        key, step_key = jax.random.split(key)
        ball, paddle = env_state.ball_x, env_state.pos
        action = jnp.where(ball < paddle, 1, jnp.where(ball > paddle, 2, 0))  # 0 stay, 1 left, 2 right
        _, env_state, reward, terminated, truncated, _ = env.step(step_key, env_state, action, env_params)
        return env_state, total + reward, terminated | truncated, key

    play = jax.jit(lambda carry: jax.lax.while_loop(lambda c: ~c[2], body, carry))
    returns: dict[int, float] = {}  # ball's start column -> return
    for key in jax.random.split(jax.random.key(0), 8):  # eight resets cover both start states
        _, env_state = env.reset(key, env_params)
        start = int(env_state.ball_x)
        if start not in returns:
            returns[start] = float(play((env_state, jnp.float32(0), jnp.bool_(False), key))[1])
    return [returns[start] for start in sorted(returns)]


def greedy_episode_tail(algo, args, state, steps: int) -> None:
    """Play one greedy episode of seed index 0 (search without noise, one env)
    on the host, step by step, and print its last `steps` steps."""
    params = jax.tree.map(lambda x: x[0], state.params)
    hparams = jax.tree.map(lambda x: x[0], state.hparams)
    env, env_params = envs.make(args.env_id, 1, **unizero.env_options(args.env_id))

    @jax.jit
    def act(history, key):
        out = algo.search(params, history, key, False, hparams)
        prior = jax.nn.softmax(algo.root_fn(params, history).prior_logits)
        return out.action, prior[0], out.search_tree.qvalues(jnp.zeros(1, jnp.int32))[0]

    step = jax.jit(lambda key, env_state, action: env.step(key, env_state, action, env_params))
    key = jax.random.key(0)
    obs, env_state = env.reset(key, env_params)
    history = unizero.empty_history(1, args.context_steps, obs.shape[1:], obs.dtype)
    timestep, log, total = jnp.zeros(1, jnp.int32), [], 0.0
    while True:
        key, search_key, step_key = jax.random.split(key, 3)
        history = unizero.observe(history, obs, timestep)
        action, prior, q = act(history, search_key)
        frame = np.asarray(obs[0])
        ball = tuple(int(i) for i in np.argwhere(frame[..., 1] > 0)[0])
        paddle = int(np.argwhere(frame[9, :, 0] > 0)[0, 0])
        obs, env_state, reward, terminated, truncated, _ = step(step_key, env_state, action)
        total += float(reward[0])
        log.append(
            f"| {len(log)} | {ball} | {paddle} | {int(frame[..., 3].sum())} | "
            f"{' '.join(f'{x:.2f}' for x in np.asarray(prior))} | {' '.join(f'{x:.2f}' for x in np.asarray(q))} | "
            f"{int(action[0])} | {float(reward[0]):g} |"
        )
        done = terminated | truncated
        history = unizero.record_action(history, action, done)
        timestep = jnp.where(done, 0, timestep + 1)
        if bool(done[0]):
            break
    print(f"\ngreedy episode (seed index 0, reset key 0): {len(log)} steps, return {total:g}; its last {steps}")
    print(
        "| step | ball (row, column) | paddle column | bricks left | prior (stay, left, right) | Q | action | reward |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(log[-steps:]))


def context_at(obs, action, timestep, index, column, steps: int) -> unizero.History:
    """The search root's real context at time-ordered replay positions `index`
    [M] of env columns `column` [M] (arrays [T, N, ...]): the `steps` steps
    ending there, earlier episodes' steps invalid, the last action not chosen
    yet (as `unizero.observe` leaves it). Gathers only those [M, steps] entries."""
    back = index[:, None] - np.arange(steps)[::-1][None, :]  # [M, C] oldest first
    column = column[:, None]
    inside = back >= 0
    at = np.maximum(back, 0)
    steps_back = np.arange(steps)[::-1][None, :]
    valid = inside & (timestep[at, column] == timestep[index, column[:, 0]][:, None] - steps_back)
    actions = np.where(valid, action[at, column], 0)
    actions[:, -1] = 0
    return unizero.History(
        jnp.asarray(obs[at, column]),
        jnp.asarray(actions, jnp.int32),
        jnp.asarray(timestep[at, column]),
        jnp.asarray(valid),
    )


def before_end_rows(model, args, obs, action, timestep, search_policy, terminated, steps_before) -> list[str]:
    """Table rows for the k steps before each replayed termination (time-ordered
    arrays [T, N, ...] of one seed; module docstring: --before-end)."""
    end_t, end_n = np.nonzero(terminated)

    @jax.jit
    def root_and_q(history):
        node = unizero.root_node(model, history, 2 * args.num_unroll_steps)
        root_value = unizero.logits_to_scalar(model.value_head(unizero.last_hidden(model, node)))
        q = []
        for a in range(3):  # Breakout-MinAtar: 0 stay, 1 left, 2 right
            _, reward, _, _, value = unizero.imagine_step(model, node, jnp.full(history.obs.shape[0], a, jnp.int32))
            q.append(reward + args.gamma * value)
        return root_value, jnp.stack(q, -1)

    rows = []
    for k in steps_before:
        keep = (end_t - k >= 0) & (timestep[end_t, end_n] >= k)  # the same episode, k steps earlier
        t, n = end_t[keep] - k, end_n[keep]
        if len(t) == 0:
            continue
        history = context_at(obs, action, timestep, t, n, args.context_steps)
        root_value, q = map(np.asarray, root_and_q(history))
        frame = obs[t, n]  # [M, 10, 10, 4]
        ball_row, ball_col = frame[..., 1].max(-1).argmax(-1), frame[..., 1].max(-2).argmax(-1)
        paddle = frame[:, 9, :, 0].argmax(-1)
        toward = np.where(ball_col < paddle, 1, np.where(ball_col > paddle, 2, 0))
        away = np.where(ball_col < paddle, 2, np.where(ball_col > paddle, 1, -1))  # -1: under the ball
        pick = np.arange(len(t))
        has_away = away >= 0
        gap = q[pick[has_away], toward[has_away]] - q[pick[has_away], away[has_away]]
        rows.append(
            f"| {k} | {len(t)} | {ball_row.mean():.1f} | {np.abs(ball_col - paddle).mean():.1f} | {root_value.mean():.2f} | "
            f"{' '.join(f'{x:.2f}' for x in q.mean(0))} | {gap.mean():+.3f} | {(q.argmax(-1) == toward).mean():.2f} | "
            f"{search_policy[t, n][pick, toward].mean():.2f} | {(action[t, n] == toward).mean():.2f} |"
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir")
    parser.add_argument("--samples", type=int, default=20_000, help="transitions the model's value is computed on")
    parser.add_argument("--episode-tail", type=int, default=0, help="print the last N steps of a greedy episode")
    parser.add_argument(
        "--last",
        type=int,
        default=None,
        help="read only the newest N replayed transitions (default: the whole replay); "
        "--last 50000 compares a larger replay with the default one",
    )
    parser.add_argument(
        "--before-end", type=int, nargs="*", default=[1, 2, 3, 4, 6, 8, 12], help="steps before each loss to tabulate"
    )
    options = parser.parse_args(argv)
    spec = importlib.util.spec_from_file_location("eval_checkpoint", HERE / "eval_checkpoint.py")
    eval_checkpoint = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(eval_checkpoint)
    module, args = eval_checkpoint.load_args(options.run_dir)
    if module is not unizero or args.env_id != "Breakout-MinAtar":
        raise SystemExit(f"{options.run_dir!r} is not a unizero run on Breakout-MinAtar")
    algo, state, update, _ = eval_checkpoint.restore_state(options.run_dir, unizero, args)
    print(f"{options.run_dir}: checkpoint of update {update}")
    # V(obs) of observations [B], each alone at its own timestep: one compile for every seed.
    values_of = jax.jit(
        lambda params, o, t: unizero.lone_values(nnx.merge(algo.graphdef, params), o[:, None], t[:, None])[:, 0]
    )
    for seed_index in range(args.num_seeds):
        buffer = jax.tree.map(lambda x: np.asarray(x[seed_index]), state.buffer)
        data, rows, size = buffer.data, buffer.rows, int(buffer.size)
        order = (np.arange(rows) + int(buffer.position)) % rows if size == rows else np.arange(size)  # oldest first
        if options.last is not None:  # the newest rows only, N transitions over the replay's env columns
            order = order[-max(1, options.last // data.reward.shape[1]) :]
        take = lambda x: x[order]  # [T, N, ...] in time order
        obs, reward, action = take(data.obs), take(data.reward), take(data.action)
        ended, terminated = take(data.terminated | data.truncated), take(data.terminated)
        # Discounted return-to-go, backwards through each env's column; known only where an episode end follows.
        returns, known = np.zeros_like(reward), np.zeros(reward.shape, bool)
        running, seen_end = np.zeros(reward.shape[1]), np.zeros(reward.shape[1], bool)
        for t in range(len(order) - 1, -1, -1):
            seen_end |= ended[t]
            running = reward[t] + args.gamma * np.where(ended[t], 0.0, running)
            returns[t], known[t] = running, seen_end
        bricks = obs[..., 3].sum((-2, -1)).round().astype(int)  # [T, N]
        paddle = obs[..., 9, :, 0].argmax(-1)
        ball_x = obs[..., 1].max(-2).argmax(-1)
        toward = np.where(ball_x < paddle, action == 1, np.where(ball_x > paddle, action == 2, action == 0))
        top_weight = take(data.search_policy).max(-1)
        root_value = take(data.root_value)
        # The model's value of sampled observations, each alone at its own timestep.
        seed_params = jax.tree.map(lambda x: x[seed_index], state.params)
        t_index, n_index = np.nonzero(known)
        pick = np.random.default_rng(0).permutation(len(t_index))[: options.samples]
        t_index, n_index = t_index[pick], n_index[pick]
        timesteps = take(data.timestep)[t_index, n_index]
        values = np.concatenate(
            [
                np.asarray(
                    values_of(seed_params, obs[t_index[i : i + 2000], n_index[i : i + 2000]], timesteps[i : i + 2000])
                )
                for i in range(0, len(t_index), 2000)
            ]
        )
        sampled_bricks = bricks[t_index, n_index]
        print(
            f"\nseed index {seed_index}: {len(order) * reward.shape[1]:,} newest replayed transitions of {size * reward.shape[1]:,}"
        )
        print("| bricks left | steps | return-to-go | V(model) | root value | top weight | toward ball |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for count in range(30, -1, -1):
            here = bricks == count
            if here.sum() < 20:
                continue
            sampled = sampled_bricks == count
            value = f"{values[sampled].mean():.3f}" if sampled.any() else "-"
            print(
                f"| {count} | {here.sum()} | {returns[here & known].mean():.3f} | {value} | "
                f"{root_value[here].mean():.3f} | {top_weight[here].mean():.3f} | {toward[here].mean():.3f} |"
            )
        left, counts = np.unique(bricks[terminated], return_counts=True)
        print("bricks left when a replayed episode ended:", ", ".join(f"{b}: {c}" for b, c in zip(left, counts)))
        model = nnx.merge(algo.graphdef, seed_params)
        if options.before_end and terminated.any():
            print(
                "\n| steps before the loss | episodes | ball row | columns from paddle | root value | "
                "Q (stay, left, right) | Q(toward) - Q(away) | top Q toward | search weight toward | taken toward |"
            )
            print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            rows = before_end_rows(
                model, args, obs, action, take(data.timestep), take(data.search_policy), terminated, options.before_end
            )
            print("\n".join(rows))
        if terminated.any():
            end_t, end_n = np.nonzero(terminated)
            final = take(data.final_obs)[end_t, end_n]
            lost = values_of(seed_params, final, take(data.timestep)[end_t, end_n] + 1)
            print(
                f"V(model) of the frame after the ball passed the paddle (terminal observation, {len(end_t)}): "
                f"mean {float(np.mean(lost)):.3f}, above 0.5 in {float(np.mean(np.asarray(lost) > 0.5)):.1%}; "
                f"of every sampled frame: {values.mean():.3f}"
            )
    print("scripted paddle that follows the ball, per start state:", ", ".join(f"{r:g}" for r in tracker_returns()))
    if options.episode_tail:
        greedy_episode_tail(algo, args, state, options.episode_tail)


if __name__ == "__main__":
    main()
