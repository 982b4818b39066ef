"""The experiment file's models: one frozen section per key (server, simulator, benchmark, objective,
budget, sampler, tracking, promotion, probe) and `SweepSpec`, the whole experiment.

Each field states its rule (types, ranges, text without control characters); config.loading reads a
file into these and adds the checks that span sections. The public names are re-exported by
config.experiment."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, StrictInt, field_validator, model_validator

from orchestrator.config import correctness, knobs, yamlfile
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
from orchestrator.config.space import Scalar, SearchSpace, Strict

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
            if why := yamlfile.arg_problem(f"{name}={out[name]}"):  # the whole NAME=value string counts
                raise ValueError(f"{name}={yamlfile.shorten(out[name], 20)} {why}")
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
METRIC_NAMES: tuple[str, ...] = get_args(MetricName)


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
    """The search stops when more than this share of the finished search trials failed and the failures are
    one kind whatever the parameters (a broken set-up); failures the parameters explain never stop it."""
    max_consecutive_failures: Annotated[int, Int(1, 100_000)] = 8
    """The search stops after this many failed trials in a row when they are one kind whatever the
    parameters (a broken set-up); failures the parameters explain never stop it."""
    min_trials_for_failure_rate: Annotated[int, Int(1, 100_000)] = 6
    """Finished search trials before max_failure_rate is applied."""
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
    defaults and the best runner-up from another region: each part's contribution. Off, the rounds
    measure one arm beside the champion and the baseline: the searched point the search's own
    measurements can least rule out as better than the pick (a near-tie, deployed if it wins), in the
    adaptive-or-fixed step control's place."""
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
    are always held back: the search stops in time for them, and an arm that does not fit (or would leave
    the search fewer than min_search_trials) is not measured (a line says so)."""
    min_search_trials: Annotated[int, Int(0, 100_000)] | None = None
    """Search trials (baselines included) the night keeps before the confirmation's other arms get time:
    on a short night an arm that would leave the search fewer is not measured, least valuable first
    (other load levels, then the step comparison, the ablations, the runner-up; the gate's pair always
    is), and `sweep plan` says so. None: 1.5 x sampler.startup_trials (rounded down), at most budget.trials."""

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
