"""What the sweep's verbs share, with owners.

- `SweepEnv` (frozen): the experiment, the work directory, the study, the proposal policy, the
  executor, the clock, the event sink and the budgets, fixed once the sweep is built; no verb can
  change them (Context exposes them as read-only properties).
- `Progress`: the counters sweep.json, the console and the summary show, written only by the record
  verb (`_record`: `launched`, `skipped`, `stop`, `record`, `recovered`...); every other verb reads it.
  tests/sweep/test_state_owners.py reads the package and fails on a write anywhere else.
- The flight (`in_flight`, `waiting_for_baseline`, `abort_reason`, `overhead`): the loop's, and the
  confirmation's while its rounds run.
- Opened by the driver: the tracker and the parent run; kept by record: the outcomes, the reserve.

The behaviour lives in the verb modules."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.clock import Clock, RealClock
from orchestrator.config.experiment import SweepSpec
from orchestrator.execute.base import Executor
from orchestrator.records import OutputsRecord, ParamValue, TrialOutcome, TrialSpec
from orchestrator.search.proposal import ProposalPolicy
from orchestrator.search.study import Study
from orchestrator.sweep._signals import Interrupts
from orchestrator.sweep._workdir import Paths, without_password, write_json
from orchestrator.sweep.schedule import ConfirmationPlan
from orchestrator.sweep.state import Best, Event, StopReason, SweepState

if TYPE_CHECKING:  # the tracker imports MLflow; only its type is needed here
    from orchestrator.tracking.tracker import Tracker


@dataclass
class Progress:
    """Counters the terminal display, sweep.json and the summary show."""

    launched: int = 0
    finished: int = 0
    complete: int = 0
    failed: int = 0
    consecutive_failures: int = 0
    skipped: int = 0
    consecutive_skips: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    best_number: int | None = None
    best_value: float | None = None
    best_params: dict[str, ParamValue] = field(default_factory=dict)
    baselines: list[tuple[float, float]] = field(default_factory=list)
    stop: StopReason | None = None
    """The first reason to stop launching (an interruption or a failed baseline replaces it)."""

    @property
    def stop_text(self) -> str:
        return self.stop.text if self.stop else ""

    @property
    def stopped_by_failure(self) -> bool:
        return self.stop is not None and self.stop.is_failure


@dataclass(frozen=True)
class InFlight:
    spec: TrialSpec
    run_id: str | None


@dataclass(frozen=True)
class SweepEnv:
    """What the sweep is run with: fixed once built."""

    spec: SweepSpec
    paths: Paths
    study: Study
    budget_trials: int
    timeout_s: float
    emit: Callable[[Event], None]
    resume: bool
    policy: ProposalPolicy
    executor: Executor
    clock: Clock = field(default_factory=RealClock)
    """The time every verb reads (real, or the model-backed executor's virtual clock)."""


@dataclass
class Context:
    env: SweepEnv
    tracker: Tracker | None = None
    parent_run_id: str | None = None
    progress: Progress = field(default_factory=Progress)
    interrupts: Interrupts = field(default_factory=Interrupts)
    started_at: float = -1.0
    """When the sweep first started (kept across --resume): the simulator's drift epoch, `sweep status`."""
    run_started: float = -1.0
    """When this invocation started (the clock's monotonic seconds): the wall-time budget counts from here."""
    abort_reason: str = ""
    """Set once the trials in flight are being aborted, and why."""
    in_flight: dict[int, InFlight] = field(default_factory=dict)
    outcomes: list[TrialOutcome] = field(default_factory=list)
    waiting_for_baseline: list[tuple[TrialOutcome, str | None]] = field(default_factory=list)
    overhead: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Per-trial orchestration timings (bench/orchestration_overhead.py reads overhead.jsonl)."""
    requeued: set[int] = field(default_factory=set)
    reserve: ConfirmationPlan | None = None
    """The confirmation held back from the search (sweep.schedule), planned before the first launch
    and again as each trial's measured seconds arrive; None until planned."""
    screen_reference: OutputsRecord | None = None
    """The correctness screen's reference capture once found (sweep._screen.reference): read from disk once."""

    def __post_init__(self) -> None:
        if self.started_at < 0:
            self.started_at = self.clock.time()
        if self.run_started < 0:
            self.run_started = self.clock.monotonic()

    @property
    def spec(self) -> SweepSpec:
        return self.env.spec

    @property
    def paths(self) -> Paths:
        return self.env.paths

    @property
    def study(self) -> Study:
        return self.env.study

    @property
    def budget_trials(self) -> int:
        return self.env.budget_trials

    @property
    def timeout_s(self) -> float:
        return self.env.timeout_s

    @property
    def emit(self) -> Callable[[Event], None]:
        return self.env.emit

    @property
    def resume(self) -> bool:
        return self.env.resume

    @property
    def policy(self) -> ProposalPolicy:
        return self.env.policy

    @property
    def executor(self) -> Executor:
        return self.env.executor

    @property
    def clock(self) -> Clock:
        return self.env.clock

    def elapsed(self) -> float:
        """Seconds since this invocation started, on the sweep's clock."""
        return self.clock.monotonic() - self.run_started

    def remaining(self) -> float:
        """Seconds left of the wall-time budget (negative once past it)."""
        return self.timeout_s - self.elapsed()

    @property
    def tracking_uri(self) -> str:
        """The experiment's tracking.uri, else MLFLOW_TRACKING_URI, else sqlite in the work directory."""
        return self.spec.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI") or self.paths.mlflow_url

    @property
    def track(self) -> Tracker:
        if self.tracker is None:
            raise RuntimeError("the sweep's tracker is opened by Sweep.run() first")
        return self.tracker

    @property
    def resume_hint(self) -> str:
        return f"`sweep run {self.spec.source or 'EXPERIMENT'} --workdir {self.paths.root} --resume`"

    def deadline_passed(self) -> bool:
        return self.elapsed() >= self.timeout_s

    def _schedule_lines(self) -> list[str]:
        """The plan of the rest of the night, for sweep.json (empty before it is planned)."""
        if self.reserve is None or not self.spec.promotion.max_rounds:
            return []
        held = self.reserve.seconds
        head = (
            f"search until about {max(self.timeout_s - held, 0) / 3600:.2f} h of {self.timeout_s / 3600:.2f} h "
            f"(elapsed {self.elapsed() / 3600:.2f} h), then the confirmation: {held / 3600:.2f} h held back"
        )
        return [head, *self.reserve.lines()]

    def write_state(self, status: str) -> None:
        p = self.progress
        state = SweepState(
            experiment=self.spec.name,
            status=status,
            pid=os.getpid(),
            updated_at=self.clock.time(),
            started_at=self.started_at,
            budget_trials=self.budget_trials,
            timeout_s=self.timeout_s,
            optuna_storage=without_password(self.paths.optuna_url),
            direction=self.spec.objective.direction,
            parent_run_id=self.parent_run_id,
            tracking_uri=without_password(self.tracking_uri),
            mlflow_experiment=self.spec.tracking.experiment or self.spec.name,
            model_name=self.spec.promotion.model_name,
            alias=self.spec.promotion.alias,
            in_flight=sorted(f.spec.number for f in self.in_flight.values()),
            launched=p.launched,
            finished=p.finished,
            complete=p.complete,
            failed=p.failed,
            skipped=p.skipped,
            failures=dict(p.failures),
            best=Best(number=p.best_number, value=p.best_value, params=p.best_params),
            stop_reason=p.stop_text,
            stop_kind=p.stop.kind if p.stop else None,
            baselines=p.baselines,
            objective=self.spec.objective.metric,
            schedule=self._schedule_lines(),
        )
        write_json(self.paths.state, state.model_dump(mode="json"))
