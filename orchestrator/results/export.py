"""Render a champion's serving configuration (records.ServingConfig) as an env file, JSON or SGLang's
arguments one a line.

The serving configuration is stored as `serving_config/serving_config.json` on the trial's MLflow run
and registered as a model version; what is read back from there is a dict, which `validate_serving_config`
turns into the model (or refuses, naming the field): the one place a dict becomes a ServingConfig.
Everything else takes and returns the model.

The env format is meant for `set -a; . champion.env; set +a`: a provenance header of `#` lines,
one `VAR=value` line per environment variable (sorted, shell-quoted only where needed) and a last
line `SGLANG_SWEEP_ARGS=...` holding the tuned SGLang flags as one shell-quoted string
(`shlex.join`), which a launcher appends to `python -m sglang.launch_server --model-path ...`.
`parse_env` reads such a file back exactly.

The sglang-args format is the flags alone, one argument a line and nothing else, for bash's
`mapfile -t args < champion.args` (then `"${args[@]}"`): no shell reads the words again, so `$(...)`,
quotes and spaces stay literal. An argument holding a newline or a NUL cannot be written so.

Everything here is pure (files are written with fsio.write_atomic, re-exported here for its callers).
"""

from __future__ import annotations

import json
import re
import shlex
import types
from collections.abc import Mapping
from typing import Any, Literal, NoReturn, Union, get_args, get_origin

from pydantic import ValidationError

from orchestrator.fsio import write_atomic
from orchestrator.records import ServingConfig

__all__ = [
    "ARGS_VAR",
    "FORMATS",
    "Format",
    "check_env_names",
    "parse_env",
    "render",
    "split_args",
    "validate_serving_config",
    "write_atomic",
]

ARGS_VAR = "SGLANG_SWEEP_ARGS"
"""The variable of the env file that holds the tuned SGLang flags, `shlex.join`-ed."""

Format = Literal["env", "json", "sglang-args"]
FORMATS: tuple[str, ...] = ("env", "json", "sglang-args")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ASSIGNMENT = re.compile(r"(?:export[ \t]+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)\Z")


def validate_serving_config(data: Mapping[str, Any]) -> ServingConfig:
    """The serving config read from a file (the registry's serving_config.json) as a ServingConfig;
    ValueError naming the first field that does not have the serving-config shape (types are checked
    strictly: "7" is not a trial number)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"serving config must be a dict, but got {type(data).__name__}")
    fields = dict(data)
    if isinstance(fields.get("sglang_args"), list):  # JSON has no tuples
        fields["sglang_args"] = tuple(fields["sglang_args"])
    try:
        model = ServingConfig.model_validate(fields, strict=True)
    except ValidationError as err:
        raise ValueError(_first_problem(err)) from None
    check_env_names(model)
    return model


def check_env_names(config: ServingConfig) -> None:
    """ValueError naming the first variable of the config that no env file can set (an invalid name, or
    the name that carries the SGLang flags)."""
    for name in config.env:
        if not _NAME.match(name):
            raise ValueError(
                f"serving config env: {name!r} is not a valid variable name "
                "(letters, digits and '_', not starting with a digit)"
            )
        if name == ARGS_VAR:
            raise ValueError(f"serving config env: {ARGS_VAR} is reserved for the SGLang flags (sglang_args)")


def _first_problem(err: ValidationError) -> str:
    """pydantic's first error in the words of a serving config: the field, the type it must have, what came."""
    e = err.errors()[0]
    loc, value = e["loc"], e.get("input")
    field = str(loc[0])
    if e["type"] == "missing":
        return f"serving config is missing the field {field!r}"
    if e["type"] == "extra_forbidden":
        return f"serving config has the unknown field {field!r}"
    annotation = ServingConfig.model_fields[field].annotation
    if len(loc) == 1:
        return (
            f"serving config field {field!r} must be {_kind_name(annotation)}, "
            f"but got {type(value).__name__} ({value!r})"
        )
    # Inside a mapping or a list: the type of one value (env['X'], sglang_args[3]).
    inner = get_args(annotation)[-1 if get_origin(annotation) is dict else 0]
    where = "".join(f"[{p!r}]" for p in loc[1:])
    return f"serving config {field}{where} must be a {_kind_name(inner)}, but got {type(value).__name__} ({value!r})"


def _kind_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return " or ".join(_kind_name(a) for a in get_args(annotation))
    if origin in (tuple, list):
        return "list"
    if origin is dict:
        return "dict"
    return "None" if annotation is type(None) else getattr(annotation, "__name__", str(annotation))


