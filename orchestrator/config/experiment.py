"""Load and validate an experiment YAML and the search spaces it names into frozen models.

Every user mistake becomes one `SpecError` naming the file, the field path, the rule and the value, with a
fix (did-you-mean for unknown keys and knobs). Nothing downstream re-checks what is validated here."""

from __future__ import annotations

import difflib
import graphlib
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, StrictInt, ValidationError, field_validator, model_validator

from orchestrator import redact
from orchestrator.config import correctness, flags, knobs, speculation, yamlfile
from orchestrator.config.durations import parse_duration
from orchestrator.config.fields import (
    EnvName,
    Fault,
    Finite,
    Fraction,
    HardwareProfile,
    Int,
    ModelProfile,
    Seconds,
    Text,
    TrackingUri,
    finite_scalar,
    no_control,
)
from orchestrator.config.messages import did_you_mean, format_errors
from orchestrator.config.space import ParamSpec, Scalar, SearchSpace, Strict, check_enumerable, when_order
from orchestrator.errors import SpecError

# ---------------------------------------------------------------- experiment

Slug = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
Port = Annotated[int, Int(1024, 65535)]
Positive = Seconds
"""A duration in seconds: > 0, finite, at most fields.MAX_SECONDS."""


class ServerSpec(Strict):
    model: Text
    """Model path (a local directory on the GPU hosts) or, for the simulator, a model name."""
    draft_model: Text | None = None
    """EAGLE-3 draft model path; required when the space turns speculation on."""
    tp: Annotated[int, Int(1, 64)] = 8
    """Tensor-parallel ranks of every trial's server (--tp-size): the GPUs one trial holds."""
    host: Text = "127.0.0.1"
    """Address the trial servers listen on (--host): loopback unless the benchmark runs elsewhere."""
    port_range: tuple[Port, Port] = (31000, 31999)
    """[first, last] port a trial server may take (--port); trials in flight never share one."""
    startup_timeout_s: Positive = 900.0
    """Seconds from launch to a ready server (/health) before the trial fails startup_timeout."""
    flags: dict[str, Scalar] = Field(default_factory=dict)
    """Fixed SGLang flags for every trial, e.g. {mem-fraction-static: 0.85, enable-metrics: true}."""
    env: dict[EnvName, str | StrictInt] = Field(default_factory=dict)
    """Fixed environment for every trial (allow-listed: NCCL_*, SGLANG_* we know)."""
    python: Text | None = None
    """Interpreter that runs the server (default: the one running the sweep)."""
    device: Literal["cuda", "cpu"] = "cuda"
    """Where the server computes: cuda (one GPU per TP rank, Ray hands them out) or cpu (SGLang's CPU
    engine, `--device cpu` with SGLANG_USE_CPU_ENGINE=1; trials hold no GPUs)."""

    @field_validator("port_range")
    @classmethod
    def _ordered(cls, v: tuple[int, int]) -> tuple[int, int]:
        if v[0] > v[1]:
            raise ValueError(f"must list the lower port first, but got {list(v)}; swap them")
        return v

    @field_validator("env")
    @classmethod
    def _env_values(cls, v: dict[str, Any]) -> dict[str, str]:
        out = {}
        for name, value in v.items():
            knob = knobs.KNOBS.get(name)
            # experiment.json keeps the string a rank receives: "16777216" is NCCL_BUFFSIZE 16777216 read back.
            as_int = knob is not None and knob.kind in ("int", "power_of_two") and re.fullmatch(r"-?[0-9]+", str(value))
            if knob and (problem := knob.check(int(value) if as_int else value)):
                raise ValueError(f"{name} {problem}")
            out[name] = no_control(str(value))
        return out

    @field_validator("flags")
    @classmethod
    def _flag_values(cls, v: dict[str, Any]) -> dict[str, Any]:
        for name, value in v.items():
            no_control(name)
            if problem := finite_scalar(value):
                raise ValueError(f"{yamlfile.shorten(name, 40)} {problem}")
        return v


