"""The champion's serving configuration in the form each place that loads it reads, and readers of
those same rules, so every format round-trips through a parser of its own semantics.

- `env`: a shell file for `set -a; . champion.env` (results.export renders and parses it).
- `docker-env`: docker's `--env-file` rules, which `kubectl create configmap --from-env-file` shares:
  one `NAME=value` a line, the value taken literally (no quotes, no `$`, no escapes, no inline
  comments), whole-line `#` comments only. The SGLang flags travel as a JSON array of strings in
  `SGLANG_SWEEP_ARGS_JSON` (written without outer quotes, which docker would keep), and
  `SGLANG_SWEEP_ENV_NAMES` lists the variables the configuration sets, so a container that got them
  through its environment can still tell them from stray ones.
- `k8s`: a ConfigMap manifest whose data is exactly what `kubectl create configmap --from-env-file`
  makes of the docker-env file, for `envFrom`.
- `json`, `sglang-args`: as results.export renders them.

Production by default: the variables and flags the sweep sets only to observe a trial (NCCL's debug
log, SGLang's device timer and step records, /metrics) are left out and named in the header;
`keep_observation=True` keeps them. Always left out (and named): what makes a server load or run code
(a library path such as SGLANG_NCCL_SO_PATH or NCCL_TUNER_PLUGIN, --trust-remote-code): the worker
image's entrypoint takes those only from the deployment itself (results.deployable). Everything here is pure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

import yaml

from orchestrator.config import yamlfile
from orchestrator.records import ServingConfig, TrialOutcome, TrialRole, TrialStatus
from orchestrator.results import export
from orchestrator.results.deployable import deploy_only

__all__ = [
    "ARGS_JSON_VAR",
    "CARRIERS",
    "CONFIGMAP_NAME",
    "ENV_NAMES_VAR",
    "EXPORT_FORMATS",
    "FORMATS",
    "TUNER_FORMAT",
    "OBSERVATION_ENV",
    "OBSERVATION_SWITCHES",
    "deployment",
    "parse_docker_env",
    "parse_k8s",
    "production",
    "render_for",
    "screen_refused",
]

FORMATS: tuple[str, ...] = ("env", "docker-env", "k8s", "json", "sglang-args")
"""The formats of a serving config (render_for)."""
TUNER_FORMAT = "nccl-tuner"
"""`sweep export --format nccl-tuner`: rendered from the work directory's probe.json (probe.tuner), not
from a serving config."""
ADAPTIVE_FORMAT = "adaptive-config"
"""`sweep export --format adaptive-config`: tuned from the work directory's trials (results.adaptive_export)."""
EXPORT_FORMATS: tuple[str, ...] = (*FORMATS, TUNER_FORMAT, ADAPTIVE_FORMAT)
"""What `sweep export --format` offers."""
TUNER_MASKED = ("NCCL_ALGO", "NCCL_PROTO")
"""Variables left out when the server loads an nccl-tuner rule file: set, they mask the tuner plugin."""

ARGS_JSON_VAR = "SGLANG_SWEEP_ARGS_JSON"
"""docker-env / k8s: the tuned SGLang flags as a one-line JSON array of strings."""
ENV_NAMES_VAR = "SGLANG_SWEEP_ENV_NAMES"
"""docker-env / k8s: comma-separated names of the variables the configuration sets (may be empty)."""
CARRIERS: frozenset[str] = frozenset({export.ARGS_VAR, ARGS_JSON_VAR, ENV_NAMES_VAR})
"""Variables that carry the configuration to the entrypoint; SGLang itself never sees them."""
CONFIGMAP_NAME = "sglang-champion"

