"""A driver SIGKILLed between registering the champion's model version and setting its alias leaves a
version without an alias; the resumed promotion finds that version by its source run and sets the alias
on it instead of registering a second one (real MLflow sqlite store and registry)."""

from __future__ import annotations

from pathlib import Path

from mlflow.tracking import MlflowClient
from mlflow_fixtures import copy_store, sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.records import ServingConfig
from orchestrator.results import export
from orchestrator.tracking.tracker import Tracker

MODEL = "demo-serving"


def _config(run_id: str) -> ServingConfig:
    return export.validate_serving_config(
        {
            "experiment": "demo",
            "trial_number": 1,
            "run_id": run_id,
            "model_version": None,
            "engine": "simulator",
            "sglang_version": "0.5.23",
            "params": {"NCCL_PROTO": "LL"},
            "env": {"NCCL_PROTO": "LL"},
            "sglang_args": ["--tp-size", "2"],
            "metrics": {"decode_tok_s": 90.0},
            "fingerprint_hash": "f00d",
            "created_at": "2026-12-01T00:00:00+00:00",
        }
    )


def test_a_version_left_without_its_alias_is_reused_not_registered_again(
    tmp_path: Path, sqlite_store_template: Path
) -> None:
    tracker = Tracker(copy_store(sqlite_store_template, tmp_path), "demo", outbox_dir=tmp_path)
    client = MlflowClient(tracking_uri=tracker.tracking_uri, registry_uri=tracker.tracking_uri)
    parent = tracker.start_sweep(run_name="s", params={}, tags={})
    run_id = tracker.start_trial(parent, number=1, params={"NCCL_PROTO": "LL"}, role="search", tags={})
    # What the killed promotion left: the registered model and version 1 from the run, no alias.
    client.create_registered_model(MODEL)
    client.create_model_version(MODEL, source=f"runs:/{run_id}/serving_config", run_id=run_id)
    assert client.get_registered_model(MODEL).aliases == {}

    version = tracker.promote(run_id, model_name=MODEL, serving_config=_config(run_id))

    assert version == "1"
    assert [str(v.version) for v in client.search_model_versions(f"name = '{MODEL}'")] == ["1"]
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == "1"
    assert tracker.resolve(MODEL).run_id == run_id


def test_another_run_still_gets_its_own_version(tmp_path: Path, sqlite_store_template: Path) -> None:
    tracker = Tracker(copy_store(sqlite_store_template, tmp_path), "demo", outbox_dir=tmp_path)
    parent = tracker.start_sweep(run_name="s", params={}, tags={})
    first = tracker.start_trial(parent, number=1, params={"NCCL_PROTO": "LL"}, role="search", tags={})
    second = tracker.start_trial(parent, number=2, params={"NCCL_PROTO": "LL"}, role="search", tags={})
    assert tracker.promote(first, model_name=MODEL, serving_config=_config(first)) == "1"
    assert tracker.promote(second, model_name=MODEL, serving_config=_config(second)) == "2"
    assert tracker.promote(second, model_name=MODEL, serving_config=_config(second)) == "2"
    assert tracker.resolve(MODEL).run_id == second
