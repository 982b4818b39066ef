"""The sweep: keep N trials in flight, ask/tell, budgets, failures, baselines, resume, promotion.

One process owns the study and MLflow. Workers get a TrialSpec and return a TrialOutcome; the outcome
is in trials/<n>/outcome.json before Optuna is told and before MLflow is logged, so a driver killed
at any moment loses nothing measured: on --resume a RUNNING trial with an outcome file is told from
the file, one without is closed as `interrupted` and its parameters are measured again once.
Resume also ends what the killed driver left running (its local Ray processes, listed in
ray-processes.json, and trial servers, by their pid files) and logs to MLflow what never got there.

Ctrl-C (or SIGTERM) once: nothing new is launched and the trials in flight finish; twice: their
servers are killed and they are closed as interrupted. Either way `--resume` continues the study.

`Sweep` is thin: the verbs live in `_workdir` (files, lock, log), `_resume`, `_signals`, `_loop`
(scheduling), `_record` (outcomes, failure budget) and `_promote` (confirmation, promotion, summary).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.config.experiment import SweepSpec
from orchestrator.errors import StorageError, SweepError, SweepToolError, TrackingError
from orchestrator.execute.base import Executor
from orchestrator.execute.processes import local_processes
from orchestrator.probe import comm
from orchestrator.records import TrialRole
from orchestrator.redact import mask_url_password
from orchestrator.search import space as sp
from orchestrator.search.proposal import ProposalPolicy
from orchestrator.search.study import Study, read_only
from orchestrator.sweep import _promote, _record, _resume
from orchestrator.sweep._context import Context, Progress, SweepEnv
from orchestrator.sweep._loop import run_loop
from orchestrator.sweep._workdir import Paths, SweepLog, WorkdirLock, default_workdir, write_json
from orchestrator.sweep.state import Event, ExecutorReady, StopKind, StopReason, SweepState, SweepSummary
from orchestrator.tracking.tracker import Tracker

log = logging.getLogger("sweep")

__all__ = ["Sweep", "default_workdir"]


def _directions(spec: SweepSpec) -> list[str]:
    d: list[str] = [spec.objective.direction]
    if spec.objective.secondary:
        d.append(spec.objective.secondary_direction)
    return d


BUDGET_ATTR = "budget_trials"
"""The study attribute that keeps the trial budget the sweep started with (--n-trials included)."""


def _stored_budget(paths: Paths, name: str) -> int | None:
    """The trial budget the sweep in `paths` started with: from sweep.json, or, when that is unreadable,
    from the study's attributes (BUDGET_ATTR); None without either."""
    try:
        return SweepState.model_validate_json(paths.state.read_bytes()).budget_trials or None
    except (OSError, ValueError):
        pass
    if paths.storage is None and not (paths.root / "optuna.db").is_file():
        return None  # nothing to read, and opening a missing sqlite file would create it
    read = read_only(paths.optuna_url, name)
    budget = read[1].get(BUDGET_ATTR) if read else None
    if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
        log.warning("%s is unreadable: the trial budget (%d) comes from the study", paths.state, budget)
        return budget
    return None