def render(config: ServingConfig, fmt: Format) -> str:
    """Render a serving config as `env`, `json` or `sglang-args` text (ends with a newline)."""
    check_env_names(config)
    if fmt == "json":
        return json.dumps(config.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
    if fmt == "sglang-args":
        return _render_args(config.sglang_args)
    if fmt == "env":
        return _render_env(config)
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, but got {fmt!r}")


def _render_env(config: ServingConfig) -> str:
    values = dict(sorted(config.env.items()))
    values[ARGS_VAR] = shlex.join(config.sglang_args)
    for name, value in values.items():
        # A newline inside a value would need a multi-line quoted string, which a line-based
        # reader (ours, docker's --env-file, systemd's EnvironmentFile) cannot take back.
        if "\n" in value or "\r" in value or "\0" in value:
            raise ValueError(
                f"env value of {name} contains a newline or NUL character, which an env file cannot hold: {value!r}"
            )
    lines = [f"# {line}" for line in _header(config)]
    lines += [f"{name}={shlex.quote(value) if _needs_quoting(value) else value}" for name, value in values.items()]
    return "\n".join(lines) + "\n"


def _render_args(args: tuple[str, ...]) -> str:
    """One argument a line, each line ending with a newline (none at all for no argument: mapfile would
    read a lone newline as one empty argument)."""
    for i, arg in enumerate(args):
        if "\n" in arg or "\0" in arg:
            raise ValueError(
                f"SGLang argument {i + 1} holds a newline or NUL character, which an argument-per-line file "
                f"cannot hold: {arg!r}"
            )
    return "".join(f"{arg}\n" for arg in args)


def _needs_quoting(value: str) -> bool:
    return value == "" or shlex.quote(value) != value


def _header(config: ServingConfig) -> list[str]:
    metrics = ", ".join(f"{k}={_number(v)}" for k, v in sorted(config.metrics.items()))
    if all(not _needs_quoting(a) for a in config.sglang_args):
        launch = [f"  python -m sglang.launch_server --model-path MODEL ... ${ARGS_VAR}"]
    else:
        # Some flag holds a space or a shell character: plain $VAR word splitting would break it apart,
        # and making a shell read the quoted string again would also run any $(...) put into the file.
        launch = [
            "  sweep export --format sglang-args -o champion.args   # one argument a line",
            '  mapfile -t args < champion.args; python -m sglang.launch_server --model-path MODEL ... "${args[@]}"',
        ]
    header = [
        "sglang-sweep serving configuration",
        f"experiment: {config.experiment}",
        f"trial: {config.trial_number}"
        + (f" {config.derivation} (not searched as such: measured in the confirmation)" if config.derivation else ""),
        f"run id: {config.run_id}",
        f"model version: {config.model_version if config.model_version is not None else '-'}",
        f"engine: {config.engine} (sglang {config.sglang_version})",
        f"metrics: {metrics or '-'}",
        f"fingerprint: {config.fingerprint_hash or '-'}",
        backend_line(config),
        f"created: {config.created_at}",
        "load it with:",
        "  set -a; . champion.env; set +a",
        *launch,
        f"{ARGS_VAR} holds the tuned SGLang flags joined with shlex.join "
        f"(Python: shlex.split(os.environ['{ARGS_VAR}'])).",
    ]
    # A newline in a free-text field would end the comment and make the rest a command.
    return [" ".join(line.splitlines()) for line in header]


def backend_line(config: ServingConfig) -> str:
    """The header line naming the all-reduce backend the trial's server recorded (never inferred here)."""
    if not config.allreduce_backend:
        return "all-reduce backend: not recorded (no trial's server ran this configuration as exported)"
    return (
        f"all-reduce backend: {config.allreduce_backend} (decode/verify, as trial {config.trial_number}'s "
        f"server recorded it)"
    )


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
    # A shell ends a line at "\n" only; str.splitlines() would also break at \x0b, \x1e, \u2028, ...
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip(" \t\r")
        if not line or line.startswith("#"):
            continue
        match = _ASSIGNMENT.match(line)
        if match is None:
            raise ValueError(f"line {number}: expected NAME=value (NAME of letters, digits and '_'), but got {raw!r}")
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
            f"line {number}: the value {text!r} is several words; quote it (e.g. {shlex.quote(' '.join(words))})"
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


def split_args(parsed: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """Split a parsed env file into (environment variables, SGLang flag list)."""
    env = {k: v for k, v in parsed.items() if k != ARGS_VAR}
    return env, shlex.split(parsed.get(ARGS_VAR, ""))
