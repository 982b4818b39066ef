"""Each export format read back by a parser of its own semantics (and, where installed, by the real reader:
docker's CLI, kubectl); production exports hold no observation-only variable or flag."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml
from deploy_helpers import (
    ARGS,
    DOCKER,
    ENV,
    KUBECTL,
    PRODUCTION_ARGS,
    PRODUCTION_ENV,
    docker_env_file_environment,
    docker_env_file_error,
    kubectl_configmap_data,
    make_config,
)

from orchestrator.results import export, formats

# Values that a shell, a quote-processing dotenv reader or a YAML writer would each read differently.
TRICKY = [
    "0",
    "",
    " ",
    " lead",
    "trail ",
    "two words",
    "it's",
    'say "hi"',
    "'single'",
    '"double"',
    "$HOME",
    "${NCCL_PROTO}",
    "$(touch x)",
    "`uname`",
    "#not-a-comment",
    "a #b",
    "back\\slash",
    "semi;colon",
    "tab\there",
    "équipe-ünïcode",
    "=leading",
    "x=y",
    "true",
    "null",
    "~",
    "- dash",
    "[1, 2]",
    "{a: b}",
    "CR\rinside",
]


def _variables(config: dict) -> dict[str, str]:
    return formats.parse_docker_env(formats.render_for(config, "docker-env"))


def test_format_list_is_what_the_cli_offers() -> None:
    assert formats.FORMATS == ("env", "docker-env", "k8s", "json", "sglang-args")
    with pytest.raises(ValueError, match="format must be one of env, docker-env, k8s, json, sglang-args"):
        formats.render_for(make_config(), "yaml")


@pytest.mark.parametrize("value", TRICKY)
def test_docker_env_round_trips_literally(value: str) -> None:
    config = make_config(env={"NCCL_PROTO": "LL", "TRICKY": value}, args=["--weird", value, "--tp-size", "8"])
    env, args = formats.deployment(_variables(config), whole_file=True)
    assert env == {"NCCL_PROTO": "LL", "TRICKY": value}
    assert args == ["--weird", value, "--tp-size", "8"]


def test_docker_env_of_the_config_read_back_from_its_json_is_the_same() -> None:
    config = make_config()
    model = export.validate_serving_config(json.loads(config.model_dump_json()))
    assert model == config and formats.render_for(model, "docker-env") == formats.render_for(config, "docker-env")


@pytest.mark.skipif(DOCKER is None, reason="docker's CLI is not installed (it reads --env-file itself)")
def test_docker_cli_reads_the_docker_env_file_as_written(tmp_path: Path) -> None:
    config = make_config(
        env={"NCCL_PROTO": "LL", **{f"V{i}": v for i, v in enumerate(TRICKY)}}, args=["--tp-size", "8", *TRICKY]
    )
    path = tmp_path / "champion.env"
    path.write_text(formats.render_for(config, "docker-env"))
    seen = docker_env_file_environment(path)
    assert seen == formats.parse_docker_env(path.read_bytes().decode())
    env, args = formats.deployment(seen, whole_file=True)
    assert env == config.env and args == list(config.sglang_args)


@pytest.mark.skipif(DOCKER is None, reason="docker's CLI is not installed")
@pytest.mark.parametrize("line", ["NCCL PROTO=LL", "=value"])
def test_what_docker_refuses_our_reader_refuses(tmp_path: Path, line: str) -> None:
    path = tmp_path / "bad.env"
    path.write_text(f"A=1\n{line}\n")
    assert docker_env_file_error(path)
    with pytest.raises(ValueError, match="line 2: .* is not a valid variable name"):
        formats.parse_docker_env(path.read_text())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("NCCL_PROTO\n", "line 1: expected NAME=value, but got 'NCCL_PROTO' (a bare NAME would make docker copy"),
        ("A=1\n1A=2\n", "line 2: '1A' is not a valid variable name"),
        ("A=1\n# c\nA=2\n", "line 3: A is set twice (first value '1')"),
    ],
)
def test_docker_env_parser_refuses_what_docker_would_read_otherwise(text: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        formats.parse_docker_env(text)
    assert str(err.value).startswith(message)


def test_docker_env_parser_follows_dockers_whitespace_and_comment_rules() -> None:
    text = '\ufeff# comment\n   # indented comment\n\n  A=  kept  \nB=#not a comment\r\nC="quoted"\n'
    assert formats.parse_docker_env(text) == {"A": "  kept  ", "B": "#not a comment", "C": '"quoted"'}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("two\nlines", "cannot be held by an env file"),
        ("ends with CR\r", "cannot be held by an env file"),
        ("\ud800", "not valid UTF-8"),
    ],
)
def test_docker_env_refuses_values_it_cannot_carry(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        formats.render_for(make_config(env={"X": value}), "docker-env")


@pytest.mark.parametrize("fmt", ["docker-env", "k8s"])
def test_carrier_names_are_reserved(fmt: str) -> None:
    with pytest.raises(ValueError, match="SGLANG_SWEEP_ARGS_JSON is reserved"):
        formats.render_for(make_config(env={"SGLANG_SWEEP_ARGS_JSON": "[]"}), fmt)


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"SGLANG_SWEEP_ENV_NAMES": ""}, "SGLANG_SWEEP_ARGS_JSON is not set"),
        (
            {"SGLANG_SWEEP_ARGS_JSON": "'[\"--tp-size\"]'", "SGLANG_SWEEP_ENV_NAMES": ""},
            "SGLANG_SWEEP_ARGS_JSON is not JSON",
        ),
        ({"SGLANG_SWEEP_ARGS_JSON": '{"a": 1}', "SGLANG_SWEEP_ENV_NAMES": ""}, "must be a JSON array of strings"),
        ({"SGLANG_SWEEP_ARGS_JSON": "[8]", "SGLANG_SWEEP_ENV_NAMES": ""}, "must be a JSON array of strings"),
        ({"SGLANG_SWEEP_ARGS_JSON": "[]"}, "SGLANG_SWEEP_ENV_NAMES is not set"),
        (
            {"SGLANG_SWEEP_ARGS_JSON": "[]", "SGLANG_SWEEP_ENV_NAMES": "NCCL_PROTO"},
            "SGLANG_SWEEP_ENV_NAMES names NCCL_PROTO, but it is not set",
        ),
        (
            {"SGLANG_SWEEP_ARGS_JSON": "[]", "SGLANG_SWEEP_ENV_NAMES": "", "NCCL_ALGO": "Tree"},
            "NCCL_ALGO set but not listed in SGLANG_SWEEP_ENV_NAMES",
        ),
    ],
)
def test_docker_env_carriers_are_checked(variables: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        formats.deployment(variables, whole_file=True)


def test_from_an_environment_only_the_listed_names_are_the_configuration() -> None:
    environment = {**_variables(make_config()), "PATH": "/bin", "NCCL_ALGO": "Tree"}
    env, args = formats.deployment(environment, whole_file=False)
    assert env == PRODUCTION_ENV and args == PRODUCTION_ARGS


def test_k8s_manifest_is_a_configmap_whose_data_round_trips() -> None:
    config = make_config(
        env={"NCCL_PROTO": "LL", **{f"V{i}": v for i, v in enumerate(TRICKY)}}, args=["--tp-size", "8", *TRICKY]
    )
    text = formats.render_for(config, "k8s")
    doc = yaml.safe_load(text)
    assert (doc["apiVersion"], doc["kind"], doc["metadata"]["name"]) == ("v1", "ConfigMap", "sglang-champion")
    assert doc["metadata"]["annotations"]["sglang-sweep/run-id"] == "abc123"
    data = formats.parse_k8s(text)
    assert data == _variables(config)
    assert formats.deployment(data, whole_file=True) == (config.env, list(config.sglang_args))


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_kubectl_from_env_file_makes_the_same_data_as_the_manifest(tmp_path: Path) -> None:
    config = make_config(
        env={"NCCL_PROTO": "LL", **{f"V{i}": v for i, v in enumerate(TRICKY)}}, args=["--tp-size", "8", *TRICKY]
    )
    path = tmp_path / "champion.env"
    path.write_text(formats.render_for(config, "docker-env"))
    assert kubectl_configmap_data(path) == formats.parse_k8s(formats.render_for(config, "k8s"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kind: Pod\n", "one object of kind ConfigMap"),
        ("kind: ConfigMap\ndata: {A: 1}\n", "data must map names to strings"),
        ("kind: [\n", "not YAML"),
    ],
)
def test_k8s_parser_refuses_what_is_not_a_configmap_of_strings(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        formats.parse_k8s(text)


def _observation_words(fmt: str, text: str) -> set[str]:
    """The observation variables and switches a format's text carries, read with that format's parser."""
    if fmt == "env":
        env, args = export.split_args(export.parse_env(text))
    elif fmt == "docker-env":
        env, args = formats.deployment(formats.parse_docker_env(text), whole_file=True)
    elif fmt == "k8s":
        env, args = formats.deployment(formats.parse_k8s(text), whole_file=True)
    elif fmt == "json":
        doc = json.loads(text)
        env, args = doc["env"], doc["sglang_args"]
    else:
        env, args = {}, shlex.split(text)
    return (set(env) & formats.OBSERVATION_ENV) | (set(args) & formats.OBSERVATION_SWITCHES)


@pytest.mark.parametrize("fmt", formats.FORMATS)
def test_production_export_holds_no_observation_variable_or_flag(fmt: str) -> None:
    text = formats.render_for(make_config(), fmt)
    assert _observation_words(fmt, text) == set()
    if fmt in ("env", "docker-env", "k8s"):
        header = [line for line in text.splitlines() if line.startswith("#")]
        assert (
            "# production export: left out as observation only: NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV "
            "SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 --enable-metrics"
        ) in header


@pytest.mark.parametrize("fmt", formats.FORMATS)
def test_keep_observation_keeps_them(fmt: str) -> None:
    text = formats.render_for(make_config(), fmt, keep_observation=True)
    expected = {"--enable-metrics"} | (
        {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "SGLANG_ENABLE_METRICS_DEVICE_TIMER"} if fmt != "sglang-args" else set()
    )
    assert _observation_words(fmt, text) == expected
    assert "left out" not in text


def test_production_keeps_everything_else_in_order() -> None:
    model, left_out = formats.production(make_config())
    assert dict(model.env) == PRODUCTION_ENV and list(model.sglang_args) == PRODUCTION_ARGS
    assert left_out == [
        "NCCL_DEBUG=INFO",
        "NCCL_DEBUG_SUBSYS=INIT,ENV",
        "SGLANG_ENABLE_METRICS_DEVICE_TIMER=1",
        "--enable-metrics",
    ]
    assert formats.production(make_config(), keep_observation=True)[0].env == ENV
    assert list(formats.production(make_config(), keep_observation=True)[0].sglang_args) == ARGS


def test_env_format_stays_the_shell_format_of_export() -> None:
    text = formats.render_for(make_config(), "env")
    assert export.split_args(export.parse_env(text)) == (PRODUCTION_ENV, PRODUCTION_ARGS)
    kept = formats.render_for(make_config(), "env", keep_observation=True)
    assert kept == export.render(make_config(), "env")
