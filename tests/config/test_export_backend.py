"""The exported champion names the all-reduce backend its trial's server recorded and carries that
backend's flags and environment in every format `sweep export` writes (issue 19)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from orchestrator.config import experiment as spec_mod
from orchestrator.results import export, formats
from orchestrator.trial import plan as planner

KIMI = Path(__file__).resolve().parents[2] / "experiments" / "kimi-k2.5-tp8.yaml"


def _config(backend: str, recorded: str):
    s = spec_mod.load(KIMI)
    return planner.serving_config(
        s,
        {"all_reduce_backend": backend},
        trial_number=7,
        run_id="r1",
        metrics={"decode_tok_s": 101.5},
        fingerprint_hash="fp",
        allreduce_backend=recorded,
    )


def _variables(fmt: str, text: str) -> dict[str, str]:
    if fmt == "env":
        return export.parse_env(text)
    if fmt == "docker-env":
        return formats.parse_docker_env(text)
    return formats.parse_k8s(text)


@pytest.mark.parametrize("fmt", ["env", "docker-env", "k8s"])
def test_every_env_format_names_the_recorded_backend_and_carries_pcie_ipc(fmt):
    text = formats.render_for(_config("pcie_ipc", "pcie_ipc"), fmt)
    header = [line for line in text.splitlines() if line.startswith("#")]
    assert "# all-reduce backend: pcie_ipc (decode/verify, as trial 7's server recorded it)" in header
    variables = _variables(fmt, text)
    assert variables["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"] == "1"
    args = (
        shlex.split(variables[export.ARGS_VAR])
        if export.ARGS_VAR in variables
        else json.loads(variables[formats.ARGS_JSON_VAR])
    )
    assert "--disable-custom-all-reduce" in args and "--enforce-disable-flashinfer-allreduce-fusion" in args


def test_json_and_sglang_args_carry_the_backend_too():
    config = _config("flashinfer_fusion", "flashinfer_fusion")
    data = json.loads(formats.render_for(config, "json"))
    assert data["allreduce_backend"] == "flashinfer_fusion"
    assert export.validate_serving_config(data).allreduce_backend == "flashinfer_fusion"  # reads back
    args = shlex.split(formats.render_for(config, "sglang-args"))
    assert args[args.index("--flashinfer-allreduce-fusion-backend") + 1] == "auto"


def test_an_older_serving_config_without_the_field_reads_and_says_not_recorded():
    data = json.loads(formats.render_for(_config("auto", "custom"), "json"))
    del data["allreduce_backend"]
    old = export.validate_serving_config(data)
    assert old.allreduce_backend == ""
    assert "# all-reduce backend: not recorded" in formats.render_for(old, "env")
    manifest = yaml.safe_load(formats.render_for(old, "k8s"))
    assert manifest["kind"] == "ConfigMap"
