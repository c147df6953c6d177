"""LightZero's own UniZero on CartPole-v0, on the CPU, for the side-by-side in docs/unizero.md.

Runs with the python of a separate virtual environment that has `lightzero` installed
(see benchmarks/lightzero_unizero.sh); nothing here is LightZero code. It takes the
package's CartPole UniZero config (zoo/classic_control/cartpole/config/
cartpole_unizero_config.py) unchanged except for what running here needs:

  policy.cuda = False, policy.device = world_model_cfg.device = 'cpu'   (no GPU)
  create_config.env_manager.type = 'base'                               (no subprocesses)
  env.stop_value = 195                                                  (LightZero's default is 1e10: never stop)
  exp_name = <out-dir>/seed<N>, and the seed

and calls the package's entry point `lzero.entry.train_unizero`. It stops at the first
evaluation whose mean return is >= stop_value (LightZero's own stop rule), at
--max-env-step, or after the first evaluation past --max-wall-seconds.

Every evaluation (LightZero's evaluator: `n_evaluator_episode` = 3 greedy episodes every
`eval_freq` training iterations - the config's 1000, or --eval-freq - and at iteration 0
until training starts) is written as a CSV row: the collector's env steps, the training
iteration, seconds since this process started (imports, config, env and policy
construction included) at the end of that evaluation, this process's CPU seconds (user +
system), the seconds spent in evaluations so far, the mean / std / min / max return and
the 1-minute load average. --threads sets torch.set_num_threads.
"""
import time

T0 = time.time()  # first statement: wall_seconds count from here (before torch and lzero load)

