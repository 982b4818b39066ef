"""The sweep's contracts: why it stopped, its state file, its summary, and the events it reports.

Imports neither Ray nor MLflow: `sweep status` and the CLI read these from another process.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.records import ParamValue, TrialOutcome
from orchestrator.results.figures import Confirmed, Contribution, LevelGain
from orchestrator.verdict.value import Outcome, Verdict

__all__ = ["Outcome", "Verdict"]  # re-exported: the promotion and the CLI read them here


class StopKind(str, enum.Enum):
    """What ended the launching of new trials."""

    trial_budget = "trial_budget"
    wall_time = "wall_time"
    grid_exhausted = "grid_exhausted"
    space_exhausted = "space_exhausted"
    consecutive_failures = "consecutive_failures"
    failure_rate = "failure_rate"
    baseline_failed = "baseline_failed"
    defaults_failed = "defaults_failed"
    """The default configuration (the model's default speculation, engine defaults elsewhere) failed."""
    interrupted = "interrupted"
    """Ctrl-C or SIGTERM once: the trials in flight finished."""
    aborted = "aborted"
    """Ctrl-C or SIGTERM twice: the trials in flight were aborted."""
    start_failed = "start_failed"
    """A check before the first trial failed (cluster, storage, MLflow): nothing was launched."""
    failed = "failed"
    """The storage, MLflow or the cluster failed while the sweep ran; what was measured is kept and
    `--resume` continues."""


FAILURE_STOPS = frozenset(
    {
        StopKind.consecutive_failures,
        StopKind.failure_rate,
        StopKind.baseline_failed,
        StopKind.defaults_failed,
        StopKind.interrupted,
        StopKind.aborted,
        StopKind.start_failed,
        StopKind.failed,
    }
)
"""Stops that end `sweep run` with exit code 1; the others are budgets."""


@dataclass(frozen=True)
class StopReason:
    """Why the sweep stopped: `kind` for the program, `text` for the user."""

    kind: StopKind
    text: str

    @property
    def is_failure(self) -> bool:
        return self.kind in FAILURE_STOPS


class Best(BaseModel):
    """The best searched trial so far (baselines are not candidates)."""

    model_config = ConfigDict(extra="ignore")

    number: int | None = None
    value: float | None = None
    params: dict[str, ParamValue] = Field(default_factory=dict)


class SweepState(BaseModel):
    """sweep.json: written by the driver after every change, read by `sweep status`/`sync`/`ui`/`export`.

    Unknown keys are ignored and most have defaults, so a file of an older version still reads.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    experiment: str
    status: str = "unknown"
    """running | finished | stopped | failed (the start failed: stop_reason says why)."""
    pid: int | None = None
    """The driver's process id (tells `sweep status` whether it still runs)."""
    updated_at: float = 0.0
    started_at: float = 0.0
    """When the sweep first started (kept across --resume), seconds since the epoch."""
    budget_trials: int = 0
    timeout_s: float | None = None
    optuna_storage: str | None = None
    """The Optuna storage URL, its password masked."""
    direction: str = "maximize"
    parent_run_id: str | None = None
    tracking_uri: str = ""
    """The MLflow tracking URI, its password masked."""
    mlflow_experiment: str | None = None
    model_name: str = ""
    alias: str = "champion"
    in_flight: list[int] = Field(default_factory=list)
    launched: int = 0
    finished: int = 0
    complete: int = 0
    failed: int = 0
    skipped: int = 0
    failures: dict[str, int] = Field(default_factory=dict)
    best: Best = Field(default_factory=Best)
    stop_reason: str = ""
    stop_kind: StopKind | None = None
    baselines: list[tuple[float, float]] = Field(default_factory=list)
    """(finished_at, objective value) of every baseline measurement."""
    objective: str = "decode_tok_s"
    schedule: list[str] = Field(default_factory=list)
    """The night as the driver plans it now (sweep.schedule): when the search ends and each confirmation
    arm held back or left out; `sweep status` prints it."""

    @property
    def experiment_in_mlflow(self) -> str:
        return self.mlflow_experiment or self.experiment


class BaselineDrift(BaseModel):
    max_relative_change: float | None = None
    flagged: bool = False
    baselines: list[tuple[float, float]] = Field(default_factory=list)


class SweepSummary(BaseModel):
    """What `Sweep.run()` returns and summary.json holds. The promotion's fields are present only
    when a promotion was attempted (the file leaves them out otherwise, as before)."""

    model_config = ConfigDict(extra="forbid")

    workdir: str
    stop_reason: str
    stop_kind: StopKind | None = None
    parent_run_id: str | None
    launched: int
    complete: int
    failed: int
    failures: dict[str, int]
    skipped: int
    champion: dict[str, Any] | None = None
    """{number, params, <objective metric>: value} of the champion, when one was chosen."""
    promoted: bool = False
    stopped_by_failure: bool = False
    """True when the sweep ended on a failure rule, a failed baseline or an interruption (exit code 1)."""
    verdict: str | None = None
    """The verdict in words, with what to change when no champion was promoted."""
    outcome: Outcome | None = None
    """The verdict for the program (and the exit code of `sweep run`)."""
    confirmed: Confirmed | None = None
    """The figures to show: confirmed medians, rounds and interval (label "unconfirmed" without a gate)."""
    search_value: float | None = None
    """The champion's search-phase measurement (one run, the best of many: optimistic), labelled as such."""
    contributions: list[Contribution] = Field(default_factory=list)
    """Why it won: each part's gain with its interval, from the same interleaved rounds."""
    promoted_config: str | None = None
    """Which arm was promoted: champion, a simpler one (no_speculation, default_communication) or runner_up."""
    deployed: dict[str, Any] | None = None
    """{name, label, number, params} of the configuration promoted: label in words ("trial 16", "trial 16
    without speculation"); every confirmed figure, level and registry field is about it."""
    concurrency: list[LevelGain] = Field(default_factory=list)
    """Champion vs baseline at each promotion.concurrency level (or, with none set, the gate's own level when
    the champion speculates: adaptive against fixed steps there)."""
    concurrency_verdict: str | None = None
    importances: dict[str, float] = Field(default_factory=dict)
    """Optuna's parameter importances (fANOVA) over the complete trials, largest first."""
    gate: dict[str, Any] | None = None
    confirmations: list[dict[str, Any]] | None = None
    not_measured: list[str] = Field(default_factory=list)
    """Confirmation arms left out because the night's time did not hold them: "<arm>: <why>"."""
    model_version: str | None = None
    env_file: str | None = None
    run_id: str | None = None
    baseline_drift: BaselineDrift = Field(default_factory=BaselineDrift)
    fingerprint_changes: list[str] = Field(default_factory=list)
    decision: Verdict | None = None
    """The verdict as one value (orchestrator.verdict): what every view renders."""

    def the_verdict(self) -> Verdict | None:
        """The Verdict every view renders: the one the promotion kept, or, in a summary.json written before
        it was kept, the same value built from the promotion's fields; None when no promotion ended."""
        if self.decision is not None:
            return self.decision
        if self.outcome is None:
            return None
        metric = next((k.removeprefix("search_") for k in (self.champion or {}) if k.startswith("search_")), "")
        return Verdict.of(self.model_dump(mode="json", exclude_unset=True), metric, self.importances)

    def to_json(self) -> dict[str, Any]:
        """The summary.json content: the fields that were set (promotion fields only when attempted)."""
        return self.model_dump(mode="json", exclude_unset=True)


# ---------------------------------------------------------------------- progress events


@dataclass(frozen=True)
class ExecutorReady:
    address: str | None
    gpus: float
    slots: int


@dataclass(frozen=True)
class TrialLaunched:
    number: int
    role: str
    params: dict[str, ParamValue]


@dataclass(frozen=True)
class TrialSkipped:
    """A proposal settled without a launch: infeasible, or a repeat of a point measured or in flight."""

    number: int
    why: str
    """One short line, e.g. `infeasible (<the rule it breaks>)` or `same parameters as trial 9`."""


@dataclass(frozen=True)
class TrialFinished:
    outcome: TrialOutcome
    speedup: float | None
    """Speed-up over the nearest baseline, when one was measured."""


@dataclass(frozen=True)
class TrackingWait:
    pending: int
    wait_s: float


@dataclass(frozen=True)
class ConfirmationRun:
    round: int
    of: int
    who: str
    """champion | baseline."""


@dataclass(frozen=True)
class Interrupted:
    press: int
    """1: finishing the trials in flight; 2: aborting them."""


@dataclass(frozen=True)
class Tick:
    launched: int
    finished: int
    in_flight: tuple[int, ...]


@dataclass(frozen=True)
class ProbeStage:
    """Stage one of a two-stage sweep finished: what it did, in a line."""

    text: str


@dataclass(frozen=True)
class ArmDropped:
    """An arm of the confirmation that does not fit the time left of the night, and why."""

    name: str
    why: str


Event = (
    ExecutorReady
    | TrialLaunched
    | TrialSkipped
    | TrialFinished
    | TrackingWait
    | ConfirmationRun
    | Interrupted
    | Tick
    | ProbeStage
    | ArmDropped
)
