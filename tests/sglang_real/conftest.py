"""The real-SGLang tier: the tool's `engine: sglang` path against a real SGLang 0.5.23 server on this
machine's CPU (docs/testing-sglang.md). `make test-sglang` builds the server's venv (.venv-sglang/) and
sets SWEEP_SGLANG_PYTHON to its interpreter; without it every test here is skipped, and `make test`
deselects them (marker sglang_real).

The model is made at test time: a random-weight Llama of 2 layers, hidden 256, with a WordLevel
tokenizer over the builtin client's words (tiny_model.py), saved with save_pretrained.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PYTHON_VAR = "SWEEP_SGLANG_PYTHON"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sglang_real: runs a real SGLang 0.5.23 server on CPU (make test-sglang)")


@pytest.hookimpl(tryfirst=True)  # before -m deselects: `make test` runs none of these
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.sglang_real)
            item.add_marker(pytest.mark.timeout(1500))


@pytest.fixture(scope="session")
def sglang_python() -> str:
    """The SGLang venv's interpreter (make test-sglang builds it)."""
    python = os.environ.get(PYTHON_VAR)
    if not python:
        pytest.skip(f"{PYTHON_VAR} is not set: run `make test-sglang`")
    if not Path(python).exists():
        pytest.fail(f"{PYTHON_VAR}={python} does not exist: run `make test-sglang`")
    return python


@pytest.fixture(scope="session")
def tiny_model(sglang_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-llama")
    subprocess.run([sglang_python, str(HERE / "tiny_model.py"), str(out)], check=True, timeout=600, capture_output=True)
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    return out
