"""One vocabulary: every `Args` field shared by two algorithm files is in
docs/glossary.md, with the glossary's type, and its docstring states the
glossary's unit and off value."""

import ast
import re
from collections import defaultdict

from conftest import ROOT, is_args_field

ALGOS = sorted(p for p in (ROOT / "algos").glob("*.py") if p.name != "__init__.py")
UNIT_WORDS = {"env steps": ("env steps", "environment steps", "agent steps"), "updates": ("update",),
              "episodes": ("episode",), "gradient steps": ("gradient steps", "learner steps"), "pixels": ("pixel",)}


def glossary() -> dict[str, dict[str, str]]:
    text = (ROOT / "docs" / "glossary.md").read_text()
    rows = {}
    table = text.split("| field | type | unit | off | meaning |", 1)[1].split("\n\n", 1)[0]
    for line in table.strip().splitlines()[1:]:
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        field, type_, unit, off, meaning = cells
        rows[field] = {"type": type_, "unit": unit, "off": off, "meaning": meaning}
    return rows


def base_type(annotation: ast.expr) -> str:
    """The annotation without `Annotated[...]` metadata; `Literal[...]` of strings is `str`."""
    if isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) == "Annotated":
        annotation = annotation.slice.elts[0]
    if isinstance(annotation, ast.Subscript) and ast.unparse(annotation.value) == "Literal":
        return "str"
    return ast.unparse(annotation)


def args_fields() -> dict[str, dict[str, tuple[str, str]]]:
    """field -> {file: (type, docstring)} over every algorithm file's Args."""
    found: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)
    for path in ALGOS:
        tree = ast.parse(path.read_text())
        (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Args"]
        for i, node in enumerate(cls.body):
            if is_args_field(node):
                doc = cls.body[i + 1].value.value if isinstance(cls.body[i + 1], ast.Expr) else ""
                found[node.target.id][path.stem] = (base_type(node.annotation), " ".join(doc.split()))
    return found


def test_shared_fields_have_one_type_unit_and_off_value():
    words, problems = glossary(), []
    for name, files in sorted(args_fields().items()):
        if len(files) < 2:
            continue
        if name not in words:
            problems.append(f"{name} (in {sorted(files)}) is not in docs/glossary.md")
            continue
        entry = words[name]
        for file, (type_, doc) in files.items():
            if type_ != entry["type"]:
                problems.append(f"{file}.{name} is {type_}, the glossary says {entry['type']}")
            if entry["off"] != "—" and not re.search(rf"(^|[\s(]){re.escape(entry['off'])}(:| turns| keeps)", doc):
                problems.append(f"{file}.{name}: the docstring does not say what {entry['off']} means "
                                f"(write '{entry['off']}: ...'): {doc!r}")
            if entry["unit"] != "—" and not any(w in doc for w in UNIT_WORDS[entry["unit"]]):
                problems.append(f"{file}.{name}: the docstring does not name its unit ({entry['unit']}): {doc!r}")
    assert not problems, "\n".join(problems)


def test_every_glossary_entry_is_a_field_of_some_file():
    used = args_fields()
    stale = [name for name in glossary() if name not in used]
    assert not stale, f"docs/glossary.md describes fields no Args has: {stale}"


def test_a_field_that_changes_meaning_changes_name():
    """The renames the glossary lists: the old spellings are gone from Args."""
    fields = args_fields()
    assert set(fields.get("tau", {})) <= {"rainbow"}  # 1: hard copy, every target_update_period env steps
    assert set(fields.get("norm_adv", {})) <= {"ppo"}  # within each minibatch
    assert "temperature" not in fields
    assert all(type_ == "float" for type_, _ in fields["target_kl"].values())  # 0, never None, is off