class FaultSpec(Strict):
    """A simulator fault injected only into trials whose knobs match `when` (all of them)."""

    fault: Fault
    """The simulator's --sim-fault text, e.g. never_ready, crash_after_tokens=40."""
    when: dict[str, Scalar | list[Scalar]] = Field(default_factory=dict)


class SimulatorSpec(Strict):
    hardware_profile: HardwareProfile = "pcie-rtxpro6000-x8"
    """The simulated host (built-in profile name or a profile file); on engine sglang, the host the
    cost model describes (`sweep plan --host` plans the all-reduce path for a profile)."""
    model_profile: ModelProfile = "kimi-k2.5"
    """The simulated model (load time, speed, drafter acceptance); on engine sglang, the model the cost
    model stands in for."""
    noise: Annotated[float, Fraction(0, 0.5)] = 0.03
    """Run-to-run multiplicative noise of a simulated server's timing (--sim-noise)."""
    noise_prefill_correlation: Annotated[float, Field(ge=0, le=1)] = 1.0
    """How far a run's TTFT shares its decode noise (--sim-noise-prefill-correlation); 1: one speed."""
    drift_per_hour: Annotated[float, Fraction(-0.5, 0.5)] = 0.0
    """The simulated host slowing by this fraction an hour since the sweep started (--sim-drift)."""
    faults: tuple[Fault | FaultSpec, ...] = ()
    """Fault injections passed as --sim-fault: a string applies to every trial, {fault, when} to the
    trials whose knobs match, e.g. {fault: never_ready, when: {NCCL_ALGO: Tree}}."""
    time_scale: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Fraction of the model profile's real load + graph-capture seconds the simulated server sleeps at
    start-up (--sim-time-scale); 0: fast starts. Cost accounting stays in real-scale seconds."""


class BenchmarkSpec(Strict):
    engine: Literal["builtin", "bench_serving"] = "builtin"
    requests: Annotated[int, Int(1, 1_000_000)] = 8
    concurrency: Annotated[int, Int(1, 4096)] = 1
    input_len: Annotated[int, Int(1, 1 << 20)] = 256
    output_len: Annotated[int, Int(2, 1 << 20)] = 256
    warmup_requests: Annotated[int, Int(0, 10_000)] = 1
    repeats: Annotated[int, Int(1, 50)] = 1
    """Measurements per trial on one server; MLflow gets the median and a bootstrap 95% interval."""
    timeout_s: Positive = 1800.0
    stall_timeout_s: Positive = 120.0
    """No token for this long while the server lives counts as a hang (nccl_hang)."""
    dataset_path: Text | None = None
    """engine bench_serving: a local ShareGPT JSON for `--dataset-name random` (real text, real
    acceptance); without it `random-ids` is used, whose acceptance lengths are unrealistic."""
    tokenizer: Text | None = None
    """engine bench_serving: tokenizer directory (default: the server's model path)."""
    client_python: Text | None = None
    """engine bench_serving: interpreter that runs `python -m sglang.bench_serving` (default: the
    server's `server.python`, else the one running the sweep)."""


METRIC_NAMES = (
    "decode_tok_s",
    "output_tok_s",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "itl_ms_p50",
    "itl_ms_p99",
    "tpot_ms_p50",
    "accept_length",
    "accept_rate",
    "verify_ms",
    "cycle_ms",
)
MetricName = Literal[
    "decode_tok_s",
    "output_tok_s",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "itl_ms_p50",
    "itl_ms_p99",
    "tpot_ms_p50",
    "accept_length",
    "accept_rate",
    "verify_ms",
    "cycle_ms",
]


class Bound(Strict):
    min: Finite | None = None
    max: Finite | None = None

    @model_validator(mode="after")
    def _some(self) -> Bound:
        if self.min is None and self.max is None:
            raise ValueError("a constraint needs `min` or `max`")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"`min <= max` must hold, but got (min={self.min}, max={self.max})")
        return self