import argparse  # noqa: E402 (after T0: the clock starts before these load)
import csv  # noqa: E402 (after T0: the clock starts before these load)
import json  # noqa: E402 (after T0: the clock starts before these load)
import os  # noqa: E402 (after T0: the clock starts before these load)
import sys  # noqa: E402 (after T0: the clock starts before these load)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", default="benchmarks/out/lightzero_unizero")
    p.add_argument("--stop-value", type=float, default=195.0)
    p.add_argument("--max-env-step", type=int, default=50_000)
    p.add_argument("--max-wall-seconds", type=float, default=3600.0)
    p.add_argument("--eval-freq", type=int, default=None,
                   help="training iterations between evaluations (default: the config's, 1000)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = p.parse_args()

    out_dir = os.path.abspath(args.out_dir)
    os.makedirs(out_dir, exist_ok=True)
    csv_path = os.path.join(out_dir, f"seed{args.seed}.csv")

    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    import importlib

    import lzero
    tu = importlib.import_module("lzero.entry.train_unizero")  # the module (lzero.entry re-exports the function)
    from zoo.classic_control.cartpole.config.cartpole_unizero_config import create_config, main_config
    t_import = time.time() - T0

    cfg, create_cfg = main_config, create_config
    cfg.exp_name = f"seed{args.seed}"  # relative: LightZero writes './<exp_name>/log'; we chdir to out_dir
    cfg.env.stop_value = args.stop_value
    cfg.policy.cuda = False
    cfg.policy.device = "cpu"
    cfg.policy.model.world_model_cfg.device = "cpu"
    if args.eval_freq is not None:
        cfg.policy.eval_freq = args.eval_freq
    create_cfg.env_manager.type = "base"
    os.chdir(out_dir)

    rows = []
    fields = ["seed", "env_steps", "train_iter", "wall_seconds", "cpu_seconds", "eval_seconds_total", "eval_return",
              "eval_return_std", "eval_return_min", "eval_return_max", "load1"]
    fh = open(csv_path, "w", newline="")
    writer = csv.DictWriter(fh, fieldnames=fields)
    writer.writeheader()
    fh.flush()
    state = {"eval_seconds": 0.0, "first_eval_start": None}

    # Record each evaluation as it ends (a subclass that times the package's own eval and
    # reads its result; the evaluation itself is LightZero's).
    class TimedEvaluator(tu.Evaluator):
        def eval(self, save_ckpt_fn=None, train_iter=-1, envstep=-1, n_episode=None, return_trajectory=False):
            start = time.time()
            self._last_stats = {}
            if state["first_eval_start"] is None:
                state["first_eval_start"] = start - T0
            out = super().eval(save_ckpt_fn, train_iter, envstep, n_episode, return_trajectory)
            stop = out[0]
            end = time.time()
            state["eval_seconds"] += end - start
            row = dict(seed=args.seed, env_steps=int(envstep), train_iter=int(train_iter),
                       wall_seconds=round(end - T0, 2), cpu_seconds=round(sum(os.times()[:2]), 2),
                       eval_seconds_total=round(state["eval_seconds"], 2),
                       load1=round(os.getloadavg()[0], 2))
            row.update(self._last_stats)
            writer.writerow(row)
            fh.flush()
            rows.append(row)
            print(f"[lightzero_unizero] seed {args.seed} env_steps {row['env_steps']} iter {row['train_iter']} "
                  f"wall {row['wall_seconds']}s eval_return {row['eval_return']} load {row['load1']}", flush=True)
            if end - T0 > args.max_wall_seconds and not stop:
                print(f"[lightzero_unizero] wall cap {args.max_wall_seconds}s reached: stopping", flush=True)
                stop = True
            return (stop,) + tuple(out[1:])

    # The evaluator logs its statistics (reward_mean, reward_std, ...) through its tb_logger;
    # catch them there instead of recomputing anything.
    class StatsTap:
        def __init__(self, inner, evaluator_ref):
            self.inner, self.ref = inner, evaluator_ref

        def add_scalar(self, tag, value, step=None, *a, **k):
            ev = self.ref.get("ev")
            if ev is not None and tag.startswith("evaluator_step/"):
                key = tag.split("/", 1)[1]
                m = {"reward_mean": "eval_return", "reward_std": "eval_return_std",
                     "reward_min": "eval_return_min", "reward_max": "eval_return_max"}
                if key in m:
                    ev._last_stats[m[key]] = round(float(value), 3)
            return self.inner.add_scalar(tag, value, step, *a, **k)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    ref = {}

    class Evaluator(TimedEvaluator):
        def __init__(self, *a, **k):
            self._last_stats = {}
            if k.get("tb_logger") is not None:
                k["tb_logger"] = StatsTap(k["tb_logger"], ref)
            super().__init__(*a, **k)
            ref["ev"] = self

    tu.Evaluator = Evaluator

    meta = dict(seed=args.seed, lightzero=getattr(lzero, "__version__", None), torch=torch.__version__,
                torch_threads=torch.get_num_threads(), python=sys.version.split()[0],
                import_seconds=round(t_import, 2), stop_value=args.stop_value, max_env_step=args.max_env_step,
                eval_freq=cfg.policy.eval_freq, n_evaluator_episode=cfg.env.n_evaluator_episode,
                collector_env_num=cfg.env.collector_env_num, n_episode=cfg.policy.n_episode,
                num_simulations=cfg.policy.num_simulations, replay_ratio=cfg.policy.replay_ratio,
                batch_size=cfg.policy.batch_size, num_unroll_steps=cfg.policy.num_unroll_steps,
                game_segment_length=cfg.policy.game_segment_length, learning_rate=cfg.policy.learning_rate,
                env_manager=create_cfg.env_manager.type, load_at_start=os.getloadavg())
    print("[lightzero_unizero] " + json.dumps(meta), flush=True)

    tu.train_unizero([cfg, create_cfg], seed=args.seed, max_env_step=args.max_env_step)
    fh.close()

    reached = next((r for r in rows if r.get("eval_return", -1) >= args.stop_value and r["train_iter"] > 0), None)
    meta.update(setup_seconds=round(state["first_eval_start"] or -1, 2), total_seconds=round(time.time() - T0, 2),
                eval_seconds_total=round(state["eval_seconds"], 2), load_at_end=os.getloadavg(),
                final_env_steps=rows[-1]["env_steps"] if rows else None,
                reached=bool(reached), env_steps_to_reach=reached["env_steps"] if reached else None,
                wall_seconds_to_reach=reached["wall_seconds"] if reached else None)
    with open(f"seed{args.seed}.json", "w") as f:
        json.dump(meta, f, indent=1)
    print("[lightzero_unizero] done " + json.dumps(meta), flush=True)


if __name__ == "__main__":
    main()
