"""The demo experiment with changes, written beside the shipped spaces, and `sweep validate` on it: shared
by the config tests of issue 10's knobs."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from orchestrator.cli import app

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "experiments" / "demo.yaml"


def changed_demo(tmp_path: Path, change: dict[str, Any], space: dict[str, Any] | None = None) -> Path:
    """The demo experiment with `change` merged in (one level deep), the shipped spaces beside it."""
    shutil.copytree(ROOT / "search_spaces", tmp_path / "search_spaces", dirs_exist_ok=True)
    (tmp_path / "experiments").mkdir(exist_ok=True)
    data = copy.deepcopy(yaml.safe_load(DEMO.read_text()))
    for key, value in change.items():
        if value is None:
            data.pop(key, None)
        elif isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    if space is not None:
        (tmp_path / "search_spaces" / "extra.yaml").write_text(yaml.safe_dump(space))
        data["search_space"] = ["../search_spaces/extra.yaml"]
    exp = tmp_path / "experiments" / "exp.yaml"
    exp.write_text(yaml.safe_dump(data, sort_keys=False))
    return exp


def validate(exp: Path) -> tuple[int, str]:
    """`sweep validate` on `exp`: (exit code, stderr)."""
    result = CliRunner().invoke(app, ["validate", str(exp)])
    return result.exit_code, result.stderr
