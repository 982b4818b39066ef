"""The champion in MLflow's model registry: `promote` registers a trial's serving config as a model
version with an alias; `resolve` fetches the config behind `models:/<name>@<alias>`.

The config is uploaded as `serving_config/serving_config.json` on the trial's run and the version's
source is `runs:/<run_id>/serving_config` (`mlflow.register_model` refuses a non-model folder in
3.17, so the version is created with the client).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import TrackingError
from orchestrator.records import ServingConfig
from orchestrator.results import export
from orchestrator.tracking import convert
from orchestrator.tracking._client import Store
from orchestrator.tracking.outage import Failure, classify

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion
    from mlflow.tracking import MlflowClient


def promote(
    store: Store,
    run_id: str,
    *,
    model_name: str,
    serving_config: ServingConfig,
    alias: str = "champion",
    description: str = "",
) -> str:
    """Register the trial run's serving config as a new model version with `alias`; return the
    version. Raises ValueError for a config that belongs to another run or sets a variable no env
    file can, and TrackingError if MLflow is unreachable or refuses."""
    export.check_env_names(serving_config)
    if not run_id:
        raise ValueError("promote needs the trial's MLflow run id (Tracker.find_trial finds it)")
    if serving_config.run_id not in ("", run_id):  # "" = not known when the config was built
        raise ValueError(f"serving config belongs to run {serving_config.run_id!r}, not to {run_id!r}")
    config = serving_config.model_copy(update={"run_id": run_id})
    tags = convert.version_tags(config)
    with store.failing_as(
        f"promote run {run_id} as {model_name!r}@{alias}",
        "(1) check the tracking server is up, then (2) promote again (the trial "
        "run and its artifacts are already in MLflow).",
    ):
        from mlflow.exceptions import MlflowException  # deferred: importing mlflow takes ~1 s

        client = store.client()
        with tempfile.TemporaryDirectory(prefix="serving_config-") as tmp:
            (Path(tmp) / "serving_config.json").write_text(
                json.dumps(config.model_dump(mode="json"), indent=2, sort_keys=True) + "\n", encoding="utf-8"
            )
            client.log_artifacts(run_id, tmp, "serving_config")
        try:
            client.get_registered_model(model_name)
        except MlflowException as e:
            if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            with contextlib.suppress(MlflowException):  # another process may create it too
                client.create_registered_model(model_name, description="Serving configurations chosen by sglang-sweep")
        source = f"runs:/{run_id}/serving_config"
        # A driver killed between creating the version and setting the alias left one: reuse it, so a
        # resumed promotion sets the alias on v1 instead of registering v2.
        version = _version_from(client, model_name, run_id, source) or client.create_model_version(
            model_name, source=source, run_id=run_id, tags=tags, description=description or None
        )
        client.set_registered_model_alias(model_name, alias, version.version)
        client.set_tag(run_id, "sweep.promoted", f"{model_name}@{alias} v{version.version}")
    return str(version.version)


def withdraw(store: Store, model_name: str, alias: str, parent_run_id: str) -> str | None:
    """Remove `alias` from `model_name` when the version it points at was registered by the sweep whose parent
    run is `parent_run_id` (a driver killed after setting it, whose resume reached another verdict); the
    version withdrawn, or None (no such alias, or another sweep's version: left as it is)."""
    with store.failing_as(
        f"check {model_name!r}@{alias} against this sweep's verdict",
        "(1) check the tracking server is up, then (2) run `sweep run EXPERIMENT --resume` again.",
    ):
        from mlflow.exceptions import MlflowException  # deferred: importing mlflow takes ~1 s

        client = store.client()
        try:
            version = client.get_model_version_by_alias(model_name, alias)
        except MlflowException as e:
            if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                return None
            raise
        parent = client.get_run(version.run_id).data.tags.get("mlflow.parentRunId") if version.run_id else None
        if parent != parent_run_id:
            return None
        client.delete_registered_model_alias(model_name, alias)
    return str(version.version)


def _version_from(client: MlflowClient, model_name: str, run_id: str, source: str) -> ModelVersion | None:
    """The newest version of `model_name` registered from `source` of run `run_id`, or None."""
    found = [
        v for v in client.search_model_versions(f"run_id = '{run_id}'") if v.name == model_name and v.source == source
    ]
    return max(found, key=lambda v: int(v.version), default=None)


def resolve(store: Store, model_name: str, alias: str = "champion") -> ServingConfig:
    """The serving config behind `models:/<model_name>@<alias>`, with `model_version` the version the
    alias points at and `run_id` the version's run: where the stored JSON becomes a ServingConfig.

    Raises TrackingError naming the store and the fix when the model or alias does not exist,
    the files are missing or not a serving config, or MLflow is unreachable.
    """
    store.require_store()
    client = store.client()
    try:
        version = client.get_model_version_by_alias(model_name, alias)
    except Exception as e:
        if classify(e) is Failure.bug:
            raise
        raise TrackingError(_resolve_problem(store, model_name, alias, e)) from e
    try:
        with tempfile.TemporaryDirectory(prefix="resolve-") as tmp:
            folder = _download_version(store, client, model_name, str(version.version), tmp)
            text = (Path(folder) / "serving_config.json").read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise TrackingError(
            f"Model {model_name!r} version {version.version} ({version.source}) in "
            f"{store.where()} holds no serving_config.json. Fix: promote a sweep's champion "
            f"again (its run folder serving_config/ was not uploaded)."
        ) from e
    except Exception as e:
        if classify(e) is Failure.bug:
            raise
        raise TrackingError(
            f"Could not download models:/{model_name}@{alias} (version {version.version}, "
            f"{version.source}) from {store.where()}: {convert.short(e)}. Fix: check the tracking "
            f"server and its artifact store are reachable."
        ) from e
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"it holds a JSON {type(data).__name__}, not an object")
        config = export.validate_serving_config({**data, "model_version": str(version.version)})
        if version.run_id and config.run_id != version.run_id:
            raise ValueError(
                f"it names run {config.run_id} but version {version.version} was made from run {version.run_id}"
            )
    except (ValueError, TypeError) as e:
        raise TrackingError(
            f"The serving_config.json of {model_name!r} version {version.version} in "
            f"{store.where()} is not a serving config: {e}. Fix: promote the champion again "
            f"with this version of sglang-sweep."
        ) from e
    return config