class ObjectiveSpec(Strict):
    """What a trial is judged by, and at which load.

    `concurrency`, when given, names the concurrent requests the objective is judged at (the load you
    will serve): every search trial is benchmarked at that level (it becomes benchmark.concurrency,
    with at least that many requests), the promotion gate decides on champion vs baseline at that
    level, and the promotion.concurrency levels are reported beside it. A benchmark.concurrency that
    names another level is refused (one number, one place); the same level twice is accepted.
    """

    metric: MetricName = "decode_tok_s"
    """What a trial is judged by: one stream's decode tok/s, aggregate output tok/s, a latency percentile..."""
    direction: Literal["maximize", "minimize"] = "maximize"
    """maximize for rates (tok/s), minimize for times (ms)."""
    concurrency: Annotated[int, Int(1, 4096)] | None = None
    """Concurrent requests the objective is judged at, e.g. 32 with metric output_tok_s; None: the
    benchmark's concurrency (default 1)."""
    constraints: dict[MetricName, Bound] = Field(default_factory=dict)
    """Trials outside these bounds are never champions, e.g. {itl_ms_p99: {max: 25}}."""
    secondary: MetricName | None = None
    """A second objective for a multi-objective sweep (Pareto front), e.g. ttft_ms_p99."""
    secondary_direction: Literal["maximize", "minimize"] = "minimize"

    def bounds(self) -> dict[str, tuple[float | None, float | None]]:
        """The constraints as results.select takes them: metric -> (low, high), None for an open side."""
        return {k: (b.min, b.max) for k, b in self.constraints.items()}


