"""Secrets never leave the process: names, environments and free text."""

from __future__ import annotations

import json

import pytest

from orchestrator.redact import (
    MASK,
    is_secret_name,
    mask_url_password,
    redact_argv,
    redact_env,
    redact_env_tree,
    redact_text,
)

HF = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3f"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
AWS_ID = "AKIA" + "IOSFODNN7EXAMPLE"

SECRET_NAMES = [
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "OPENAI_API_KEY",
    "WANDB_API_KEY",
    "GITHUB_TOKEN",
    "GITHUBTOKEN",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "DB_PASSWD",
    "DB_PWD",
    "SMTP_PASS",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "HTTP_AUTH",
    "SESSION_COOKIE",
    "SSH_PRIVATE_KEY",
    "CLIENTSECRET",
    "apiKey",
    "hfToken",
    "api-key",
    "x.auth.token",
]
NOT_SECRET_NAMES = [
    "NCCL_PROTO",
    "NCCL_IB_PKEY",
    "NCCL_ALGO",
    "CUDA_VISIBLE_DEVICES",
    "KEYBOARD",
    "MONKEY_PATCH",
    "TOKENIZERS_PARALLELISM",
    "SGLANG_MAX_NEW_TOKENS",
    "speculative_num_draft_tokens",
    "speculative_token_map",
    "HF_TOKEN_PATH",
    "SSH_AUTH_SOCK",
    "AUTHOR",
    "PASSTHROUGH",
    "PWD",
    "OLDPWD",
    "XDG_SESSION_TYPE",
    "PATH",
    "HOME",
    "",
]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", NOT_SECRET_NAMES)
def test_names_that_are_not_secret(name):
    assert not is_secret_name(name)


def test_redact_env_masks_secret_values_and_keeps_knobs():
    env = {
        "HF_TOKEN": HF,
        "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
        "NCCL_PROTO": "LL",
        "NCCL_BUFFSIZE": "0",
        "EMPTY": "",
        "OPTUNA_STORAGE": "postgresql://sweep:s3cr3tpw@db.internal:5432/optuna",
    }
    out = redact_env(env)
    assert out == {
        "HF_TOKEN": MASK,
        "AWS_SECRET_ACCESS_KEY": MASK,
        "NCCL_PROTO": "LL",
        "NCCL_BUFFSIZE": "0",
        "EMPTY": "",
        "OPTUNA_STORAGE": "postgresql://sweep:***@db.internal:5432/optuna",
    }
    assert env["HF_TOKEN"] == HF  # the input is not touched


PLANTED = {"HF_TOKEN": HF, "AWS_SECRET_ACCESS_KEY": AWS_SECRET, "SHORT_KEY": "abc", "NCCL_PROTO": "LL"}

TEXT_CASES = [
    ("value anywhere in a log line", f"loading with token {HF} ok", "loading with token *** ok"),
    ("value inside JSON", json.dumps({"env": {"X": AWS_SECRET}}), '{"env": {"X": "***"}}'),
    ("secret-named assignment", "export HF_TOKEN=whatever123", "export HF_TOKEN=***"),
    ("quoted assignment", "api_key='k-123'", "api_key='***'"),
    ("JSON pair by name", '{"MLFLOW_TRACKING_PASSWORD": "pw"}', '{"MLFLOW_TRACKING_PASSWORD": "***"}'),
    ("CLI flag", "sglang serve --api-key sk-local-1 --port 30000", "sglang serve --api-key *** --port 30000"),
    ("argv list as JSON", '["--api-key", "k-1", "--port", "30000"]', '["--api-key", "***", "--port", "30000"]'),
    ("argv list as Python repr", "['--api-key', 'k-1']", "['--api-key', '***']"),
    ("bearer header", "Authorization: Bearer abcdef.123456", "Authorization: Bearer ***"),
    ("unknown HF token shape", "token hf_" + "Z" * 34, "token ***"),
    ("AWS key id shape", f"id={AWS_ID}", "id=***"),
    ("GitHub token shape", "ghp_" + "a1" * 18, "***"),
    ("URL password", "https://user:hunter22@mlflow.example/api", "https://user:***@mlflow.example/api"),
    ("short values are not searched for", "abc appears in abcdef", "abc appears in abcdef"),
    (
        "knobs untouched",
        "NCCL_PROTO=LL NCCL_MAX_NCHANNELS=16 max_new_tokens=512",
        "NCCL_PROTO=LL NCCL_MAX_NCHANNELS=16 max_new_tokens=512",
    ),
    (
        "None is not a secret",
        "ServerArgs(api_key=None, tokenizer_path='/m')",
        "ServerArgs(api_key=None, tokenizer_path='/m')",
    ),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in TEXT_CASES], ids=[c[0] for c in TEXT_CASES])
