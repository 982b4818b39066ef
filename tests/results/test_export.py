"""The exported files a deployment loads: exact round-trips, and what a real shell sees."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.records import ServingConfig
from orchestrator.results import export

TRICKY_VALUES = [
    "0",
    "vertical\x0btab",
    "record\x1esep",
    "line\u2028sep",  # line breaks to str.splitlines(), not to a shell
    "",
    " ",
    "two words",
    "it's",
    'say "hi"',
    "$HOME",
    "${NCCL_PROTO}",
    "#not-a-comment",
    "a#b",
    "back\\slash",
    "`uname`",
    "semi;colon",
    "~/tilde",
    "*.glob?",
    "tab\there",
    "équipe-ünïcode",
    "=leading-equals",
    "x=y",
    "LL,LL128",
]


def stored(**overrides) -> dict:
    """A serving config as its JSON file holds it."""
    config = {
        "experiment": "demo",
        "trial_number": 7,
        "run_id": "0123456789abcdef0123456789abcdef",
        "model_version": "3",
        "engine": "simulator",
        "sglang_version": "0.5.23",
        "params": {"NCCL_PROTO": "LL", "NCCL_ALGO": None, "speculative_num_steps": 3},
        "env": {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "16", "NCCL_BUFFSIZE": "4194304"},
        "sglang_args": [
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "4",
        ],
        "metrics": {"decode_tok_s": 181.25, "speedup_vs_baseline": 1.31},
        "fingerprint_hash": "9f2c1e",
        "created_at": "2025-06-01T03:04:05+00:00",
        "allreduce_backend": "",
        "derivation": "",
    }
    config.update(overrides)
    return config


def make_config(**overrides) -> ServingConfig:
    return export.validate_serving_config(stored(**overrides))


def expected_env(config: ServingConfig) -> dict[str, str]:
    return {**config.env, export.ARGS_VAR: shlex.join(config.sglang_args)}


@pytest.mark.parametrize("value", TRICKY_VALUES)
def test_env_value_round_trips_exactly(value: str) -> None:
    config = make_config(env={"NCCL_PROTO": "LL", "TRICKY": value})
    parsed = export.parse_env(export.render(config, "env"))
    assert parsed == expected_env(config)
    assert parsed["TRICKY"] == value


@pytest.mark.parametrize("value", TRICKY_VALUES)
def test_sglang_args_round_trip_through_the_env_file(value: str) -> None:
    args = ["--speculative-algorithm", "EAGLE3", "--weird", value]
    config = make_config(sglang_args=args)
    env, parsed_args = export.split_args(export.parse_env(export.render(config, "env")))
    assert env == config.env
    assert parsed_args == args


def test_env_file_layout_header_sorted_then_args_last() -> None:
    config = make_config()
    text = export.render(config, "env")
    lines = text.splitlines()
    header = [line for line in lines if line.startswith("#")]
    body = [line for line in lines if not line.startswith("#")]
    assert lines[: len(header)] == header, "the provenance header comes first"
    joined = "\n".join(header)
    for needle in (
        "experiment: demo",
        "trial: 7",
        config.run_id,
        "model version: 3",
        "decode_tok_s=181.25",
        "9f2c1e",
        "2025-06-01T03:04:05+00:00",
        "set -a; . champion.env; set +a",
        "$SGLANG_SWEEP_ARGS",
    ):
        assert needle in joined
    assert body == [
        "NCCL_BUFFSIZE=4194304",
        "NCCL_MAX_NCHANNELS=16",
        "NCCL_PROTO=LL",
        "SGLANG_SWEEP_ARGS='--speculative-algorithm EAGLE3 --speculative-num-steps 3 "
        "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4'",
    ]


def test_header_fields_cannot_break_out_of_the_comment() -> None:
    config = make_config(experiment="demo\nrm -rf /", model_version=None)
    parsed = export.parse_env(export.render(config, "env"))
    assert parsed == expected_env(config)
    assert "model version: -" in export.render(config, "env")


def test_empty_args_still_write_the_args_line() -> None:
    config = make_config(sglang_args=[], env={})
    text = export.render(config, "env")
    assert text.splitlines()[-1] == "SGLANG_SWEEP_ARGS=''"
    assert export.split_args(export.parse_env(text)) == ({}, [])


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(
    "args",
    [
        ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"],
        ["--json-model-override-args", '{"a": "b c"}', "--name", "it's $HOME"],
    ],
)
def test_bash_sees_exactly_the_exported_values(tmp_path: Path, args: list[str]) -> None:
    config = make_config(
        env={f"TRICKY_{i}": v for i, v in enumerate(TRICKY_VALUES)},
        sglang_args=args,
    )
    path = export.write_atomic(tmp_path / "champion.env", export.render(config, "env"))
    # The file is sourced the way the header tells users to, then env -0 lists what exported.
    script = 'set -a; . "$1"; set +a; env -0'
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent"}
    out = subprocess.run(
        ["bash", "-c", script, "bash", str(path)], env=clean, capture_output=True, check=True, timeout=30
    ).stdout
    seen = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    for name, value in expected_env(config).items():
        assert seen[name] == value, name
    # A launcher that re-reads the flag string gets the exact argv back.
    argv = (
        subprocess.run(
            [
                "bash",
                "-c",
                'set -a; . "$1"; set +a; eval "set -- $SGLANG_SWEEP_ARGS"; printf "%s\\0" "$@"',
                "bash",
                str(path),
            ],
            env=clean,
            capture_output=True,
            check=True,
            timeout=30,
        )
        .stdout.decode()
        .split("\0")[:-1]
    )
    assert argv == args


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_plain_flags_work_with_unquoted_expansion_as_the_header_says(tmp_path: Path) -> None:
    config = make_config()
    path = export.write_atomic(tmp_path / "champion.env", export.render(config, "env"))
    assert "eval" not in export.render(config, "env")
    out = (
        subprocess.run(
            ["bash", "-c", 'set -a; . "$1"; set +a; printf "%s\\0" $SGLANG_SWEEP_ARGS', "bash", str(path)],
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            capture_output=True,
            check=True,
            timeout=30,
        )
        .stdout.decode()
        .split("\0")[:-1]
    )
    assert out == list(config.sglang_args)


def test_header_switches_to_the_argument_file_when_a_flag_needs_quoting() -> None:
    text = export.render(make_config(sglang_args=["--name", "a b"]), "env")
    assert "mapfile -t args < champion.args" in text and "eval" not in text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("A=1\n", {"A": "1"}),
        ("A=\n", {"A": ""}),
        ("A=''\n", {"A": ""}),
        ('A=""\n', {"A": ""}),
        ("export A=1\n", {"A": "1"}),
        ("\n# comment\n   # indented comment\nA=1\n\n", {"A": "1"}),
        ("A='x y'\nB=\"p q\"\n", {"A": "x y", "B": "p q"}),
        ("A=a\\ b\n", {"A": "a b"}),
        ("A=a#b\n", {"A": "a#b"}),
        ("A='$HOME'\n", {"A": "$HOME"}),
        ("A=\\$HOME\n", {"A": "$HOME"}),
        ('A="it\'s"\n', {"A": "it's"}),
        ("A='it'\"'\"'s'\n", {"A": "it's"}),
        ("A=1\r\nB=2\r\n", {"A": "1", "B": "2"}),
    ],
)
def test_parse_env_accepts(text: str, expected: dict[str, str]) -> None:
    assert export.parse_env(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("A=1\nnot an assignment\n", "line 2: expected NAME=value"),
        ("1A=x\n", "line 1: expected NAME=value"),
        ("A B=x\n", "line 1: expected NAME=value"),
        ("A=two words\n", "line 1: the value 'two words' is several words"),
        ("A='unterminated\n", "line 1: cannot read the value"),
        ("A=$HOME\n", "line 1: '$' in the value"),
        ('A="$HOME"\n', "line 1: '$' in the value"),
        ('A="\\$HOME"\n', "line 1: '\\\\$' in the value"),
        ("A=`id`\n", "line 1: '`' in the value"),
        ("A=x;y\n", "line 1: ';' in the value"),
        ("A=~/x\n", "line 1: '~' in the value"),
        ("A=1\nB=2\nA=3\n", "line 3: A is set twice"),
    ],
)
def test_parse_env_rejects_with_line_number(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        export.parse_env(text)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"env": {"NCCL PROTO": "LL"}}, "not a valid variable name"),
        ({"env": {"SGLANG_SWEEP_ARGS": "x"}}, "reserved"),
        ({"env": {"NCCL_PROTO": 1}}, "env['NCCL_PROTO'] must be a str"),
        ({"env": {"NCCL_PROTO": "a\nb"}}, "newline"),
        ({"sglang_args": ["--x", 3]}, "sglang_args[1] must be a str"),
        ({"trial_number": "7"}, "'trial_number' must be int"),
        ({"trial_number": True}, "'trial_number' must be int"),
        ({"model_version": 3}, "'model_version' must be str or None"),
    ],
)
def test_a_stored_config_that_cannot_be_exported_is_refused_naming_the_field(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        export.render(export.validate_serving_config(stored(**overrides)), "env")
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"NCCL PROTO": "LL"}, "not a valid variable name"),
        ({"SGLANG_SWEEP_ARGS": "x"}, "reserved"),
    ],
)
def test_render_refuses_a_variable_no_env_file_can_set(env: dict[str, str], message: str) -> None:
    config = make_config().model_copy(update={"env": env})
    for fmt in export.FORMATS:
        with pytest.raises(ValueError, match=message):
            export.render(config, fmt)  # type: ignore[arg-type]


def test_render_rejects_a_missing_field_and_an_unknown_format() -> None:
    config = stored()
    del config["fingerprint_hash"]
    with pytest.raises(ValueError, match="missing the field 'fingerprint_hash'"):
        export.validate_serving_config(config)
    with pytest.raises(ValueError, match="format must be one of env, json, sglang-args"):
        export.render(make_config(), "yaml")  # type: ignore[arg-type]


def test_json_is_the_config_sorted_and_round_trips() -> None:
    config = make_config(env={"TRICKY": "$x #y 'z'"})
    text = export.render(config, "json")
    assert json.loads(text) == stored(env={"TRICKY": "$x #y 'z'"})
    assert text == json.dumps(stored(env={"TRICKY": "$x #y 'z'"}), indent=2, sort_keys=True) + "\n"
    assert export.validate_serving_config(json.loads(text)) == config


def test_sglang_args_format_is_one_argument_a_line() -> None:
    config = make_config(sglang_args=["--a", "x y", "--b", ""])
    text = export.render(config, "sglang-args")
    assert text == "--a\nx y\n--b\n\n"
    assert export.render(make_config(sglang_args=[]), "sglang-args") == ""