class BudgetSpec(Strict):
    trials: Annotated[int, Int(1, 100_000)] = 100
    """Trials (server launches of the search, baselines included) before the search stops."""
    wall_time: float = 8 * 3600.0
    """The whole run, probe + search + confirmation: seconds, or a duration such as 8h, 45m, 30s
    (`sweep run --timeout` overrides it). The confirmation is planned and held back from the start."""
    concurrent_trials: Annotated[int, Int(1, 1024)] = 1
    """Trials in flight at once (at most 1024: one per GPU group of a large cluster)."""
    trial_timeout_s: Positive = 3600.0
    """Seconds one trial may take in all (start-up, benchmark, every repeat) before it fails trial_timeout."""
    max_failure_rate: Annotated[float, Field(strict=True, gt=0, le=1)] = 0.5
    """The search stops when more than this share of the finished trials failed."""
    max_consecutive_failures: Annotated[int, Int(1, 100_000)] = 8
    """The search stops after this many failed trials in a row."""
    min_trials_for_failure_rate: Annotated[int, Int(1, 100_000)] = 6
    """Finished trials before max_failure_rate is applied."""
    baseline_every: Annotated[int, Int(0, 100_000)] = 0
    """Measure the baseline again every K finished trials (0: only at the start). The promotion gate's
    interleaved runs measure it again at the end; every baseline measurement feeds the drift check."""
    baseline_drift_threshold: Annotated[float, Field(strict=True, gt=0, le=10, allow_inf_nan=False)] = 0.05
    """The baseline's measurements moving more than this fraction over the sweep is reported as host drift."""

    @field_validator("wall_time", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> float:
        return parse_duration(v)


class SamplerSpec(Strict):
    kind: Literal["tpe", "random", "grid"] = "tpe"
    seed: Annotated[int, Int(0, 2**32 - 1)] = 0
    """The sampler's seed (numpy's range: 0 to 2^32 - 1)."""
    startup_trials: Annotated[int, Int(1, 100_000)] = 8
    remeasure_every: Annotated[int, Int(0, 100_000)] = 0
    """Every K-th complete search trial after the start-up, measure the best point or its closest rival
    again while noise cannot tell them apart (results.select.near_tie); K is for 2% noise, noisier repeats
    shrink it, to every 2nd trial at least (results.select.remeasure_interval). 0: never."""


class TrackingSpec(Strict):
    uri: TrackingUri | None = None
    """MLflow tracking URI; default sqlite:///<workdir>/mlflow.db."""
    experiment: Text | None = None
    """MLflow experiment name; default the experiment's name."""


class PromotionSpec(correctness.Gated):
    model_name: Slug
    """The MLflow registered model the promoted configuration becomes a version of."""
    alias: Slug = "champion"
    """The registry alias the promoted version gets; `sweep export` reads models:/<model_name>@<alias>."""
    min_gain: Annotated[float, Field(strict=True, ge=0, lt=10)] = 0.0
    """Relative gain over the baseline the champion must show (0.02 = 2%)."""
    min_rounds: Annotated[int, Field(ge=3, le=100)] = 3
    """Interleaved champion/baseline rounds measured before the first look (an interval needs 3)."""
    max_rounds: Annotated[int, Field(ge=0, le=100)] = 12
    """Rounds after which an undecided confirmation stops; 0: no gate, the search-phase champion is
    promoted unconfirmed (labelled so everywhere) when its one measurement shows min_gain over the
    baseline's, and not promoted otherwise."""
    explain: bool = True
    """Also measure, in the same rounds, the champion without speculation, its speculation with NCCL at
    defaults and the best runner-up from another region: each part's contribution."""
    concurrency: tuple[Annotated[int, Field(ge=1, le=4096)], ...] = ()
    """Concurrent requests at which champion and baseline are also compared before promotion (the
    load you will serve), e.g. [1, 8, 32]; empty: only the level the objective is judged at
    (objective.concurrency, else benchmark.concurrency). With a speculating champion, each level also
    compares --speculative-adaptive against the fixed step count (SGLang versions that have it)."""
    equivalence_margin: Annotated[float, Field(strict=False, ge=0, lt=1)] = 0.01
    """A part of the champion (its speculation, or its NCCL settings) is dropped for the simpler
    configuration only when the confirmation shows it adds less than this (0.01 = 1%): the upper gate
    bound of its gain below the margin (an equivalence test). Merely not significant is not enough:
    the fuller configuration is promoted, or more rounds are measured while the night allows."""
    confirm_share: Annotated[float, Field(strict=False, ge=0, le=0.9)] = 0.3
    """Share of budget.wall_time held back for the confirmation's other arms (runner-up, ablations,
    other load levels, adaptive vs fixed steps), beside the gate's own two arms at min_rounds, which
    are always held back: the search stops in time for them, and an arm that does not fit is not
    measured (a line says so)."""

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data: Any) -> Any:
        if isinstance(data, dict) and "confirm_repeats" in data:
            raise ValueError(
                "`confirm_repeats` was replaced by sequential confirmation: interleaved rounds until the "
                "evidence decides. Write `min_rounds: 3` and `max_rounds: 12` (at most that many rounds) "
                "instead, or `max_rounds: 0` to promote the search-phase champion unconfirmed"
            )
        return data

    @model_validator(mode="after")
    def _can_decide(self) -> PromotionSpec:
        if self.max_rounds and self.max_rounds < self.min_rounds:
            raise ValueError(
                f"`min_rounds <= max_rounds` must hold (or max_rounds: 0 for no gate), but got "
                f"(min_rounds={self.min_rounds}, max_rounds={self.max_rounds})"
            )
        if len(set(self.concurrency)) != len(self.concurrency):
            raise ValueError(f"`concurrency` lists a level twice: {list(self.concurrency)}")
        return self


