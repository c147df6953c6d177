"""Copying one algorithm file works: each `algos/*.py`, copied alone into an
empty directory outside the repository, imports with only the installed
package (`jaxzoo`), finds its presets, and `make_train` builds its functions
there. (Each file's CLI smoke test also runs the copied file: `--preset tiny`
through `conftest.run_copied_script`.)"""

import os
import shutil
import subprocess
import sys

from conftest import ROOT

ALGOS = sorted(p.stem for p in (ROOT / "algos").glob("*.py") if p.name != "__init__.py")

# Runs in the copy's directory, in a fresh interpreter with no PYTHONPATH: the
# copied file is imported by its path, so nothing of the repository is on sys.path.
PROBE = """
import importlib.util, os, sys
from jaxzoo import cli
repository = sys.argv[1]
assert all(os.path.abspath(p or ".") != repository for p in sys.path), sys.path
for name in sys.argv[2:]:
    spec = importlib.util.spec_from_file_location(name, name + ".py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert os.path.dirname(os.path.abspath(module.__file__)) == os.getcwd(), module.__file__
    algo = module.make_train(cli.preset_args(module.Args, name, "tiny"))
    print(name, "ok", type(algo).__name__)
"""


def test_every_algorithm_file_works_copied_alone(tmp_path):
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    for name in ALGOS:
        shutil.copy(ROOT / "algos" / f"{name}.py", workdir)
    (workdir / "probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "probe.py", str(ROOT), *ALGOS], cwd=workdir, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    for name in ALGOS:
        assert f"{name} ok" in out.stdout


def test_no_generic_top_level_package_is_installed():
    """`pip install` of this project puts `jaxzoo` on the path, never `common`
    or `algos` (which would shadow, or be shadowed by, a user's own)."""
    code = "import importlib.util as u; print(u.find_spec('common'), u.find_spec('algos'), u.find_spec('jaxzoo.algos'))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True, timeout=60)
    common_spec, algos_spec, jaxzoo_algos = out.stdout.split(" ", 2)
    assert common_spec == "None" and algos_spec == "None", out.stdout
    assert "algos" in jaxzoo_algos
