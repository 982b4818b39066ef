"""`serve-champion`, the worker image's entrypoint: start SGLang with an exported champion, reading the
configuration as data (it is never sourced and nothing in it is evaluated).

Where the configuration comes from:
1. the file CHAMPION_ENV (default /config/champion.env, used when it exists), in the format CHAMPION_FORMAT
   names (`docker-env` or `env`) or, by default, the one whose carrier variable it sets
   (SGLANG_SWEEP_ARGS_JSON or SGLANG_SWEEP_ARGS), read with that format's own parser;
2. otherwise the container's environment, as `docker run --env-file champion.env` or Kubernetes `envFrom`
   deliver a docker-env export.

What a configuration may hold (deployable.config_problem): the knob catalogue's variables (config.knobs.env_rule,
the allow-list `sweep export` writes from) and never one that names code (deployable.names_code: PATH, LD_*,
PYTHONPATH, SGLANG_NCCL_SO_PATH, NCCL_TUNER_PLUGIN, NCCL_NET_PLUGIN, any *_SO_PATH / *_PLUGIN); SGLang flags
of SGLang's own list spelt whole (argparse would take --model-pat for --model-path), never one the
entrypoint sets (--model-path, --model, --host, --port) nor one that runs code (--trust-remote-code, ...);
no value a process cannot be given (a NUL byte, a lone surrogate, more than 128 KiB).

Variables that name code come only from the deployment: the container's own environment when the
configuration is a file, or this entrypoint's `--path-env NAME=VALUE`. When the configuration arrives as
the container's environment, the entrypoint cannot tell the file's variables from the deployment's, so
every variable that names code must be the image's own, recorded when the image was built
(IMAGE_ENV_FILE, written by `--record-image-env FILE`; `--image-env FILE` reads another record).

Deploy-time settings: MODEL_PATH (required), DRAFT_MODEL_PATH (replaces the value of
--speculative-draft-model-path), HOST (default 0.0.0.0), PORT (default 30000), SGLANG_PYTHON (the
interpreter that has sglang, default python3). Arguments given to the entrypoint, besides its own options
(`--path-env NAME=VALUE`, `--drop-site-env`, `--image-env FILE`), follow the configuration's flags.
NCCL variables: the container's tuning knobs (NCCL_ALGO, NCCL_PROTO, ... of the catalogue) that the
configuration does not set are dropped, since the champion was measured without them; the site's own
(NCCL_SOCKET_IFNAME, NCCL_IB_*, NCCL_NET_*, and every NCCL_* the catalogue does not tune) are kept unless
the configuration sets them or `--drop-site-env` is given; NCCL_NVLS_ENABLE is always kept (the image
keeps NVLink multicast off).
Bad input gets one message on stderr and exit code 2.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.config import knobs
from orchestrator.errors import UserError
from orchestrator.fsio import write_atomic
from orchestrator.results import deployable, export, formats

__all__ = ["DEFAULT_ENV_FILE", "IMAGE_ENV_FILE", "OWN_OPTIONS", "DeployError", "launch", "main"]

DEFAULT_ENV_FILE = "/config/champion.env"
IMAGE_ENV_FILE = "/etc/sglang-sweep/image-env.json"
"""The image's own values of the variables that name code, written at build (docker/Dockerfile.worker)."""
DEFAULT_PORT = "30000"
DEFAULT_HOST = "0.0.0.0"
_KEPT_NCCL = frozenset({"NCCL_NVLS_ENABLE"})
_SITE_PREFIXES = ("NCCL_SOCKET_", "NCCL_IB_", "NCCL_NET_")
_DRAFT_FLAG = "--speculative-draft-model-path"
_PROG = "serve-champion"
OWN_OPTIONS = ("--path-env", "--drop-site-env", "--image-env", "--record-image-env")
"""The entrypoint's own options (none is an SGLang flag); every other argument goes to SGLang."""


class DeployError(UserError):
    """The configuration or a deploy-time setting is unusable; the message says which and how to fix it."""


@dataclass(frozen=True)
class Options:
    """The entrypoint's own options."""

    path_env: dict[str, str] = field(default_factory=dict)
    """--path-env NAME=VALUE: variables that name code, set for SGLang by the deployment."""
    drop_site_env: bool = False
    """--drop-site-env: drop the container's site NCCL variables too."""
    image_env: str = IMAGE_ENV_FILE
    """--image-env FILE: the record of the image's own variables that name code."""
    record_image_env: str | None = None
    """--record-image-env FILE: write that record from this environment and exit (at image build)."""


@dataclass(frozen=True)
class Configuration:
    """What the configuration sets, and where it came from."""

    env: dict[str, str]
    args: list[str]
    source: str
    from_environment: bool