class ProbeSpec(Strict):
    """The probe stage of a two-stage sweep (`sweep probe` runs it alone)."""

    enabled: bool = False
    """Stage one probes the NCCL settings; stage two runs full trials only over the kept ones."""
    keep_within: Annotated[float, Field(ge=1.0, le=100)] = 1.2
    """Keep the settings whose verify-size all-reduce latency is within this ratio of the best (the
    NCCL defaults are always kept)."""
    budget: Annotated[int, Int(1, 100_000)] | None = None
    """NCCL settings to probe; default orchestrator.probe.DEFAULT_BUDGET (48)."""


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
    probe: ProbeSpec = ProbeSpec()
    source: str = ""
    """Path of the experiment file this was loaded from."""

    @field_validator("sglang_version")
    @classmethod
    def _known_version(cls, v: str) -> str:
        if v not in knobs.SGLANG_VERSIONS:
            raise ValueError(
                f"must be one of {', '.join(knobs.SGLANG_VERSIONS)} (the versions whose flag names "
                f"this tool knows), but got {v!r}; set the version installed on the GPU hosts"
            )
        return v


# ---------------------------------------------------------------- loading


def _read_yaml(path: Path, what: str, *, named_in: str | None = None) -> dict:
    data = yamlfile.parse(yamlfile.read_text(path, what, named_in=named_in), str(path))
    if data is None:
        raise SpecError(f"{path}: the {what} file is empty; it must be a YAML mapping (key: value)")
    if not isinstance(data, dict):
        raise SpecError(f"{path}: the {what} file must be a YAML mapping (key: value), but got a {type(data).__name__}")
    return data


def _check_space_knobs(space: SearchSpace, where: str) -> None:
    for name, param in space.params.items():
        at = f"{where}: params.{name}"
        knob = knobs.KNOBS.get(name)
        if knob is None:
            raise SpecError(
                f"{at}: unknown knob; {did_you_mean(name, list(knobs.KNOBS), 'known knobs')} "
                f"(the catalogue is orchestrator/config/knobs.py)"
            )
        if param.choices is None:
            if knob.kind != "int":
                raise SpecError(
                    f"{at}: a low/high range needs an integer knob, but {name} is {knob.kind}; "
                    f"list its values with `choices:` ({knob.doc})"
                )
            for end in ("low", "high"):
                if problem := knob.check(getattr(param, end)):
                    raise SpecError(f"{at}.{end}: {name} {problem}; fix the bound ({name}: {knob.doc})")
        else:
            for value in param.choices:
                if problem := knob.check(value):
                    raise SpecError(f"{at}.choices: {name} {problem}; fix or remove that value ({name}: {knob.doc})")
        if not param.when and (param.choices is None or None not in param.choices):
            example = ", ".join(map(str, param.values()[:3]))
            raise SpecError(
                f"{at}: the baseline (engine defaults, nothing set) must be a point of the space; "
                f"add null (= not set) to its choices, e.g. choices: [null, {example}]"
            )
        for dep in param.when:
            if dep not in knobs.KNOBS:
                raise SpecError(f"{at}.when.{dep}: unknown knob; {did_you_mean(dep, list(knobs.KNOBS), 'known knobs')}")


def load_space(path: Path, *, named_in: str | None = None) -> SearchSpace:
    """Read and validate one search-space file against the knob catalogue."""
    data = _read_yaml(path, "search space", named_in=named_in)
    try:
        space = SearchSpace.model_validate(data)
    except ValidationError as err:
        raise SpecError(format_errors(err, SearchSpace, str(path))) from None
    _check_space_knobs(space, str(path))
    return space


