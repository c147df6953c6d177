"""House rules that keep the algorithm files consistent (CONVENTIONS.md)."""

import ast
import dataclasses
import importlib
import inspect
import re
import tomllib

import pytest
from conftest import ROOT, is_args_field

from jaxzoo import atari

ALGOS = sorted(p for p in (ROOT / "algos").glob("*.py") if p.name != "__init__.py")
COMMON_LOOP = "".join((ROOT / "common" / name).read_text() for name in ("runner.py", "logger.py", "parallel.py"))


def args_fields(tree: ast.Module) -> tuple[list[str], ast.ClassDef]:
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Args"]
    fields = [n.target.id for n in cls.body if is_args_field(n)]
    return fields, cls


@pytest.mark.parametrize("path", ALGOS, ids=lambda p: p.stem)
def test_every_args_field_is_read(path):
    source = path.read_text()
    tree = ast.parse(source)
    fields, cls = args_fields(tree)
    # Everything but the field declarations and their docstrings (properties and
    # validation inside Args count as reads).
    declared = set()
    for i, node in enumerate(cls.body):
        if is_args_field(node):
            declared.update(range(node.lineno, node.end_lineno + 1))
            doc = cls.body[i + 1] if i + 1 < len(cls.body) else None
            if isinstance(doc, ast.Expr):
                declared.update(range(doc.lineno, doc.end_lineno + 1))
    outside = "\n".join(line for n, line in enumerate(source.splitlines(), 1) if n not in declared)
    # atari.preprocessing(args) reads every field named as one of atari.Preprocessing's.
    read_by_atari = set(atari.Preprocessing._fields) if "atari.preprocessing(args)" in outside else set()
    unread = [
        f
        for f in fields
        if not re.search(rf"\b{f}\b", outside)
        and not re.search(rf"args\.{f}\b", COMMON_LOOP)
        and f not in read_by_atari
    ]
    assert not unread, f"{path.name}: Args fields never read: {unread}"


@pytest.mark.parametrize("path", ALGOS, ids=lambda p: p.stem)
def test_every_field_has_a_docstring(path):
    tree = ast.parse(path.read_text())
    _, cls = args_fields(tree)
    body = cls.body
    for i, node in enumerate(body):
        if is_args_field(node):
            following = body[i + 1] if i + 1 < len(body) else None
            assert isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant), \
                f"{path.name}: field {node.target.id} has no docstring (tyro shows it in --help)"


@pytest.mark.parametrize("path", ALGOS, ids=lambda p: p.stem)
def test_configs_have_a_tiny_preset_of_known_keys(path):
    config = ROOT / "configs" / f"{path.stem}.toml"
    assert config.exists(), f"{path.name} has no configs/{path.stem}.toml"
    tables = tomllib.loads(config.read_text())
    assert "tiny" in tables
    fields, _ = args_fields(ast.parse(path.read_text()))
    for name, table in tables.items():
        unknown = set(table) - set(fields) - {"extends"}
        assert table.get("extends", name) in tables, f"[{name}] extends an unknown preset"
        assert not unknown, f"configs/{path.stem}.toml [{name}] has keys that are not Args fields: {unknown}"


@pytest.mark.parametrize("path", ALGOS, ids=lambda p: p.stem)
def test_algorithm_files_import_no_other_algorithm(path):
    source = path.read_text()
    assert not re.search(r"^\s*(from|import)\s+algos", source, re.M), f"{path.name} imports another algorithm file"


def test_shared_fields_are_identical_across_files():
    shared = ["exp_name", "seed", "num_seeds", "env_id", "total_timesteps", "log_every", "track", "tensorboard",
              "save_model", "checkpoint_every", "resume", "run_root", "eval_episodes", "compile_cache", "parallel",
              "distributed", "coordinator_address", "num_processes", "process_id", "distributed_timeout",
              "capture_video"]
    for path in ALGOS:
        fields, _ = args_fields(ast.parse(path.read_text()))
        assert fields[: len(shared)] == shared, f"{path.name}: shared Args fields out of order or missing"


LIBRARY = ALGOS + sorted((ROOT / "common").glob("*.py"))


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_function_is_longer_than_150_lines(path):
    """Code a reader can hold in mind: no function of the library, nested
    pieces included, runs past 150 lines (split it into named pieces)."""
    tree = ast.parse(path.read_text())
    long = [
        (node.name, node.lineno, node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 150
    ]
    assert not long, f"{path.name}: functions over 150 lines (name, line, length): {long}"


@pytest.mark.parametrize("path", ALGOS, ids=lambda p: p.stem)
def test_every_file_has_the_sweep_contract(path):
    """Every file sweeps like ppo.py: a `Hyperparams` pytree with `from_args`,
    and `init` / `train` taking `(key, hparams=None)` (each file's tests run a
    vmapped sweep through them)."""
    module = importlib.import_module(f"jaxzoo.algos.{path.stem}")
    fields = [f.name for f in dataclasses.fields(module.Hyperparams)]
    assert fields and hasattr(module.Hyperparams, "from_args")
    hparams = module.Hyperparams.from_args(module.Args())
    assert all(getattr(hparams, name).dtype.kind == "f" for name in fields), "Hyperparams hold floats"
    source = inspect.getsource(module)
    assert re.search(r"def train\(\s*key[^)]*hparams: Hyperparams \| None = None", source), "train(key, hparams=None)"
    assert re.search(r"def init\(\s*key[^)]*hparams: Hyperparams \| None = None", source) or path.stem == "world_models"