OBSERVATION_ENV: frozenset[str] = frozenset(
    {
        "NCCL_DEBUG",
        "NCCL_DEBUG_SUBSYS",
        "NCCL_DEBUG_FILE",  # NCCL's log proves which settings took effect
        "SGLANG_ENABLE_METRICS_DEVICE_TIMER",  # the verify-latency source of /metrics
        "SGLANG_RECORD_STEP_TIME",  # step_time_dict in /server_info
        "SGLANG_LOG_MS",  # millisecond log timestamps, for reading timings off the log
    }
)
"""Variables a sweep sets to observe a trial; they change no result and cost a production server."""
OBSERVATION_SWITCHES: frozenset[str] = frozenset({"--enable-metrics", "--enable-metrics-for-all-schedulers"})
"""SGLang switches the sweep adds to read /metrics (config.render.fixed_flags); no value follows them."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def production(model: ServingConfig, *, keep_observation: bool = False) -> tuple[ServingConfig, list[str]]:
    """The config without its observation-only variables and switches, and what was left out
    (`NAME=value` and `--switch` words, in order). ValueError names a variable no env file can set."""
    export.check_env_names(model)
    if keep_observation:
        return model, []
    left_out = [f"{name}={value}" for name, value in sorted(model.env.items()) if name in OBSERVATION_ENV]
    left_out += [arg for arg in model.sglang_args if arg in OBSERVATION_SWITCHES]
    kept = model.model_copy(
        update={
            "env": {name: value for name, value in model.env.items() if name not in OBSERVATION_ENV},
            "sglang_args": tuple(arg for arg in model.sglang_args if arg not in OBSERVATION_SWITCHES),
        }
    )
    return kept, left_out


def with_tuner_file(config: ServingConfig, tuner_file: str) -> tuple[ServingConfig, list[str]]:
    """The config loading the nccl-tuner rule file `tuner_file` (NCCL_TUNER_CONFIG_FILE) without the
    variables that would mask the plugin; and those left out (`NAME=value`)."""
    masked = [f"{k}={v}" for k, v in sorted(config.env.items()) if k in TUNER_MASKED]
    env = {k: v for k, v in config.env.items() if k not in TUNER_MASKED}
    env["NCCL_TUNER_CONFIG_FILE"] = tuner_file
    return config.model_copy(update={"env": env}), masked


def render_for(
    config: ServingConfig, fmt: str, *, keep_observation: bool = False, tuner_file: str | None = None
) -> str:
    """Render a serving config in one of FORMATS (text ending with a newline); production by default,
    and never with what only a deployment may set (`deploy_only`).

    ValueError names the problem: an unknown format, a malformed config, or a value the format cannot
    hold (a newline, or for docker-env a carriage return at the end of a value).
    """
    if fmt == TUNER_FORMAT:
        raise ValueError("nccl-tuner rules come from the work directory's probe.json, not from a serving config")
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, but got {fmt!r}")
    model, left_out = production(config, keep_observation=keep_observation)
    model, deployment_only = deploy_only(model)
    note = ""
    if tuner_file is not None:
        model, masked = with_tuner_file(model, tuner_file)
        note = (
            f"# NCCL tuner rules from {tuner_file}: left out {' '.join(masked) or 'nothing'} (NCCL_ALGO / "
            f"NCCL_PROTO mask the plugin); give the plugin's .so to the server as well "
            f"(serve-champion --path-env NCCL_TUNER_PLUGIN=<.so>: a configuration names no library)\n"
        )
    comments = _left_out_lines(left_out) + _deploy_only_lines(deployment_only)
    if fmt == "env":
        _check_line_breaks(model)
    if fmt == "docker-env":
        return note + _render_docker_env(model, comments)
    if fmt == "k8s":
        return _render_k8s(model, comments)
    text = export.render(model, fmt)  # type: ignore[arg-type]  # fmt is one of export.FORMATS here
    if fmt != "env":
        return text
    if left_out or deployment_only:
        # After export's own header, before the first variable: the file stays one comment block.
        lines = text.splitlines(keepends=True)
        at = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
        text = "".join(lines[:at] + [f"# {line}\n" for line in comments] + lines[at:])
    return note + text


_PYTHON_LINE_BREAKS = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
"""Characters str.splitlines breaks lines at besides \\n and \\r; export.parse_env reads with it."""


def _check_line_breaks(config: ServingConfig) -> None:
    """Refuse, for the env format, a value export.parse_env would split into two lines (no round trip)."""
    for name, value in [*config.env.items(), *((export.ARGS_VAR, a) for a in config.sglang_args)]:
        if any(c in _PYTHON_LINE_BREAKS for c in value):
            raise ValueError(
                f"env value of {name} holds a line-break character the env format's reader splits "
                f"at: {value!r} (the docker-env format carries it)"
            )


def _left_out_lines(left_out: list[str]) -> list[str]:
    if not left_out:
        return ["production export: no observation-only variable or flag was set"]
    return [
        f"production export: left out as observation only: {' '.join(left_out)}",
        "(sweep export --keep-observation keeps them; extra SGLang flags can follow the image's command)",
    ]


def _deploy_only_lines(left_out: list[str]) -> list[str]:
    if not left_out:
        return []
    return [
        f"left out, as only a deployment sets them (they load or run code): {' '.join(left_out)}",
        "(serve-champion takes a library path with --path-env NAME=VALUE or from the container's own "
        "environment, and such flags after the image name)",
    ]


def _variables(config: ServingConfig) -> dict[str, str]:
    """The docker-env / k8s variables: the environment, then the two carriers."""
    for name in config.env:
        if name in CARRIERS:
            raise ValueError(f"serving config env: {name} is reserved for carrying the configuration")
    for i, arg in enumerate(config.sglang_args):
        if why := yamlfile.arg_problem(arg):  # JSON would carry it, but no process can be given it
            raise ValueError(f"env value of {ARGS_JSON_VAR}: SGLang argument {i + 1} {why}")
    values = dict(sorted(config.env.items()))
    values[ENV_NAMES_VAR] = ",".join(sorted(config.env))
    # ASCII-only JSON: every control character is escaped, so the array is always one line.
    values[ARGS_JSON_VAR] = json.dumps(list(config.sglang_args), separators=(",", ":"))
    for name, value in values.items():
        if "\n" in value or "\0" in value or value.endswith("\r"):
            # docker and kubectl read line by line and drop a final carriage return.
            raise ValueError(
                f"env value of {name} cannot be held by an env file "
                f"(a newline, NUL, or a carriage return at its end): {value!r}"
            )
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"env value of {name} is not valid UTF-8, which docker refuses: {value!r}") from None
    return values


def _provenance(config: ServingConfig) -> list[str]:
    metrics = ", ".join(f"{k}={v:.6g}" for k, v in sorted(config.metrics.items()))
    lines = [
        f"experiment: {config.experiment}; trial: {config.trial_number}"
        f"{' ' + config.derivation if config.derivation else ''}; run id: {config.run_id}; "
        f"model version: {config.model_version if config.model_version is not None else '-'}",
        f"engine: {config.engine} (sglang {config.sglang_version}); fingerprint: {config.fingerprint_hash or '-'}; "
        f"created: {config.created_at}",
        export.backend_line(config),
        f"metrics: {metrics or '-'}",
    ]
    # A newline in a free-text field would end the comment and start a variable.
    return [" ".join(line.splitlines()) for line in lines]


def _render_docker_env(config: ServingConfig, comments: list[str]) -> str:
    values = _variables(config)
    header = [
        "sglang-sweep serving configuration, docker-env format",
        *_provenance(config),
        "Values are literal (docker --env-file and kubectl --from-env-file rules): add no quotes.",
        f"{ARGS_JSON_VAR}: the SGLang flags as a JSON array; {ENV_NAMES_VAR}: the variables set here.",
        "Serve it with the worker image (docker/Dockerfile.worker), which reads it without a shell:",
        "  docker run --gpus all --ipc host --env-file champion.env -e MODEL_PATH=/models/M "
        "-v /models:/models:ro IMAGE",
        "  or mount it as a file: -v $PWD/champion.env:/config/champion.env:ro",
        "Kubernetes: kubectl create configmap sglang-champion --from-env-file=champion.env, then envFrom.",
        *comments,
    ]
    lines = [f"# {line}" for line in header] + [f"{name}={value}" for name, value in values.items()]
    return "\n".join(lines) + "\n"


def parse_docker_env(text: str) -> dict[str, str]:
    """Read a docker-env file by docker's `--env-file` rules, refusing what docker would read differently
    from what was meant: a name with whitespace or an invalid name, a line without `=` (docker would
    copy that variable from the caller's environment), or a name set twice. Values stay literal."""
    result: dict[str, str] = {}
    if text.startswith("\ufeff"):
        text = text[1:]
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw[:-1] if raw.endswith("\r") else raw  # as Go's line scanner
        line = line.lstrip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        if not sep:
            raise ValueError(
                f"line {number}: expected NAME=value, but got {raw!r} (a bare NAME would make "
                "docker copy the variable from the environment it runs in)"
            )
        if not _NAME.match(name):
            raise ValueError(
                f"line {number}: {name!r} is not a valid variable name "
                "(letters, digits and '_', not starting with a digit)"
            )
        if name in result:
            raise ValueError(f"line {number}: {name} is set twice (first value {result[name]!r})")
        result[name] = value
    return result


def _render_k8s(config: ServingConfig, comments: list[str]) -> str:
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": CONFIGMAP_NAME,
            "labels": {"app.kubernetes.io/managed-by": "sglang-sweep"},
            "annotations": {
                "sglang-sweep/experiment": config.experiment,
                "sglang-sweep/trial": str(config.trial_number),
                "sglang-sweep/run-id": config.run_id,
                "sglang-sweep/model-version": config.model_version or "",
                "sglang-sweep/created": config.created_at,
            },
        },
        "data": _variables(config),
    }
    header = [
        "sglang-sweep serving configuration, a Kubernetes ConfigMap",
        *_provenance(config),
        "Apply it (kubectl apply -f), then in the worker container: envFrom: [{configMapRef: "
        f"{{name: {CONFIGMAP_NAME}}}}}] and env MODEL_PATH; the entrypoint reads these variables.",
        "The same data: kubectl create configmap sglang-champion --from-env-file=champion.env "
        "(sweep export --format docker-env)",
        *comments,
    ]
    body = yaml.safe_dump(manifest, sort_keys=False, allow_unicode=False, width=1 << 16)
    return "".join(f"# {line}\n" for line in header) + body