def _check_links(space: SearchSpace, origin: dict[str, str], where: str) -> None:
    """`when` conditions name knobs of the merged space, with values those knobs take, without cycles."""
    for name, param in space.params.items():
        for dep, wanted in param.when.items():
            at = f"{origin[name]}: params.{name}.when.{dep}"
            if dep not in space.params:
                raise SpecError(
                    f"{at}: the condition refers to knob {dep}, which no search space of {where} "
                    f"defines; add {dep} to a search space or drop the condition"
                )
            values = space.params[dep].values()
            for w in wanted if isinstance(wanted, list) else [wanted]:
                if w not in values:
                    shown = (
                        f"{values[0]} to {values[-1]}"
                        if isinstance(values, range)
                        else yamlfile.shorten(", ".join(map(str, values)), 200)
                    )
                    raise SpecError(
                        f"{at}: {dep} never takes the value {yamlfile.shorten(repr(w))} (its values: "
                        f"{shown}), so {name} would never be swept; fix the value"
                    )
    mode = space.params.get("speculative_attention_mode")
    algo_when = mode.when.get("speculative_algorithm") if mode is not None else None
    if mode is not None and (algo_when is None or None in (algo_when if isinstance(algo_when, list) else [algo_when])):
        raise SpecError(
            f"{origin['speculative_attention_mode']}: params.speculative_attention_mode: passed to SGLang "
            f"only with speculative decoding, so without it every value would be the same server "
            f"counted twice; add `when: {{speculative_algorithm: EAGLE3}}`"
        )
    try:
        when_order(space)
    except graphlib.CycleError as cycle:
        todo = [n for n in space.params if n in set(cycle.args[1])]
        raise SpecError(
            f"{origin[todo[0]]}: params.{todo[0]}.when: the `when` conditions of "
            f"{', '.join(todo)} depend on each other in a cycle; break the cycle"
        ) from None


# Metrics the baseline (no speculation) cannot have: an objective must be defined for every trial.
_SPECULATION_ONLY = ("accept_length", "accept_rate", "verify_ms")


def _objective_load(spec: SweepSpec, where: str) -> SweepSpec:
    """The experiment with benchmark.concurrency at the objective's level (see ObjectiveSpec)."""
    level = spec.objective.concurrency
    if level is None or level == spec.benchmark.concurrency and spec.benchmark.requests >= level:
        return spec
    if "concurrency" in spec.benchmark.model_fields_set and spec.benchmark.concurrency != level:
        raise SpecError(
            f"{where}: benchmark.concurrency: {spec.benchmark.concurrency} conflicts with "
            f"objective.concurrency: {level}, the load the objective is judged at (the search "
            f"trials and the promotion gate run there); remove benchmark.concurrency, or set "
            f"objective.concurrency to {spec.benchmark.concurrency}"
        )
    bench = spec.benchmark.model_copy(update={"concurrency": level, "requests": max(spec.benchmark.requests, level)})
    return spec.model_copy(update={"benchmark": bench})


def _check_adaptive(spec: SweepSpec, origin: dict[str, str], where: str) -> None:
    param = spec.space.params.get("speculative_adaptive")
    if param is None or spec.sglang_version in knobs.ADAPTIVE_VERSIONS or not any(param.values()):
        return
    raise SpecError(
        f"{origin['speculative_adaptive']}: params.speculative_adaptive: --speculative-adaptive is "
        f"known in sglang {', '.join(knobs.ADAPTIVE_VERSIONS)}, not in sglang_version "
        f"{spec.sglang_version} of {where}; remove the knob or set sglang_version: "
        f'"{knobs.ADAPTIVE_VERSIONS[-1]}"'
    )


def _check_objective(spec: SweepSpec, where: str) -> None:
    for field in ("metric", "secondary"):
        name = getattr(spec.objective, field)
        if name in _SPECULATION_ONLY:
            raise SpecError(
                f"{where}: objective.{field}: {name} exists only with speculative decoding, but the "
                f"baseline runs without it; use cycle_ms (one decode iteration, defined for every "
                f"trial), decode_tok_s, or a latency percentile"
            )


