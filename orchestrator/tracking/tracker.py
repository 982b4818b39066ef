"""MLflow for a sweep, as the driver and the CLI see it: a thin `Tracker` over the verb modules.

It only uses `MlflowClient` with explicit run ids (never the process-global active run), so the
driver can keep several trials open at once. Layout in MLflow (DESIGN.md, "Storage and tracking
defaults"):

- experiment = the experiment spec's name; with a sqlite store its artifacts go to
  `<workdir>/mlartifacts` (the directory holding the database);
- parent run (tag `sweep.kind=sweep`) per sweep: summary metrics, `results.csv`/`results.html`,
  figures;
- child run per trial (tags `mlflow.parentRunId`, `sweep.kind=trial`, `sweep.trial_number`,
  `sweep.role`), named `trial-0007`, `baseline-0000`, `confirm-0012`; params = every knob (None is
  logged as "unset"); metrics = every number of the outcome's Metrics plus `<name>_ci95_low/high`;
  artifacts = the trial folder under `trial/`;
- champion = a registered model version whose source is the trial run's `serving_config` folder,
  with an alias (default `champion`).

Outages and bugs: when MLflow is unreachable (`outage.classify`), `log_trial`, `end_sweep` and
`log_sweep_summary` do not raise: they queue one line in the outbox (`outbox.py`) and
`replay_outbox` sends them later, in order. After a failed call further writes go straight to the
outbox for a back-off window; a successful call or `replay_outbox` closes it, and the first
successful `log_trial` or `end_sweep` after an outage replays the outbox by itself. When MLflow
answers but refuses, they raise TrackingError; a bug of ours raises as it is, never queued.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import TrackingError
from orchestrator.fsio import disk_failing
from orchestrator.records import ServingConfig, TrialOutcome
from orchestrator.tracking import convert, registry, runs
from orchestrator.tracking._client import Store
from orchestrator.tracking.convert import SWEEP_STATUSES
from orchestrator.tracking.outage import Failure, classify
from orchestrator.tracking.outbox import EndSweep, LogSweepSummary, LogTrial, Outbox, OutboxEntry

if TYPE_CHECKING:
    import pandas
    from matplotlib.figure import Figure

__all__ = ["Tracker", "TrackingError"]

log = logging.getLogger(__name__)

_REFUSED_FIX = (
    "(1) check the sweep's runs were not deleted in the MLflow UI, then (2) report it "
    "with sweep.log: MLflow answered, so this is no outage and nothing was queued."
)

# sqlite's own words for a full or failing disk (sqlite3.OperationalError, SQLITE_FULL / SQLITE_IOERR).
_DISK_FIX = (
    "free space on the disk that holds the tracking store (nothing measured is lost: the trial's "
    "files and the Optuna study keep it), then run the same command with --resume."
)


class Tracker:
    """The sweep's view of one MLflow tracking store and experiment. Nothing happens in the constructor: the
    MLflow client, the experiment and the database are created on first use, so building one cannot fail."""

    def __init__(
        self, tracking_uri: str, experiment_name: str, *, outbox_dir: Path, artifact_location: str | None = None
    ):
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.outbox_dir = Path(outbox_dir)
        self._store = Store(tracking_uri, experiment_name, artifact_location=artifact_location)
        self._outbox = Outbox(self.outbox_dir)

    def experiment_id(self) -> str:
        """The experiment's id, creating the experiment (or restoring a deleted one) if needed."""
        return self._store.experiment_id()

    # ----------------------------------------------------------------- sweep (parent run)

    def start_sweep(
        self, *, run_name: str, params: Mapping[str, Any], tags: Mapping[str, Any], resume_run_id: str | None = None
    ) -> str:
        """Create the sweep's parent run (or mark `resume_run_id` RUNNING again); return its id.

        On resume, params already on the run are kept (MLflow params cannot change); new ones are
        added. Raises TrackingError if MLflow cannot be reached: a sweep does not start blind.
        """
        what = f"resume the sweep run {resume_run_id}" if resume_run_id else "start the sweep run"
        with self._store.failing_as(
            what,
            "(1) start the tracking server or correct tracking.uri in "
            "the experiment file, or (2) leave tracking.uri unset to "
            "use the sqlite store in the work directory.",
        ):
            run_id = runs.start_sweep(
                self._store, run_name=run_name, params=params, tags=tags, resume_run_id=resume_run_id
            )
        self._outbox.backoff.up()
        return run_id

    def end_sweep(self, parent_run_id: str, status: str = "FINISHED") -> None:
        """Close the parent run as FINISHED, FAILED or KILLED (queued if MLflow is unreachable)."""
        if status not in SWEEP_STATUSES:
            raise ValueError(f"status must be one of {', '.join(SWEEP_STATUSES)}, but got {status!r}")
        if not self._outbox.backoff.active():
            self._replay_if_pending()  # last chance for queued trial logs before the sweep ends
        try:
            self._store.client().set_terminated(parent_run_id, status)
        except Exception as e:
            self._require_outage(e, f"close the sweep run {parent_run_id}")
            self._queue(EndSweep.model_validate({"parent_run_id": parent_run_id, "status": status}), e)
        else:
            self._outbox.backoff.up()

    def log_sweep_summary(
        self,
        parent_run_id: str,
        *,
        metrics: Mapping[str, float],
        tags: Mapping[str, Any],
        table: pandas.DataFrame,
        figures: Mapping[str, Figure],
    ) -> None:
        """Put the sweep's summary on the parent run: metrics, tags, the results table as
        `results.csv`, `results.html` and an MLflow table (`results.json`), figures as
        `figures/<name>.png`. Queued (files kept under the outbox folder) if MLflow is unreachable.
        """
        stage = self._outbox.summary_stage(parent_run_id)
        runs.stage_summary(stage, table, figures)
        # 4 significant digits, as the trial runs' (docs/results.md): 79.72, not 79.718345 tok/s.
        rounded = {name: convert.rounded(value) for name, value in convert.metrics(metrics).items()}
        entry = LogSweepSummary(
            parent_run_id=parent_run_id, summary_dir=str(stage.resolve()), metrics=rounded, tags=convert.tags(tags)
        )
        if self._outbox.backoff.active():
            self._queue(entry, "MLflow was unreachable moments ago")
            return
        try:
            runs.write_summary(self._store, parent_run_id, stage, entry.metrics, entry.tags, table)
        except Exception as e:
            self._require_outage(e, f"log the summary of sweep run {parent_run_id}")
            self._queue(entry, e)
        else:
            self._outbox.backoff.up()
            shutil.rmtree(stage, ignore_errors=True)

    # ----------------------------------------------------------------- trials (child runs)

    def start_trial(
        self,
        parent_run_id: str,
        *,
        number: int,
        params: Mapping[str, Any],
        role: Any = "search",
        tags: Mapping[str, Any],
    ) -> str | None:
        """Open the trial's child run (RUNNING, params = every knob) and return its id.

        Finds the run first if this trial number and role already have one under the parent.
        Returns None if MLflow is unreachable; `log_trial(..., run_id=None)` creates it later.
        """
        if self._outbox.backoff.active():
            return None
        try:
            run_id = runs.open_trial(
                self._store, parent_run_id, number=number, role=convert.role_text(role), params=params, tags=tags
            )
        except Exception as e:
            self._require_outage(e, f"open the run of trial {number}")
            self._outbox.backoff.down()
            log.warning("MLflow unreachable, trial %s will be logged later: %s", number, convert.short(e))
            return None
        self._outbox.backoff.up()
        return run_id

    def log_trial(
        self,
        parent_run_id: str,
        outcome: TrialOutcome,
        *,
        run_id: str | None = None,
        extra_metrics: Mapping[str, float] | None = None,
        extra_tags: Mapping[str, Any] | None = None,
    ) -> None:
        """Log a finished trial on its child run and close the run; queued if MLflow is unreachable.

        The run is `run_id`, or the parent's child with this trial number and role, or a new one.
        Logging the same outcome twice gives the same run contents.
        """
        metrics = convert.metrics(extra_metrics or {})
        tags = convert.tags(extra_tags or {})
        if self._outbox.backoff.active():
            self._queue(
                self._log_trial_entry(parent_run_id, outcome, run_id, metrics, tags),
                "MLflow was unreachable moments ago",
            )
            return
        try:
            runs.write_trial(self._store, parent_run_id, outcome, run_id, metrics, tags)
        except Exception as e:
            self._require_outage(e, f"log trial {outcome.number}")
            self._queue(self._log_trial_entry(parent_run_id, outcome, run_id, metrics, tags), e)
            return
        self._outbox.backoff.up()
        self._replay_if_pending()

    def _log_trial_entry(
        self,
        parent_run_id: str,
        outcome: TrialOutcome,
        run_id: str | None,
        metrics: dict[str, float],
        tags: dict[str, str],
    ) -> LogTrial:
        return LogTrial(
            parent_run_id=parent_run_id,
            run_id=run_id,
            outcome_path=str(self._outbox.outcome_file(outcome)),
            extra_metrics=metrics,
            extra_tags=tags,
        )

    def find_trial(
        self, parent_run_id: str, number: int, role: Any = "search", trial_dir: str | None = None
    ) -> str | None:
        """The run id of this trial's child run under the parent (with `trial_dir`: the run of that
        folder, e.g. one confirmation round), or None."""
        with self._store.reading(f"find trial {number} of sweep run {parent_run_id}"):
            return runs.find_trial(self._store, parent_run_id, number, convert.role_text(role), trial_dir)

    def child_runs(self, parent_run_id: str) -> pandas.DataFrame:
        """The parent's trial runs as a DataFrame, one row per run ordered by trial number
        (columns as `runs.child_runs`). Raises TrackingError if MLflow cannot be read."""
        return runs.child_runs(self._store, parent_run_id)

    # ----------------------------------------------------------------- outbox

    def pending(self) -> int:
        """How many MLflow writes wait in the outbox."""
        return self._outbox.pending()

    def replay_outbox(self) -> tuple[int, int]:
        """Send the queued writes in order; return (replayed, still pending).

        Each replay is idempotent, so a crash halfway sends some twice without harm. Stops trying
        at the first failure if MLflow is unreachable; lines that can never succeed (unreadable,
        outcome file gone, refused by MLflow) move to outbox.rejected.jsonl.
        """
        return self._outbox.replay(self._store)

    def _replay_if_pending(self) -> None:
        """MLflow just answered: send what waited in the outbox, in order."""
        if not self._outbox.pending():
            return
        try:
            self._outbox.replay(self._store)
        except OSError as e:  # e.g. the outbox folder became unwritable; retried next time
            log.warning("outbox replay failed: %s", convert.short(e))

    def _require_outage(self, error: Exception, what: str) -> None:
        """Return if `error` is an outage (the write may be queued); raise otherwise: a bug as it
        is, a refusal by MLflow as TrackingError."""
        failure = classify(error)
        if failure is Failure.bug:
            raise error
        if failure is Failure.refused:
            self._outbox.backoff.up()  # MLflow answered
            text = convert.short(error)
            fix = _DISK_FIX if disk_failing(text) else _REFUSED_FIX
            raise TrackingError(f"{self._store.where()} refused to {what}: {text}. Fix: {fix}") from error

    def _queue(self, entry: OutboxEntry, error: BaseException | str) -> None:
        if isinstance(error, BaseException):
            # A real failed call lengthens the back-off; queueing *because of* the back-off must
            # not, or a few trials would push the next attempt ten minutes out.
            self._outbox.backoff.down()
        entry = entry.model_copy(update={"queued_at": convert.now_iso(), "error": convert.short(error)})
        log.warning(
            "%s unreachable, %s queued in %s: %s", self._store.where(), entry.op, self._outbox.path, entry.error
        )
        self._outbox.append(entry)

    # ----------------------------------------------------------------- report

    def links(
        self, parent_run_id: str, *, champion_trial: int | None, model: str | None, version: str | None
    ) -> dict[str, str]:
        """MLflow UI links (relative, `#/...`) for a description: `trials` (the ranked trials view),
        `champion` (its run) and `model` (the registered version), where they exist."""
        with self._store.reading(f"read the runs of sweep run {parent_run_id}"):
            return runs.links(self._store, parent_run_id, champion_trial=champion_trial, model=model, version=version)

    def publish_report(
        self,
        parent_run_id: str,
        *,
        description: str,
        report: Path,
        plots: Mapping[str, str],
        plotly_js: str,
        champion_trial: int | None,
        star_run_id: str | None = None,
    ) -> None:
        """Put the report on the parent run: its description (markdown), `report.html`, Optuna's plots as
        `optuna/<name>.html`, and the tag `sweep.champion` on the promoted configuration's run
        (`star_run_id`: the registry version's source run), else on the champion trial's. Raises
        TrackingError when MLflow cannot be reached or refuses."""
        with self._store.failing_as(
            f"publish the report on sweep run {parent_run_id}",
            "(1) start the tracking server, then (2) run `sweep report` again.",
        ):
            runs.publish_report(
                self._store,
                parent_run_id,
                description=description,
                report=report,
                plots=plots,
                plotly_js=plotly_js,
                champion_trial=champion_trial,
                star_run_id=star_run_id,
            )

    # ----------------------------------------------------------------- registry

    def promote(
        self,
        run_id: str,
        *,
        model_name: str,
        serving_config: ServingConfig,
        alias: str = "champion",
        description: str = "",
    ) -> str:
        """Register the trial run's serving config as a new model version with `alias`; return the version.

        The config is uploaded as `serving_config/serving_config.json` on the run and the version's
        source is `runs:/<run_id>/serving_config`. Raises TrackingError if MLflow refuses.
        """
        version = registry.promote(
            self._store,
            run_id,
            model_name=model_name,
            serving_config=serving_config,
            alias=alias,
            description=description,
        )
        self._outbox.backoff.up()
        return version

    def withdraw(self, model_name: str, alias: str, parent_run_id: str) -> str | None:
        """Remove `alias` where it points at a version this sweep registered (registry.withdraw)."""
        return registry.withdraw(self._store, model_name, alias, parent_run_id)

    def resolve(self, model_name: str, alias: str = "champion") -> ServingConfig:
        """Fetch the serving config behind `models:/<model_name>@<alias>`, with
        `model_version` and `run_id` from the registry. Raises TrackingError naming the store and
        the fix when the model or alias does not exist or MLflow is unreachable."""
        return registry.resolve(self._store, model_name, alias)
