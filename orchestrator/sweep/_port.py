"""The sweep's side of the verdict's port (orchestrator.verdict.port.Port): the one object through which the
promotion runs its rounds on the sweep's executor, reads the clock and the trials measured, and reaches
MLflow. Everything here is the sweep's (Context, executor, study, tracker); the verdict sees only the port."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

from orchestrator.config import eagle
from orchestrator.config.experiment import SweepSpec
from orchestrator.errors import TrackingError
from orchestrator.execute.base import Finished
from orchestrator.fsio import write_atomic
from orchestrator.records import FailureKind, TrialOutcome, TrialRole, TrialSpec
from orchestrator.results import formats
from orchestrator.sweep._context import Context
from orchestrator.sweep._loop import WAIT_S, act_on_interrupts, keep_files
from orchestrator.sweep._record import baseline_measured_at
from orchestrator.sweep.state import ArmDropped, ConfirmationRun, TrackingWait
from orchestrator.trial import plan as planner
from orchestrator.verdict import correctness_gate
from orchestrator.verdict.arm import Arm
from orchestrator.verdict.port import Chosen, Run
from orchestrator.verdict.rounds import value_of
from orchestrator.verdict.schedule import at_concurrency

log = logging.getLogger("sweep")

TRACKED = "tracked"
"""The file that marks a confirmation run as logged to MLflow (or its outbox): a resumed round that keeps the
run does not log it twice."""

MLFLOW_WAIT_AT_END_S = 60.0
"""At the end, how long results waiting in the outbox wait for MLflow to return before promotion gives up."""


class SweepPort:
    """The verdict's port over the sweep's Context."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx

    # ------------------------------------------------------------------ the night

    @property
    def spec(self) -> SweepSpec:
        return self._ctx.spec

    @property
    def outcomes(self) -> list[TrialOutcome]:
        return self._ctx.outcomes

    @property
    def workdir(self) -> Path:
        return self._ctx.paths.root

    @property
    def resume_hint(self) -> str:
        return self._ctx.resume_hint

    @property
    def timeout_s(self) -> float:
        return self._ctx.timeout_s

    def elapsed(self) -> float:
        return self._ctx.elapsed()

    def remaining(self) -> float:
        return self._ctx.remaining()

    def slots(self) -> int:
        return self._ctx.executor.idle()

    def interrupted(self) -> bool:
        return bool(self._ctx.interrupts.pressed)

    def stop_for_interrupt(self) -> None:
        act_on_interrupts(self._ctx)

    def dropped(self, name: str, why: str) -> None:
        self._ctx.emit(ArmDropped(name=name, why=why))

    def arm_dir(self, round_i: int, arm: str) -> Path:
        return self._ctx.paths.confirm_dir(round_i, arm.replace("@", "-c"))

    # ------------------------------------------------------------------ the rounds

    def run_round(self, order: Sequence[Arm], round_i: int, of: int) -> Iterator[Run]:
        """Run the arms of round `round_i` in `order`, as many at a time as the executor has free slots;
        each finished run's files kept, its run logged to MLflow, a baseline's value kept as the sweep's.
        A run a killed driver already finished for this round (its outcome.json, same configuration) is
        handed back as it was, not measured again (a --resume continues from the last round it completed)."""
        order = list(order)
        kept = {arm.name: run for arm in order if (run := self._kept(arm, round_i)) is not None}
        if kept:
            log.info("confirmation round %d: %s kept from before the --resume", round_i + 1, ", ".join(sorted(kept)))
        yield from kept.values()
        for arm, finished in self._measure(order, round_i, of, skip=set(kept)):
            yield self._keep(arm, finished, round_i)

    def _kept(self, arm: Arm, i: int) -> Run | None:
        """The run of `arm` in round `i` an earlier driver finished and kept, or None (none, another
        configuration, or one the kill interrupted). One that never reached MLflow is logged now."""
        if not self._ctx.resume:
            return None
        folder = self.arm_dir(i, arm.name)
        try:
            outcome = TrialOutcome.model_validate_json((folder / "outcome.json").read_bytes())
        except (OSError, ValueError):
            return None
        if outcome.role is not TrialRole.confirm or outcome.params != arm.params:
            return None
        if outcome.failure_kind is FailureKind.interrupted:
            return None
        if not (folder / TRACKED).exists():
            self._track(arm, outcome, i)
        return Run(arm, outcome)

    def _measure(self, order: list[Arm], i: int, of: int, skip: set[str]) -> Iterator[tuple[Arm, Finished]]:
        ctx = self._ctx
        executor = ctx.executor
        pending = [a for a in order if a.name not in skip]
        running: dict[int, Arm] = {}
        while pending or running:
            while pending and executor.idle() > 0 and not ctx.interrupts.pressed:
                arm = pending.pop(0)
                spec = self._spec_of(arm, i, order.index(arm))
                ctx.emit(ConfirmationRun(round=i + 1, of=of, who=arm.name))
                running[executor.submit(spec)] = arm
            if ctx.interrupts.pressed:
                pending.clear()
            if not running:
                return
            for finished in executor.wait(WAIT_S):
                arm_done = running.pop(finished.handle, None)
                if arm_done is not None:
                    yield arm_done, finished
            if ctx.interrupts.pressed >= 2 and not ctx.abort_reason:
                ctx.abort_reason = "aborted by a second Ctrl-C"
                for handle in running:
                    executor.abort(handle)

    def _spec_of(self, arm: Arm, i: int, position: int) -> TrialSpec:
        ctx = self._ctx
        return TrialSpec(
            number=arm.number,
            params=arm.params,
            effective_params=eagle.effective(arm.params),
            role=TrialRole.confirm,
            repeats=ctx.spec.benchmark.repeats,
            trial_dir=str(self.arm_dir(i, arm.name)),
            seed=ctx.spec.sampler.seed * 7919 + i * 64 + position,
            sweep_started_at=ctx.started_at,
            experiment=at_concurrency(ctx.spec, arm.concurrency),
            outputs=correctness_gate.request(self, arm.name, i),
        )

    def _keep(self, arm: Arm, finished: Finished, i: int) -> Run:
        ctx = self._ctx
        if finished.lost is not None:
            return Run(arm, None, finished.lost)
        outcome = finished.outcome
        keep_files(self.arm_dir(i, arm.name), finished.files)
        self._track(arm, outcome, i)
        value = value_of(outcome, ctx.spec.objective.metric)
        if value is not None and arm.name == "baseline":
            baseline_measured_at(ctx, outcome.finished_at, value)
        return Run(arm, outcome)

    def _track(self, arm: Arm, outcome: TrialOutcome, i: int) -> None:
        """Log the confirmation run to MLflow (or its outbox), then mark its folder as logged."""
        ctx = self._ctx
        ctx.track.log_trial(
            ctx.parent_run_id or "",
            outcome,
            run_id=None,
            extra_metrics={},
            extra_tags={
                "sweep.confirm_round": str(i),
                "sweep.confirm_of": arm.name,
                "sweep.confirm_concurrency": str(arm.concurrency),
            },
        )
        folder = self.arm_dir(i, arm.name)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / TRACKED).touch()

    # ------------------------------------------------------------------ MLflow

    def pending(self) -> int:
        return self._ctx.track.pending()

    def run_id_of(self, outcome: TrialOutcome) -> str | None:
        """The trial's MLflow run, after sending what waits in the outbox (its run may be created there)."""
        ctx = self._ctx
        if not self._send_outbox(MLFLOW_WAIT_AT_END_S):
            return None
        for t in ctx.study.trials():
            if t.number == outcome.number and t.attrs.get("mlflow_run_id"):
                return str(t.attrs["mlflow_run_id"])
        try:
            return ctx.track.find_trial(ctx.parent_run_id or "", outcome.number, outcome.role.value)
        except TrackingError as exc:  # MLflow down: reported as "not promoted"
            log.warning("cannot find the MLflow run of trial %d: %s", outcome.number, exc)
            return None

    def confirm_run_id(self, number: int, folder: Path) -> str | None:
        ctx = self._ctx
        if not self._send_outbox(MLFLOW_WAIT_AT_END_S):
            return None
        try:
            return ctx.track.find_trial(ctx.parent_run_id or "", number, TrialRole.confirm.value, str(folder))
        except TrackingError as exc:
            log.warning("cannot find the MLflow run of trial %d's confirmation run: %s", number, exc)
            return None

    def register(self, chosen: Chosen) -> tuple[str, Path]:
        """The chosen configuration as the serving config SGLang's version takes (trial.plan), registered
        under the alias, and champion.env written from it with the version."""
        spec = self._ctx.spec
        config = planner.serving_config(
            spec,
            chosen.params,
            trial_number=chosen.number,
            run_id=chosen.run_id,
            metrics=chosen.metrics,
            fingerprint_hash=chosen.fingerprint_hash,
            allreduce_backend=chosen.allreduce_backend,
        ).model_copy(update={"derivation": chosen.derivation})
        version = self._ctx.track.promote(
            chosen.run_id,
            model_name=spec.promotion.model_name,
            serving_config=config,
            alias=spec.promotion.alias,
            description=chosen.description,
        )
        env_path = self.workdir / "champion.env"
        write_atomic(env_path, formats.render_for(config.model_copy(update={"model_version": version}), "env"))
        return version, env_path

    def _send_outbox(self, wait_s: float) -> bool:
        """Replay the MLflow outbox, retrying for up to `wait_s` while MLflow is unreachable; True once empty."""
        ctx = self._ctx
        deadline = ctx.clock.monotonic() + wait_s
        _, pending = ctx.track.replay_outbox()
        if pending:
            log.warning(
                "MLflow unreachable with %d result(s) in the outbox: waiting up to %.0fs for it", pending, wait_s
            )
            ctx.emit(TrackingWait(pending=pending, wait_s=wait_s))
        while pending and ctx.clock.monotonic() < deadline and not ctx.interrupts.pressed:
            ctx.clock.sleep(min(5.0, max(deadline - ctx.clock.monotonic(), 0.0)))
            _, pending = ctx.track.replay_outbox()
        return not pending
