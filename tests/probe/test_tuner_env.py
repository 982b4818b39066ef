"""An env export for a server that loads nccl-tuner rules: NCCL_ALGO / NCCL_PROTO left out (they mask the
plugin), NCCL_TUNER_CONFIG_FILE set, read back by each format's own parser."""

from __future__ import annotations

import pytest

from orchestrator.records import ServingConfig
from orchestrator.results import export, formats

CONFIG = ServingConfig(
    experiment="demo",
    trial_number=7,
    run_id="abc123",
    model_version="3",
    engine="sglang",
    sglang_version="0.5.23",
    params={},
    env={"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "SYS", "NCCL_DEBUG": "INFO"},
    sglang_args=("--tp-size", "8"),
    metrics={"decode_tok_s": 94.0},
    fingerprint_hash="f00d",
    created_at="2026-11-29T00:00:00+00:00",
)
WANTED = {"NCCL_P2P_LEVEL": "SYS", "NCCL_TUNER_CONFIG_FILE": "/etc/nccl/tuner.csv"}


def test_env_file_loading_tuner_rules_leaves_algo_and_proto_out():
    text = formats.render_for(CONFIG, "env", tuner_file="/etc/nccl/tuner.csv")
    env = export.parse_env(text)
    assert {k: v for k, v in env.items() if k != export.ARGS_VAR} == WANTED
    assert env[export.ARGS_VAR] == "--tp-size 8"
    assert "left out NCCL_ALGO=Ring NCCL_PROTO=LL" in text.splitlines()[0]


def test_docker_env_and_json_load_the_rules_too():
    variables = formats.parse_docker_env(formats.render_for(CONFIG, "docker-env", tuner_file="/etc/nccl/tuner.csv"))
    env, _ = formats.deployment(variables, whole_file=True)
    assert env == WANTED
    assert '"NCCL_TUNER_CONFIG_FILE": "/etc/nccl/tuner.csv"' in formats.render_for(
        CONFIG, "json", tuner_file="/etc/nccl/tuner.csv"
    )


def test_nccl_tuner_is_not_rendered_from_a_serving_config():
    with pytest.raises(ValueError, match="probe.json"):
        formats.render_for(CONFIG, "nccl-tuner")