def _words(argv: Sequence[str]) -> Iterator[tuple[str, str | None]]:
    """(option, its value) for the entrypoint's own options, (word, None) for everything else."""
    it = iter(argv)
    for word in it:
        name, eq, value = word.partition("=")
        if name not in OWN_OPTIONS:
            yield word, None
        elif name == "--drop-site-env":
            if eq:
                raise DeployError(f"{name} takes no value, but got {word!r}")
            yield name, ""
        elif eq:
            yield name, value
        else:
            following = next(it, None)
            if following is None:
                raise DeployError(
                    f"{name} needs a value, e.g. {name} {'NAME=VALUE' if name == '--path-env' else 'FILE'}"
                )
            yield name, following


def own_options(argv: Sequence[str]) -> tuple[Options, list[str]]:
    """The entrypoint's own options among `argv`, and the rest (extra SGLang flags, in order)."""
    path_env: dict[str, str] = {}
    extra: list[str] = []
    settings: dict[str, str] = {}
    for word, value in _words(argv):
        if value is None:
            extra.append(word)
        elif word == "--path-env":
            name, eq, path = value.partition("=")
            if not eq or not deployable.names_code(name):
                raise DeployError(
                    f"--path-env takes NAME=VALUE for a variable that names code (a library, a plugin, a search "
                    f"path: SGLANG_NCCL_SO_PATH, NCCL_TUNER_PLUGIN, LD_LIBRARY_PATH, ...), but got {value!r}; give "
                    "other variables through the configuration or the container's environment"
                )
            path_env[name] = path
        else:
            settings[word] = value
    options = Options(
        path_env=path_env,
        drop_site_env="--drop-site-env" in settings,
        image_env=settings.get("--image-env", IMAGE_ENV_FILE),
        record_image_env=settings.get("--record-image-env"),
    )
    return options, extra


def load(environ: Mapping[str, str]) -> Configuration:
    """The configuration `environ` points at (a file, else the environment itself), read as data."""
    path = environ.get("CHAMPION_ENV") or DEFAULT_ENV_FILE
    if "CHAMPION_ENV" not in environ and not Path(path).exists():
        if formats.ARGS_JSON_VAR in environ:
            return _from_environment(environ)
        if export.ARGS_VAR in environ:
            raise DeployError(
                f"the environment carries {export.ARGS_VAR}, the shell env format, whose quotes docker --env-file "
                f"and kubectl keep as part of the values; export with sweep export --format docker-env instead"
            )
    return _from_file(path, environ.get("CHAMPION_FORMAT"))


def _from_environment(environ: Mapping[str, str]) -> Configuration:
    try:
        env, args = formats.deployment(environ, whole_file=False)
    except ValueError as e:
        raise DeployError(f"the configuration in the environment is unusable: {e}") from None
    return Configuration(env, args, "the environment (docker-env variables)", from_environment=True)


def _from_file(path: str, fmt: str | None) -> Configuration:
    try:
        # newline="": a carriage return inside a value is part of it for docker's reader too.
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError, ValueError) as e:  # ValueError: a NUL byte in CHAMPION_ENV
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise DeployError(
            f"cannot read the champion env file {path} ({reason}); mount it there, set CHAMPION_ENV, or pass a "
            f"docker-env export with docker run --env-file (which sets {formats.ARGS_JSON_VAR})"
        ) from None
    fmt = fmt or _detect(text)
    try:
        if fmt == "docker-env":
            env, args = formats.deployment(formats.parse_docker_env(text), whole_file=True)
        elif fmt == "env":
            env, args = export.split_args(export.parse_env(text))
        else:
            raise DeployError(f"CHAMPION_FORMAT must be docker-env or env, but got {fmt!r}")
    except ValueError as e:
        raise DeployError(f"{path} ({fmt} format): {e}") from None
    return Configuration(env, args, f"{path} ({fmt} format)", from_environment=False)


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


def image_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What the image record holds: the environment's variables that name code."""
    return {k: v for k, v in sorted(environ.items()) if deployable.names_code(k)}


def _check_image_env(environ: Mapping[str, str], record_path: str) -> None:
    """With the configuration in the environment, every variable that names code must be the image's."""
    try:
        record = json.loads(Path(record_path).read_text(encoding="utf-8"))
        if not isinstance(record, dict) or not all(isinstance(v, str) for v in record.values()):
            raise ValueError("not a JSON object of strings")
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise DeployError(
            f"the configuration arrived as the container's environment, where the entrypoint cannot tell its "
            f"variables from the deployment's, so the variables that name code (PATH, LD_*, ...) must be the "
            f"image's own, recorded in {record_path} ({reason}); build the image from docker/Dockerfile.worker "
            f"(it writes the record), pass --image-env FILE, or mount the configuration as a file (CHAMPION_ENV)"
        ) from None
    own = image_env(environ)
    changed = sorted(n for n in set(own) | set(record) if own.get(n) != record.get(n))
    if changed:
        shown = ", ".join(f"{n}={own[n]!r}" if n in own else f"{n} unset" for n in changed)
        raise DeployError(
            f"the environment sets {shown}, unlike the image ({record_path}): with the configuration in the "
            f"environment (docker --env-file, envFrom) a variable the file does not list cannot be told from "
            f"the deployment's, so a variable that names code must be the image's; set it with serve-champion "
            f"--path-env NAME=VALUE, or mount the configuration as a file (CHAMPION_ENV) and keep it in the "
            f"container's environment"
        )


