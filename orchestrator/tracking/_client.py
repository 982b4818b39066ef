"""One MLflow tracking store and experiment: the client, created on first use, and what every verb
needs from it (the experiment, a run's experiment, where-strings, batched logging, failure wording).

Failing fast: MLflow's HTTP client reads its retry and timeout settings from environment variables
on every request (`mlflow.environment_variables.MLFLOW_HTTP_REQUEST_*`; the `MlflowClient` API
takes no per-client setting), and by default retries 7 times with exponential backoff, i.e.
minutes per call against a stopped server. The first time a Store creates its client it therefore
sets, unless the user already set them, the values in MLFLOW_ENV_DEFAULTS (one retry, 15 s
timeout, and no progress bars or run-URL prints). A refused connection then fails in about 20 ms
(measured on loopback).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from orchestrator import redact
from orchestrator.errors import TrackingError
from orchestrator.tracking import convert
from orchestrator.tracking.outage import Failure, classify

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

MLFLOW_ENV_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0.5",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
    # Keep MLflow's own stdout/stderr chatter out of the sweep's terminal display.
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
    # "Creating initial MLflow database tables..." and the like: MLflow's INFO lines are no news.
    "MLFLOW_LOGGING_LEVEL": "WARNING",
}
"""Set in os.environ (unless already set) when a Store first creates its client; see the module
doc for why this is the only way."""


class Store:
    """The client of one tracking URI and the id of one experiment in it, both made on first use.

    Nothing happens in the constructor, so building one is free and cannot fail.
    """

    def __init__(self, tracking_uri: str, experiment_name: str, *, artifact_location: str | None = None):
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.artifact_location = artifact_location
        self.lock = threading.RLock()
        self._client: MlflowClient | None = None
        self._experiment_id: str | None = None
        self._run_experiments: dict[str, str] = {}

    def where(self) -> str:
        """`MLflow at <uri>` with any password in the URI masked, for messages."""
        return f"MLflow at {redact.redact_text(self.tracking_uri)}"

    def default_artifact_location(self) -> str | None:
        """`<workdir>/mlartifacts` for a sqlite store (workdir = the database's folder), else None
        (a tracking server decides)."""
        if self.artifact_location is not None:
            return self.artifact_location
        db = convert.sqlite_path(self.tracking_uri)
        if db is None:
            return None
        return str(db.resolve().parent / "mlartifacts")

    def client(self) -> MlflowClient:
        """The MlflowClient for the tracking URI (also the registry URI)."""
        with self.lock:
            if self._client is None:
                for name, value in MLFLOW_ENV_DEFAULTS.items():
                    # Process-wide on purpose: MLflow reads these per request and offers no
                    # per-client setting (module doc). A value the user set wins.
                    os.environ.setdefault(name, value)
                from mlflow.tracking import MlflowClient  # deferred: importing mlflow takes ~1 s

                db = convert.sqlite_path(self.tracking_uri)
                if db is not None:
                    db.parent.mkdir(parents=True, exist_ok=True)
                self._client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)
            return self._client

    def experiment_id(self) -> str:
        """The experiment's id, creating the experiment (or restoring a deleted one) if needed."""
        with self.lock:
            if self._experiment_id is None:
                self._experiment_id = self._get_or_create_experiment()
            return self._experiment_id

    def _get_or_create_experiment(self) -> str:
        client = self.client()  # first: it quiets MLflow's logging before mlflow is imported
        from mlflow.exceptions import MlflowException  # deferred with the client

        experiment = client.get_experiment_by_name(self.experiment_name)
        if experiment is not None:
            if experiment.lifecycle_stage == "deleted":
                client.restore_experiment(experiment.experiment_id)
            return str(experiment.experiment_id)
        try:
            return str(
                client.create_experiment(self.experiment_name, artifact_location=self.default_artifact_location())
            )
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            experiment = client.get_experiment_by_name(self.experiment_name)  # created meanwhile
            if experiment is None:
                raise
            return str(experiment.experiment_id)

    def existing_experiment_id(self) -> str | None:
        """The experiment's id for read-only use: never creates a store or an experiment."""
        self.require_store()
        with self.lock:
            if self._experiment_id is None:
                experiment = self.client().get_experiment_by_name(self.experiment_name)
                if experiment is None or experiment.lifecycle_stage == "deleted":
                    return None
                self._experiment_id = str(experiment.experiment_id)
            return self._experiment_id

    def require_store(self) -> None:
        """Raise TrackingError if the tracking URI is a sqlite file that does not exist."""
        db = convert.sqlite_path(self.tracking_uri)
        if db is not None and not db.exists():
            raise TrackingError(
                f"There is no MLflow store at {db}. Fix: (1) give the work directory of a sweep "
                f"that has run (--workdir), or (2) pass --tracking-uri of the store that has it."
            )

    def experiment_of(self, run_id: str) -> str:
        """The experiment of a run (cached: a run never moves)."""
        with self.lock:
            if run_id not in self._run_experiments:
                self._run_experiments[run_id] = str(self.client().get_run(run_id).info.experiment_id)
            return self._run_experiments[run_id]

    def reachable(self) -> bool:
        """Whether MLflow answers a cheap read now (False on an outage; a bug raises)."""
        try:
            self.client().search_experiments(max_results=1)
        except Exception as e:
            if classify(e) is Failure.bug:
                raise
            return False
        return True

    @contextlib.contextmanager
    def failing_as(self, what: str, fix: str) -> Iterator[None]:
        """Turn an outage or refusal of MLflow into a TrackingError saying what, where and the fix;
        a bug of ours passes through as it is."""
        try:
            yield
        except TrackingError:
            raise
        except Exception as e:
            if classify(e) is Failure.bug:
                raise
            raise TrackingError(f"Could not {what} in {self.where()}: {convert.short(e)}. Fix: {fix}") from e

    def reading(self, what: str) -> contextlib.AbstractContextManager[None]:
        """`failing_as` for a read: the fix is to check the server and the ids given."""
        return self.failing_as(
            what, "(1) check the tracking server is up, (2) check the run id / --workdir / --tracking-uri."
        )

    def log_batch(
        self,
        run_id: str,
        *,
        metrics: Mapping[str, float] | None = None,
        params: Mapping[str, str] | None = None,
        tags: Mapping[str, str] | None = None,
        timestamp_ms: int | None = None,
        step: int = 0,
    ) -> None:
        """log_batch in chunks MLflow accepts (100 params, 100 tags, 1000 metrics per call); the
        metrics at `step` (a trial's number, so MLflow's charts draw them along the sweep)."""
        client = self.client()  # first: it quiets MLflow's logging before mlflow is imported
        from mlflow.entities import Metric, Param, RunTag  # deferred with the client

        stamp = timestamp_ms if timestamp_ms is not None else convert.ms(time.time())
        metric_list = [Metric(k, v, stamp, step) for k, v in (metrics or {}).items()]
        param_list = [Param(k, v) for k, v in (params or {}).items()]
        tag_list = [RunTag(k, v) for k, v in (tags or {}).items()]
        while metric_list or param_list or tag_list:
            client.log_batch(run_id, metrics=metric_list[:1000], params=param_list[:100], tags=tag_list[:100])
            metric_list, param_list, tag_list = (metric_list[1000:], param_list[100:], tag_list[100:])

    def params_of(self, run_id: str) -> dict[str, str] | None:
        """The params already on a run, or None if the run does not exist (or was deleted)."""
        client = self.client()  # first: it quiets MLflow's logging before mlflow is imported
        from mlflow.exceptions import MlflowException  # deferred with the client

        try:
            run = client.get_run(run_id)
        except MlflowException as e:
            if e.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise
        return None if run.info.lifecycle_stage == "deleted" else dict(run.data.params)
