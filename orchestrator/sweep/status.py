"""`sweep status` from another shell: progress read from sweep.json and the Optuna storage.

Imports neither Ray nor MLflow, so it answers in a moment while a sweep runs.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from orchestrator.errors import StateFileError, SweepError
from orchestrator.records import ParamValue, TrialRole
from orchestrator.results import cost, select
from orchestrator.search.sampler import OUTPUTS_CHANGED_ATTR
from orchestrator.search.study import TrialView, read_only
from orchestrator.sweep._workdir import Paths, adopt, check_databases, origin_of
from orchestrator.sweep.state import (
    ConfirmationRun,
    Event,
    ExecutorReady,
    SweepState,
    SweepSummary,
    TrackingWait,
    TrialFinished,
    TrialLaunched,
)
from orchestrator.verdict.value import Verdict

log = logging.getLogger("sweep")


@dataclass(frozen=True)
class BestSoFar:
    number: int
    value: float
    speedup: float | None
    """The ratio over the baseline kept in the study when the trial was told, when one was measured."""
    params: dict[str, ParamValue]
    """The knobs that are set (None values left out)."""

    @property
    def speedup_pct(self) -> float | None:
        """The speed-up as MLflow, results.csv and the report show it (select.speedup_pct)."""
        return None if self.speedup is None else select.speedup_pct(self.speedup)


@dataclass(frozen=True)
class StatusReport:
    """What `sweep status` shows, counted from the Optuna storage (skipped proposals, interrupted
    trials and confirmation runs are not trials)."""

    experiment: str
    status: str
    driver_alive: bool
    """The driver that wrote sweep.json still runs."""
    budget_trials: int
    launched: int
    complete: int
    failed: int
    running: int
    skipped: int
    failures: dict[str, int]
    objective: str
    best: BestSoFar | None
    baseline: float | None
    """The latest baseline measurement."""
    baselines: list[tuple[float, float]]
    elapsed_s: float
    eta_s: float | None
    fingerprints: dict[str, list[str]]
    """Hosts whose fingerprint changed during the sweep -> the hashes seen."""
    stop_reason: str
    phase: str = "search"
    """search | confirming round k of max | done."""
    verdict: str | None = None
    """The promotion's verdict in words, once the sweep is done."""
    env_file: str | None = None
    """The champion's env file, once promoted."""
    decision: Verdict | None = None
    """The finished sweep's Verdict (summary.json), read once; None while it runs."""
    remaining: cost.Remaining | None = None
    """Trials that still fit the wall time, from the measured start-up and benchmark seconds."""
    schedule: list[str] = field(default_factory=list)
    """The night as the driver last planned it (sweep.json's schedule)."""


def phase_of(workdir: Path, status: str) -> str:
    """What the sweep is doing: `search`, `confirming round k of max` (from the confirmation folders and
    the experiment's promotion.max_rounds) or `done`."""
    if status != "running":
        return "done"
    rounds = {p.name.split("-", 1)[0] for p in (workdir / "confirm").glob("*") if p.is_dir()}
    if not rounds:
        return "search"
    try:
        promotion = json.loads((workdir / "experiment.json").read_text()).get("promotion", {})
        limit = promotion.get("max_rounds") or promotion.get("confirm_repeats")
    except (OSError, ValueError, AttributeError):
        limit = None
    return f"confirming round {len(rounds)}" + (f" of {limit}" if limit else "")


def verdict_of(workdir: Path) -> Verdict | None:
    """The finished sweep's Verdict (summary.json), or None before the end or where it cannot be read."""
    try:
        summary = SweepSummary.model_validate_json((workdir / "summary.json").read_bytes())
    except (OSError, ValidationError):
        return None
    return summary.the_verdict()


