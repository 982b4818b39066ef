"""MLflow for a sweep: a parent run per sweep, a nested child run per trial, registry, outbox.

This is the only module that imports MLflow, and it only uses `MlflowClient` with explicit run ids
(never the process-global active run), so the driver can keep several trials open at once.

Layout in MLflow (DESIGN.md, "Storage and tracking defaults"):

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

When MLflow is unreachable, `log_trial`, `kill_trial`, `end_sweep` and `log_sweep_summary` do not
raise: they append one JSON line to `<outbox_dir>/outbox.jsonl` and `replay_outbox` sends them later
(idempotently) in order. Outbox line formats:

    {"op": "log_trial", "parent_run_id": str, "run_id": str | null,
     "outcome_path": "<trial_dir>/outcome.json", "extra_metrics": {str: float},
     "extra_tags": {str: str}, "queued_at": ISO-8601, "error": str}
    {"op": "kill_trial", "run_id": str, "queued_at": ..., "error": ...}
    {"op": "end_sweep", "parent_run_id": str, "status": "FINISHED" | "FAILED" | "KILLED", ...}
    {"op": "log_sweep_summary", "parent_run_id": str, "summary_dir": str,
     "metrics": {str: float}, "tags": {str: str}, ...}

Failing fast: MLflow's HTTP client reads its retry and timeout settings from environment
variables on every request (`mlflow.environment_variables.MLFLOW_HTTP_REQUEST_*`; the
`MlflowClient` API takes no per-client setting), and by default retries 7 times with exponential
backoff, i.e. minutes per call against a stopped server. The first time a Tracker creates its
client it therefore sets, unless the user already set them, MLFLOW_HTTP_REQUEST_MAX_RETRIES=1,
MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR=1, MLFLOW_HTTP_REQUEST_BACKOFF_JITTER=0.5,
MLFLOW_HTTP_REQUEST_TIMEOUT=15 (and quiets MLflow's progress bars and run-URL prints; all in
MLFLOW_ENV_DEFAULTS). A refused connection then fails in about 20 ms (measured on loopback).
On top of that, after a failed call the tracker sends further trial logs straight to the outbox
for a back-off window (30 s, doubling up to 10 min) instead of waiting on a server that hangs; a
successful call or `replay_outbox` closes it, and the first successful `log_trial` or `end_sweep`
after an outage replays the outbox by itself.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import logging
import math
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import redact
from orchestrator.errors import TrackingError
from orchestrator.records import FailureKind, TrialOutcome, TrialStatus
from orchestrator.results import export

if TYPE_CHECKING:
    import pandas
    from matplotlib.figure import Figure
    from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)

OUTBOX_FILE = "outbox.jsonl"
REJECTED_FILE = "outbox.rejected.jsonl"
"""Outbox lines that can never be sent (unreadable JSON, outcome file gone), kept for inspection."""
OUTBOX_FILES_DIR = "outbox-files"

KIND_TAG = "sweep.kind"
TRIAL_TAG = "sweep.trial_number"
ROLE_TAG = "sweep.role"
TRIAL_DIR_TAG = "sweep.trial_dir"
"""Tells apart runs that share a trial number and role (the rounds of a confirmation)."""
PARENT_TAG = "mlflow.parentRunId"
NOTE_TAG = "mlflow.note.content"
UNSET = "unset"
"""How a knob left at its default (None) appears among a run's params."""

REASON_MAX = 500
NOTE_MAX = 4000
TAG_MAX = 5000
SWEEP_STATUSES = ("FINISHED", "FAILED", "KILLED")

MLFLOW_ENV_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.5",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
    # Keep MLflow's own stdout/stderr chatter out of the sweep's terminal display.
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}
"""Set in os.environ (unless already set) when a Tracker first creates its client; see the module
doc for why this is the only way."""
_BACKOFF_FIRST_S = 30.0
_BACKOFF_MAX_S = 600.0
_ROLE_RUN_PREFIX = {"search": "trial"}
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")




