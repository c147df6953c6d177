"""Every notebook runs top to bottom at a tiny budget (JAXZOO_NOTEBOOK_TINY=1)."""


import nbformat
import pytest
from conftest import ROOT, slow_except
from nbclient import NotebookClient

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", slow_except((ROOT / "notebooks" / "ppo.ipynb",), NOTEBOOKS), ids=lambda p: p.stem)
def test_notebook_executes(path, monkeypatch):
    monkeypatch.setenv("JAXZOO_NOTEBOOK_TINY", "1")
    notebook = nbformat.read(path, as_version=4)
    source = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    assert f"from jaxzoo.algos import {path.stem}" in source, "notebooks import the algorithm, never copy it"
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    errors = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