@dataclass(frozen=True)
class Settings:
    """The deploy-time settings (MODEL_PATH, HOST, PORT, SGLANG_PYTHON, DRAFT_MODEL_PATH)."""

    model: str
    host: str
    port: str
    python: str
    draft: str


def _settings(environ: Mapping[str, str]) -> Settings:
    model = environ.get("MODEL_PATH", "")
    if not model:
        raise DeployError("MODEL_PATH is not set: give the target model directory, e.g. -e MODEL_PATH=/models/M")
    port = environ.get("PORT") or DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise DeployError(f"PORT must be a port number (1-65535), but got {port!r}")
    python = environ.get("SGLANG_PYTHON") or "python3"
    if shutil.which(python, path=environ.get("PATH", os.defpath)) is None:
        raise DeployError(
            f"cannot start {python} (No such file or directory, or not executable); "
            "SGLANG_PYTHON names the interpreter that has sglang"
        )
    host = environ.get("HOST") or DEFAULT_HOST
    return Settings(model, host, port, python, environ.get("DRAFT_MODEL_PATH", ""))


def _site_variable(name: str) -> bool:
    """An NCCL variable of the site (its network, its plugins), not a tuning knob the champion was measured at."""
    knob = knobs.KNOBS.get(name)
    return name.startswith(_SITE_PREFIXES) or knob is None or knob.target != "env"


def _environment(
    environ: Mapping[str, str], config: Configuration, options: Options
) -> tuple[dict[str, str], list[str]]:
    """SGLang's environment: the container's, less the NCCL variables that are not the configuration's
    (tuning knobs always, site variables with --drop-site-env), then the configuration, then --path-env."""
    theirs = sorted(k for k in environ if k.startswith("NCCL_") and k not in config.env and k not in _KEPT_NCCL)
    site = [] if options.drop_site_env else [k for k in theirs if _site_variable(k)]
    stray = [k for k in theirs if k not in site]
    notes = [f"dropped NCCL variables the configuration does not set: {', '.join(stray)}"] if stray else []
    if site:
        notes.append(f"kept the site's NCCL variables: {', '.join(site)} (--drop-site-env drops them)")
    env = {k: v for k, v in environ.items() if k not in stray and k not in formats.CARRIERS}
    env.update(config.env)
    env.update(options.path_env)
    return env, notes


def launch(environ: Mapping[str, str], extra: Sequence[str] = ()) -> tuple[list[str], dict[str, str], list[str]]:
    """(argv, environment, notes) that start SGLang for the configuration `environ` points at; `extra` are
    the entrypoint's arguments (its own options among SGLang flags).

    Reads the configuration (and, when it is the environment, the image record) and nothing else;
    DeployError for anything unusable.
    """
    return _launch(environ, *own_options(extra))


def _launch(
    environ: Mapping[str, str], options: Options, sglang_extra: list[str]
) -> tuple[list[str], dict[str, str], list[str]]:
    config = load(environ)
    if problem := deployable.config_problem(config.env, config.args):
        raise DeployError(f"{config.source} {problem}")
    if config.from_environment:
        _check_image_env(environ, options.image_env)
    settings = _settings(environ)
    notes = [f"configuration from {config.source}"]
    args = config.args
    if settings.draft:
        args, replaced = _replace_draft(args, settings.draft, config.source)
        if not replaced:
            notes.append("DRAFT_MODEL_PATH ignored: this configuration runs no draft model")
    env, env_notes = _environment(environ, config, options)
    argv = [settings.python, "-m", "sglang.launch_server", "--model-path", settings.model]
    argv += ["--host", settings.host, "--port", settings.port, *args, *sglang_extra]
    return argv, env, notes + env_notes


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


def _record(environ: Mapping[str, str], path: str) -> None:
    """--record-image-env FILE: the image's own variables that name code, as JSON."""
    try:
        write_atomic(Path(path), json.dumps(image_env(environ), indent=1, sort_keys=True) + "\n")
    except OSError as e:
        raise DeployError(f"--record-image-env {path}: cannot write it ({e.strerror or e})") from None


def main(argv: Sequence[str] | None = None) -> int:
    """Replace this process with SGLang; return 2 (after one message) when the input is unusable."""
    extra = list(sys.argv[1:] if argv is None else argv)
    try:
        options, sglang_extra = own_options(extra)
        if options.record_image_env is not None:
            _record(os.environ, options.record_image_env)
            return 0
        command, env, notes = _launch(os.environ, options, sglang_extra)
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
