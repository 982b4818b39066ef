"""Render a champion's serving configuration as an env file, JSON or an SGLang argument line.

The serving configuration is a plain dict (it is stored as `serving_config/serving_config.json`
on the trial's MLflow run and registered as a model version):

    {"experiment": str, "trial_number": int, "run_id": str, "model_version": str | None,
     "engine": "sglang" | "simulator", "sglang_version": str,
     "params": {knob: value | None}, "env": {"NCCL_PROTO": "LL", ...},
     "sglang_args": ["--speculative-algorithm", "EAGLE3", ...],
     "metrics": {name: float}, "fingerprint_hash": str, "created_at": ISO-8601 str}

The env format is meant for `set -a; . champion.env; set +a`: a provenance header of `#` lines,
one `VAR=value` line per environment variable (sorted, shell-quoted only where needed) and a last
line `SGLANG_SWEEP_ARGS=...` holding the tuned SGLang flags as one shell-quoted string
(`shlex.join`), which a launcher appends to `python -m sglang.launch_server --model-path ...`.
`parse_env` reads such a file back exactly.

Everything here is pure except `write_atomic`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tempfile
from pathlib import Path
from typing import Any, Literal, NoReturn

ARGS_VAR = "SGLANG_SWEEP_ARGS"
"""The variable of the env file that holds the tuned SGLang flags, `shlex.join`-ed."""

Format = Literal["env", "json", "sglang-args"]
FORMATS: tuple[str, ...] = ("env", "json", "sglang-args")

_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "experiment": str,
    "trial_number": int,
    "run_id": str,
    "model_version": (str, type(None)),
    "engine": str,
    "sglang_version": str,
    "params": dict,
    "env": dict,
    "sglang_args": list,
    "metrics": dict,
    "fingerprint_hash": str,
    "created_at": str,
}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ASSIGNMENT = re.compile(r"(?:export[ \t]+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)\Z")


def validate_serving_config(config: dict[str, Any]) -> None:
    """Raise ValueError naming the first field that does not have the serving-config shape."""
    if not isinstance(config, dict):
        raise ValueError(f"serving config must be a dict, but got {type(config).__name__}")
    for key, kind in _REQUIRED.items():
        if key not in config:
            raise ValueError(f"serving config is missing the field {key!r}")
        value = config[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(
                f"serving config field {key!r} must be {_kind_name(kind)}, "
                f"but got {type(value).__name__} ({value!r})"
            )
    for name, value in config["env"].items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(
                f"serving config env: {name!r} is not a valid variable name "
                "(letters, digits and '_', not starting with a digit)"
            )
        if name == ARGS_VAR:
            raise ValueError(
                f"serving config env: {ARGS_VAR} is reserved for the SGLang flags (sglang_args)"
            )
        if not isinstance(value, str):
            raise ValueError(
                f"serving config env[{name!r}] must be a str, but got {type(value).__name__} "
                f"({value!r})"
            )
    for i, arg in enumerate(config["sglang_args"]):
        if not isinstance(arg, str):
            raise ValueError(
                f"serving config sglang_args[{i}] must be a str, but got {type(arg).__name__} "
                f"({arg!r})"
            )


def render(config: dict[str, Any], fmt: Format) -> str:
    """Render a serving config as `env`, `json` or `sglang-args` text (ends with a newline)."""
    validate_serving_config(config)
    if fmt == "json":
        return json.dumps(config, indent=2, sort_keys=True) + "\n"
    if fmt == "sglang-args":
        return shlex.join(config["sglang_args"]) + "\n"
    if fmt == "env":
        return _render_env(config)
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, but got {fmt!r}")


def _render_env(config: dict[str, Any]) -> str:
    values = dict(sorted(config["env"].items()))
    values[ARGS_VAR] = shlex.join(config["sglang_args"])
    for name, value in values.items():
        # A newline inside a value would need a multi-line quoted string, which a line-based
        # reader (ours, docker's --env-file, systemd's EnvironmentFile) cannot take back.
        if "\n" in value or "\r" in value or "\0" in value:
            raise ValueError(
                f"env value of {name} contains a newline or NUL character, which an env file "
                f"cannot hold: {value!r}"
            )
    lines = [f"# {line}" for line in _header(config)]
    lines += [f"{name}={shlex.quote(value) if _needs_quoting(value) else value}"
              for name, value in values.items()]
    return "\n".join(lines) + "\n"


def _needs_quoting(value: str) -> bool:
    return value == "" or shlex.quote(value) != value


def _header(config: dict[str, Any]) -> list[str]:
    metrics = ", ".join(f"{k}={_number(v)}" for k, v in sorted(config["metrics"].items()))
    if all(not _needs_quoting(a) for a in config["sglang_args"]):
        launch = f"python -m sglang.launch_server --model-path MODEL ... ${ARGS_VAR}"
    else:
        # Some flag holds a space or a shell character: plain $VAR word splitting would break
        # it apart, so the shell has to re-read the quoted string.
        launch = f'eval "python -m sglang.launch_server --model-path MODEL ... ${ARGS_VAR}"'
    header = [
        "sglang-sweep serving configuration",
        f"experiment: {config['experiment']}",
        f"trial: {config['trial_number']}",
        f"run id: {config['run_id']}",
        f"model version: {config['model_version'] if config['model_version'] is not None else '-'}",
        f"engine: {config['engine']} (sglang {config['sglang_version']})",
        f"metrics: {metrics or '-'}",
        f"fingerprint: {config['fingerprint_hash'] or '-'}",
        f"created: {config['created_at']}",
        "load it with:",
        "  set -a; . champion.env; set +a",
        f"  {launch}",
        f"{ARGS_VAR} holds the tuned SGLang flags joined with shlex.join "
        f"(Python: shlex.split(os.environ['{ARGS_VAR}'])).",
    ]
    # A newline in a free-text field would end the comment and make the rest a command.
    return [" ".join(line.splitlines()) for line in header]


def _number(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def parse_env(text: str) -> dict[str, str]:
    """Read an env file written by `render(..., "env")` (or a hand-edited one) back into a dict.

    Blank lines and `#` comment lines are skipped; every other line must be `NAME=value` (an
    optional `export ` prefix is accepted) where value is one shell word. Anything whose meaning
    in a shell would differ from a literal string (`$`, backquotes outside single quotes, several
    words) is rejected with its line number rather than guessed at.
    """
    result: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _ASSIGNMENT.match(line)
        if match is None:
            raise ValueError(
                f"line {number}: expected NAME=value (NAME of letters, digits and '_'), "
                f"but got {raw!r}"
            )
        name, value_text = match.groups()
        if name in result:
            raise ValueError(f"line {number}: {name} is set twice (first value {result[name]!r})")
        result[name] = _parse_value(value_text, number)
    return result


def _parse_value(text: str, number: int) -> str:
    _reject_expansions(text, number)
    try:
        words = shlex.split(text, comments=False, posix=True)
    except ValueError as e:
        raise ValueError(f"line {number}: cannot read the value {text!r}: {e}") from None
    if not words:
        return ""
    if len(words) > 1:
        raise ValueError(
            f"line {number}: the value {text!r} is several words; quote it "
            f"(e.g. {shlex.quote(' '.join(words))})"
        )
    return words[0]


_SHELL_SPECIAL = set("$`;&|<>()~")
"""Characters a shell gives a meaning to even inside an assignment, unless they are quoted."""


def _reject_expansions(text: str, number: int) -> None:
    """Refuse what a shell would not read as a literal string (`$x`, backquotes, `;`, `~`, ...).

    shlex and the shell agree on single quotes, double quotes without `$`/backquotes, and
    backslash escapes outside quotes; everything else is refused rather than guessed at.
    """
    quote = ""
    chars = iter(text)
    for char in chars:
        if quote == "'":
            if char == "'":
                quote = ""
            continue
        if char == "\\":
            escaped = next(chars, "")
            if quote == '"' and escaped and escaped in "$`":
                _refuse(text, number, "\\" + escaped)
            continue
        if quote == '"':
            if char == '"':
                quote = ""
            elif char in "$`":
                _refuse(text, number, char)
            continue
        if char in "'\"":
            quote = char
        elif char in _SHELL_SPECIAL:
            _refuse(text, number, char)


def _refuse(text: str, number: int, what: str) -> NoReturn:
    raise ValueError(
        f"line {number}: {what!r} in the value {text!r} would be interpreted by the shell; "
        "put the value in single quotes"
    )


def split_args(parsed: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """Split a parsed env file into (environment variables, SGLang flag list)."""
    env = {k: v for k, v in parsed.items() if k != ARGS_VAR}
    return env, shlex.split(parsed.get(ARGS_VAR, ""))


def write_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write text to path so that readers see the old file or the new one, never a partial one.

    A temporary file in the same directory is written and fsynced, then `os.replace`d over path.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates the file 0600; keep the mode of the file being replaced, if any.
        os.chmod(tmp, target.stat().st_mode & 0o777 if target.exists() else 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:
        dir_fd = os.open(target.parent, os.O_RDONLY)
    except OSError:
        return target
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    except OSError:
        pass
    finally:
        os.close(dir_fd)
    return target


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if isinstance(kind, tuple):
        return " or ".join("None" if k is type(None) else k.__name__ for k in kind)
    return kind.__name__