def test_redact_text(text, expected):
    assert redact_text(text, PLANTED) == expected


def test_redact_text_defaults_to_the_process_environment(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "my-private-value-1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_SECRET)
    out = redact_text(f"a my-private-value-1 b {AWS_SECRET} c")
    assert out == "a *** b *** c"


def test_planted_secrets_never_survive_a_dump_of_everything():
    # What a trial folder would hold: launch.json with env and argv, a log tail, a fingerprint.
    env = {**PLANTED, "NCCL_ALGO": "Ring"}
    artifact = json.dumps(
        {"env": env, "argv": ["--api-key", "zz-top-secret"], "log": f"Downloading with {HF}; AWS {AWS_SECRET}"},
        indent=1,
    )
    cleaned = redact_text(artifact, env)
    for secret in (HF, AWS_SECRET, "zz-top-secret"):
        assert secret not in cleaned
    assert '"NCCL_ALGO": "Ring"' in cleaned


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--api-key", "k", "--port", "30000"], ["--api-key", MASK, "--port", "30000"]),
        (["--api-key=k", "--tp-size", "8"], [f"--api-key={MASK}", "--tp-size", "8"]),
        (["--speculative-num-draft-tokens", "4"], ["--speculative-num-draft-tokens", "4"]),
        (["--api-key"], ["--api-key"]),
    ],
)
def test_redact_argv(argv, expected):
    assert redact_argv(argv) == expected


def test_redact_env_tree_for_json_artifacts():
    tree = {
        "server_args": {
            "api_key": "sk-local-1",
            "admin_api_key": None,
            "tp_size": 8,
            "hf_token": "",
            "enable_auth": True,
        },
        "processes": [{"pid": 1, "cmdline": f"python serve.py --api-key abc123 {HF}"}],
        "nccl_env": {"NCCL_PROTO": "LL"},
        "argv": ("--api-key", "zz-top-secret"),
    }
    out = redact_env_tree(tree, PLANTED)
    assert out["server_args"] == {
        "api_key": MASK,
        "admin_api_key": None,
        "tp_size": 8,
        "hf_token": "",
        "enable_auth": True,
    }
    assert out["processes"][0]["cmdline"] == "python serve.py --api-key *** ***"
    assert out["nccl_env"] == {"NCCL_PROTO": "LL"}
    assert "zz-top-secret" not in json.dumps(out)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://sweep:s3cr%40t@db.example:5432/optuna", "postgresql://sweep:***@db.example:5432/optuna"),
        ("postgresql+psycopg2://u:pw@host/db?sslmode=require", "postgresql+psycopg2://u:***@host/db?sslmode=require"),
        ("http://user:pw@127.0.0.1:5000", "http://user:***@127.0.0.1:5000"),
        ("postgresql://sweep@db/optuna", "postgresql://sweep@db/optuna"),
        ("sqlite:////runs/demo/optuna.db", "sqlite:////runs/demo/optuna.db"),
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ],
)
def test_mask_url_password(url, shown):
    assert mask_url_password(url) == shown
