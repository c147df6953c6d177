"""Every algorithm file runs every gymnax environment whose action space it
supports, or refuses it at start-up with a ValueError that names the env.

Each (file, env) pair of gymnax's registry (classic control, bsuite, MinAtar,
misc) builds `make_train` on the file's tiny preset and traces the whole
training run (`jax.eval_shape(train)`: a few updates, every shape and dtype
checked, nothing compiled), so the sweep costs seconds per pair.
`benchmarks/reliability.py registry` runs a few real updates of every pair;
docs/reliability.md has its table.
"""

import dataclasses
import importlib

import jax
import pytest

from jaxzoo import cli, envs

ALGOS = ["impala", "mpo", "planet", "ppo", "rainbow", "unizero", "unizero_ppo", "world_models"]


def build(algo: str, env_id: str):
    """`make_train` of `algo`'s tiny preset on `env_id`: the algorithm's
    functions, or the ValueError it refuses the env with."""
    module = importlib.import_module(f"jaxzoo.algos.{algo}")
    args = dataclasses.replace(cli.preset_args(module.Args, algo, "tiny"), env_id=env_id)
    return module.make_train(args)


@pytest.mark.parametrize("algo", ALGOS)
def test_every_registered_env_runs_or_is_refused_by_name(algo):
    crashed, refused, ran = {}, [], []
    for env_id in envs.ENV_IDS:
        try:
            functions = build(algo, env_id)
            # World Models trains in stages; the others have one `train`.
            if hasattr(functions, "train"):
                jax.eval_shape(functions.train, jax.random.key(0))
            ran.append(env_id)
        except ValueError as error:
            if env_id not in str(error):
                crashed[env_id] = f"refused without naming the env: {error}"
            else:
                refused.append(env_id)
        except Exception as error:  # noqa: BLE001 - every other failure is the defect this test looks for
            crashed[env_id] = f"{type(error).__name__}: {str(error)[:300]}"
    assert not crashed, f"{algo}: {crashed}"
    assert ran, f"{algo} runs no registered env"
