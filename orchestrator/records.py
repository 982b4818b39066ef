"""Values that cross process boundaries: what a trial is asked to do and what comes back.

Everything here is a frozen pydantic model so it pickles through Ray, dumps to JSON for the trial
folder, and cannot be mutated by whoever receives it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

ParamValue = str | int | float | bool | None
"""A knob's value in a trial. None means "not set": the variable or flag is left out."""


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TrialStatus(str, enum.Enum):
    COMPLETE = "COMPLETE"
    FAILED = "FAILED"
    INFEASIBLE = "INFEASIBLE"


class FailureKind(str, enum.Enum):
    startup_timeout = "startup_timeout"
    server_crash = "server_crash"
    oom = "oom"
    nccl_hang = "nccl_hang"
    bench_error = "bench_error"
    env_not_applied = "env_not_applied"
    metric_missing = "metric_missing"
    port_in_use = "port_in_use"
    interrupted = "interrupted"
    infeasible = "infeasible"
    trial_timeout = "trial_timeout"
    worker_lost = "worker_lost"
    internal_error = "internal_error"


class TrialRole(str, enum.Enum):
    search = "search"  # proposed by the sampler
    baseline = "baseline"  # no speculation, no NCCL variables
    confirm = "confirm"  # promotion gate re-measure


class LaunchPlan(Frozen):
    """Exactly what is started: argv list and the environment additions, nothing implicit."""

    argv: tuple[str, ...]
    flags: dict[str, str | bool] = Field(default_factory=dict)
    """The SGLang flags of argv as data: `--flag` -> value, True for a switch (argv is rendered from it)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables this plan sets on top of the inherited environment (NCCL_*, SGLANG_*, ...)."""
    host: str = "127.0.0.1"
    port: int
    engine: str
    warnings: tuple[str, ...] = ()


class BenchRecord(Frozen):
    """One request as the benchmark client saw it (one line of bench.jsonl)."""

    index: int
    repeat: int = 0
    """Which of the trial's repeated measurements this request belongs to."""
    warmup: bool = False
    ok: bool
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    start_s: float = 0.0
    """Wall time (time.time()) the request was sent."""
    ttft_s: float | None = None
    latency_s: float | None = None
    chunk_times_s: tuple[float, ...] = ()
    """Arrival of each streamed chunk, seconds after the request was sent."""
    chunk_tokens: tuple[int, ...] = ()
    """Tokens carried by each chunk (a speculative chunk carries several)."""
    meta_info: dict[str, Any] = Field(default_factory=dict)
    """The final meta_info of /generate (spec_accept_length, spec_verify_ct, ...)."""


class Metrics(Frozen):
    """What one measurement of one configuration gave. Fields a source did not provide are None."""

    decode_tok_s: float
    """Median over requests of one stream's decode rate: (completion_tokens - 1) / (latency - ttft)."""
    output_tok_s: float
    """All output tokens / wall time of the measured requests (aggregate throughput)."""
    ttft_ms_p50: float | None = None
    ttft_ms_p99: float | None = None
    itl_ms_p50: float | None = None
    itl_ms_p99: float | None = None
    tpot_ms_p50: float | None = None
    accept_length: float | None = None
    accept_rate: float | None = None
    accept_length_per_request: float | None = None
    """Mean over the measured requests of each one's own accept length (its tokens / its verify cycles), beside
    accept_length's token-weighted figure; sources["prompts"] says whether the text was synthetic."""
    verify_ms: float | None = None
    cycle_ms: float | None = None
    requests_ok: int = 0
    requests_failed: int = 0
    sources: dict[str, str] = Field(default_factory=dict)
    """Where each derived number came from, e.g. {"verify_ms": "device_timer"}."""

    @property
    def acceptance_label(self) -> str | None:
        """How its acceptance must be read where it is shown: "synthetic prompts" when measured on the
        builtin generator's prompts (inflated against real text), "real text" on a dataset; None without it."""
        if self.accept_length is None and self.accept_rate is None:
            return None
        prompts = self.sources.get("prompts", "")
        return "synthetic prompts" if prompts.startswith("synthetic") else "real text" if prompts else None


