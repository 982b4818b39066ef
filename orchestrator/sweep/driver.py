"""The sweep loop: keep N trials in flight, ask/tell, budgets, failures, baselines, resume, promotion.

One process owns the study and MLflow. Workers get a TrialSpec and return a TrialOutcome; the outcome
is written to trials/<n>/outcome.json before Optuna is told and before MLflow is logged, so a driver
killed at any moment loses nothing measured: on --resume a RUNNING trial with an outcome file is
told from the file, one without is closed as `interrupted` and its parameters are measured again once.
Resume also ends what the killed driver left running (its local Ray processes, listed in
ray-processes.json, and trial servers, by their pid files) and logs to MLflow what never got there.

Ctrl-C (or SIGTERM) once: nothing new is launched and the trials in flight finish; twice: their
servers are killed and they are closed as interrupted. Either way `--resume` continues the study.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.config.experiment import SweepSpec
from orchestrator.errors import SweepError
from orchestrator.execute import ray_actor
from orchestrator.records import FailureKind, TrialOutcome, TrialRole, TrialSpec, TrialStatus
from orchestrator.results import select
from orchestrator.search import space as sp
from orchestrator.search.study import StorageError, Study, TrialView
from orchestrator.trial import plan as planner
from orchestrator.trial import server as srv
from orchestrator.trial.runner import write_json

log = logging.getLogger("sweep")

MAX_SKIPPED_PROPOSALS = 200
"""Consecutive proposals that need no launch (infeasible, already measured) before the space counts as exhausted."""


MLFLOW_WAIT_AT_END_S = 60.0
"""At the end, how long results waiting in the outbox wait for MLflow to return before promotion gives up."""


_NOT_THE_PARAMETERS = frozenset({FailureKind.worker_lost, FailureKind.port_in_use, FailureKind.internal_error})
"""Failure kinds that say nothing about the configuration: never blacklisted, measured again once."""


class _RedactSecrets(logging.Filter):
    """sweep.log never holds a secret from the environment, whatever a message quotes."""

    def filter(self, record: logging.LogRecord) -> bool:
        from orchestrator import redact

        record.msg = redact.redact_text(record.getMessage())
        record.args = ()
        return True


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else "an exception"




@dataclass
class Progress:
    """Counters the terminal display and `sweep status` show."""

    launched: int = 0
    finished: int = 0
    complete: int = 0
    failed: int = 0
    consecutive_failures: int = 0
    skipped: int = 0
    consecutive_skips: int = 0
    failures: Counter = field(default_factory=Counter)
    best_number: int | None = None
    best_value: float | None = None
    best_params: dict[str, Any] = field(default_factory=dict)
    baselines: list[tuple[float, float]] = field(default_factory=list)
    stop_reason: str = ""
    stopped_by_failure: bool = False
    """True when the sweep ended on a failure rule, a failed baseline or an interruption (exit code 1),
    not on a budget."""


@dataclass(frozen=True)
class Paths:
    root: Path
    storage: str | None = None
    """An Optuna RDB URL (postgresql://...) instead of the work directory's sqlite file."""

    @property
    def optuna_url(self) -> str:
        return self.storage or f"sqlite:///{self.root / 'optuna.db'}"

    @property
    def mlflow_url(self) -> str:
        return f"sqlite:///{self.root / 'mlflow.db'}"

    @property
    def state(self) -> Path:
        return self.root / "sweep.json"

    @property
    def ray_processes(self) -> Path:
        """The local Ray instance's processes, for a resumed driver to end if this one is killed."""
        return self.root / "ray-processes.json"

    def trial_dir(self, number: int) -> Path:
        return self.root / "trials" / f"{number:04d}"

    def confirm_dir(self, i: int, who: str) -> Path:
        return self.root / "confirm" / f"{i:02d}-{who}"


def _without_password(url: str) -> str:
    """A storage URL safe to write down: postgresql://user:secret@host/db -> postgresql://user:***@host/db."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _duration(seconds: float) -> str:
    """30 s, 45 min, 8.0 h: a budget the way a user wrote it, roughly."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def default_workdir(spec: SweepSpec) -> Path:
    return Path("runs") / spec.name


def objective_values(spec: SweepSpec, outcome: TrialOutcome) -> list[float] | None:
    m = outcome.metrics
    if m is None:
        return None
    names = [spec.objective.metric] + ([spec.objective.secondary] if spec.objective.secondary else [])
    values = [getattr(m, n) for n in names]
    return None if any(v is None for v in values) else [float(v) for v in values]


def _directions(spec: SweepSpec) -> list[str]:
    d = [spec.objective.direction]
    if spec.objective.secondary:
        d.append(spec.objective.secondary_direction)
    return d


class Sweep:
    """One sweep of one experiment in one work directory."""

    def __init__(
        self,
        spec: SweepSpec,
        workdir: Path,
        *,
        ray_address: str | None = None,
        storage: str | None = None,
        resume: bool = False,
        n_trials: int | None = None,
        timeout_s: float | None = None,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
    ):
        self.spec = spec
        self.paths = Paths(Path(workdir).resolve(), storage)
        self.ray_address = ray_address
        self.resume = resume
        self.budget_trials = n_trials or spec.budget.trials
        self.timeout_s = timeout_s or spec.budget.wall_time
        self.on_event = on_event or (lambda kind, data: None)
        self.progress = Progress()
        self.study = Study(self.paths.optuna_url, spec.name, spec.space, spec.sampler, _directions(spec))
        self.tracker = None
        self.parent_run_id: str | None = None
        self.started_at = time.time()
        """When the sweep first started (kept across --resume): the simulator's drift epoch, `sweep status`."""
        self._run_started = time.monotonic()
        """When this invocation started: the wall-time budget counts from here."""
        self._lock_file = None
        self._stop = 0  # Ctrl-C presses: 1 finish in-flight trials, 2 abort them now
        self._announced = 0  # presses already acted on by the loop (the signal handler only counts)
        self._signal = "Ctrl-C"  # how the last press came: Ctrl-C or SIGTERM
        self._abort_reason = ""  # set: trials in flight are being aborted, and why
        self._in_flight: dict[Any, tuple[Any, TrialSpec, str | None]] = {}
        self._actors: list[Any] = []
        self._idle: list[Any] = []
        self._outcomes: list[TrialOutcome] = []
        self._waiting_for_baseline: list[tuple[TrialOutcome, str | None]] = []
        self._overhead: dict[int, dict[str, Any]] = {}
        """Per-trial orchestration timings (bench/orchestration_overhead.py reads overhead.jsonl)."""
        self._keys: dict[str, tuple[int, str]] = {}
        self._requeued: set[int] = set()

    # ------------------------------------------------------------------ setup

    def _lock(self) -> None:
        self.paths.root.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.paths.root / ".lock", "w")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SweepError(f"{self.paths.root}: another `sweep run` is using this work directory; "
                             f"wait for it, or pass --workdir to start a separate sweep") from None

    def _setup_logging(self) -> None:
        handler = logging.FileHandler(self.paths.root / "sweep.log", encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler.addFilter(_RedactSecrets())
        # The driver's own log and the package's modules (tracking's outbox warnings among them).
        for logger in (log, logging.getLogger("orchestrator")):
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
        self._log_handler = handler

    def _open(self) -> None:
        from orchestrator.tracking.tracker import Tracker

        try:
            existed = self.study.exists()
        except StorageError as exc:
            raise SweepError(str(exc)) from None
        if existed and not self.resume:
            raise SweepError(
                f"{self.paths.root} already holds a sweep of {self.spec.name!r}; "
                f"1) pass --resume to continue it, 2) pass --workdir DIR to start a new one, "
                f"or 3) delete the directory")
        if self.resume and not existed:
            raise SweepError(f"{self.paths.root}: nothing to resume (no study {self.spec.name!r} in optuna.db); "
                             f"run without --resume to start")
        self.study.open()
        write_json(self.paths.root / "experiment.json", self.spec.model_dump(mode="json"))
        if existed:
            self.started_at = float(self.study.get_attr("sweep_started_at", self.started_at))
        else:
            self.study.set_attr("sweep_started_at", self.started_at)
        uri = self.tracking_uri
        self.tracker = Tracker(uri, self.spec.tracking.experiment or self.spec.name,
                               outbox_dir=self.paths.root,
                               artifact_location=(self.paths.root / "mlartifacts").as_uri()
                               if uri == self.paths.mlflow_url else None)
        self.parent_run_id = self.tracker.start_sweep(
            run_name=f"sweep-{time.strftime('%Y%m%d-%H%M%S', time.localtime(self.started_at))}",
            params={"experiment": self.spec.name, "engine": self.spec.engine, "space": self.spec.space.name,
                    "sampler": self.spec.sampler.kind, "budget_trials": self.budget_trials,
                    "concurrent_trials": self.spec.budget.concurrent_trials, "objective": self.spec.objective.metric,
                    "sglang_version": self.spec.sglang_version, "tp": self.spec.server.tp},
            tags={"sweep.workdir": str(self.paths.root), "sweep.engine": self.spec.engine},
            resume_run_id=self.study.get_attr("parent_run_id"),
        )
        self.study.set_attr("parent_run_id", self.parent_run_id)
        self._write_state("running")

    @property
    def tracking_uri(self) -> str:
        """The experiment's tracking.uri, else MLFLOW_TRACKING_URI, else sqlite in the work directory."""
        return self.spec.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI") or self.paths.mlflow_url

    def _write_state(self, status: str) -> None:
        p = self.progress
        write_json(self.paths.state, {
            "experiment": self.spec.name, "status": status, "pid": os.getpid(), "updated_at": time.time(),
            "started_at": self.started_at, "budget_trials": self.budget_trials, "timeout_s": self.timeout_s,
            "optuna_storage": _without_password(self.paths.optuna_url), "direction": self.spec.objective.direction,
            "parent_run_id": self.parent_run_id, "tracking_uri": _without_password(self.tracking_uri),
            "mlflow_experiment": self.spec.tracking.experiment or self.spec.name,
            "model_name": self.spec.promotion.model_name, "alias": self.spec.promotion.alias,
            "in_flight": sorted(s.number for _, s, _ in self._in_flight.values()),
            "launched": p.launched, "finished": p.finished, "complete": p.complete, "failed": p.failed,
            "skipped": p.skipped, "failures": dict(p.failures), "best": {"number": p.best_number,
            "value": p.best_value, "params": p.best_params}, "stop_reason": p.stop_reason,
            "baselines": p.baselines, "objective": self.spec.objective.metric,
        })

    # ------------------------------------------------------------------ resume

    def _reap_previous_driver(self) -> None:
        """End what a killed driver left behind: its local Ray processes and its trial servers.

        We hold the work directory's lock, so the driver that wrote these records is gone.
        """
        record = self.paths.ray_processes
        if record.exists():
            try:
                data = json.loads(record.read_text())
            except ValueError:
                data = {}
            if data.get("driver_pid") != os.getpid():
                ended = ray_actor.reap_processes(data.get("processes", []))
                if ended:
                    log.info("ended %d Ray process(es) the previous driver left: %s", len(ended), ", ".join(ended))
            record.unlink(missing_ok=True)
        pid_files = [*self.paths.root.glob("trials/*/server.pid"), *self.paths.root.glob("confirm/*/server.pid")]
        for pid_file in sorted(pid_files):
            if reaped := srv.reap_orphan(pid_file.parent):
                log.info(reaped)

    def _recover(self) -> None:
        """Rebuild counters from the storage, then settle the trials a killed driver left RUNNING."""
        trials = self.study.trials()
        for t in trials:
            if t.state in ("COMPLETE", "FAIL"):
                self._count_existing(t)
        replayed, pending = self.tracker.replay_outbox()
        if replayed or pending:
            log.info("MLflow outbox: replayed %d, still pending %d", replayed, pending)
        if not pending:
            self._reconcile_mlflow(trials)
        for t in trials:
            if t.state == "RUNNING":
                self._recover_running(t)

    def _recover_running(self, t: TrialView) -> None:
        """A trial the killed driver never settled: told from its outcome.json if the worker wrote
        one, else closed as interrupted (Optuna FAIL, MLflow KILLED) and queued to be measured again."""
        tdir = self.paths.trial_dir(t.number)
        run_id = t.attrs.get("mlflow_run_id") or None
        outcome_file = tdir / "outcome.json"
        if outcome_file.exists():
            outcome = TrialOutcome.model_validate_json(outcome_file.read_text())
            log.info("trial %d finished before the driver died; telling it from outcome.json", t.number)
            self.progress.launched += 1
            self._record(outcome, run_id)
            return
        log.info("trial %d was running when the driver died: closing it as interrupted", t.number)
        self._record(TrialOutcome(
            number=t.number, params=sp.complete(self.spec.space, t.params), role=TrialRole(t.role),
            status=TrialStatus.FAILED, failure_kind=FailureKind.interrupted,
            reason="the driver stopped while this trial ran; its parameters are measured again",
            trial_dir=str(tdir), started_at=t.start or 0.0, finished_at=time.time()), run_id)

    def _count_existing(self, t: TrialView) -> None:
        p = self.progress
        kind = t.attrs.get("failure_kind")
        if t.attrs.get("skipped") or kind == FailureKind.interrupted.value:
            return
        key = sp.key(sp.complete(self.spec.space, t.params))
        if t.role == TrialRole.baseline.value and t.state == "COMPLETE" and t.values:
            p.baselines.append(((t.end or 0.0), float(t.values[0])))
        if t.state == "COMPLETE":
            p.complete += 1
            self._keys.setdefault(key, (t.number, "COMPLETE"))
            self._update_best(t.number, float(t.values[0]) if t.values else None, t.params, t.role)
        else:
            p.failed += 1
            p.failures[kind or "unknown"] += 1
            self._keys.setdefault(key, (t.number, "FAIL"))
        p.launched += 1
        p.finished += 1
        outcome_file = self.paths.trial_dir(t.number) / "outcome.json"
        if outcome_file.exists():
            self._outcomes.append(TrialOutcome.model_validate_json(outcome_file.read_text()))

    def _reconcile_mlflow(self, trials: list[TrialView]) -> None:
        """Log the finished trials MLflow lacks: a driver killed between telling Optuna and logging."""
        from orchestrator.tracking.tracker import TrackingError

        try:
            runs = self.tracker.child_runs(self.parent_run_id)
        except TrackingError as exc:
            log.warning("cannot compare MLflow with the study: %s", exc)
            return
        logged = {(int(n), str(r)) for n, r, st in zip(runs.get("trial_number", []), runs.get("role", []),
                                                       runs.get("status", [])) if st != "RUNNING"}
        speedups = {t.number: t.attrs.get("speedup_vs_baseline") for t in trials}
        for o in self._outcomes:
            if (o.number, o.role.value) not in logged:
                log.info("trial %d is in the study but not in MLflow: logging it now", o.number)
                extra = {"speedup_vs_baseline": speedups[o.number]} if speedups.get(o.number) else {}
                self.tracker.log_trial(self.parent_run_id, o, run_id=None, extra_metrics=extra,
                                       extra_tags={"sweep.engine": self.spec.engine})

    # ------------------------------------------------------------------ the loop

    def run(self) -> dict[str, Any]:
        """Run (or resume) the sweep to its end; return the final summary."""
        self._lock()
        self._setup_logging()
        try:
            self._reap_previous_driver()
            self._open()
            self._recover()
            if not self._baseline_measured() and not self._baseline_queued():
                self.study.enqueue(sp.baseline_params(self.spec.space), {"role": TrialRole.baseline.value})
            self._install_signals()
            self._start_ray()
            self._install_signals()  # ray.init() puts its own SIGTERM handler (sys.exit) in place
            self._loop()
            return self._finish()
        finally:
            self._restore_signals()
            ray_actor.shutdown()
            self.paths.ray_processes.unlink(missing_ok=True)
            if hasattr(self, "_log_handler"):
                log.removeHandler(self._log_handler)
                logging.getLogger("orchestrator").removeHandler(self._log_handler)
                self._log_handler.close()

    def _baseline_measured(self) -> bool:
        return any(o.role is TrialRole.baseline and o.status is TrialStatus.COMPLETE for o in self._outcomes)

    def _baseline_queued(self) -> bool:
        return any(t.state == "WAITING" and t.role == TrialRole.baseline.value for t in self.study.trials())

    def _start_ray(self) -> None:
        tp = self.spec.server.tp
        n = self.spec.budget.concurrent_trials
        if self.ray_address:
            try:
                info = ray_actor.connect(self.ray_address)
            except ray_actor.ClusterUnreachable as exc:
                raise SweepError(str(exc)) from None
        else:
            logical = tp * n if self.spec.engine == "simulator" else None
            info = ray_actor.init_local(num_gpus=logical)
        gpus = ray_actor.cluster_gpus()
        if gpus < tp:
            raise SweepError(f"the Ray cluster has {gpus:g} GPUs but one trial needs server.tp={tp}; "
                             f"add GPUs/hosts or lower server.tp")
        slots = min(n, int(gpus // tp))
        if slots < n:
            log.warning("budget.concurrent_trials=%d but the cluster fits %d trials of tp=%d", n, slots, tp)
        self._actors = [ray_actor.new_actor(tp) for _ in range(slots)]
        self._idle = list(self._actors)
        if not self.ray_address:
            # GCS and raylet die with this process, but not all of their children do (actor.local_processes).
            write_json(self.paths.ray_processes, {"driver_pid": os.getpid(),
                                                  "processes": ray_actor.local_processes()})
        log.info("Ray %s: %g GPUs, %d trial slot(s)", info.get("address"), gpus, slots)
        self.on_event("ray", {"address": info.get("address"), "gpus": gpus, "slots": slots})

    def _install_signals(self) -> None:
        def handler(signum, frame):
            # Only count here: printing from a signal handler can hit a reentrant write on stdout.
            self._stop += 1
            self._signal = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name

        old = signal.signal(signal.SIGINT, handler), signal.signal(signal.SIGTERM, handler)
        if not hasattr(self, "_old_sigint"):
            self._old_sigint, self._old_sigterm = old

    def _restore_signals(self) -> None:
        if hasattr(self, "_old_sigint"):
            signal.signal(signal.SIGINT, self._old_sigint)
            signal.signal(signal.SIGTERM, self._old_sigterm)

    def _act_on_interrupts(self) -> None:
        """First Ctrl-C (or SIGTERM): launch nothing more; second: abort the trials in flight."""
        while self._announced < min(self._stop, 2):
            self._announced += 1
            if self._announced == 1:
                self.progress.stopped_by_failure = True
                self.progress.stop_reason = (
                    f"interrupted ({self._signal}): no new trials launched, the trials in flight finished; "
                    f"continue with `sweep run {self.spec.source or 'EXPERIMENT'} --workdir {self.paths.root} --resume`")
            else:
                self.progress.stopped_by_failure = True
                self.progress.stop_reason = (
                    f"interrupted twice ({self._signal}): the trials in flight were aborted and will be measured "
                    f"again; continue with `sweep run {self.spec.source or 'EXPERIMENT'} --workdir {self.paths.root} --resume`")
                self._abort_in_flight(f"aborted by a second {self._signal}")
            self.on_event("interrupt", {"press": self._announced})

    def _abort_in_flight(self, reason: str) -> None:
        """Kill the servers of the trials in flight; their outcomes come back as interrupted."""
        if self._abort_reason:
            return
        self._abort_reason = reason
        for act, spec, _ in self._in_flight.values():
            log.warning("aborting trial %d: %s", spec.number, reason)
            act.abort.remote()  # runs beside run() in the actor (max_concurrency=2); not awaited

    def _deadline_passed(self) -> bool:
        return time.monotonic() - self._run_started >= self.timeout_s

    def _should_launch(self) -> bool:
        p = self.progress
        if self._stop or p.stop_reason:
            return False
        if p.launched >= self.budget_trials:
            p.stop_reason = f"trial budget reached ({self.budget_trials})"
            return False
        if self._deadline_passed():
            p.stop_reason = f"wall-time budget reached ({_duration(self.timeout_s)}); trials in flight finished"
            return False
        return True

    def _loop(self) -> None:
        while True:
            self._act_on_interrupts()
            while self._idle and self._should_launch():
                if not self._launch_next():
                    break
            if not self._in_flight:
                if not self._should_launch():
                    break
                continue
            done, _ = ray_actor.wait(list(self._in_flight), timeout_s=0.5)
            for ref in done:
                self._collect(ref)
            self.on_event("tick", {"progress": self.progress, "in_flight": self._in_flight_view()})

    def _in_flight_view(self) -> list[dict[str, Any]]:
        return [{"number": s.number, "role": s.role.value, "params": s.params}
                for _, s, _ in self._in_flight.values()]

    def _launch_next(self) -> bool:
        """Ask for a point and launch it, or settle it without a launch; False when nothing can be asked."""
        p = self.progress
        t_ask = time.perf_counter()
        asked = self.study.ask()
        if asked is None:
            p.stop_reason = "grid exhausted: every feasible point was measured"
            return False
        number, params, attrs = asked
        role = TrialRole(attrs.get("role", TrialRole.search.value))
        why = sp.infeasible_reason(params)
        if why is not None:
            self.study.tell_failed(number, {"failure_kind": FailureKind.infeasible.value, "reason": why,
                                            "skipped": True})
            log.info("trial %d infeasible, not launched: %s", number, why)
            return self._skipped()
        if role is TrialRole.search and self._settle_duplicate(number, sp.key(params)):
            return self._skipped()
        p.consecutive_skips = 0
        ask_s = time.perf_counter() - t_ask
        tdir = self.paths.trial_dir(number)
        spec = TrialSpec(number=number, params=params, role=role, repeats=self.spec.benchmark.repeats,
                         trial_dir=str(tdir), seed=self.spec.sampler.seed * 100_003 + number,
                         sweep_started_at=self.started_at, experiment=self.spec.model_dump(mode="json"))
        tdir.mkdir(parents=True, exist_ok=True)
        write_json(tdir / "spec.json", {"number": number, "role": role.value, "params": params})
        t_mlflow = time.perf_counter()
        run_id = self.tracker.start_trial(self.parent_run_id, number=number, params=params, role=role.value,
                                          tags={"sweep.engine": self.spec.engine})
        self._overhead[number] = {"number": number, "ask_s": ask_s, "mlflow_start_s": time.perf_counter() - t_mlflow}
        self.study.set_trial_attrs(number, {"role": role.value, "mlflow_run_id": run_id or "",
                                            "trial_dir": str(tdir)})
        act = self._idle.pop()
        self._overhead[number]["submitted_at"] = time.time()
        ref = act.run.remote(spec)
        self._in_flight[ref] = (act, spec, run_id)
        p.launched += 1
        log.info("trial %d launched (%s): %s", number, role.value,
                 {k: v for k, v in params.items() if v is not None})
        self.on_event("launch", {"number": number, "role": role.value, "params": params})
        self._write_state("running")
        return True

    def _settle_duplicate(self, number: int, key: str) -> bool:
        """Close a proposal whose parameters were measured already or are being measured; True if so.

        Nothing is measured twice: a repeat of a finished trial is told its result again (or its
        failure), a repeat of a trial in flight is dropped. Re-measures of interrupted trials too.
        """
        previous = self._keys.get(key)
        if previous is not None:
            prev_number, state = previous
            if state == "FAIL":
                self.study.tell_failed(number, {"failure_kind": "duplicate_of_failed", "skipped": True,
                                                "reason": f"same parameters as failed trial {prev_number}"})
            else:
                prev = self.study.trials()[prev_number]
                self.study.tell_complete(number, list(prev.values or ()), {"duplicate_of": prev_number,
                                                                          "skipped": True})
            return True
        running = next((s.number for _, s, _ in self._in_flight.values()
                        if s.role is TrialRole.search and sp.key(s.params) == key), None)
        if running is not None:
            self.study.tell_failed(number, {"failure_kind": "duplicate_of_running", "skipped": True,
                                            "reason": f"same parameters as trial {running}, in flight"})
            return True
        return False

    def _skipped(self) -> bool:
        p = self.progress
        p.skipped += 1
        p.consecutive_skips += 1
        if p.consecutive_skips >= MAX_SKIPPED_PROPOSALS:
            p.stop_reason = (f"search space exhausted: {MAX_SKIPPED_PROPOSALS} proposals in a row were "
                             f"infeasible or already measured")
            return False
        return True

    def _collect(self, ref) -> None:
        act, spec, run_id = self._in_flight.pop(ref)
        try:
            outcome, files = ray_actor.get(ref)
        except ray_actor.TaskError as exc:
            # A bug in the trial code, not a lost machine: keep the traceback, keep the actor.
            log.error("trial %d raised inside its worker:\n%s", spec.number, exc)
            outcome = TrialOutcome(number=spec.number, params=spec.params, role=spec.role,
                                   status=TrialStatus.FAILED, failure_kind=FailureKind.internal_error,
                                   reason=f"the trial raised {_last_line(str(exc))} (traceback in sweep.log)",
                                   trial_dir=spec.trial_dir, finished_at=time.time())
            files = {}
        except ray_actor.RayError as exc:
            outcome = TrialOutcome(number=spec.number, params=spec.params, role=spec.role,
                                   status=TrialStatus.FAILED, failure_kind=FailureKind.worker_lost,
                                   reason=f"the Ray worker running this trial was lost: {type(exc).__name__}",
                                   trial_dir=spec.trial_dir, finished_at=time.time())
            files = {}
            self._actors.remove(act)
            with contextlib.suppress(Exception):
                ray_actor.kill(act)
            act = ray_actor.new_actor(self.spec.server.tp)
            self._actors.append(act)
        timing = self._overhead.get(spec.number, {})
        collected_at = time.time()
        t_files = time.perf_counter()
        if self._abort_reason and outcome.status is not TrialStatus.COMPLETE:
            outcome = outcome.model_copy(update={"failure_kind": FailureKind.interrupted,
                                                 "reason": self._abort_reason})
        tdir = Path(spec.trial_dir)
        tdir.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():  # files from a worker on another host
            target = tdir / name
            # Same host: the file is already here, whole (the copy may be a tail of a large log).
            if not target.exists():
                target.write_bytes(data)
        if timing and outcome.started_at:
            timing.update(dispatch_s=max(outcome.started_at - timing.pop("submitted_at"), 0.0),
                          return_s=max(collected_at - outcome.finished_at, 0.0) if outcome.finished_at else 0.0,
                          files_s=time.perf_counter() - t_files)
        self._idle.append(act)
        if self._baseline_in_flight() and outcome.status is TrialStatus.COMPLETE:
            # Recorded once the baseline is, so its speed-up is known (outcome.json is already written).
            self._waiting_for_baseline.append((outcome, run_id))
            return
        self._record(outcome, run_id)
        if outcome.role is TrialRole.baseline:
            while self._waiting_for_baseline:
                self._record(*self._waiting_for_baseline.pop(0))

    def _baseline_in_flight(self) -> bool:
        """The first baseline is still being measured (so no trial has a speed-up yet)."""
        return not self._baseline_measured() and any(s.role is TrialRole.baseline for _, s, _ in self._in_flight.values())

    def _record(self, outcome: TrialOutcome, run_id: str | None) -> None:
        """outcome.json first, then Optuna, then MLflow (or its outbox)."""
        p = self.progress
        tdir = Path(outcome.trial_dir) if outcome.trial_dir else self.paths.trial_dir(outcome.number)
        tdir.mkdir(parents=True, exist_ok=True)
        values = objective_values(self.spec, outcome) if outcome.status is TrialStatus.COMPLETE else None
        if outcome.status is TrialStatus.COMPLETE and values is None:  # objective missing from a measurement
            outcome = outcome.model_copy(update={"status": TrialStatus.FAILED,
                                                 "failure_kind": FailureKind.metric_missing,
                                                 "reason": f"objective {self.spec.objective.metric} missing"})
        write_json(tdir / "outcome.json", outcome.model_dump(mode="json"))
        t_tell = time.perf_counter()
        extra: dict[str, float] = {}
        attrs: dict[str, Any] = {"role": outcome.role.value, "status": outcome.status.value,
                                 "fingerprint_hash": outcome.fingerprint_hash, "node": outcome.node}
        if values is not None:
            if outcome.role is TrialRole.baseline:
                p.baselines.append((outcome.finished_at, values[0]))
            base = select.nearest_baseline(outcome.finished_at, p.baselines)
            if base:
                extra["speedup_vs_baseline"] = select.speedup(values[0], base,
                                                              direction=self.spec.objective.direction)
                attrs["speedup_vs_baseline"] = extra["speedup_vs_baseline"]
            self.study.tell_complete(outcome.number, values, attrs)
            p.complete += 1
            p.consecutive_failures = 0
            self._keys.setdefault(sp.key(outcome.params), (outcome.number, "COMPLETE"))
            self._update_best(outcome.number, values[0], outcome.params, outcome.role.value)
        elif outcome.failure_kind is FailureKind.interrupted:
            # Not a verdict on the parameters: nothing counts, they are measured again (once per interruption).
            self.study.tell_failed(outcome.number, {**attrs, "failure_kind": FailureKind.interrupted.value,
                                                    "reason": outcome.reason[:500]})
            self.study.enqueue(outcome.params, {"role": outcome.role.value, "remeasure_of": outcome.number})
            log.warning("trial %d interrupted (%s); its parameters are queued to be measured again",
                        outcome.number, outcome.reason)
        else:
            kind = outcome.failure_kind.value if outcome.failure_kind else FailureKind.metric_missing.value
            self.study.tell_failed(outcome.number, {**attrs, "failure_kind": kind, "reason": outcome.reason[:500]})
            p.failed += 1
            p.consecutive_failures += 1
            p.failures[kind] += 1
            if outcome.failure_kind in _NOT_THE_PARAMETERS:
                # The machine, not the configuration, failed: measure these parameters again once.
                if outcome.number not in self._requeued and outcome.role is TrialRole.search:
                    self._requeued.add(outcome.number)
                    self.study.enqueue(outcome.params, {"role": outcome.role.value, "remeasure_of": outcome.number})
            else:
                self._keys.setdefault(sp.key(outcome.params), (outcome.number, "FAIL"))
            log.warning("trial %d failed: %s: %s", outcome.number, kind, outcome.reason)
            if outcome.role is TrialRole.baseline:
                p.stopped_by_failure = True
                p.stop_reason = (f"the baseline failed ({kind}: {outcome.reason}); nothing can be compared "
                                 f"against it: fix the server set-up first (see {tdir / 'server.log'})")
                self._abort_in_flight("aborted: the baseline failed")
        if outcome.failure_kind is not FailureKind.interrupted:
            p.finished += 1
            self._outcomes.append(outcome)
        tell_s = time.perf_counter() - t_tell
        t_log = time.perf_counter()
        self.tracker.log_trial(self.parent_run_id, outcome, run_id=run_id or None, extra_metrics=extra,
                               extra_tags={"sweep.engine": self.spec.engine})
        timing = self._overhead.pop(outcome.number, None)
        if timing is not None and "dispatch_s" in timing:
            timing.update(tell_s=tell_s, mlflow_log_s=time.perf_counter() - t_log)
            with open(self.paths.root / "overhead.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(timing) + "\n")
        self._check_failure_budget()
        self._maybe_remeasure_baseline()
        self.on_event("finish", {"outcome": outcome, "speedup": extra.get("speedup_vs_baseline")})
        self._write_state("running")

    def _update_best(self, number: int, value: float | None, params: dict, role: str) -> None:
        p = self.progress
        if value is None or role != TrialRole.search.value:
            return
        better = (p.best_value is None or (value > p.best_value if self.spec.objective.direction == "maximize"
                                           else value < p.best_value))
        if better:
            p.best_number, p.best_value, p.best_params = number, value, dict(params)

    def _check_failure_budget(self) -> None:
        p, b = self.progress, self.spec.budget
        if p.stop_reason:  # the first reason to stop is the one to report; trials in flight still finish
            return
        if p.consecutive_failures >= b.max_consecutive_failures:
            p.stopped_by_failure = True
            p.stop_reason = (f"{p.consecutive_failures} trials failed in a row "
                             f"(budget.max_consecutive_failures={b.max_consecutive_failures}); "
                             f"failures by kind: {dict(p.failures)}")
        elif p.finished >= b.min_trials_for_failure_rate and p.failed / max(p.finished, 1) > b.max_failure_rate:
            p.stopped_by_failure = True
            p.stop_reason = (f"{p.failed} of {p.finished} trials failed, above budget.max_failure_rate="
                             f"{b.max_failure_rate:g}; failures by kind: {dict(p.failures)}")

    def _maybe_remeasure_baseline(self) -> None:
        k = self.spec.budget.baseline_every
        if k and self.progress.finished and self.progress.finished % k == 0 and self._should_launch():
            self.study.enqueue(sp.baseline_params(self.spec.space), {"role": TrialRole.baseline.value})

    # ------------------------------------------------------------------ the end

    def _finish(self) -> dict[str, Any]:
        from orchestrator.results import report

        p = self.progress
        self._act_on_interrupts()
        status = "stopped" if self._stop else "finished"
        summary: dict[str, Any] = {"workdir": str(self.paths.root), "stop_reason": p.stop_reason,
                                   "parent_run_id": self.parent_run_id, "launched": p.launched,
                                   "complete": p.complete, "failed": p.failed, "failures": dict(p.failures),
                                   "skipped": p.skipped, "champion": None, "promoted": False,
                                   "stopped_by_failure": p.stopped_by_failure}
        if not self._stop and p.stop_reason and "baseline failed" not in p.stop_reason:
            summary.update(self._promote())
        # After the promotion gate: its interleaved baselines are the end-of-sweep measurement.
        drift = select.drift(p.baselines, threshold=self.spec.budget.baseline_drift_threshold)
        summary["baseline_drift"] = {"max_relative_change": drift[0], "flagged": drift[1],
                                     "baselines": p.baselines}
        changed = fingerprint_changes(self._outcomes)
        summary["fingerprint_changes"] = changed
        self.tracker.log_sweep_summary(
            self.parent_run_id, metrics=report.parent_metrics(summary, self._outcomes),
            tags={"sweep.stop_reason": p.stop_reason[:250], "sweep.baseline_drift_flagged": str(drift[1]),
                  "sweep.status": status, "sweep.fingerprint_changed": str(bool(changed)),
                  **({"sweep.fingerprint_changes": "; ".join(changed)[:1000]} if changed else {})},
            table=report.results_table(self.spec, self._outcomes, p.baselines),
            figures=report.figures(self.spec, self._outcomes, p.baselines),
        )
        self.tracker.end_sweep(self.parent_run_id, "FINISHED" if status == "finished" else "KILLED")
        self._write_state(status)
        write_json(self.paths.root / "summary.json", summary)
        return summary

    def _promote(self) -> dict[str, Any]:
        """Champion -> interleaved confirmation against the baseline -> registry alias -> env file."""
        constraints = {k: (b.min, b.max) for k, b in self.spec.objective.constraints.items()}
        feasible = [o for o in self._outcomes if o.role is TrialRole.search]
        champion = select.pick_champion(feasible, metric=self.spec.objective.metric,
                                        direction=self.spec.objective.direction, constraints=constraints)
        baseline = next((o for o in reversed(self._outcomes)
                         if o.role is TrialRole.baseline and o.status is TrialStatus.COMPLETE), None)
        if champion is None or baseline is None:
            return {"verdict": "no feasible trial to promote" if champion is None else "no baseline measured"}
        run_id = self._run_id_of(champion)
        if run_id is None:
            return {"verdict": f"not promoted: trial {champion.number} is not in MLflow yet ({self.tracker.pending()} "
                               f"result(s) wait in the outbox); when MLflow is reachable run `sweep sync` and "
                               f"`sweep run {self.spec.source or 'EXPERIMENT'} --workdir {self.paths.root} --resume` to promote"}
        metric = self.spec.objective.metric
        champ_samples = [getattr(m, metric) for m in champion.repeats or (champion.metrics,)]
        base_samples = [getattr(m, metric) for m in baseline.repeats or (baseline.metrics,)]
        n_confirm = self.spec.promotion.confirm_repeats
        confirm_log: list[dict[str, Any]] = []
        if n_confirm:
            champ_samples, base_samples, confirm_log = self._confirm(champion, n_confirm)
            if self._stop:
                self._act_on_interrupts()
                return {"verdict": "not promoted: interrupted during the confirmation runs",
                        "confirmations": confirm_log}
        if len(champ_samples) < 2 or len(base_samples) < 2:
            failed = sum(1 for r in confirm_log if r["status"] != "COMPLETE")
            return {"verdict": f"not promoted: {failed} of {len(confirm_log)} confirmation runs failed or were "
                               f"skipped, leaving {len(champ_samples)} champion and {len(base_samples)} baseline "
                               f"measurement(s); see {self.paths.root / 'confirm'}",
                    "confirmations": confirm_log}
        gate = select.promotion_gate(champ_samples, base_samples, min_gain=self.spec.promotion.min_gain,
                                     direction=self.spec.objective.direction)
        result: dict[str, Any] = {
            "champion": {"number": champion.number, "params": {k: v for k, v in champion.params.items()
                                                               if v is not None},
                         metric: getattr(champion.metrics, metric)},
            "gate": gate.model_dump(mode="json"), "confirmations": confirm_log, "verdict": gate.reason,
        }
        if not gate.passed:
            log.warning("no promotion: %s", gate.reason)
            return result
        config = planner.serving_config(
            self.spec, champion.params, trial_number=champion.number, run_id=run_id or "",
            metrics={k: v for k, v in {metric: float(sum(champ_samples) / len(champ_samples)),
                                       "baseline_" + metric: float(sum(base_samples) / len(base_samples)),
                                       "gain": gate.gain}.items()},
            fingerprint_hash=champion.fingerprint_hash)
        from orchestrator.tracking.tracker import TrackingError

        try:
            version = self.tracker.promote(run_id, model_name=self.spec.promotion.model_name, serving_config=config,
                                           alias=self.spec.promotion.alias, description=gate.reason)
        except TrackingError as exc:
            log.warning("champion not promoted: %s", exc)
            result["verdict"] = f"{gate.reason}; but not promoted: {exc}"
            return result
        config["model_version"] = version
        from orchestrator.results import export

        env_path = self.paths.root / "champion.env"
        export.write_atomic(env_path, export.render(config, "env"))
        result.update(promoted=True, model_version=version, env_file=str(env_path), run_id=run_id)
        log.info("promoted trial %d as %s@%s (version %s): %s", champion.number, self.spec.promotion.model_name,
                 self.spec.promotion.alias, version, gate.reason)
        return result

    def _run_id_of(self, outcome: TrialOutcome) -> str | None:
        """The trial's MLflow run, after sending what waits in the outbox (its run may be created there)."""
        if not self._send_outbox(wait_s=MLFLOW_WAIT_AT_END_S):
            return None
        for t in self.study.trials():
            if t.number == outcome.number and t.attrs.get("mlflow_run_id"):
                return t.attrs["mlflow_run_id"]
        try:
            return self.tracker.find_trial(self.parent_run_id, outcome.number, outcome.role.value)
        except Exception as exc:  # noqa: BLE001 - MLflow down: reported as "not promoted"
            log.warning("cannot find the MLflow run of trial %d: %s", outcome.number, exc)
            return None

    def _send_outbox(self, wait_s: float) -> bool:
        """Replay the MLflow outbox, retrying for up to `wait_s` while MLflow is unreachable; True once empty."""
        deadline = time.monotonic() + wait_s
        _, pending = self.tracker.replay_outbox()
        if pending:
            log.warning("MLflow unreachable with %d result(s) in the outbox: waiting up to %.0fs for it", pending, wait_s)
            self.on_event("tracking_wait", {"pending": pending, "wait_s": wait_s})
        while pending and time.monotonic() < deadline and not self._stop:
            time.sleep(min(5.0, max(deadline - time.monotonic(), 0.0)))
            _, pending = self.tracker.replay_outbox()
        return not pending

    def _confirm(self, champion: TrialOutcome, n: int) -> tuple[list[float], list[float], list[dict]]:
        """Champion and baseline measured again, interleaved A B A B ..., on one slot."""
        metric = self.spec.objective.metric
        champ, base, rows = [], [], []
        act = self._actors[0]
        baseline_params = sp.baseline_params(self.spec.space)
        # The wall-time budget covers the confirmation too: each round needs about two trials' time.
        round_s = 2 * max((o.finished_at - o.started_at for o in self._outcomes if o.finished_at), default=0.0)
        for i in range(n):
            if i and time.time() - self.started_at + round_s > self.timeout_s:
                rows.append({"round": i, "who": "both", "status": "SKIPPED",
                             "reason": "the wall-time budget leaves no time for another round"})
                break
            for who, params in (("champion", champion.params), ("baseline", baseline_params)):
                if self._stop:
                    break
                tdir = self.paths.confirm_dir(i, who)
                spec = TrialSpec(number=champion.number if who == "champion" else -1, params=params,
                                 role=TrialRole.confirm, repeats=self.spec.benchmark.repeats, trial_dir=str(tdir),
                                 seed=self.spec.sampler.seed * 7919 + i * 2 + (who == "baseline"),
                                 sweep_started_at=self.started_at, experiment=self.spec.model_dump(mode="json"))
                self.on_event("confirm", {"round": i + 1, "of": n, "who": who})
                try:
                    outcome = self._await_confirmation(act, act.run.remote(spec))
                except ray_actor.RayError as exc:
                    rows.append({"round": i, "who": who, "status": "FAILED", "reason": str(exc)[:200]})
                    continue
                self.tracker.log_trial(self.parent_run_id, outcome, run_id=None, extra_metrics={},
                                       extra_tags={"sweep.confirm_round": str(i), "sweep.confirm_of": who})
                values = [getattr(m, metric) for m in outcome.repeats] if outcome.status is TrialStatus.COMPLETE else []
                (champ if who == "champion" else base).extend(v for v in values if v is not None)
                if who == "baseline" and values and values[0] is not None:
                    self.progress.baselines.append((outcome.finished_at, float(values[0])))  # the end-of-sweep baseline
                rows.append({"round": i, "who": who, "status": outcome.status.value, metric: values})
        return champ, base, rows

    def _await_confirmation(self, act, ref) -> TrialOutcome:
        """Wait for one confirmation run; a second Ctrl-C aborts it like a trial."""
        while not ray_actor.wait([ref], timeout_s=0.5)[0]:
            if self._stop >= 2 and not self._abort_reason:
                self._abort_reason = "aborted by a second Ctrl-C"
                act.abort.remote()
        outcome, _ = ray_actor.get(ref)
        return outcome


def fingerprint_changes(outcomes: list[TrialOutcome]) -> list[str]:
    """Hosts whose stable fingerprint changed during the sweep (a driver update, another NCCL...),
    one line per change. Different hosts of a cluster differ by nature and are not a change."""
    from orchestrator.trial import observe

    first: dict[str, TrialOutcome] = {}
    changes: list[str] = []
    for o in sorted((o for o in outcomes if o.fingerprint_hash), key=lambda o: o.started_at):
        host = str(o.fingerprint.get("host") or o.node)
        seen = first.setdefault(host, o)
        if o.fingerprint_hash != seen.fingerprint_hash:
            what = ", ".join(observe.fingerprint_diff(seen.fingerprint, o.fingerprint)) or "fingerprint"
            changes.append(f"{host}: trial {o.number} differs from trial {seen.number}: {what}")
            first[host] = o
    return changes


# ---------------------------------------------------------------------- status from another shell


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


def status_report(workdir: Path, storage: str | None = None) -> dict[str, Any]:
    """Progress of the sweep in `workdir`, read from sweep.json and the Optuna storage (no MLflow needed)."""
    from orchestrator.search.study import read_only

    workdir = Path(workdir)
    try:
        state = json.loads((workdir / "sweep.json").read_text())
    except FileNotFoundError:
        raise SweepError(f"{workdir}: no sweep here (sweep.json missing); pass the --workdir `sweep run` used") from None
    url = storage or state.get("optuna_storage") or Paths(workdir.resolve()).optuna_url
    if ":***@" in url:
        raise SweepError(f"{workdir}: the sweep's Optuna storage needs a password that is never written down; "
                         f"pass --storage URL or set SWEEP_OPTUNA_STORAGE")
    read = read_only(url, state["experiment"])
    trials, _ = read if read else ([], {})
    counted = [t for t in trials if not t.attrs.get("skipped") and t.attrs.get("failure_kind") != "interrupted"
               and t.role != TrialRole.confirm.value]
    finished = [t for t in counted if t.state in ("COMPLETE", "FAIL")]
    failures = Counter(t.attrs.get("failure_kind", "unknown") for t in finished if t.state == "FAIL")
    complete = [t for t in finished if t.state == "COMPLETE" and t.values]
    running = [t for t in trials if t.state == "RUNNING"]
    sign = 1.0 if state.get("direction", "maximize") == "maximize" else -1.0
    searched = [t for t in complete if t.role == TrialRole.search.value and not t.attrs.get("skipped")]
    best = max(searched, key=lambda t: sign * t.values[0], default=None)
    baselines = [(t.end or 0.0, t.values[0]) for t in complete if t.role == TrialRole.baseline.value]
    budget = int(state.get("budget_trials") or 0)
    elapsed = (state.get("updated_at") if state.get("status") != "running" else time.time()) - state["started_at"]
    launched = len(finished) + len(running)
    eta = None
    if finished and state.get("status") == "running" and budget:
        per_trial = elapsed / max(len(finished), 1)
        eta = max(budget - len(finished), 0) * per_trial
    per_node: dict[str, set[str]] = {}
    for t in finished:
        if t.attrs.get("fingerprint_hash"):
            per_node.setdefault(str(t.attrs.get("node", "")).split("/")[0], set()).add(t.attrs["fingerprint_hash"])
    fps = {node: sorted(h) for node, h in per_node.items() if len(h) > 1}  # only real changes, per host
    return {
        "experiment": state["experiment"], "status": state.get("status", "unknown"),
        "driver_alive": _pid_alive(state.get("pid")) and state.get("status") == "running",
        "budget_trials": budget, "launched": launched, "complete": len(complete), "failed": len(finished) - len(complete),
        "running": len(running), "skipped": sum(1 for t in trials if t.attrs.get("skipped")),
        "failures": dict(failures), "objective": state.get("objective", "decode_tok_s"),
        "best": None if best is None else {"number": best.number, "value": best.values[0],
                                           "speedup": best.attrs.get("speedup_vs_baseline"),
                                           "params": {k: v for k, v in best.params.items() if v is not None}},
        "baseline": baselines[-1][1] if baselines else None, "baselines": baselines,
        "elapsed_s": elapsed, "eta_s": eta, "fingerprints": fps, "stop_reason": state.get("stop_reason", ""),
    }