class Sweep:
    """One sweep of one experiment in one work directory.

    `executor` runs the trials (`execute.ray_actor.RayExecutor` for `sweep run`); the sweep starts
    it, and closes it at the end.
    """

    def __init__(
        self,
        spec: SweepSpec,
        workdir: Path,
        *,
        executor: Executor,
        storage: str | None = None,
        resume: bool = False,
        n_trials: int | None = None,
        timeout_s: float | None = None,
        on_event: Callable[[Event], None] | None = None,
    ):
        paths = Paths(Path(workdir).resolve(), storage)
        # NCCL knobs searched only where NCCL carries the objective; a backend knob none of whose values
        # moves the objective's messages not searched at all (probe.comm)
        collapsed = comm.collapsed(spec)
        spec = spec.model_copy(update={"space": sp.collapse_all(spec.space, collapsed)})
        self._collapsed = [inert.line for inert in collapsed]
        study = Study(paths.optuna_url, spec.name, spec.space, spec.sampler, _directions(spec), spec.budget.trials)
        if resume and n_trials is None:
            n_trials = _stored_budget(paths, spec.name)  # --resume continues the original budget (--n-trials included)
        self.ctx = Context(
            SweepEnv(
                spec=spec,
                paths=paths,
                study=study,
                budget_trials=n_trials or spec.budget.trials,
                timeout_s=timeout_s or spec.budget.wall_time,
                emit=on_event or (lambda event: None),
                resume=resume,
                policy=ProposalPolicy(study),
                executor=executor,
                clock=executor.clock,
            )
        )
        self._lock = WorkdirLock(paths.root)
        self._log = SweepLog(paths.root)

    @property
    def budget_trials(self) -> int:
        return self.ctx.budget_trials

    @property
    def progress(self) -> Progress:
        return self.ctx.progress

    @property
    def parent_run_id(self) -> str | None:
        return self.ctx.parent_run_id

    def run(self) -> SweepSummary:
        """Run (or resume) the sweep to its end; return the final summary."""
        ctx = self.ctx
        self._lock.acquire()
        self._log.open()
        try:
            _resume.reap_previous_driver(ctx.paths)
            self.open()
            for line in self._collapsed:
                log.info(line)
            try:
                _resume.recover(ctx)
                if not _record.baseline_measured(ctx) and not self._baseline_queued():
                    ctx.study.enqueue(sp.baseline_params(ctx.spec.space), {"role": TrialRole.baseline.value})
                ctx.interrupts.install()
                self._start_executor()
            except SweepToolError as exc:  # a pre-flight check: sweep.json says failed, and why
                self._start_failed(str(exc))
                raise
            ctx.interrupts.install()  # ray.init() puts its own SIGTERM handler (sys.exit) in place
            try:
                run_loop(ctx)
                return _promote.finish(ctx)
            except SweepToolError as exc:  # storage, MLflow or the cluster failed mid-sweep: not `running`
                self._failed_mid_sweep(str(exc))
                raise
        finally:
            ctx.interrupts.restore()
            ctx.executor.close()
            ctx.paths.ray_processes.unlink(missing_ok=True)
            self._log.close()
            self._lock.release()

    def open(self) -> None:
        """Open (or, resuming, reopen) the study and the sweep's MLflow parent run; write sweep.json.

        A --resume that fails here says so in sweep.json, keeping what the earlier run recorded there."""
        try:
            self._open()
        except SweepToolError as exc:
            if self.ctx.resume:
                self._resume_failed(str(exc))
            raise

    def _open(self) -> None:
        ctx, spec = self.ctx, self.ctx.spec
        try:
            existed = ctx.study.exists()
        except StorageError as exc:
            raise SweepError(str(exc)) from None
        if existed and not ctx.resume and self._unstarted():
            existed = False  # an earlier start failed after creating the study: take it over
        if existed and not ctx.resume:
            raise SweepError(
                f"{ctx.paths.root} already holds a sweep of {spec.name!r}; "
                f"1) pass --resume to continue it, 2) pass --workdir DIR to start a new one, "
                f"or 3) delete the directory"
            )
        if ctx.resume and not existed:
            raise SweepError(
                f"{ctx.paths.root}: nothing to resume (no study {spec.name!r} in optuna.db); "
                f"run without --resume to start"
            )
        ctx.study.open()
        try:
            self._begin(existed)
        except SweepToolError as exc:
            if not existed:  # sweep.json says failed and why; no empty study is left, so the same command works
                self._start_failed(str(exc))
            raise
        except BaseException:
            if not existed:  # a start that fails leaves no empty study behind: the same command works again
                ctx.study.delete()
            raise

    def _begin(self, existed: bool) -> None:
        ctx, spec = self.ctx, self.ctx.spec
        experiment = spec.model_dump(mode="json")
        if spec.tracking.uri:
            experiment["tracking"]["uri"] = mask_url_password(spec.tracking.uri)
        write_json(ctx.paths.root / "experiment.json", experiment)
        if existed:
            ctx.started_at = float(ctx.study.get_attr("sweep_started_at", ctx.started_at))
        else:
            ctx.study.set_attr("sweep_started_at", ctx.started_at)
            ctx.study.set_attr(BUDGET_ATTR, ctx.budget_trials)
        uri = ctx.tracking_uri
        ctx.tracker = Tracker(
            uri,
            spec.tracking.experiment or spec.name,
            outbox_dir=ctx.paths.root,
            artifact_location=(ctx.paths.root / "mlartifacts").as_uri() if uri == ctx.paths.mlflow_url else None,
        )
        ctx.parent_run_id = ctx.tracker.start_sweep(
            run_name=f"sweep-{time.strftime('%Y%m%d-%H%M%S', time.localtime(ctx.started_at))}",
            params={
                "experiment": spec.name,
                "engine": spec.engine,
                "space": spec.space.name,
                "sampler": spec.sampler.kind,
                "budget_trials": ctx.budget_trials,
                "concurrent_trials": spec.budget.concurrent_trials,
                "objective": spec.objective.metric,
                "sglang_version": spec.sglang_version,
                "tp": spec.server.tp,
            },
            tags={"sweep.workdir": str(ctx.paths.root), "sweep.engine": spec.engine},
            resume_run_id=ctx.study.get_attr("parent_run_id"),
        )
        if not ctx.parent_run_id:  # e.g. a server that answers `{}` to every request
            raise TrackingError(
                f"MLflow at {mask_url_password(uri)} opened the sweep's run without giving its id, so it is not "
                f"an MLflow tracking server that works; check tracking.uri (and the server's /health), or leave "
                f"tracking.uri out to record in the work directory's sqlite store"
            )
        ctx.study.set_attr("parent_run_id", ctx.parent_run_id)
        ctx.write_state("running")

    def _unstarted(self) -> bool:
        """Whether the study in storage is one a start left before its parent run existed (killed, or
        failed where no cleanup ran): no trial and no parent run, so nothing of it is worth resuming."""
        try:
            self.ctx.study.open()
        except StorageError as exc:
            raise SweepError(str(exc)) from None
        return not self.ctx.study.trials() and self.ctx.study.get_attr("parent_run_id") is None

    def _start_failed(self, reason: str) -> None:
        """sweep.json and the parent run say the start failed, and why (not `running`)."""
        ctx = self.ctx
        _record.stop(ctx, StopReason(StopKind.start_failed, f"the sweep could not start: {reason}"))
        self._write_failed_state()
        if ctx.tracker is not None and ctx.parent_run_id:
            try:
                ctx.tracker.end_sweep(ctx.parent_run_id, "FAILED")
            except SweepToolError:
                pass  # MLflow is what failed: the message raised says so, the run stays as it is
        if not ctx.resume and not ctx.progress.launched:
            ctx.study.delete()  # nothing ran: the same command starts afresh once the cause is fixed

    def _resume_failed(self, reason: str) -> None:
        """sweep.json says this --resume could not start, and why, and keeps the rest as the earlier run
        left it (its counts, best, baselines and why it stopped: the study was not read yet, so this
        run has nothing to replace them with). An unreadable or missing sweep.json is left as it is."""
        ctx = self.ctx
        try:
            earlier = SweepState.model_validate_json(ctx.paths.state.read_bytes())
        except (OSError, ValueError):
            log.warning("%s is missing or unreadable: it does not record that this --resume failed", ctx.paths.state)
            return
        before = f", which had stopped: {earlier.stop_reason}" if earlier.stop_reason else ""
        text = f"the --resume could not start: {reason} (the rest of sweep.json is the earlier run's{before})"
        try:
            write_json(
                ctx.paths.state,
                earlier.model_copy(
                    update={
                        "status": "failed",
                        "stop_kind": StopKind.start_failed,
                        "stop_reason": text,
                        "pid": os.getpid(),
                        "updated_at": ctx.clock.time(),
                    }
                ).model_dump(mode="json"),
            )
        except OSError:
            pass  # a full disk, say: the error raised names the cause
        if ctx.tracker is not None and ctx.parent_run_id:
            try:
                ctx.tracker.end_sweep(ctx.parent_run_id, "FAILED")  # reopened by this --resume: not left RUNNING
            except SweepToolError:
                pass  # MLflow is what failed: the message raised says so

    def _failed_mid_sweep(self, reason: str) -> None:
        """sweep.json says the sweep failed, and why, once the storage, MLflow or the cluster failed while
        it ran (it used to stay `running`); the study and every measurement stay for --resume."""
        _record.stop(self.ctx, StopReason(StopKind.failed, f"the sweep failed: {reason}"))
        self._write_failed_state()

    def _write_failed_state(self) -> None:
        try:
            self.ctx.write_state("failed")
        except OSError:
            pass  # a full disk (the failure being reported): the error raised names it; nothing more to say

    def _baseline_queued(self) -> bool:
        return any(t.state == "WAITING" and t.role == TrialRole.baseline.value for t in self.ctx.study.trials())

    def _start_executor(self) -> None:
        ctx, spec = self.ctx, self.ctx.spec
        tp, n = spec.server.tp, spec.budget.concurrent_trials
        info = ctx.executor.start()
        if info.owns_processes:
            # GCS and raylet die with this process, but not all of their children do (processes.local_processes).
            write_json(ctx.paths.ray_processes, {"driver_pid": os.getpid(), "processes": local_processes()})
        if info.slots < n:
            log.warning("budget.concurrent_trials=%d but the cluster fits %d trials of tp=%d", n, info.slots, tp)
        log.info("Ray %s: %g GPUs, %d trial slot(s)", info.address, info.gpus, info.slots)
        ctx.emit(ExecutorReady(address=info.address, gpus=info.gpus, slots=info.slots))
