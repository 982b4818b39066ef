"""Issue 38 (hardening, round three), item 3 of what to build: one message and exit 2 for every bad byte
`sweep validate` can meet (a lone surrogate from a YAML escape in tracking.experiment, server.model or
server.draft_model; a flag or env value past the 128 KiB Linux passes in one argument or variable), `sweep
run --timeout ''` refused, and `sweep sync --tracking-uri` for an MLflow server that moved."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import demo_experiment, write_experiment
from typer.testing import CliRunner

from orchestrator.cli import app


def _refused(tmp_path: Path, **overrides: object) -> str:
    exp = write_experiment(tmp_path, demo_experiment(**overrides))
    result = CliRunner().invoke(app, ["validate", str(exp)])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in text and text.count("error:") == 1, text
    return text


@pytest.mark.parametrize(
    "overrides",
    [
        {"tracking": {"experiment": "night\udc80"}},
        {"server": {"model": "/models/K\ud800"}},
        {"server": {"model": "m", "draft_model": "/models/\udfff-draft"}},
        {"server": {"model": "m", "flags": {"served-model-name": "a\udc80"}}},
    ],
)
def test_a_lone_surrogate_anywhere_is_one_message(tmp_path: Path, overrides: dict) -> None:
    text = _refused(tmp_path, **overrides)
    assert "holds a lone surrogate" in text and "write the character itself" in text


def test_a_flag_value_past_128_kib_is_one_message(tmp_path: Path) -> None:
    text = _refused(tmp_path, server={"model": "m", "flags": {"served-model-name": "x" * (128 * 1024)}})
    assert "is 131072 bytes, more than the 131071 that Linux passes in one argument or variable" in text


def test_an_env_value_past_128_kib_with_its_name_is_one_message(tmp_path: Path) -> None:
    """The value alone fits; NAME=value, the string execve gets, does not."""
    value = "y" * (128 * 1024 - 10)
    text = _refused(tmp_path, server={"model": "m", "env": {"NCCL_TUNER_CONFIG_FILE": value}})
    assert "server.env" in text and "is 131085 bytes, more than the 131071" in text


def test_an_empty_timeout_is_refused(tmp_path: Path) -> None:
    exp = write_experiment(tmp_path, demo_experiment())
    result = CliRunner().invoke(app, ["run", str(exp), "--timeout", "", "--workdir", str(tmp_path / "wd")])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert "--timeout: a duration looks like 8h, 30m, 90s or a number of seconds, but got ''" in text
    assert not (tmp_path / "wd").exists()


def test_sync_refuses_a_tracking_uri_that_is_none(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["sync", "--workdir", str(tmp_path), "--tracking-uri", "127.0.0.1:5000"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "--tracking-uri must be an MLflow tracking URI" in text, text
