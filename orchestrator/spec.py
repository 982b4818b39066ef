"""Load and validate an experiment YAML and the search spaces it names into frozen models.

Every user mistake becomes one `SpecError` whose message names the file, the field path, the rule
and the value, with a fix (did-you-mean for unknown keys and knobs). Nothing downstream re-checks
what is validated here.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from orchestrator import knobs

Scalar = str | int | float | bool | None


class SpecError(Exception):
    """A user error in an experiment or search-space file: one clear message, exit code 2."""


class Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# ---------------------------------------------------------------- search space


class ParamSpec(Strict):
    """One dimension: either `choices` or an integer range `low`..`high` (optionally `step`, `log`)."""

    choices: tuple[Scalar, ...] | None = None
    low: int | None = None
    high: int | None = None
    step: int = 1
    log: bool = False
    when: dict[str, Scalar | list[Scalar]] = Field(default_factory=dict)
    """Active only when these knobs have these values, e.g. {speculative_algorithm: EAGLE3}."""

    @model_validator(mode="after")
    def _one_form(self) -> ParamSpec:
        if self.choices is not None:
            if self.low is not None or self.high is not None:
                raise ValueError("give either `choices` or `low`/`high`, not both")
            if not self.choices:
                raise ValueError("`choices` must not be empty")
            if len(set(map(repr, self.choices))) != len(self.choices):
                raise ValueError(f"`choices` has duplicates: {list(self.choices)}")
        else:
            if self.low is None or self.high is None:
                raise ValueError("give `choices: [...]` or both `low` and `high`")
            if self.low > self.high:
                raise ValueError(f"`low <= high` must hold, but got (low={self.low}, high={self.high})")
            if self.step < 1:
                raise ValueError(f"`step` must be >= 1, but got {self.step}")
            if self.log and (self.low < 1 or self.step != 1):
                raise ValueError("`log: true` needs low >= 1 and step 1")
        return self

    def values(self) -> tuple[Scalar, ...]:
        """Every value this dimension can take (ranges expanded)."""
        if self.choices is not None:
            return self.choices
        assert self.low is not None and self.high is not None  # guaranteed by _one_form
        return tuple(range(self.low, self.high + 1, self.step))


class SearchSpace(Strict):
    name: str = "space"
    description: str = ""
    params: dict[str, ParamSpec]


# ---------------------------------------------------------------- experiment

Slug = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
Port = Annotated[int, Field(ge=1024, le=65535)]
Positive = Annotated[float, Field(gt=0)]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_duration(value: str | float | int) -> float:
    """'8h', '30m', '90s', '1.5d' or a number of seconds -> seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value <= 0:
            raise ValueError(f"a duration must be > 0, but got {value}")
        return float(value)
    m = _DURATION.match(str(value))
    if not m:
        raise ValueError(f"a duration looks like 8h, 30m, 90s or a number of seconds, but got {value!r}")
    seconds = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    if seconds <= 0:
        raise ValueError(f"a duration must be > 0, but got {value!r}")
    return seconds


class ServerSpec(Strict):
    model: str
    """Model path (a local directory on the GPU hosts) or, for the simulator, a model name."""
    draft_model: str | None = None
    """EAGLE-3 draft model path; required when the space turns speculation on."""
    tp: Annotated[int, Field(ge=1, le=64)] = 8
    host: str = "127.0.0.1"
    port_range: tuple[Port, Port] = (31000, 31999)
    startup_timeout_s: Positive = 900.0
    flags: dict[str, Scalar] = Field(default_factory=dict)
    """Fixed SGLang flags for every trial, e.g. {mem-fraction-static: 0.85, enable-metrics: true}."""
    env: dict[str, str | int] = Field(default_factory=dict)
    """Fixed environment for every trial (allow-listed: NCCL_*, SGLANG_* we know)."""
    python: str | None = None
    """Interpreter that runs the server (default: the one running the sweep)."""

    @field_validator("port_range")
    @classmethod
    def _ordered(cls, v: tuple[int, int]) -> tuple[int, int]:
        if v[0] > v[1]:
            raise ValueError(f"port_range must be [low, high] with low <= high, but got {list(v)}")
        return v

    @field_validator("env")
    @classmethod
    def _allowed_env(cls, v: dict[str, Any]) -> dict[str, str]:
        out = {}
        for name, value in v.items():
            why = knobs.env_rule(name)
            if why:
                raise ValueError(f"environment variable {name} {why}")
            knob = knobs.KNOBS.get(name)
            if knob and (problem := knob.check(value)):
                raise ValueError(f"{name} {problem}")
            out[name] = str(value)
        return out