def _pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_state(workdir: Path) -> SweepState:
    """The sweep's sweep.json, its work-directory databases resolved against `workdir` (a moved or copied
    work directory reads its own optuna.db and mlflow.db, never the original's); SweepError when the
    directory holds no readable sweep."""
    path = Path(workdir) / "sweep.json"
    try:
        state = SweepState.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise SweepError(
            f"{workdir}: no sweep here (sweep.json missing); pass the --workdir `sweep run` used"
        ) from None
    except IsADirectoryError:
        raise StateFileError(
            f"{path} is a directory, not the sweep's state file; remove it (the study in optuna.db "
            "keeps the trials) and run `sweep run --resume` to write it again"
        ) from None
    except OSError as exc:
        raise StateFileError(
            f"{path} cannot be read ({exc.strerror or exc}); check its permissions and the disk"
        ) from None
    except ValidationError as exc:
        raise StateFileError(
            f"{path} is not a sweep state file ({exc.errors()[0]['msg']}); it was cut short or "
            "overwritten: `sweep run --resume` with the same experiment writes it again"
        ) from None
    state = relocated(state, Path(workdir))
    if state.optuna_storage == f"sqlite:///{Path(workdir).resolve() / 'optuna.db'}" or not state.optuna_storage:
        check_databases(Path(workdir), ("optuna.db",))
    return state


_OWN_FILES = {"optuna_storage": "optuna.db", "tracking_uri": "mlflow.db"}


def moved_from(workdir: Path) -> str | None:
    """A line saying where a moved or copied work directory came from (its sweep.json names another
    folder's databases), for the console; None when it is where it ran."""
    origin = origin_of(workdir)
    if origin is None:
        return None
    how = "copied" if (origin / "sweep.json").exists() else "moved"
    return f"{workdir} was {how} from {origin}: its own optuna.db and mlflow.db are read, never the original's"


def relocated(state: SweepState, workdir: Path) -> SweepState:
    """`state` with the sqlite files it names inside its recorded work directory resolved in `workdir`.

    sweep.json records absolute URLs (sqlite:////old/place/optuna.db): after `mv` or `cp -r` they name the
    original's databases. `_workdir.adopt` says where the directory came from and points its own mlflow.db
    at its own artifacts; here the copy in `workdir` of each of the original's own files is read instead.
    """
    origin = adopt(workdir)
    if origin is None:
        return state
    here = workdir.resolve()
    changes = {
        key: f"sqlite:///{here / name}"
        for key, name in _OWN_FILES.items()
        if getattr(state, key) == f"sqlite:///{origin / name}" and (here / name).is_file()
    }
    return state.model_copy(update=changes)


def status_report(workdir: Path, storage: str | None = None) -> StatusReport:
    """Progress of the sweep in `workdir`, read from sweep.json and the Optuna storage (no MLflow needed)."""
    workdir = Path(workdir)
    state = read_state(workdir)
    trials = _study_trials(workdir, state, storage)
    finished = _finished(trials)
    complete = [t for t in finished if t.state == "COMPLETE" and t.values]
    running = [t for t in trials if t.state == "RUNNING"]
    baselines = _baselines(complete, state)
    elapsed = _elapsed_s(state)
    phase = phase_of(workdir, state.status)
    eta, remaining = _forecast(state, finished, running, elapsed, phase)
    decision = _decision(workdir, state.status, phase)
    shown = decision if phase == "done" else None
    return StatusReport(
        experiment=state.experiment,
        status=state.status,
        driver_alive=_driver_alive(state),
        budget_trials=state.budget_trials,
        launched=len(finished) + len(running),
        complete=len(complete),
        failed=len(finished) - len(complete),
        running=len(running),
        skipped=sum(1 for t in trials if t.attrs.get("skipped")),
        failures=_failures_by_kind(finished),
        objective=state.objective,
        best=_best_so_far(complete, state.direction),
        baseline=max(baselines, key=lambda tv: tv[0])[1] if baselines else None,
        baselines=baselines,
        elapsed_s=elapsed,
        eta_s=eta,
        fingerprints=_changed_fingerprints(finished),
        stop_reason=state.stop_reason,
        schedule=list(state.schedule),
        phase=phase,
        verdict=shown.text if shown is not None else None,
        env_file=shown.env_file if shown is not None and shown.promoted else None,
        decision=decision,
        remaining=remaining,
    )