def _check_server(spec: SweepSpec, origin: dict[str, str], where: str) -> None:
    algo = spec.space.params.get("speculative_algorithm")
    drafter = bool(spec.server.draft_model) or "speculative_draft_model_path" in spec.space.params
    if algo is not None and speculation.drafter_missing(algo.values(), drafter):
        raise SpecError(
            f"{where}: server.draft_model: required field is missing: the search space turns "
            f"speculative decoding on (speculative_algorithm in {origin['speculative_algorithm']}); "
            f"add the EAGLE-3 draft model path"
        )
    for i, fault in enumerate(spec.simulator.faults):
        for knob in getattr(fault, "when", {}):
            if knob not in spec.space.params:
                raise SpecError(
                    f"{where}: simulator.faults.{i}.when.{knob}: not a knob of the search space, so "
                    f"the fault would never fire; "
                    f"{did_you_mean(knob, list(spec.space.params), 'knobs of the space')}"
                )
    for name in spec.server.env:
        if name in spec.space.params:
            raise SpecError(
                f"{where}: server.env.{name}: also swept by the search space ({origin[name]}), so the "
                f"baseline would not run the engine defaults; remove it from server.env"
            )
    _check_dashes(spec, where)
    known = flags.known_flags(spec.sglang_version)
    by_knob = flags.knob_flags(spec.sglang_version)
    for name in spec.server.flags:
        flag = "--" + name.lstrip("-")
        at = f"{where}: server.flags.{name}"
        if redact.is_secret_name(name.lstrip("-").replace("-", "_")):
            raise SpecError(
                f"{at}: looks like a secret, and experiments, launch plans, MLflow and the exported "
                f"env file are all written to disk; pass it to the server through its deployment "
                f"environment instead"
            )
        if flag in flags.MANAGED_FLAGS:
            raise SpecError(
                f"{at}: set by the sweep itself from {flags.MANAGED_FLAGS[flag]}; remove it from server.flags"
            )
        if known is not None and flag not in known:
            raise SpecError(
                f"{at}: not a flag of sglang {spec.sglang_version} (launch_server --help); {_flag_hint(flag, known)}"
            )
        if problem := flags.value_problem(flag, spec.server.flags[name]):
            raise SpecError(f"{at}: {problem}")
        if by_knob.get(flag) in spec.space.params:
            knob = by_knob[flag]
            raise SpecError(
                f"{at}: the search space sweeps {knob} ({origin[knob]}), which sets this flag; "
                f"remove it from server.flags or {knob} from the space"
            )
        for knob in flags.OVERRIDING_FLAGS.get(flag, ()):
            if knob in spec.space.params:
                raise SpecError(
                    f"{at}: SGLang lets this flag win over the swept knob {knob} ({origin[knob]}), so "
                    f"every value of {knob} would run the same server; remove it from server.flags "
                    f"or {knob} from the space"
                )
    _check_backend_flags(spec, origin, where)


def _check_backend_flags(spec: SweepSpec, origin: dict[str, str], where: str) -> None:
    """Fixed flags that defeat a swept all_reduce_backend value (flags.BACKEND_CONFLICTS)."""
    backend = spec.space.params.get("all_reduce_backend")
    swept = backend.values() if backend is not None else ()
    for name in spec.server.flags:
        if problem := flags.backend_conflict("--" + name.lstrip("-"), swept):
            raise SpecError(f"{where}: server.flags.{name}: {problem} ({origin['all_reduce_backend']})")


def _check_dashes(spec: SweepSpec, where: str) -> None:
    """server.model, draft_model and host are each the word after a flag on the command line."""
    for field in ("model", "draft_model", "host"):
        value = getattr(spec.server, field)
        if value is not None and (problem := flags.dash_problem(value)):
            raise SpecError(f"{where}: server.{field}: {problem}")


_DEVICE_TIMER = "SGLANG_ENABLE_METRICS_DEVICE_TIMER"