def _download_version(store: Store, client: MlflowClient, model_name: str, version: str, dst: str) -> str:
    # mlflow.artifacts.download_artifacts("models:/...") resolves the run's artifacts through
    # the process-global tracking URI, not the one given (3.17), so go through our client.
    uri = client.get_model_version_download_uri(model_name, version)
    if uri.startswith("runs:/"):
        run_id, _, path = uri[len("runs:/") :].partition("/")
        return str(client.download_artifacts(run_id, path, dst))
    import mlflow.artifacts  # deferred: importing mlflow takes ~1 s

    return str(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=dst, tracking_uri=store.tracking_uri))


def _resolve_problem(store: Store, model_name: str, alias: str, error: Exception) -> str:
    code = getattr(error, "error_code", "")
    if code == "RESOURCE_DOES_NOT_EXIST":
        return (
            f"No registered model {model_name!r} in {store.where()}. Fix: (1) let a sweep "
            f"finish (it promotes its champion), or (2) pass the model name the "
            f"experiment's promotion.model_name uses (--model), or (3) pass the store "
            f"that has it (--workdir or --tracking-uri)."
        )
    if code == "INVALID_PARAMETER_VALUE" and "alias" in str(error).lower():
        try:
            aliases = sorted(store.client().get_registered_model(model_name).aliases)
        except Exception as e:
            if classify(e) is Failure.bug:
                raise
            aliases = []
        known = f" (it has: {', '.join(aliases)})" if aliases else " (it has no aliases)"
        return (
            f"Registered model {model_name!r} in {store.where()} has no alias "
            f"{alias!r}{known}. Fix: (1) pass one of its aliases with --alias, or "
            f"(2) promote a champion by letting a sweep finish."
        )
    return (
        f"Could not reach {store.where()} to resolve models:/{model_name}@{alias}: "
        f"{convert.short(error)}. Fix: (1) start the tracking server, or (2) pass the right "
        f"--tracking-uri / --workdir."
    )
