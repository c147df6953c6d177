"""Milliseconds per learner update of Stoix's continuous MPO, timed the way
benchmarks/mpo_cost.py times ours (one seed, after compiling, median of 5
timings of one compiled call that runs 20 updates in a `lax.scan`, as a run's
loop does: the host's per-call dispatch is not counted on either side), for
the comparison of issue 27.

Runs with a Python environment that has Stoix's dependencies, not ours (Stoix
pins jax < 0.6); the exact set is listed below. Side by side with ours:

    /tmp/stoix-venv/bin/python benchmarks/stoix_mpo_cost.py --stoix /tmp/stoix
    PYTHONPATH=. python benchmarks/mpo_cost.py   # row "256-256 networks, batch 128 x 10 samples"

`--stoix` is a work tree of github.com/EdanToledo/Stoix at commit
8fff19c94a478c1e1ff75fbf10396d488aa25d70 (2026-03-18, "Add JaxARC
environment setup and documentation (#188)").

What is timed. Stoix's `stoix/systems/mpo/ff_mpo_continuous.py` has no
importable update function: `get_learner_fn` returns `learner_fn`, which
scans `_update_step` (rollout_length env steps, a buffer add, then `epochs`
iterations of the nested closure `_update_epoch`). One `_update_epoch` is one
learner update: sample B sequences of T steps from the flashbax buffer; one
`jax.grad` of the actor-and-dual loss (E-step: N actions per state from the
target policy, scored by the target critic; `mpo_loss` of
`continuous_loss.py` with decoupled mean / stddev KL duals) over all B*T
states; one `jax.grad` of the critic loss (expected SARSA over N target-policy
actions, truncated GAE over the sequence); `pmean` of the gradients over the
"batch" and "device" axes; Adam with global-norm clipping for actor, critic
and duals; Polyak targets. This script builds everything with Stoix's own
code (its hydra configs composed with overrides, `environments.make`,
`learner_setup`: its networks, optimizers, flashbax buffer and warm-up) and
takes `_update_epoch` out of `_update_step`: the same code object, made into
a function over the same closure cells (so the same config, apply and update
functions). It runs as Stoix runs it, `jax.pmap` over the device axis (one CPU
device) of `jax.vmap` over the update-batch axis (update_batch_size = 1);
nothing else (env steps, buffer add, logging) is timed. Two rows:

- "pre-sampled batch": the cell holding the buffer's sample function is given
  one that returns a fixed batch (sampled once from the real buffer) passed in
  as an argument, as benchmarks/mpo_cost.py hands our learner step its
  windows; this is the row to compare with ours.
- "flashbax sample included": the update exactly as Stoix runs it, the
  buffer (Stoix's default total_buffer_size, 200k) an input of the timed call
  rather than part of its output: inside Stoix's scan the buffer is carried
  without a copy, while returning it from a pmapped call copies all of it
  every step (that copy, not the sample, was about 9 ms per step in a check
  run on the loaded 2-core CPU).

Set to match our `pendulum` preset at the 256-256 size of mpo_cost.py's third
row (configs/mpo.toml, issue 27): env gymnax Pendulum-v1 (observation 3,
action 1), actor and critic torsos [256, 256] (Stoix's default is 4 x 256),
system.num_samples = 10 (default 128), system.total_batch_size = 128 (default
256), system.sample_sequence_length = 2 (default 16): the shortest sequence
that gives a one-step TD target, so 128 sequences are 128 critic transitions,
as ours. arch.total_num_envs = 2 (ours: num_envs = 2; only the warm-up and
buffer shape use it). system.epochs (72), rollout_length (8) and warmup_steps
(16) change how often an update runs, not what one costs; the update is timed
alone. use_retrace / use_n_step_bootstrap stay False (Stoix's default, a
truncated GAE target, which over sequences of 2 is the one-step TD target
r + gamma V(s'), as ours) and stochastic_policy_eval stays
True (V(s') as a mean over num_samples actions, as ours).

What differs and cannot be matched by a setting:
- Stoix's sequences: the actor loss runs on all B*T = 256 states of the 128
  sequences of 2 (ours: the E-step on 128 states), and the critic loss scores
  N target actions at all 256 states (ours: at the 128 next states). Per
  update that is 2 x 256 x 10 target-critic evaluations against our
  2 x 128 x 10. `--batch-size 64` (64 sequences of 2: 128 states, the same
  target-critic work as ours, but 64 critic transitions) bounds it from the
  other side.
- Networks: Stoix's MLPTorso is Dense + SiLU without LayerNorm (ours: Linear
  -> LayerNorm -> tanh, then ELU); its policy is a tanh-squashed Normal
  (TFP's `AffineTanhTransformedDistribution`: samples and log-probs go through
  the bijector; ours is a Gaussian with clipped actions).
- Ours: one optimizer for the duals with per-dual learning rates as injected
  hyperparameters, hard target copies every 100 steps (a `where` each step),
  an M-step `lax.scan` of m_steps = 1; Stoix: one joint gradient for actor and
  duals, Polyak targets every step, pmean over size-1 axes.
- Runtime: Stoix runs on jax 0.5.3 / flax linen 0.10.5, ours on the jax and
  flax NNX of our environment: XLA versions differ; say which when reporting.

Installed for it (python 3.11 venv; versions of Stoix's uv.lock where it pins
them; optax from the registry because the lock takes optax's main branch):
jax[cpu] 0.5.3, jaxlib 0.5.3, flax 0.10.5, optax 0.2.4, chex 0.1.89, distrax
0.1.5, tensorflow-probability 0.25.0, flashbax 0.1.3, rlax 0.1.6, hydra-core
1.3.2, omegaconf 2.3.0, numpy 1.26.4, colorama 0.4.6, dm-tree 0.1.8,
gymnasium 1.1.1, stoa-env 0.1.2 and gymnax 0.0.9 (both --no-deps; Stoix's
lock has the same versions, stoa-env from its git main), matplotlib 3.11.2
and seaborn 0.13.2 (gymnax imports them at import time), and, only
because ff_mpo_continuous.py imports Stoix's logger at module level, wandb
0.19.8, neptune 1.13.0, tensorboard-logger 0.1.0, pandas 2.2.3 and protobuf
3.20.3 (Stoix's pin; tensorboard-logger's generated protos need it). Nothing
is stubbed.

On our jax, to tell Stoix's code from its XLA (docs/performance.md, "MPO
against Stoix on one jax"): the same Stoix work tree and this script also run
in a second environment with the jax stack of ours, jax 0.10.2, jaxlib
0.10.2, flax 0.12.8, optax 0.2.8, chex 0.1.92, distrax 0.1.9, rlax 0.1.9,
numpy 2.4.6 and tfp-nightly 0.26.0.dev20261027 (tensorflow-probability 0.25.0
does not import on jax 0.10: `jax.interpreters.xla.pytype_aval_mappings` is
gone), with flashbax 0.1.3, stoa-env 0.1.2 and gymnax 0.0.9 --no-deps and the
other packages of the list above at its versions. Nothing in Stoix is changed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
import types

STOIX_COMMIT = "8fff19c94a478c1e1ff75fbf10396d488aa25d70"


def row_label(layers: list[int], batch_size: int, num_samples: int, sequence_length: int) -> str:
    """The first cell of this script's rows (benchmarks/speed.py finds its row by it)."""
    sizes = "-".join(str(n) for n in layers)
    return (
        f"Stoix ff_mpo_continuous `_update_epoch`: {sizes} networks, batch {batch_size} x {num_samples} samples, "
        f"sequences of {sequence_length}"
    )