class FaultSpec(Strict):
    """A simulator fault injected only into trials whose knobs match `when` (all of them)."""

    fault: str
    """The simulator's --sim-fault text, e.g. never_ready, crash_after_tokens=40."""
    when: dict[str, Scalar | list[Scalar]] = Field(default_factory=dict)


class SimulatorSpec(Strict):
    hardware_profile: str = "pcie-rtxpro6000-x8"
    model_profile: str = "kimi-k2.5"
    noise: Annotated[float, Field(ge=0, le=0.5)] = 0.03
    drift_per_hour: Annotated[float, Field(ge=-0.5, le=0.5)] = 0.0
    faults: tuple[str | FaultSpec, ...] = ()
    """Fault injections passed as --sim-fault: a string applies to every trial, {fault, when} to the
    trials whose knobs match, e.g. {fault: never_ready, when: {NCCL_ALGO: Tree}}."""


class BenchmarkSpec(Strict):
    engine: Literal["builtin", "bench_serving"] = "builtin"
    requests: Annotated[int, Field(ge=1)] = 8
    concurrency: Annotated[int, Field(ge=1)] = 1
    input_len: Annotated[int, Field(ge=1)] = 256
    output_len: Annotated[int, Field(ge=2)] = 256
    warmup_requests: Annotated[int, Field(ge=0)] = 1
    repeats: Annotated[int, Field(ge=1, le=50)] = 1
    """Measurements per trial on one server; MLflow gets the median and a bootstrap 95% interval."""
    timeout_s: Positive = 1800.0
    stall_timeout_s: Positive = 120.0
    """No token for this long while the server lives counts as a hang (nccl_hang)."""


METRIC_NAMES = (
    "decode_tok_s", "output_tok_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99",
    "tpot_ms_p50", "accept_length", "accept_rate", "verify_ms", "cycle_ms",
)
MetricName = Literal[
    "decode_tok_s", "output_tok_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99",
    "tpot_ms_p50", "accept_length", "accept_rate", "verify_ms", "cycle_ms",
]


class Bound(Strict):
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _some(self) -> Bound:
        if self.min is None and self.max is None:
            raise ValueError("a constraint needs `min` or `max`")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"`min <= max` must hold, but got (min={self.min}, max={self.max})")
        return self


class ObjectiveSpec(Strict):
    metric: MetricName = "decode_tok_s"
    direction: Literal["maximize", "minimize"] = "maximize"
    constraints: dict[MetricName, Bound] = Field(default_factory=dict)
    """Trials outside these bounds are never champions, e.g. {itl_ms_p99: {max: 25}}."""
    secondary: MetricName | None = None
    """A second objective for a multi-objective sweep (Pareto front), e.g. ttft_ms_p99."""
    secondary_direction: Literal["maximize", "minimize"] = "minimize"


