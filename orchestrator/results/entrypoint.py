"""`serve-champion`, the worker image's entrypoint: start SGLang with an exported champion, reading the
configuration as data (it is never sourced and nothing in it is evaluated).

Where the configuration comes from:
1. the file CHAMPION_ENV (default /config/champion.env, used when it exists), in the format CHAMPION_FORMAT
   names (`docker-env` or `env`) or, by default, the one whose carrier variable it sets
   (SGLANG_SWEEP_ARGS_JSON or SGLANG_SWEEP_ARGS), read with that format's own parser;
2. otherwise the container's environment, as `docker run --env-file champion.env` or Kubernetes `envFrom`
   deliver a docker-env export.

Deploy-time settings: MODEL_PATH (required), DRAFT_MODEL_PATH (replaces the value of
--speculative-draft-model-path), HOST (default 0.0.0.0), PORT (default 30000), SGLANG_PYTHON (the
interpreter that has sglang, default python3). Arguments given to the entrypoint follow the
configuration's flags. The configuration is the only source of NCCL variables: the container's NCCL_*
that it does not set are dropped, except NCCL_NVLS_ENABLE (the image keeps NVLink multicast off).
A configuration may set only the variables an experiment may set (config.knobs.env_rule, the allow-list
`sweep export` writes from): PATH, LD_PRELOAD, PYTHONPATH and every other name are refused, so a file
cannot choose the interpreter, preload a library or change what Python imports.
Bad input gets one message on stderr and exit code 2.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from orchestrator.config import knobs
from orchestrator.errors import UserError
from orchestrator.results import export, formats

__all__ = ["DEFAULT_ENV_FILE", "DeployError", "launch", "main"]

DEFAULT_ENV_FILE = "/config/champion.env"
DEFAULT_PORT = "30000"
DEFAULT_HOST = "0.0.0.0"
_KEPT_NCCL = frozenset({"NCCL_NVLS_ENABLE"})
_SET_BY_ENTRYPOINT = ("--model-path", "--host", "--port")
_DRAFT_FLAG = "--speculative-draft-model-path"
_PROG = "serve-champion"


class DeployError(UserError):
    """The configuration or a deploy-time setting is unusable; the message says which and how to fix it."""


def load(environ: Mapping[str, str]) -> tuple[dict[str, str], list[str], str]:
    """The configuration's (environment, SGLang flags) and a description of where they came from."""
    path = environ.get("CHAMPION_ENV") or DEFAULT_ENV_FILE
    no_file = "CHAMPION_ENV" not in environ and not Path(path).exists()
    if no_file and formats.ARGS_JSON_VAR in environ:
        try:
            env, args = formats.deployment(environ, whole_file=False)
        except ValueError as e:
            raise DeployError(f"the configuration in the environment is unusable: {e}") from None
        return env, args, "the environment (docker-env variables)"
    if no_file and export.ARGS_VAR in environ:
        raise DeployError(
            f"the environment carries {export.ARGS_VAR}, the shell env format, whose quotes docker --env-file and "
            f"kubectl keep as part of the values; export with sweep export --format docker-env instead"
        )
    try:
        # newline="": a carriage return inside a value is part of it for docker's reader too.
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise DeployError(
            f"cannot read the champion env file {path} ({reason}); mount it there, set CHAMPION_ENV, or pass a "
            f"docker-env export with docker run --env-file (which sets {formats.ARGS_JSON_VAR})"
        ) from None
    fmt = environ.get("CHAMPION_FORMAT") or _detect(text)
    try:
        if fmt == "docker-env":
            env, args = formats.deployment(formats.parse_docker_env(text), whole_file=True)
        elif fmt == "env":
            env, args = export.split_args(export.parse_env(text))
        else:
            raise DeployError(f"CHAMPION_FORMAT must be docker-env or env, but got {fmt!r}")
    except ValueError as e:
        raise DeployError(f"{path} ({fmt} format): {e}") from None
    return env, args, f"{path} ({fmt} format)"