def compose_config(stoix_dir: str, batch_size: int, sequence_length: int, num_samples: int, layers: list[int]):
    """Stoix's default_ff_mpo_continuous config with our sizes (its hydra search
    path is relative to the repository root, hence the chdir)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    sizes = "[" + ",".join(str(n) for n in layers) + "]"
    overrides = [
        "env=gymnax/pendulum",
        f"network.actor_network.pre_torso.layer_sizes={sizes}",
        f"network.q_network.pre_torso.layer_sizes={sizes}",
        f"system.total_batch_size={batch_size}",
        f"system.sample_sequence_length={sequence_length}",
        f"system.num_samples={num_samples}",
        "arch.total_num_envs=2",
        "arch.total_timesteps=1e6",
        "arch.seed=0",
    ]
    cwd = os.getcwd()
    os.chdir(stoix_dir)
    try:
        config_dir = os.path.join(stoix_dir, "stoix/configs/default/anakin")
        with initialize_config_dir(config_dir=config_dir, version_base="1.2"):
            config = compose("default_ff_mpo_continuous.yaml", overrides=overrides)
    finally:
        os.chdir(cwd)
    OmegaConf.set_struct(config, False)  # as Stoix's hydra_entry_point
    return config


def stoix_update_epoch(learn, sample_fn=None):
    """Stoix's `_update_epoch` closure out of the pmapped `learner_fn` that
    `learner_setup` returns: the nested function's code object over the cells of
    its enclosing `_update_step`, optionally with another buffer sample function."""
    import inspect

    learner_fn = inspect.unwrap(learn)
    update_step = dict(zip(learner_fn.__code__.co_freevars, learner_fn.__closure__))["_update_step"].cell_contents
    cells = dict(zip(update_step.__code__.co_freevars, update_step.__closure__))
    if sample_fn is not None:
        cells["buffer_sample_fn"] = types.CellType(sample_fn)
    code = next(c for c in update_step.__code__.co_consts if getattr(c, "co_name", None) == "_update_epoch")
    return types.FunctionType(
        code, update_step.__globals__, code.co_name, None, tuple(cells[n] for n in code.co_freevars)
    )


def milliseconds_per_update(
    stoix_dir: str,
    batch_size: int,
    sequence_length: int,
    num_samples: int,
    layers: list[int],
    steps: int = 20,
    repeats: int = 5,
) -> tuple[float, float]:
    """(ms per update on a pre-sampled batch, ms per update with the flashbax sample)."""
    import jax
    from flashbax.buffers.trajectory_buffer import TrajectoryBufferSample
    from stoix.systems.mpo.ff_mpo_continuous import learner_setup
    from stoix.utils import make_env as environments
    from stoix.utils.total_timestep_checker import check_total_timesteps

    config = compose_config(stoix_dir, batch_size, sequence_length, num_samples, layers)
    config.num_devices = len(jax.devices())
    with contextlib.redirect_stdout(sys.stderr):  # Stoix's banners
        config = check_total_timesteps(config)
        env, _ = environments.make(config)
        key, actor_key, q_key = jax.random.split(jax.random.PRNGKey(config.arch.seed), 3)
        learn, _, learner_state = learner_setup(env, (key, actor_key, q_key), config)
    params, opt_states, buffer_state, keys = (
        learner_state.params,
        learner_state.opt_states,
        learner_state.buffer_state,
        learner_state.key,
    )

    def timed(update_epoch, carry, buffer) -> float:
        # As learner_fn runs it: vmap over the update-batch axis, pmap over devices. The buffer
        # (read-only in an update) is an input, not carried: inside Stoix's scan it is never
        # copied, while a pmap output of it would copy all of it on every call.
        def update(carry, buffer):
            (params, opt_states, _, key), _ = update_epoch((carry[0], carry[1], buffer, carry[2]), None)
            return params, opt_states, key  # the update splits its own key

        def run_steps(carry, buffer):  # `steps` updates in one compiled call, as learner_fn's scan runs them
            return jax.lax.scan(lambda carry, _: (update(carry, buffer), None), carry, None, steps)[0]

        run = jax.pmap(jax.vmap(run_steps, axis_name="batch"), axis_name="device")
        carry = jax.block_until_ready(run(carry, buffer))
        timings = []
        for _ in range(repeats):
            start = time.perf_counter()
            carry = jax.block_until_ready(run(carry, buffer))
            timings.append((time.perf_counter() - start) / steps * 1e3)
        return statistics.median(timings)

    real = stoix_update_epoch(learn)
    sample = dict(zip(real.__code__.co_freevars, real.__closure__))["buffer_sample_fn"].cell_contents
    # One batch [devices, update batch, B, T, ...] from Stoix's buffer, handed to each update as its "buffer state".
    batch = jax.pmap(jax.vmap(lambda b, k: sample(b, k).experience))(buffer_state, keys)
    presampled = stoix_update_epoch(learn, lambda fixed, _key: TrajectoryBufferSample(experience=fixed))
    return timed(presampled, (params, opt_states, keys), batch), timed(real, (params, opt_states, keys), buffer_state)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stoix", required=True, help=f"work tree of EdanToledo/Stoix (commit {STOIX_COMMIT[:12]})")
    parser.add_argument("--batch-size", type=int, default=128, help="sequences per update (system.total_batch_size)")
    parser.add_argument("--sequence-length", type=int, default=2, help="steps per sequence (>= 2)")
    parser.add_argument("--num-samples", type=int, default=10, help="sampled actions per state")
    parser.add_argument("--layers", type=int, nargs="+", default=[256, 256], help="actor and critic torso sizes")
    args = parser.parse_args()
    stoix_dir = os.path.abspath(args.stoix)
    sys.path.insert(0, stoix_dir)

    import jax

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(
        f"machine: {cpu}, {os.cpu_count()} cores, {platform.system()}, jax {jax.__version__}, "
        f"load average {os.getloadavg()[0]:.1f}, Stoix at {stoix_dir} (written for {STOIX_COMMIT[:12]})\n"
    )
    presampled, with_sample = milliseconds_per_update(
        stoix_dir, args.batch_size, args.sequence_length, args.num_samples, args.layers
    )
    label = row_label(args.layers, args.batch_size, args.num_samples, args.sequence_length)
    print("| learner step | ms per step (1 seed) |\n| --- | --- |")
    print(f"| {label}, pre-sampled batch | {presampled:.2f} |")
    print(f"| {label}, flashbax sample included | {with_sample:.2f} |", flush=True)


if __name__ == "__main__":
    main()