def _decision(workdir: Path, status: str, phase: str) -> Verdict | None:
    """The finished sweep's Verdict, read once; None while it runs (its summary.json would be a resumed
    run's old one)."""
    return verdict_of(workdir) if status != "running" or phase == "done" else None


def _study_trials(workdir: Path, state: SweepState, storage: str | None) -> list[TrialView]:
    """Every trial of the sweep's study (none when the storage holds no such study yet); SweepError when
    the storage needs a password that was never written down."""
    url = storage or state.optuna_storage or Paths(workdir.resolve()).optuna_url
    if ":***@" in url:
        raise SweepError(
            f"{workdir}: the sweep's Optuna storage needs a password that is never written down; "
            f"pass --storage URL or set SWEEP_OPTUNA_STORAGE"
        )
    read = read_only(url, state.experiment)
    trials, _ = read if read else ([], {})
    return trials


def _finished(trials: list[TrialView]) -> list[TrialView]:
    """The finished trials (complete or failed) that status counts: not skipped proposals, interrupted
    trials or confirmation runs."""
    counted = [
        t
        for t in trials
        if not t.attrs.get("skipped")
        and t.attrs.get("failure_kind") != "interrupted"
        and t.role != TrialRole.confirm.value
    ]
    return [t for t in counted if t.state in ("COMPLETE", "FAIL")]


def _driver_alive(state: SweepState) -> bool:
    """The sweep is running and the driver that wrote sweep.json still runs."""
    return _pid_alive(state.pid) and state.status == "running"


def _baselines(complete: list[TrialView], state: SweepState) -> list[tuple[float, float]]:
    """(time, objective value) of every baseline measurement: sweep.json's list, which holds the search's
    baseline trials and the confirmation rounds' baselines (the drift figure's), or the study's baseline
    trials where sweep.json holds fewer (a driver killed between telling the study and writing sweep.json)."""
    trials = [(t.end or 0.0, t.values[0]) for t in complete if t.role == TrialRole.baseline.value and t.values]
    return list(state.baselines) if len(state.baselines) >= len(trials) else trials


def recorded_speedups(trials: list[TrialView]) -> dict[int, float]:
    """Trial number -> the speed-up ratio the driver kept in the study when it told the trial
    (`speedup_vs_baseline`): the one figure MLflow, results.csv, the report and status show."""
    return {
        t.number: float(t.attrs["speedup_vs_baseline"])
        for t in trials
        if isinstance(t.attrs.get("speedup_vs_baseline"), (int, float))
    }


def _elapsed_s(state: SweepState) -> float:
    """Seconds since the sweep started: until now while it runs, until its last update once it ended;
    never below 0."""
    # A clock stepped back (NTP, another host's sweep.json) must not show negative time or ETA.
    return max((state.updated_at if state.status != "running" else time.time()) - state.started_at, 0.0)


def _forecast(
    state: SweepState, finished: list[TrialView], running: list[TrialView], elapsed: float, phase: str
) -> tuple[float | None, cost.Remaining | None]:
    """(ETA in seconds at the pace so far, trials that still fit the wall time left), while the search
    runs under a trial budget; the second only with a wall time; (None, None) otherwise."""
    budget = state.budget_trials
    if not (finished and phase == "search" and budget):
        return None, None
    eta = max(budget - len(finished), 0) * (elapsed / max(len(finished), 1))
    if not state.timeout_s:
        return eta, None
    # Measured start-up + benchmark seconds per trial: how many more fit the wall time left.
    return eta, cost.remaining_trials(
        _timings(finished), left_s=state.timeout_s - elapsed, concurrent=max(len(running), 1)
    )


def _timings(finished: list[TrialView]) -> list[dict[str, float]]:
    """The measured server start-up and benchmark seconds of the finished trials that recorded both."""
    return [
        {"server_start": float(t.attrs["server_start_s"]), "bench": float(t.attrs["bench_s"])}
        for t in finished
        if "server_start_s" in t.attrs and "bench_s" in t.attrs
    ]