class BudgetSpec(Strict):
    trials: Annotated[int, Field(ge=1)] = 100
    wall_time: float = 8 * 3600.0
    concurrent_trials: Annotated[int, Field(ge=1)] = 1
    trial_timeout_s: Positive = 3600.0
    max_failure_rate: Annotated[float, Field(gt=0, le=1)] = 0.5
    max_consecutive_failures: Annotated[int, Field(ge=1)] = 8
    min_trials_for_failure_rate: Annotated[int, Field(ge=1)] = 6
    baseline_every: Annotated[int, Field(ge=0)] = 0
    """Measure the baseline again every K finished trials (0: only at the start and the end)."""
    baseline_drift_threshold: Annotated[float, Field(gt=0)] = 0.05

    @field_validator("wall_time", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> float:
        return parse_duration(v)


class SamplerSpec(Strict):
    kind: Literal["tpe", "random", "grid"] = "tpe"
    seed: int = 0
    startup_trials: Annotated[int, Field(ge=1)] = 8


class TrackingSpec(Strict):
    uri: str | None = None
    """MLflow tracking URI; default sqlite:///<workdir>/mlflow.db."""
    experiment: str | None = None
    """MLflow experiment name; default the experiment's name."""


class PromotionSpec(Strict):
    model_name: Slug
    alias: Slug = "champion"
    min_gain: Annotated[float, Field(ge=0)] = 0.0
    """Relative gain over the baseline the champion must show (0.02 = 2%)."""
    confirm_repeats: Annotated[int, Field(ge=0, le=20)] = 2
    """Interleaved champion/baseline re-measurements (A B A B ...) before promotion; 0 skips the gate."""


class SweepSpec(Strict):
    name: Slug
    description: str = ""
    engine: Literal["simulator", "sglang"]
    sglang_version: str = knobs.DEFAULT_SGLANG_VERSION
    server: ServerSpec
    simulator: SimulatorSpec = SimulatorSpec()
    search_space: tuple[str, ...]
    """Search-space files, relative to the experiment file."""
    space: SearchSpace
    """The merged, validated search space (filled in by load())."""
    benchmark: BenchmarkSpec = BenchmarkSpec()
    objective: ObjectiveSpec = ObjectiveSpec()
    budget: BudgetSpec = BudgetSpec()
    sampler: SamplerSpec = SamplerSpec()
    tracking: TrackingSpec = TrackingSpec()
    promotion: PromotionSpec
    source: str = ""
    """Path of the experiment file this was loaded from."""

    @field_validator("sglang_version")
    @classmethod
    def _known_version(cls, v: str) -> str:
        if v not in knobs.SGLANG_VERSIONS:
            raise ValueError(f"must be one of {list(knobs.SGLANG_VERSIONS)}, but got {v!r}")
        return v

    @model_validator(mode="after")
    def _cross_checks(self) -> SweepSpec:
        for name, param in self.space.params.items():
            if param.when and any(k not in self.space.params for k in param.when):
                missing = [k for k in param.when if k not in self.space.params]
                raise ValueError(f"space.params.{name}.when refers to {missing}, which the space does not define")
        spec_on = any(v is not None for v in self.space.params.get("speculative_algorithm", ParamSpec(choices=(None,))).values())
        if spec_on and not self.server.draft_model:
            raise ValueError("server.draft_model is required: the space turns speculative decoding on")
        return self


# ---------------------------------------------------------------- loading and messages


def _did_you_mean(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(sorted(options))}"


def _model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class that owns the field at `loc` (to list its keys)."""
    current: Any = model
    for part in loc:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(str(part))
        if field is None:
            return None
        ann = field.annotation
        current = None
        for cand in (ann, *getattr(ann, "__args__", ())):
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                current = cand
                break
            for inner in getattr(cand, "__args__", ()):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    current = inner
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _format_errors(err: ValidationError, model: type[BaseModel], where: str) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"])
        path = ".".join(str(p) for p in loc) or "(top level)"
        if e["type"] == "extra_forbidden":
            owner = _model_at(model, loc[:-1])
            options = list(owner.model_fields) if owner else []
            if owner is SweepSpec:
                options = [o for o in options if o not in ("space", "source")]
            lines.append(f"{where}: {path}: unknown key; {_did_you_mean(str(loc[-1]), options)}")
            continue
        msg = e["msg"].removeprefix("Value error, ")
        value = e.get("input")
        shown = "" if e["type"] == "missing" or isinstance(value, dict) else f" (got {value!r})"
        if e["type"] == "missing":
            msg = "required field is missing; add it"
        lines.append(f"{where}: {path}: {msg}{shown}")
    return "\n".join(lines)


def _read_yaml(path: Path, what: str) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: {what} file not found; check the path (relative paths are resolved from the experiment file)") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read {what} file: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(f"{path}{at}: not valid YAML: {problem}; fix the syntax at that line") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a {what} file must be a YAML mapping (key: value), but got {type(data).__name__}")
    return data


def _check_space_knobs(space: SearchSpace, where: str) -> None:
    for name, param in space.params.items():
        knob = knobs.KNOBS.get(name)
        if knob is None:
            raise SpecError(f"{where}: params.{name}: unknown knob; {_did_you_mean(name, list(knobs.KNOBS))} "
                            f"(the catalogue is orchestrator/knobs.py)")
        for value in param.values():
            if problem := knob.check(value):
                raise SpecError(f"{where}: params.{name}: {problem}; allowed: {knob.doc}")
        if not param.when and (param.choices is None or None not in param.choices):
            raise SpecError(f"{where}: params.{name}: the baseline (engine defaults, nothing set) must be a point "
                            f"of the space: use `choices:` and include null (null = not set), "
                            f"e.g. choices: [null, {', '.join(map(str, param.values()[:3]))}]")
        for dep, wanted in param.when.items():
            if dep not in knobs.KNOBS:
                raise SpecError(f"{where}: params.{name}.when: unknown knob {dep!r}; {_did_you_mean(dep, list(knobs.KNOBS))}")


def load_space(path: Path) -> SearchSpace:
    data = _read_yaml(path, "search space")
    try:
        space = SearchSpace.model_validate(data)
    except ValidationError as err:
        raise SpecError(_format_errors(err, SearchSpace, str(path))) from None
    _check_space_knobs(space, str(path))
    return space


def _check_flags(flags: dict[str, Scalar], version: str, where: str) -> None:
    from orchestrator import plan  # the planner owns the flag tables

    known = plan.known_flags(version)
    for name in flags:
        flag = "--" + name.lstrip("-")
        if known is not None and flag not in known:
            options = sorted(f.removeprefix("--") for f in known)
            raise SpecError(f"{where}: server.flags.{name}: not a flag of sglang {version}; "
                            f"{_did_you_mean(name.lstrip('-'), options)}")
        if flag in plan.MANAGED_FLAGS:
            raise SpecError(f"{where}: server.flags.{name}: set by the sweep itself ({plan.MANAGED_FLAGS[flag]}); "
                            f"remove it from server.flags")


def load(path: str | Path) -> SweepSpec:
    """Read, merge and validate an experiment and its search spaces; raise SpecError on any mistake."""
    path = Path(path)
    data = _read_yaml(path, "experiment")
    where = str(path)
    spaces = data.get("search_space")
    if isinstance(spaces, str):
        spaces = [spaces]
        data["search_space"] = spaces
    if not isinstance(spaces, list) or not spaces or not all(isinstance(s, str) for s in spaces):
        raise SpecError(f"{where}: search_space: must be a list of search-space files, e.g. "
                        f"[../search_spaces/nccl.yaml]")
    params: dict[str, ParamSpec] = {}
    for rel in spaces:
        sp = load_space((path.parent / rel).resolve() if not Path(rel).is_absolute() else Path(rel))
        for name, p in sp.params.items():
            if name in params:
                raise SpecError(f"{where}: search_space: knob {name} is defined twice (again in {rel}); keep one")
            params[name] = p
    if "space" in data or "source" in data:
        key = "space" if "space" in data else "source"
        raise SpecError(f"{where}: {key}: unknown key; search spaces are named in `search_space`")
    data["space"] = {"name": "+".join(Path(s).stem for s in spaces), "params": params}
    data["source"] = str(path)
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(_format_errors(err, SweepSpec, where)) from None
    _check_flags(spec.server.flags, spec.sglang_version, where)
    return spec


def from_dict(data: dict[str, Any]) -> SweepSpec:
    """Rebuild a SweepSpec that was validated before (e.g. sent to a worker as JSON)."""
    return SweepSpec.model_validate(data)