def _check_cpu_device(spec: SweepSpec, origin: dict[str, str], where: str) -> None:
    """server.device cpu: what SGLang 0.5.23's CPU engine needs, and what cannot run there."""
    at = f"{where}: server.device"
    if spec.engine == "simulator":
        raise SpecError(
            f"{at}: cpu: the simulator models GPU hosts only; use engine: sglang for SGLang's CPU "
            f"engine, or remove server.device"
        )
    if spec.server.env.get("SGLANG_USE_CPU_ENGINE") != "1":
        raise SpecError(
            f"{at}: cpu: SGLang 0.5.23 takes its CPU paths only with SGLANG_USE_CPU_ENGINE=1 "
            f'(sglang/srt/utils/common.py::is_cpu); add server.env.SGLANG_USE_CPU_ENGINE: "1"'
        )
    timer = spec.server.env.get(_DEVICE_TIMER) == "1" or any(
        str(v) == "1" for v in (spec.space.params[_DEVICE_TIMER].values() if _DEVICE_TIMER in spec.space.params else ())
    )
    if timer:
        src = origin.get(_DEVICE_TIMER, "server.env")
        raise SpecError(
            f"{at}: cpu: {_DEVICE_TIMER}=1 ({src}) times forward passes with CUDA events, and SGLang "
            f'exits at start-up without a GPU ("Found no NVIDIA driver"); remove it (verify_ms then '
            f"comes from the log and the request timings)"
        )


def _flag_hint(flag: str, known: frozenset[str]) -> str:
    """did-you-mean for a flag: the full name of an argparse abbreviation, else the closest spelling."""
    longer = sorted((f for f in known if f.startswith(flag)), key=len)
    close = longer[:1] or difflib.get_close_matches(flag, sorted(known), n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0].removeprefix('--')!r}?"
    return "see the --help dump in orchestrator/reference/ for the flags of this version"


def load(path: str | Path) -> SweepSpec:
    """Read, merge and validate an experiment and its search spaces; raise SpecError on any mistake."""
    try:
        return _load(Path(path))
    except SpecError as exc:  # a value quoted back is cut, however long the user made it
        raise SpecError(yamlfile.bounded(str(exc))) from None


def _load(path: Path) -> SweepSpec:
    data = _read_yaml(path, "experiment")
    where = str(path)
    fields = [f for f in SweepSpec.model_fields if f not in ("space", "source")]
    for key in data:  # first, so that a misspelt `search_space` is reported as such
        if key not in fields:
            raise SpecError(f"{where}: {key}: unknown key; {did_you_mean(str(key), fields)}")
    spaces = data.get("search_space")
    if isinstance(spaces, str):
        spaces = [spaces]
    if not isinstance(spaces, list) or not spaces or not all(isinstance(s, str) for s in spaces):
        got = "nothing" if spaces is None else repr(spaces)
        raise SpecError(
            f"{where}: search_space: must be a list of search-space files, but got {got}; "
            f"e.g. search_space: [../search_spaces/nccl.yaml]"
        )
    params: dict[str, ParamSpec] = {}
    origin: dict[str, str] = {}
    for rel in spaces:
        file = Path(os.path.normpath(path.parent / rel))  # experiments/../search_spaces/x -> search_spaces/x
        sp = load_space(file, named_in=where)
        for name, p in sp.params.items():
            if name in params:
                raise SpecError(
                    f"{where}: search_space: knob {name} is defined in both {origin[name]} and "
                    f"{file}; keep it in one of them"
                )
            params[name] = p
            origin[name] = str(file)
    data = {
        **data,
        "search_space": spaces,
        "source": where,
        "space": {"name": "+".join(Path(s).stem for s in spaces), "params": params},
    }
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(format_errors(err, SweepSpec, where)) from None
    _check_links(spec.space, origin, where)
    if spec.sampler.kind == "grid":
        try:
            check_enumerable(spec.space, "sampler.kind grid")
        except SpecError as exc:
            raise SpecError(f"{where}: sampler.kind: {exc}") from None
    _check_server(spec, origin, where)
    if spec.server.device == "cpu":
        _check_cpu_device(spec, origin, where)
    _check_adaptive(spec, origin, where)
    _check_objective(spec, where)
    return _objective_load(spec, where)