def _failures_by_kind(finished: list[TrialView]) -> dict[str, int]:
    """Failed trials counted by failure kind (`unknown` where none was recorded)."""
    return dict(Counter(t.attrs.get("failure_kind", "unknown") for t in finished if t.state == "FAIL"))


def _best_so_far(complete: list[TrialView], direction: str) -> BestSoFar | None:
    """The best completed search trial in the objective's direction, with its set knobs; None before one."""
    sign = 1.0 if direction == "maximize" else -1.0
    searched = [
        t
        for t in complete
        if t.role == TrialRole.search.value and not t.attrs.get("skipped") and not t.attrs.get(OUTPUTS_CHANGED_ATTR)
    ]  # refused by the correctness screen: never the best
    best = max(searched, key=lambda t: sign * t.values[0] if t.values else 0.0, default=None)
    if best is None or not best.values:
        return None
    return BestSoFar(
        number=best.number,
        value=best.values[0],
        speedup=best.attrs.get("speedup_vs_baseline"),
        params={k: v for k, v in best.params.items() if v is not None},
    )


def _changed_fingerprints(finished: list[TrialView]) -> dict[str, list[str]]:
    """Hosts whose fingerprint changed during the sweep -> the hashes seen, sorted (only real changes)."""
    per_node: dict[str, set[str]] = {}
    for t in finished:
        if t.attrs.get("fingerprint_hash"):
            per_node.setdefault(str(t.attrs.get("node", "")).split("/")[0], set()).add(t.attrs["fingerprint_hash"])
    return {node: sorted(h) for node, h in per_node.items() if len(h) > 1}


@dataclass
class LiveProgress:
    """The live line under `sweep run`'s output: trials done of the budget, those in flight with their own
    elapsed time, best so far, an ETA from measured durations, and the phase. Fed the sweep's events."""

    budget: int
    objective: str
    slots: int = 1
    phase: str = "search"
    finished: int = 0
    best: float | None = None
    maximize: bool = True
    started: dict[int, float] = field(default_factory=dict)
    durations: list[float] = field(default_factory=list)

    def on(self, event: Event, now: float) -> None:
        """Take one event; `now` is a monotonic clock reading."""
        if isinstance(event, ExecutorReady):
            self.slots = max(event.slots, 1)
        elif isinstance(event, TrialLaunched):
            self.started[event.number] = now
        elif isinstance(event, TrialFinished):
            o = event.outcome
            self.started.pop(o.number, None)
            self.finished += 1
            if o.started_at and o.finished_at:
                self.durations.append(max(o.finished_at - o.started_at, 0.0))
            value = getattr(o.metrics, self.objective, None) if o.metrics is not None else None
            if (
                o.role is TrialRole.search
                and value is not None
                and (self.best is None or (value > self.best if self.maximize else value < self.best))
            ):
                self.best = float(value)
        elif isinstance(event, ConfirmationRun):
            self.phase = f"confirmation round {event.round} of {event.of}"
        elif isinstance(event, TrackingWait):
            self.phase = "promotion (waiting for MLflow)"

    def line(self, now: float) -> str:
        """One line: `search · 7/20 done · in flight #8 12s, #9 3s · best 72.6 decode_tok_s · ETA 4 min`."""
        parts = [self.phase, f"{self.finished}/{self.budget} done"]
        if self.started:
            parts.append("in flight " + ", ".join(f"#{n} {now - t:.0f}s" for n, t in sorted(self.started.items())))
        if self.best is not None:
            parts.append(f"best {self.best:.1f} {self.objective}")
        if self.phase == "search" and self.durations:
            left = max(self.budget - self.finished, 0)
            eta = left * (sum(self.durations) / len(self.durations)) / self.slots
            parts.append(f"ETA {eta / 60:.0f} min" if eta >= 90 else f"ETA {eta:.0f} s")
        return " · ".join(parts)
