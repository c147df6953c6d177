"""Shared test setup: a private JAX compilation cache and small helpers."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests run from a clone even before `pip install -e .`


@pytest.fixture(scope="session", autouse=True)
def _compile_cache(tmp_path_factory):
    os.environ["JAXZOO_CACHE_DIR"] = str(tmp_path_factory.mktemp("jax-cache"))
    yield