class MeasurementSummary(Frozen):
    """r repeated measurements of one configuration reduced to medians and bootstrap intervals."""

    repeats: int
    median: dict[str, float]
    ci95_low: dict[str, float] = Field(default_factory=dict)
    ci95_high: dict[str, float] = Field(default_factory=dict)


class ScoreRequest(Frozen):
    """A token sequence for the server to score (SGLang's input logprobs): another configuration's
    greedy output after a prompt, which the baseline's server rates against its own choices."""

    arm: str
    """The confirmation arm whose output it is (champion, no_speculation, ...)."""
    prompt: int
    """Index into the fixed prompt set (trial.outputs.PROMPTS)."""
    input_ids: tuple[int, ...]
    """The prompt's token ids, then the output's."""
    continuation: int
    """How many of the last input_ids are the output to score."""


class OutputsRequest(Frozen):
    """Capture greedy outputs of the fixed prompts after the benchmark (promotion.correctness), and score
    the listed sequences; the trial writes what it got to outputs.json (OutputsRecord)."""

    prompts: int
    max_new_tokens: int
    score: tuple[ScoreRequest, ...] = ()
    top_logprobs: int = 0
    """Also keep the server's `top_logprobs` best tokens at each output position (SGLang's
    top_logprobs_num): the first baseline's capture, which the search's correctness screen reads."""


class PromptOutput(Frozen):
    """One prompt's greedy output as the server returned it."""

    prompt: int
    prompt_ids: tuple[int, ...]
    """The prompt as the server tokenized it (its input_token_logprobs ids)."""
    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...] = ()
    """The server's log-probability of each output token."""
    output_top: tuple[tuple[tuple[int, float], ...], ...] = ()
    """At each output position, the server's best (token id, log-probability) pairs, best first, when the
    request asked for them (OutputsRequest.top_logprobs; SGLang's output_top_logprobs)."""


class ScoredOutput(Frozen):
    """How the server rates another configuration's output, token by token."""

    arm: str
    prompt: int
    logprobs: tuple[float, ...]
    """Its log-probability of each output token."""
    top_logprobs: tuple[float, ...]
    """Its own best token's log-probability at each of those positions."""


class OutputsRecord(Frozen):
    """outputs.json of a trial asked for outputs: what was captured and scored, or why not."""

    prompts: tuple[PromptOutput, ...] = ()
    scored: tuple[ScoredOutput, ...] = ()
    error: str = ""
    """Why the capture or the scoring stopped (empty when complete)."""


class TrialSpec(Frozen):
    """What the driver sends to a worker: which parameters, where to write, which role."""

    number: int
    """Optuna trial number (unique per study)."""
    params: dict[str, ParamValue]
    role: TrialRole = TrialRole.search
    repeats: int = 1
    trial_dir: str
    seed: int = 0
    sweep_started_at: float = 0.0
    """Shared epoch of the sweep (the simulator's host drift is a function of time since it)."""
    effective_params: dict[str, ParamValue] = Field(default_factory=dict)
    """The values the server is launched with (config.eagle.effective: at top-k 1 SGLang forces draft
    tokens = steps + 1); empty: the same as params. Every record shows these."""
    experiment: Any
    """The validated experiment, a config.SweepSpec (typed Any: a leaf cannot name config's types). It
    pickles through Ray as it is, so a worker needs no files and validates nothing again."""
    outputs: OutputsRequest | None = None
    """Also capture greedy outputs (and score others') after the benchmark: outputs.json."""