def parse_k8s(text: str) -> dict[str, str]:
    """The data of a ConfigMap manifest (YAML), checked to be a ConfigMap of string values."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"the manifest is not YAML: {e}") from None
    if not isinstance(doc, dict) or doc.get("kind") != "ConfigMap":
        raise ValueError("the manifest must be one object of kind ConfigMap")
    data = doc.get("data") or {}
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise ValueError("the ConfigMap's data must map names to strings")
    return dict(data)


def deployment(variables: Mapping[str, str], *, whole_file: bool) -> tuple[dict[str, str], list[str]]:
    """(environment, SGLang flags) carried by docker-env / k8s variables; ValueError names what is wrong.

    With `whole_file` the variables are a parsed file, and every one of them besides the carriers must
    be listed in SGLANG_SWEEP_ENV_NAMES (so the file means the same mounted or passed with --env-file);
    otherwise they are a container's whole environment, of which only the listed names are the
    configuration's. Every listed name must be present.
    """
    if ARGS_JSON_VAR not in variables:
        raise ValueError(f"{ARGS_JSON_VAR} is not set (export with sweep export --format docker-env)")
    args = _json_args(variables[ARGS_JSON_VAR])
    names = _listed_names(variables)
    if whole_file:
        unlisted = sorted(set(variables) - set(names) - CARRIERS)
        if unlisted:
            raise ValueError(
                f"{', '.join(unlisted)} set but not listed in {ENV_NAMES_VAR}; add "
                f"{'it' if len(unlisted) == 1 else 'them'} there (comma-separated) or remove the line"
            )
    return {name: variables[name] for name in names}, args


def _json_args(text: str) -> list[str]:
    """The flags of SGLANG_SWEEP_ARGS_JSON: a JSON array of strings, nothing nested."""
    shape = 'it must be an unquoted JSON array of strings, e.g. ["--tp-size","8"]'
    try:
        args = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{ARGS_JSON_VAR} is not JSON ({e}); {shape}") from None
    except RecursionError:  # json's decoder recurses once per level of nesting
        raise ValueError(f"{ARGS_JSON_VAR} is nested too deeply to read; {shape}") from None
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError(
            f"{ARGS_JSON_VAR} must be a JSON array of strings, but got {yamlfile.shorten(repr(text), 120)}"
        )
    return args


def _listed_names(variables: Mapping[str, str]) -> list[str]:
    """The names SGLANG_SWEEP_ENV_NAMES lists, each a settable variable that is present."""
    names_text = variables.get(ENV_NAMES_VAR)
    if names_text is None:
        raise ValueError(f"{ENV_NAMES_VAR} is not set (it lists the variables the configuration sets)")
    names = [n for n in names_text.split(",") if n]
    for name in names:
        if not _NAME.match(name) or name in CARRIERS:
            raise ValueError(
                f"{ENV_NAMES_VAR}: {yamlfile.shorten(repr(name), 80)} is not a variable the configuration can set"
            )
        if name not in variables:
            raise ValueError(f"{ENV_NAMES_VAR} names {name}, but it is not set")
    return names


# ---------------------------------------------------------------- what the correctness screen refused

_TUNER_KNOBS = {"NCCL_PROTO": "protocol", "NCCL_ALGO": "algorithm"}


def tuner_name(value: str) -> str:
    """An NCCL algorithm or protocol as one spelling for comparing: NCCL_ALGO's `NVLSTree`, the TUNING
    log's `NVLS_TREE` and the tuner file's `nvls_tree` are all `nvlstree`."""
    return value.lower().replace("_", "")


def screen_refused(outcomes: list[TrialOutcome]) -> dict[str, dict[str, list[int]]]:
    """The protocols and algorithms the search's correctness screen refused: {"protocol" | "algorithm":
    {tuner_name(value): the trials}} for each NCCL_PROTO / NCCL_ALGO value that complete search trials set
    and whose every such trial the screen refused (outcome.outputs_changed). A value some trial set with
    unchanged outputs is not refused: the other knobs of the refused ones may be the cause."""
    seen: dict[tuple[str, str], list[TrialOutcome]] = {}
    for o in outcomes:
        if o.role is not TrialRole.search or o.status is not TrialStatus.COMPLETE:
            continue
        for knob, kind in _TUNER_KNOBS.items():
            value = o.params.get(knob)
            if value is not None:
                seen.setdefault((kind, tuner_name(str(value))), []).append(o)
    refused: dict[str, dict[str, list[int]]] = {}
    for (kind, value), trials in sorted(seen.items()):
        if all(o.outputs_changed for o in trials):
            refused.setdefault(kind, {})[value] = [o.number for o in trials]
    return refused