class Tracker:
    """The sweep's view of one MLflow tracking store and experiment.

    Nothing happens in the constructor: the MLflow client, the experiment and the database are
    created on first use, so building a Tracker is free and cannot fail.
    """

    def __init__(self, tracking_uri: str, experiment_name: str, *, outbox_dir: Path,
                 artifact_location: str | None = None):
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.outbox_dir = Path(outbox_dir)
        self.artifact_location = artifact_location
        self._client_obj: MlflowClient | None = None
        self._experiment_id: str | None = None
        self._lock = threading.RLock()
        self._failures = 0
        self._down_until = 0.0
        self._run_experiments: dict[str, str] = {}

    # ----------------------------------------------------------------- where things live

    @property
    def outbox_path(self) -> Path:
        return self.outbox_dir / OUTBOX_FILE

    def default_artifact_location(self) -> str | None:
        """`<workdir>/mlartifacts` for a sqlite store (workdir = the database's folder), else None
        (a tracking server decides)."""
        if self.artifact_location is not None:
            return self.artifact_location
        db = _sqlite_path(self.tracking_uri)
        if db is None:
            return None
        return str(db.resolve().parent / "mlartifacts")

    def _where(self) -> str:
        return f"MLflow at {redact.redact_text(self.tracking_uri)}"

    # ----------------------------------------------------------------- client and experiment

    def _client(self) -> MlflowClient:
        with self._lock:
            if self._client_obj is None:
                for name, value in MLFLOW_ENV_DEFAULTS.items():
                    # Process-wide on purpose: MLflow reads these per request and offers no
                    # per-client setting (module doc). A value the user set wins.
                    os.environ.setdefault(name, value)
                from mlflow.tracking import MlflowClient

                db = _sqlite_path(self.tracking_uri)
                if db is not None:
                    db.parent.mkdir(parents=True, exist_ok=True)
                self._client_obj = MlflowClient(tracking_uri=self.tracking_uri,
                                                registry_uri=self.tracking_uri)
            return self._client_obj

    def experiment_id(self) -> str:
        """The experiment's id, creating the experiment (or restoring a deleted one) if needed."""
        with self._lock:
            if self._experiment_id is None:
                self._experiment_id = self._get_or_create_experiment()
            return self._experiment_id

    def _get_or_create_experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        client = self._client()
        experiment = client.get_experiment_by_name(self.experiment_name)
        if experiment is not None:
            if experiment.lifecycle_stage == "deleted":
                client.restore_experiment(experiment.experiment_id)
            return experiment.experiment_id
        try:
            return client.create_experiment(self.experiment_name,
                                            artifact_location=self.default_artifact_location())
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            experiment = client.get_experiment_by_name(self.experiment_name)  # created meanwhile
            if experiment is None:
                raise
            return experiment.experiment_id

    def _existing_experiment_id(self) -> str | None:
        """The experiment's id for read-only use: never creates a store or an experiment."""
        self._require_store()
        with self._lock:
            if self._experiment_id is None:
                experiment = self._client().get_experiment_by_name(self.experiment_name)
                if experiment is None or experiment.lifecycle_stage == "deleted":
                    return None
                self._experiment_id = experiment.experiment_id
            return self._experiment_id

    def _require_store(self) -> None:
        db = _sqlite_path(self.tracking_uri)
        if db is not None and not db.exists():
            raise TrackingError(
                f"There is no MLflow store at {db}. Fix: (1) give the work directory of a sweep "
                f"that has run (--workdir), or (2) pass --tracking-uri of the store that has it."
            )

    # ----------------------------------------------------------------- sweep (parent run)

    def start_sweep(self, *, run_name: str, params: Mapping[str, Any], tags: Mapping[str, Any],
                    resume_run_id: str | None = None) -> str:
        """Create the sweep's parent run (or mark `resume_run_id` RUNNING again); return its id.

        On resume, params already on the run are kept (MLflow params cannot change); new ones are
        added. Raises TrackingError if MLflow cannot be reached: a sweep does not start blind.
        """
        run_tags = {**_str_dict(tags), KIND_TAG: "sweep"}
        run_params = _params(params)
        try:
            client = self._client()
            if resume_run_id is None:
                run = client.create_run(self.experiment_id(), run_name=run_name, tags=run_tags)
                run_id = run.info.run_id
                _log_batch(client, run_id, params=run_params)
            else:
                run = client.get_run(resume_run_id)
                run_id = resume_run_id
                client.update_run(run_id, status="RUNNING")
                new = {k: v for k, v in run_params.items() if k not in run.data.params}
                _log_batch(client, run_id, params=new,
                           tags={**run_tags, "sweep.resumed_at": _now_iso()})
        except TrackingError:
            raise
        except Exception as e:
            what = (f"resume the sweep run {resume_run_id}" if resume_run_id
                    else "start the sweep run")
            raise TrackingError(
                f"Could not {what} in {self._where()}: {_short(e)}. Fix: (1) start the tracking "
                f"server or correct tracking.uri in the experiment file, or (2) leave tracking.uri "
                f"unset to use the sqlite store in the work directory."
            ) from e
        self._mark_up()
        return run_id

    def end_sweep(self, parent_run_id: str, status: str = "FINISHED") -> None:
        """Close the parent run as FINISHED, FAILED or KILLED (queued if MLflow is unreachable)."""
        if status not in SWEEP_STATUSES:
            raise ValueError(
                f"status must be one of {', '.join(SWEEP_STATUSES)}, but got {status!r}")
        if not self._backing_off():
            self._replay_if_pending()  # last chance for queued trial logs before the sweep ends
        try:
            self._client().set_terminated(parent_run_id, status)
        except Exception as e:
            self._queue({"op": "end_sweep", "parent_run_id": parent_run_id, "status": status}, e)
        else:
            self._mark_up()

    def log_sweep_summary(self, parent_run_id: str, *, metrics: Mapping[str, float],
                          tags: Mapping[str, Any], table: pandas.DataFrame,
                          figures: Mapping[str, Figure]) -> None:
        """Put the sweep's summary on the parent run: metrics, tags, the results table as
        `results.csv`, `results.html` and an MLflow table (`results.json`), figures as
        `figures/<name>.png`. Queued (files kept under the outbox folder) if MLflow is unreachable.
        """
        stage = self.outbox_dir / OUTBOX_FILES_DIR / f"summary-{_safe(parent_run_id)}"
        shutil.rmtree(stage, ignore_errors=True)
        (stage / "figures").mkdir(parents=True)
        table.to_csv(stage / "results.csv", index=False)
        (stage / "results.html").write_text(table.to_html(index=False, na_rep=""),
                                            encoding="utf-8")
        for name, figure in figures.items():
            filename = _safe(name.removesuffix(".png")) + ".png"
            figure.savefig(stage / "figures" / filename, dpi=120, bbox_inches="tight")
        clean_metrics = _metrics(metrics)
        clean_tags = _str_dict(tags)
        if self._backing_off():
            self._queue(_summary_line(parent_run_id, stage, clean_metrics, clean_tags),
                        "MLflow was unreachable moments ago")
            return
        try:
            self._write_summary(parent_run_id, stage, clean_metrics, clean_tags, table)
        except Exception as e:
            self._queue(_summary_line(parent_run_id, stage, clean_metrics, clean_tags), e)
        else:
            self._mark_up()
            shutil.rmtree(stage, ignore_errors=True)

    def _write_summary(self, parent_run_id: str, stage: Path, metrics: dict[str, float],
                       tags: dict[str, str], table: pandas.DataFrame | None = None) -> None:
        client = self._client()
        now = _ms(time.time())
        _log_batch(client, parent_run_id, metrics=metrics, tags=tags, timestamp_ms=now)
        figures = stage / "figures"
        if figures.is_dir() and not any(figures.iterdir()):
            figures.rmdir()
        client.log_artifacts(parent_run_id, str(stage))
        if table is None:
            import pandas as pd

            table = pd.read_csv(stage / "results.csv")
        try:
            client.log_table(parent_run_id, table, "results.json")
        except Exception as e:  # the CSV and HTML are already there; the table view is a bonus
            log.warning("results table not logged as an MLflow table: %s", _short(e))

    # ----------------------------------------------------------------- trials (child runs)

    def start_trial(self, parent_run_id: str, *, number: int, params: Mapping[str, Any],
                    role: str, tags: Mapping[str, Any]) -> str | None:
        """Open the trial's child run (RUNNING, params = every knob) and return its id.

        Finds the run first if this trial number and role already have one under the parent.
        Returns None if MLflow is unreachable; `log_trial(..., run_id=None)` creates it later.
        """
        if self._backing_off():
            return None
        role = _role(role)
        try:
            client = self._client()
            run_id = self._find_trial(client, parent_run_id, number, role)
            if run_id is None:
                run_id = self._create_trial(client, parent_run_id, number, role, _str_dict(tags))
            else:
                client.update_run(run_id, status="RUNNING")
            self._log_params(client, run_id, _params(params))
        except Exception as e:
            self._mark_down()
            log.warning("MLflow unreachable, trial %s will be logged later: %s", number, _short(e))
            return None
        self._mark_up()
        return run_id

    def log_trial(self, parent_run_id: str, outcome: TrialOutcome, *, run_id: str | None = None,
                  extra_metrics: Mapping[str, float] | None = None,
                  extra_tags: Mapping[str, Any] | None = None) -> None:
        """Log a finished trial on its child run and close the run; never raises for MLflow.

        The run is `run_id`, or the parent's child with this trial number and role, or a new one.
        Logging the same outcome twice gives the same run contents. If any MLflow call fails the
        whole log is queued in the outbox (module doc) and sent by `replay_outbox`.
        """
        extra_metrics = _metrics(extra_metrics or {})
        extra_tags = _str_dict(extra_tags or {})
        line = {"op": "log_trial", "parent_run_id": parent_run_id, "run_id": run_id,
                "outcome_path": None, "extra_metrics": extra_metrics, "extra_tags": extra_tags}
        if self._backing_off():
            line["outcome_path"] = str(self._outcome_file(outcome))
            self._queue(line, "MLflow was unreachable moments ago")
            return
        try:
            self._write_trial(parent_run_id, outcome, run_id, extra_metrics, extra_tags)
        except Exception as e:
            line["outcome_path"] = str(self._outcome_file(outcome))
            self._queue(line, e)
            return
        self._mark_up()
        self._replay_if_pending()

    def _replay_if_pending(self) -> None:
        """MLflow just answered: send what waited in the outbox, in order."""
        if not self.pending():
            return
        try:
            self.replay_outbox()
        except Exception as e:  # e.g. the outbox folder became unwritable; retried next time
            log.warning("outbox replay failed: %s", _short(e))

    def kill_trial(self, run_id: str) -> None:
        """Close a trial's run as KILLED (an interrupted trial); queued if MLflow is unreachable."""
        try:
            self._client().set_terminated(run_id, "KILLED")
        except Exception as e:
            self._queue({"op": "kill_trial", "run_id": run_id}, e)
        else:
            self._mark_up()

    def kill_running_trials(self, parent_run_id: str) -> list[int]:
        """Close every child run of the parent still RUNNING as KILLED (for `--resume`); return
        their trial numbers. Replay the outbox first, so queued results are not taken for
        interrupted trials. Raises TrackingError if MLflow is unreachable."""
        killed = []
        runs = self._child_run_objects(parent_run_id)
        with self._reading(f"close the interrupted trial runs of sweep run {parent_run_id}"):
            for run in runs:
                if run.info.status == "RUNNING":
                    self._client().set_tag(run.info.run_id, "sweep.failure_kind",
                                           FailureKind.interrupted.value)
                    self._client().set_terminated(run.info.run_id, "KILLED")
                    killed.append(int(run.data.tags.get(TRIAL_TAG, -1)))
        return sorted(killed)

    def _write_trial(self, parent_run_id: str, outcome: TrialOutcome, run_id: str | None,
                     extra_metrics: dict[str, float], extra_tags: dict[str, str]) -> str:
        role = _role(outcome.role)
        params = _params(outcome.params)
        metrics = {**_outcome_metrics(outcome), **extra_metrics}
        tags = {**_outcome_tags(outcome), **extra_tags}
        client = self._client()
        existing: dict[str, str] | None = None
        if run_id is not None:
            existing = _params_of(client, run_id)
            if existing is None:
                log.warning("MLflow run %s of trial %s is gone; logging to a new run",
                            run_id, outcome.number)
                run_id = None
        if run_id is None:
            run_id = self._find_trial(client, parent_run_id, outcome.number, role,
                                      trial_dir=outcome.trial_dir)
            existing = None if run_id is None else _params_of(client, run_id)
        if run_id is None:
            run_id = self._create_trial(client, parent_run_id, outcome.number, role,
                                        _str_dict({TRIAL_DIR_TAG: outcome.trial_dir or None}))
        new_params, clash_tags = _param_diff(params, existing or {})
        # A fixed timestamp and step make a repeated log of the same outcome a no-op in MLflow.
        when = outcome.finished_at or outcome.started_at or time.time()
        _log_batch(client, run_id, metrics=metrics, params=new_params,
                   tags={**tags, **clash_tags}, timestamp_ms=_ms(when))
        trial_dir = Path(outcome.trial_dir) if outcome.trial_dir else None
        if trial_dir is not None and trial_dir.is_dir():
            client.log_artifacts(run_id, str(trial_dir), "trial")
        end = _ms(outcome.finished_at) if outcome.finished_at else None
        client.set_terminated(run_id, _run_status(outcome), end_time=end)
        return run_id

    def _create_trial(self, client: MlflowClient, parent_run_id: str, number: int, role: str,
                      tags: dict[str, str]) -> str:
        run = client.create_run(
            self._experiment_of(client, parent_run_id),
            run_name=trial_run_name(role, number, tags.get(TRIAL_DIR_TAG, "")),
            tags={**tags, PARENT_TAG: parent_run_id, KIND_TAG: "trial",
                  TRIAL_TAG: str(number), ROLE_TAG: role},
        )
        return run.info.run_id

    def _find_trial(self, client: MlflowClient, parent_run_id: str, number: int, role: str,
                    trial_dir: str | None = None) -> str | None:
        """The child run of this trial number and role (and, when given, trial folder).

        A run without a trial-folder tag (opened by start_trial) matches any folder; a run with
        another folder is another measurement (a confirmation round) and does not match.
        """
        runs = client.search_runs(
            [self._experiment_of(client, parent_run_id)],
            filter_string=(f"tags.`{PARENT_TAG}` = '{parent_run_id}' and "
                           f"tags.`{TRIAL_TAG}` = '{int(number)}' and "
                           f"tags.`{ROLE_TAG}` = '{_quote_filter(role)}'"),
            max_results=1000,
            order_by=["attributes.start_time ASC"],
        )
        if not trial_dir:
            return runs[0].info.run_id if runs else None
        wanted = _str_dict({TRIAL_DIR_TAG: trial_dir})[TRIAL_DIR_TAG]  # as it was stored
        for run in runs:
            if run.data.tags.get(TRIAL_DIR_TAG) == wanted:
                return run.info.run_id
        for run in runs:
            if TRIAL_DIR_TAG not in run.data.tags:
                return run.info.run_id
        return None

    def find_trial(self, parent_run_id: str, number: int, role: str = "search") -> str | None:
        """The run id of this trial's child run under the parent, or None."""
        with self._reading(f"find trial {number} of sweep run {parent_run_id}"):
            return self._find_trial(self._client(), parent_run_id, number, _role(role))

    @staticmethod
    def _log_params(client: MlflowClient, run_id: str, params: dict[str, str]) -> None:
        new, clash_tags = _param_diff(params, client.get_run(run_id).data.params)
        _log_batch(client, run_id, params=new, tags=clash_tags)

    def _experiment_of(self, client: MlflowClient, run_id: str) -> str:
        with self._lock:
            if run_id not in self._run_experiments:
                self._run_experiments[run_id] = client.get_run(run_id).info.experiment_id
            return self._run_experiments[run_id]

    def _outcome_file(self, outcome: TrialOutcome) -> Path:
        """Where the outbox finds this outcome: the trial's outcome.json if it holds exactly this
        outcome, else a copy written under the outbox folder."""
        if outcome.trial_dir:
            path = Path(outcome.trial_dir) / "outcome.json"
            try:
                if TrialOutcome.model_validate_json(path.read_text(encoding="utf-8")) == outcome:
                    return path.resolve()
            except (OSError, ValueError):
                pass
        role = _role(outcome.role)
        path = self.outbox_dir / OUTBOX_FILES_DIR / "outcomes" / f"{role}-{outcome.number:04d}.json"
        export.write_atomic(path, outcome.model_dump_json(indent=2) + "\n")
        return path.resolve()

    # ----------------------------------------------------------------- outbox

    def pending(self) -> int:
        """How many MLflow writes wait in the outbox."""
        try:
            text = self.outbox_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return 0
        return sum(1 for line in text.splitlines() if line.strip())

    def replay_outbox(self) -> tuple[int, int]:
        """Send the queued writes in order; return (replayed, still pending).

        Each replay is idempotent, so a crash halfway sends some twice without harm. Stops trying
        at the first failure if MLflow is unreachable; lines that can never succeed (unreadable,
        outcome file gone) move to outbox.rejected.jsonl. The outbox is rewritten atomically.
        """
        with self._outbox_locked():
            try:
                lines = self.outbox_path.read_text(encoding="utf-8").splitlines()
            except FileNotFoundError:
                return 0, 0
            replayed, keep, rejected = 0, [], []
            unreachable = False
            for line in (item for item in lines if item.strip()):
                if unreachable:
                    keep.append(line)
                    continue
                try:
                    send = self._replay_action(json.loads(line))
                except (ValueError, KeyError, TypeError, OSError) as e:
                    # Unreadable line or input files gone: retrying can never help.
                    log.warning("outbox line cannot be replayed, moved to %s: %s",
                                REJECTED_FILE, _short(e))
                    rejected.append(line)
                    continue
                try:
                    send()
                except Exception as e:
                    log.warning("outbox replay failed, kept for later: %s", _short(e))
                    keep.append(line)
                    unreachable = not self._reachable()
                else:
                    replayed += 1
            if rejected:
                with open(self.outbox_dir / REJECTED_FILE, "a", encoding="utf-8") as f:
                    f.write("".join(line + "\n" for line in rejected))
            export.write_atomic(self.outbox_path, "".join(line + "\n" for line in keep))
        if unreachable:
            self._mark_down()
        elif replayed:
            self._mark_up()
        return replayed, len(keep)

    def _replay_action(self, entry: dict[str, Any]) -> Callable[[], Any]:
        """Read one outbox entry and its files; return the MLflow calls that send it.

        Everything that can fail for good (bad JSON shape, files gone) fails here, before any
        MLflow call, so that a failure of the returned callable means "try again later".
        """
        op = entry["op"]
        if op == "log_trial":
            outcome = TrialOutcome.model_validate_json(
                Path(entry["outcome_path"]).read_text(encoding="utf-8"))
            parent, run_id = str(entry["parent_run_id"]), entry.get("run_id")
            metrics, tags = entry.get("extra_metrics") or {}, entry.get("extra_tags") or {}
            return lambda: self._write_trial(parent, outcome, run_id, metrics, tags)
        if op == "kill_trial":
            run_id = str(entry["run_id"])
            return lambda: self._client().set_terminated(run_id, "KILLED")
        if op == "end_sweep":
            parent, status = str(entry["parent_run_id"]), str(entry["status"])
            if status not in SWEEP_STATUSES:
                raise ValueError(f"bad sweep status {status!r}")
            return lambda: self._client().set_terminated(parent, status)
        if op == "log_sweep_summary":
            parent, stage = str(entry["parent_run_id"]), Path(entry["summary_dir"])
            if not (stage / "results.csv").is_file():
                raise FileNotFoundError(f"summary files are gone: {stage}")
            metrics, tags = entry.get("metrics") or {}, entry.get("tags") or {}

            def send() -> None:
                self._write_summary(parent, stage, metrics, tags)
                shutil.rmtree(stage, ignore_errors=True)

            return send
        raise ValueError(f"unknown outbox op {op!r}")

    def _queue(self, line: dict[str, Any], error: BaseException | str) -> None:
        if isinstance(error, BaseException):
            # A real failed call lengthens the back-off; queueing *because of* the back-off must not,
            # or a few trials would push the next attempt ten minutes out.
            self._mark_down()
        line = {**line, "queued_at": _now_iso(), "error": _short(error)}
        log.warning("%s unreachable, %s queued in %s: %s", self._where(), line["op"],
                    self.outbox_path, line["error"])
        with self._outbox_locked():
            with open(self.outbox_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(line, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())

    @contextlib.contextmanager
    def _outbox_locked(self) -> Iterator[None]:
        """One writer at a time, across threads and processes (`sweep sync` beside a sweep)."""
        with self._lock:
            self.outbox_dir.mkdir(parents=True, exist_ok=True)
            with open(self.outbox_dir / "outbox.lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)

    def _reachable(self) -> bool:
        try:
            self._client().search_experiments(max_results=1)
        except Exception:
            return False
        return True

    def _backing_off(self) -> bool:
        return time.monotonic() < self._down_until

    def _mark_down(self) -> None:
        with self._lock:
            self._failures += 1
            window = min(_BACKOFF_MAX_S, _BACKOFF_FIRST_S * 2 ** (self._failures - 1))
            self._down_until = time.monotonic() + window

    def _mark_up(self) -> None:
        with self._lock:
            self._failures = 0
            self._down_until = 0.0

    # ----------------------------------------------------------------- registry

    def promote(self, run_id: str, *, model_name: str, serving_config: Mapping[str, Any],
                alias: str = "champion", description: str = "") -> str:
        """Register the trial run's serving config as a new model version with `alias`; return
        the version.

        The config is uploaded as `serving_config/serving_config.json` on the run and the version's
        source is `runs:/<run_id>/serving_config`. Raises TrackingError if MLflow refuses.
        """
        config = dict(serving_config)
        export.validate_serving_config(config)
        if not run_id:
            raise ValueError("promote needs the trial's MLflow run id (Tracker.find_trial finds it)")
        if config["run_id"] not in ("", run_id):  # "" = not known when the config was built
            raise ValueError(
                f"serving config belongs to run {config['run_id']!r}, not to {run_id!r}")
        config["run_id"] = run_id
        from mlflow.exceptions import MlflowException

        version_tags = {
            TRIAL_TAG: str(config["trial_number"]),
            "sweep.experiment": config["experiment"],
            "sweep.engine": config["engine"],
            "sweep.fingerprint_hash": config["fingerprint_hash"],
            **{f"metric.{k}": _number_text(v) for k, v in config["metrics"].items()},
        }
        try:
            client = self._client()
            with tempfile.TemporaryDirectory(prefix="serving_config-") as tmp:
                (Path(tmp) / "serving_config.json").write_text(
                    json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
                client.log_artifacts(run_id, tmp, "serving_config")
            try:
                client.get_registered_model(model_name)
            except MlflowException as e:
                if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
                with contextlib.suppress(MlflowException):  # another process may create it too
                    client.create_registered_model(
                        model_name, description="Serving configurations chosen by sglang-sweep")
            version = client.create_model_version(
                model_name, source=f"runs:/{run_id}/serving_config", run_id=run_id,
                tags=version_tags, description=description or None)
            client.set_registered_model_alias(model_name, alias, version.version)
            client.set_tag(run_id, "sweep.promoted", f"{model_name}@{alias} v{version.version}")
        except Exception as e:
            raise TrackingError(
                f"Could not promote run {run_id} as {model_name!r}@{alias} in {self._where()}: "
                f"{_short(e)}. Fix: (1) check the tracking server is up, then (2) promote again "
                f"(the trial run and its artifacts are already in MLflow)."
            ) from e
        self._mark_up()
        return str(version.version)

    def resolve(self, model_name: str, alias: str = "champion") -> dict[str, Any]:
        """Fetch the serving config behind `models:/<model_name>@<alias>`.

        Returns the serving config (the dict `export.render` takes) with its provenance from the
        registry: `model_version` is the version the alias points at, `run_id` the version's run
        (its source is `runs:/<run_id>/serving_config`). Raises TrackingError naming the store and
        the fix when the model or alias does not exist or MLflow is unreachable.
        """
        self._require_store()
        client = self._client()
        try:
            version = client.get_model_version_by_alias(model_name, alias)
        except Exception as e:
            raise TrackingError(self._resolve_problem(client, model_name, alias, e)) from e
        try:
            with tempfile.TemporaryDirectory(prefix="resolve-") as tmp:
                folder = self._download_version(client, model_name, str(version.version), tmp)
                text = (Path(folder) / "serving_config.json").read_text(encoding="utf-8")
        except FileNotFoundError as e:
            raise TrackingError(
                f"Model {model_name!r} version {version.version} ({version.source}) in "
                f"{self._where()} holds no serving_config.json. Fix: promote a sweep's champion "
                f"again (its run folder serving_config/ was not uploaded)."
            ) from e
        except Exception as e:
            raise TrackingError(
                f"Could not download models:/{model_name}@{alias} (version {version.version}, "
                f"{version.source}) from {self._where()}: {_short(e)}. Fix: check the tracking "
                f"server and its artifact store are reachable."
            ) from e
        try:
            config = json.loads(text)
            config["model_version"] = str(version.version)
            export.validate_serving_config(config)
            if version.run_id and config["run_id"] != version.run_id:
                raise ValueError(f"it names run {config['run_id']} but version "
                                 f"{version.version} was made from run {version.run_id}")
        except (ValueError, TypeError) as e:
            raise TrackingError(
                f"The serving_config.json of {model_name!r} version {version.version} in "
                f"{self._where()} is not a serving config: {e}. Fix: promote the champion again "
                f"with this version of sglang-sweep."
            ) from e
        return config

    def _download_version(self, client: MlflowClient, model_name: str, version: str,
                          dst: str) -> str:
        # mlflow.artifacts.download_artifacts("models:/...") resolves the run's artifacts through
        # the process-global tracking URI, not the one given (3.17), so go through our client.
        uri = client.get_model_version_download_uri(model_name, version)
        if uri.startswith("runs:/"):
            run_id, _, path = uri[len("runs:/"):].partition("/")
            return client.download_artifacts(run_id, path, dst)
        import mlflow.artifacts

        return mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=dst,
                                                   tracking_uri=self.tracking_uri)

    def _resolve_problem(self, client: MlflowClient, model_name: str, alias: str,
                         error: Exception) -> str:
        code = getattr(error, "error_code", "")
        if code == "RESOURCE_DOES_NOT_EXIST":
            return (f"No registered model {model_name!r} in {self._where()}. Fix: (1) let a sweep "
                    f"finish (it promotes its champion), or (2) pass the model name the "
                    f"experiment's promotion.model_name uses (--model), or (3) pass the store "
                    f"that has it (--workdir or --tracking-uri).")
        if code == "INVALID_PARAMETER_VALUE" and "alias" in str(error).lower():
            try:
                aliases = sorted(client.get_registered_model(model_name).aliases)
            except Exception:
                aliases = []
            known = f" (it has: {', '.join(aliases)})" if aliases else " (it has no aliases)"
            return (f"Registered model {model_name!r} in {self._where()} has no alias "
                    f"{alias!r}{known}. Fix: (1) pass one of its aliases with --alias, or "
                    f"(2) promote a champion by letting a sweep finish.")
        return (f"Could not reach {self._where()} to resolve models:/{model_name}@{alias}: "
                f"{_short(error)}. Fix: (1) start the tracking server, or (2) pass the right "
                f"--tracking-uri / --workdir.")

    # ----------------------------------------------------------------- reading back

    def find_parent(self, *, run_name: str | None = None,
                    status: str | None = None) -> str | None:
        """The most recent sweep (parent) run of the experiment, optionally with this run name or
        status (RUNNING, FINISHED, ...); None if there is none. Never creates anything."""
        with self._reading("find the latest sweep run"):
            experiment_id = self._existing_experiment_id()
            if experiment_id is None:
                return None
            runs = self._client().search_runs(
                [experiment_id], filter_string=" and ".join(self._parent_filters(run_name, status)),
                max_results=1, order_by=["attributes.start_time DESC"])
        return runs[0].info.run_id if runs else None

    @staticmethod
    def _parent_filters(run_name: str | None, status: str | None) -> list[str]:
        filters = [f"tags.`{KIND_TAG}` = 'sweep'"]
        if run_name is not None:
            filters.append(f"attributes.run_name = '{_quote_filter(run_name)}'")
        if status is not None:
            filters.append(f"attributes.status = '{_quote_filter(status)}'")
        return filters

    def child_runs(self, parent_run_id: str) -> pandas.DataFrame:
        """The parent's trial runs as a DataFrame, one row per run ordered by trial number.

        Columns: run_id, run_name, status, start_time, end_time, trial_number, role, then
        `metrics.<name>`, `params.<knob>` and `tags.<key>` as in `mlflow.search_runs`.
        """
        import pandas as pd

        rows = []
        for run in self._child_run_objects(parent_run_id):
            info, data = run.info, run.data
            row: dict[str, Any] = {
                "run_id": info.run_id,
                "run_name": info.run_name,
                "status": info.status,
                "start_time": _timestamp(info.start_time),
                "end_time": _timestamp(info.end_time),
                "trial_number": int(data.tags.get(TRIAL_TAG, -1)),
                "role": data.tags.get(ROLE_TAG, ""),
            }
            row.update({f"metrics.{k}": v for k, v in data.metrics.items()})
            row.update({f"params.{k}": v for k, v in data.params.items()})
            row.update({f"tags.{k}": v for k, v in data.tags.items()
                        if not k.startswith("mlflow.")})
            rows.append(row)
        columns = ["run_id", "run_name", "status", "start_time", "end_time", "trial_number",
                   "role"]
        frame = pd.DataFrame(rows, columns=None if rows else columns)
        if rows:
            frame = frame.sort_values(["trial_number", "start_time"], kind="stable")
            frame = frame.reset_index(drop=True)
        return frame

    def _child_run_objects(self, parent_run_id: str) -> list[Any]:
        self._require_store()
        with self._reading(f"read the trial runs of sweep run {parent_run_id}"):
            client = self._client()
            experiment_id = client.get_run(parent_run_id).info.experiment_id
            runs, token = [], None
            while True:
                page = client.search_runs(
                    [experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
                    max_results=1000, page_token=token)
                runs.extend(page)
                token = page.token
                if not token:
                    return runs

    @contextlib.contextmanager
    def _reading(self, what: str) -> Iterator[None]:
        """Turn MLflow failures of a read into a TrackingError that says what, where and the fix."""
        try:
            yield
        except TrackingError:
            raise
        except Exception as e:
            raise TrackingError(
                f"Could not {what} in {self._where()}: {_short(e)}. Fix: (1) check the tracking "
                f"server is up, (2) check the run id / --workdir / --tracking-uri."
            ) from e


# --------------------------------------------------------------------- pure helpers


def trial_run_name(role: str, number: int, trial_dir: str = "") -> str:
    """`trial-0007` for a searched trial, `baseline-0000`; a confirmation round is named after
    its folder (`confirm-00-champion`) since its rounds share a trial number."""
    role = _role(role)
    if role == "confirm" and trial_dir:
        return f"confirm-{Path(trial_dir).name}"
    return f"{_ROLE_RUN_PREFIX.get(role, role)}-{int(number):04d}"


def _role(role: Any) -> str:
    return str(getattr(role, "value", role))


def _run_status(outcome: TrialOutcome) -> str:
    if outcome.failure_kind == FailureKind.interrupted:
        return "KILLED"
    return "FINISHED" if outcome.status == TrialStatus.COMPLETE else "FAILED"


def _params(params: Mapping[str, Any]) -> dict[str, str]:
    """Every knob as an MLflow param: None becomes "unset", secret-named values are masked."""
    out = {}
    for name, value in params.items():
        if redact.is_secret_name(name):
            out[name] = redact.MASK
        else:
            out[name] = UNSET if value is None else redact.redact_text(_value_text(value))
    return out


def _str_dict(values: Mapping[str, Any]) -> dict[str, str]:
    """Tags as strings; secrets masked; long values cut to what MLflow stores."""
    out = {}
    for name, value in values.items():
        if value is None:
            continue
        text = redact.MASK if redact.is_secret_name(name) else redact.redact_text(
            _value_text(value))
        out[str(name)] = text[:TAG_MAX]
    return out


def _value_text(value: Any) -> str:
    return str(getattr(value, "value", value))


def _metrics(values: Mapping[str, Any]) -> dict[str, float]:
    """Numbers only (bools and None dropped), as floats; NaN kept (MLflow shows it as NaN)."""
    return {str(k): float(v) for k, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _outcome_metrics(outcome: TrialOutcome) -> dict[str, float]:
    metrics: dict[str, float] = {}
    if outcome.metrics is not None:
        metrics.update(_metrics(outcome.metrics.model_dump(exclude={"sources"})))
    if outcome.summary is not None:
        metrics["repeats"] = float(outcome.summary.repeats)
        metrics.update(_metrics({f"{k}_ci95_low": v for k, v in outcome.summary.ci95_low.items()}))
        metrics.update(_metrics({f"{k}_ci95_high": v
                                 for k, v in outcome.summary.ci95_high.items()}))
    metrics.update(_metrics({f"time_{k}_s": v for k, v in outcome.timings.items()}))
    if outcome.started_at and outcome.finished_at:
        metrics["time_total_s"] = outcome.finished_at - outcome.started_at
    return metrics


def _outcome_tags(outcome: TrialOutcome) -> dict[str, str]:
    tags: dict[str, Any] = {
        "sweep.status": outcome.status.value,
        "sweep.failure_kind": outcome.failure_kind.value if outcome.failure_kind else None,
        "sweep.engine": outcome.launch.engine if outcome.launch is not None else None,
        "sweep.fingerprint_hash": outcome.fingerprint_hash or None,
        TRIAL_TAG: str(outcome.number),
        ROLE_TAG: _role(outcome.role),
        TRIAL_DIR_TAG: outcome.trial_dir or None,
        "sweep.allreduce_path": outcome.allreduce_path or None,
        "sweep.node": outcome.node or None,
        "sweep.reason": outcome.reason[:REASON_MAX] if outcome.reason else None,
        "sweep.warnings": "; ".join(outcome.warnings) if outcome.warnings else None,
    }
    if outcome.metrics is not None and outcome.metrics.sources:
        tags["sweep.metric_sources"] = json.dumps(outcome.metrics.sources, sort_keys=True)
    if outcome.status != TrialStatus.COMPLETE and (outcome.reason or outcome.log_tail):
        # The run's description in the UI: why it failed and the end of its log.
        note = f"{outcome.failure_kind.value if outcome.failure_kind else 'failed'}: " \
               f"{outcome.reason}\n\n```\n{outcome.log_tail[-NOTE_MAX:]}\n```"
        tags[NOTE_TAG] = note
    return _str_dict(tags)


def _log_batch(client: MlflowClient, run_id: str, *, metrics: Mapping[str, float] | None = None,
               params: Mapping[str, str] | None = None, tags: Mapping[str, str] | None = None,
               timestamp_ms: int | None = None) -> None:
    """log_batch in chunks MLflow accepts (100 params, 100 tags, 1000 metrics per call)."""
    from mlflow.entities import Metric, Param, RunTag

    stamp = timestamp_ms if timestamp_ms is not None else _ms(time.time())
    metric_list = [Metric(k, v, stamp, 0) for k, v in (metrics or {}).items()]
    param_list = [Param(k, v) for k, v in (params or {}).items()]
    tag_list = [RunTag(k, v) for k, v in (tags or {}).items()]
    while metric_list or param_list or tag_list:
        client.log_batch(run_id, metrics=metric_list[:1000], params=param_list[:100],
                         tags=tag_list[:100])
        metric_list, param_list, tag_list = metric_list[1000:], param_list[100:], tag_list[100:]


def _params_of(client: MlflowClient, run_id: str) -> dict[str, str] | None:
    """The params already on a run, or None if the run does not exist (or was deleted)."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException as e:
        if e.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    return None if run.info.lifecycle_stage == "deleted" else dict(run.data.params)


def _param_diff(params: Mapping[str, str],
                existing: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(params not yet logged, a tag naming those logged with another value).

    MLflow params cannot change once logged; a clash (a bug upstream) is flagged rather than
    left to fail the whole log forever.
    """
    new = {k: v for k, v in params.items() if k not in existing}
    clash = sorted(k for k, v in params.items() if k in existing and existing[k] != v)
    return new, ({"sweep.param_mismatch": ",".join(clash)[:TAG_MAX]} if clash else {})


def _summary_line(parent_run_id: str, stage: Path, metrics: dict[str, float],
                  tags: dict[str, str]) -> dict[str, Any]:
    return {"op": "log_sweep_summary", "parent_run_id": parent_run_id,
            "summary_dir": str(stage.resolve()), "metrics": metrics, "tags": tags}


def _sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///relative` or `sqlite:////absolute` URI, else None."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    return Path(path)


def _quote_filter(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def _safe(name: str) -> str:
    return _SAFE_NAME.sub("_", name).strip("._") or "figure"


def _number_text(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) and math.isfinite(value) else str(value)


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def _timestamp(ms: int | None) -> Any:
    import pandas as pd

    return pd.Timestamp(ms, unit="ms", tz="UTC") if ms else pd.NaT


def _now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _short(error: BaseException | str, limit: int = 300) -> str:
    text = error if isinstance(error, str) else (str(error) or type(error).__name__)
    text = " ".join(redact.redact_text(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
