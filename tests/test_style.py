"""House rules that keep the algorithm files consistent (CONVENTIONS.md)."""

import ast
import re
import tomllib

import pytest

from conftest import ROOT

ALGOS = sorted(p for p in (ROOT / "algos").glob("*.py") if p.name != "__init__.py")
COMMON_LOOP = (ROOT / "common" / "runner.py").read_text() + (ROOT / "common" / "logger.py").read_text()


def args_fields(tree: ast.Module) -> tuple[list[str], ast.ClassDef]:
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Args"]
    fields = [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)]
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
        if isinstance(node, ast.AnnAssign):
            declared.update(range(node.lineno, node.end_lineno + 1))
            doc = cls.body[i + 1] if i + 1 < len(cls.body) else None
            if isinstance(doc, ast.Expr):
                declared.update(range(doc.lineno, doc.end_lineno + 1))
    outside = "\n".join(line for n, line in enumerate(source.splitlines(), 1) if n not in declared)
    unread = [f for f in fields if not re.search(rf"\b{f}\b", outside) and not re.search(rf"args\.{f}\b", COMMON_LOOP)]
    assert not unread, f"{path.name}: Args fields never read: {unread}"


@pytest.mark.parametrize("path", ALGOS, ids=lambda p: p.stem)
def test_every_field_has_a_docstring(path):
    tree = ast.parse(path.read_text())
    _, cls = args_fields(tree)
    body = cls.body
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign):
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
              "save_model", "checkpoint_every", "resume", "run_root", "eval_episodes", "compile_cache"]
    for path in ALGOS:
        fields, _ = args_fields(ast.parse(path.read_text()))
        assert fields[: len(shared)] == shared, f"{path.name}: shared Args fields out of order or missing"