def _detect(text: str) -> str:
    """The format whose carrier variable the file sets; DeployError when it sets neither."""
    for line in text.split("\n"):
        word = line.lstrip().removeprefix("export ").lstrip()
        if word.startswith(formats.ARGS_JSON_VAR + "="):
            return "docker-env"
        if word.startswith(export.ARGS_VAR + "="):
            return "env"
    raise DeployError(
        f"the file sets neither {formats.ARGS_JSON_VAR} (docker-env format) nor {export.ARGS_VAR} (env format); "
        "write it with sweep export --format docker-env"
    )


def launch(environ: Mapping[str, str], extra: Sequence[str] = ()) -> tuple[list[str], dict[str, str], list[str]]:
    """(argv, environment, notes) that start SGLang for the configuration `environ` points at.

    Reads the configuration file and nothing else; DeployError for anything unusable.
    """
    config_env, args, source = load(environ)
    refused = sorted(name for name in config_env if knobs.env_rule(name) is not None)
    if refused:
        raise DeployError(
            f"{source} sets {', '.join(refused)}, which sweep export never writes: a configuration may set only "
            "the allow-listed NCCL_* and SGLANG_* variables of orchestrator/config/knobs.py (and "
            f"{', '.join(sorted(n for n in knobs.PASSTHROUGH_ENV if not n.startswith(('NCCL_', 'SGLANG_'))))}); "
            f"remove {'that line' if len(refused) == 1 else 'those lines'}, or export the configuration again"
        )
    model = environ.get("MODEL_PATH", "")
    if not model:
        raise DeployError("MODEL_PATH is not set: give the target model directory, e.g. -e MODEL_PATH=/models/M")
    port = environ.get("PORT") or DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise DeployError(f"PORT must be a port number (1-65535), but got {port!r}")
    host = environ.get("HOST") or DEFAULT_HOST
    for flag in _SET_BY_ENTRYPOINT:
        if any(a == flag or a.startswith(flag + "=") for a in args):
            raise DeployError(
                f"{source} sets {flag}, which the entrypoint sets from "
                f"{'MODEL_PATH' if flag == '--model-path' else flag[2:].upper()}; remove it there"
            )
    notes = [f"configuration from {source}"]
    draft = environ.get("DRAFT_MODEL_PATH", "")
    if draft:
        args, replaced = _replace_draft(args, draft, source)
        if not replaced:
            notes.append("DRAFT_MODEL_PATH ignored: this configuration runs no draft model")
    python = environ.get("SGLANG_PYTHON") or "python3"
    if shutil.which(python, path=environ.get("PATH", os.defpath)) is None:
        raise DeployError(
            f"cannot start {python} (No such file or directory, or not executable); "
            "SGLANG_PYTHON names the interpreter that has sglang"
        )
    argv = [python, "-m", "sglang.launch_server", "--model-path", model, "--host", host, "--port", port, *args, *extra]
    stray = sorted(k for k in environ if k.startswith("NCCL_") and k not in _KEPT_NCCL and k not in config_env)
    if stray:
        notes.append(f"dropped NCCL variables the configuration does not set: {', '.join(stray)}")
    env = {k: v for k, v in environ.items() if k not in stray and k not in formats.CARRIERS}
    env.update(config_env)
    return argv, env, notes


def _replace_draft(args: list[str], draft: str, source: str) -> tuple[list[str], bool]:
    out, replaced = list(args), False
    for i, word in enumerate(out):
        if word == _DRAFT_FLAG:
            if i + 1 >= len(out):
                raise DeployError(f"{source}: {_DRAFT_FLAG} has no value")
            out[i + 1], replaced = draft, True
        elif word.startswith(_DRAFT_FLAG + "="):
            out[i], replaced = f"{_DRAFT_FLAG}={draft}", True
    return out, replaced


def main(argv: Sequence[str] | None = None) -> int:
    """Replace this process with SGLang; return 2 (after one message) when the input is unusable."""
    extra = list(sys.argv[1:] if argv is None else argv)
    try:
        command, env, notes = launch(os.environ, extra)
    except DeployError as e:
        print(f"{_PROG}: {e}", file=sys.stderr)
        return e.exit_code
    for note in notes:
        print(f"{_PROG}: {note}", file=sys.stderr)
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except OSError as e:
        print(
            f"{_PROG}: cannot start {command[0]} ({e.strerror}); SGLANG_PYTHON names the interpreter that has sglang",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