class TrialOutcome(Frozen):
    """What comes back from one trial. Expected failures are values here, never exceptions."""

    number: int
    params: dict[str, ParamValue]
    """The proposal, as the study holds it."""
    effective_params: dict[str, ParamValue] = Field(default_factory=dict)
    """What the server was launched with (TrialSpec.effective_params); empty: the same as params."""
    role: TrialRole = TrialRole.search
    status: TrialStatus
    failure_kind: FailureKind | None = None
    reason: str = ""
    log_tail: str = ""
    metrics: Metrics | None = None
    """The median measurement (objective source) when status is COMPLETE."""
    repeats: tuple[Metrics, ...] = ()
    summary: MeasurementSummary | None = None
    fingerprint: dict[str, Any] = Field(default_factory=dict)
    fingerprint_hash: str = ""
    effective_env: dict[str, Any] = Field(default_factory=dict)
    """Per-rank observation of what reached the workers, see observe.py."""
    allreduce_path: str = ""
    launch: LaunchPlan | None = None
    trial_dir: str = ""
    node: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    timings: dict[str, float] = Field(default_factory=dict)
    """Seconds spent per phase: server_start, bench, shutdown, observe."""
    warnings: tuple[str, ...] = ()
    outputs_changed: str = ""
    """Why the search's correctness screen found this trial's greedy outputs changed (its first token
    that leaves the baseline's, as the baseline's capture rates it; promotion.correctness.screen); the
    measurement stands, but the trial is never a candidate. Empty: not refused."""


def launched_params(outcome: TrialOutcome) -> dict[str, ParamValue]:
    """The knob values a trial's server ran with: what MLflow, results.csv and the report show."""
    return dict(outcome.effective_params or outcome.params)


class ServingConfig(Frozen):
    """What a deployment needs to reproduce a trial: its environment and the SGLang flags it ran with.

    Stored as `serving_config/serving_config.json` on the trial's MLflow run, registered as the
    champion model version, and rendered by `results.export`.
    """

    experiment: str
    trial_number: int
    derivation: str = ""
    """How the configuration differs from trial `trial_number` ("without speculation"); "" when it is that trial."""
    run_id: str
    model_version: str | None = None
    engine: str
    sglang_version: str
    params: dict[str, ParamValue]
    env: dict[str, str]
    """Environment variables of the trial (NCCL_*, SGLANG_*), exactly as the ranks received them."""
    sglang_args: tuple[str, ...]
    """SGLang flags the trial was launched with, beyond the model path, host and port."""
    metrics: dict[str, float]
    fingerprint_hash: str
    created_at: str
    """ISO-8601 UTC time the config was made."""
    allreduce_backend: str = ""
    """The all-reduce backend that carried the trial's decode/verify messages, as its server recorded it
    (TrialOutcome.allreduce_path: SGLang's start-up lines, else its flags and host): flashinfer_fusion,
    pcie_ipc, custom, nccl, none (TP 1) or unknown; "" when no trial's record stands for this configuration."""


SPECULATION_PREFIX = "speculative_"
"""Knobs of speculative decoding; the others (NCCL_*, all_reduce_path, ...) are the communication
settings: the two parts a configuration's gain is split into (verdict.choose.contributions) and pooled over
(stats.pooled_scores)."""


def speculation_knob(name: str) -> bool:
    return name.startswith(SPECULATION_PREFIX)


def prefill_group(params: Mapping[str, ParamValue]) -> tuple[bool, tuple[tuple[str, ParamValue], ...]]:
    """What a point's prefill time (its TTFT at one request) depends on: whether it speculates (the draft
    model prefills too) and its communication settings (the prefill's all-reduces), not its draft steps,
    top-k or draft tokens: the groups stats.covariate_adjusted fits a run's TTFT over."""
    return params.get("speculative_algorithm") is not None, split_point(params)[1]


def prefill_x(ttft_ms: object) -> float | None:
    """A run's TTFT as the covariate stats.covariate_adjusted takes (its log), None where the run has no
    usable one (not recorded, not a positive finite number): such a run stays as measured."""
    if isinstance(ttft_ms, bool) or not isinstance(ttft_ms, (int, float)):
        return None
    return math.log(ttft_ms) if ttft_ms > 0 and math.isfinite(ttft_ms) else None


def split_point(
    params: Mapping[str, ParamValue],
) -> tuple[tuple[tuple[str, ParamValue], ...], tuple[tuple[str, ParamValue], ...]]:
    """(the point's speculation knobs, its other knobs) as hashable, sorted items, unset ones left out:
    the two groups stats.pooled_scores pools measurements over."""
    items = sorted((k, v) for k, v in params.items() if v is not None)
    return tuple(i for i in items if speculation_knob(i[0])), tuple(i for i in items if not speculation_knob(i[0]))
