"""What MLflow stores for the sweep's values: params, metrics, tags, names and filters (no store needed)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from orchestrator.records import (
    FailureKind,
    LaunchPlan,
    MeasurementSummary,
    Metrics,
    ServingConfig,
    TrialOutcome,
    TrialRole,
    TrialStatus,
)
from orchestrator.tracking import convert


@pytest.mark.parametrize(
    ("role", "number", "trial_dir", "name"),
    [
        ("search", 7, "", "trial-0007"),
        (TrialRole.search, 12345, "", "trial-12345"),
        ("baseline", 0, "", "baseline-0000"),
        (TrialRole.confirm, 7, "/w/confirm/00-champion", "confirm-00-champion"),
        ("confirm", 7, "", "confirm-0007"),
    ],
)
def test_trial_run_names(role: Any, number: int, trial_dir: str, name: str) -> None:
    assert convert.trial_run_name(role, number, trial_dir) == name


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"NCCL_PROTO": "LL", "NCCL_ALGO": None}, {"NCCL_PROTO": "LL", "NCCL_ALGO": "unset"}),
        (
            {"speculative_num_steps": 3, "ratio": 0.5, "flag": True},
            {"speculative_num_steps": "3", "ratio": "0.5", "flag": "True"},
        ),
        ({"role": TrialRole.baseline}, {"role": "baseline"}),
        ({"HF_TOKEN": "hf_abcdef", "API_KEY": None}, {"HF_TOKEN": "***", "API_KEY": "***"}),
        ({"uri": "postgresql://me:hunter2@db/optuna"}, {"uri": "postgresql://me:***@db/optuna"}),
    ],
)
def test_params(values: dict[str, Any], expected: dict[str, str]) -> None:
    assert convert.params(values) == expected


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"a": None, "b": 1}, {"b": "1"}),
        ({"sweep.role": TrialRole.search}, {"sweep.role": "search"}),
        ({"MLFLOW_TRACKING_PASSWORD": "x"}, {"MLFLOW_TRACKING_PASSWORD": "***"}),
        ({"long": "x" * 6000}, {"long": "x" * convert.TAG_MAX}),
    ],
)
def test_tags(values: dict[str, Any], expected: dict[str, str]) -> None:
    assert convert.tags(values) == expected


def test_metrics_keep_numbers_only() -> None:
    out = convert.metrics({"tok_s": 150, "ratio": 1.5, "ok": True, "none": None, "text": "1", "nan": float("nan")})
    assert set(out) == {"tok_s", "ratio", "nan"}
    assert out["tok_s"] == 150.0 and isinstance(out["tok_s"], float)
    assert math.isnan(out["nan"])


def _outcome(**update: Any) -> TrialOutcome:
    values: dict[str, Any] = dict(
        number=3,
        params={"NCCL_PROTO": "LL"},
        role=TrialRole.search,
        status=TrialStatus.COMPLETE,
        metrics=Metrics(
            decode_tok_s=150.0, output_tok_s=290.0, accept_length=2.5, sources={"accept_length": "meta_info"}
        ),
        launch=LaunchPlan(argv=("python",), port=1, engine="simulator"),
        trial_dir="/w/trials/3",
        started_at=100.0,
        finished_at=160.0,
        timings={"bench": 20.0},
    )
    values.update(update)
    return TrialOutcome(**values)


@pytest.mark.parametrize(
    ("update", "status"),
    [
        ({}, "FINISHED"),
        ({"status": TrialStatus.FAILED, "failure_kind": FailureKind.oom, "metrics": None}, "FAILED"),
        ({"status": TrialStatus.FAILED, "failure_kind": FailureKind.interrupted, "metrics": None}, "KILLED"),
        ({"status": TrialStatus.INFEASIBLE, "failure_kind": FailureKind.infeasible, "metrics": None}, "FAILED"),
    ],
)
def test_run_status(update: dict[str, Any], status: str) -> None:
    assert convert.run_status(_outcome(**update)) == status


def test_outcome_metrics_and_tags() -> None:
    outcome = _outcome()
    metrics = convert.outcome_metrics(outcome)
    assert metrics["decode_tok_s"] == 150.0 and metrics["accept_length"] == 2.5
    assert metrics["time_bench_s"] == 20.0 and metrics["time_total_s"] == 60.0
    assert "verify_ms" not in metrics, "a metric nobody measured is not logged"
    tags = convert.outcome_tags(outcome)
    assert tags["sweep.status"] == "COMPLETE" and tags["sweep.engine"] == "simulator"
    assert tags["sweep.trial_number"] == "3" and tags["sweep.role"] == "search"
    assert tags["sweep.metric_sources"] == '{"accept_length": "meta_info"}'
    assert "sweep.failure_kind" not in tags and convert.NOTE_TAG not in tags


def test_a_failed_outcome_describes_itself_in_the_run_note() -> None:
    outcome = _outcome(
        status=TrialStatus.FAILED,
        failure_kind=FailureKind.oom,
        metrics=None,
        reason="CUDA out of memory " * 50,
        log_tail="x" * 9000,
    )
    tags = convert.outcome_tags(outcome)
    assert tags["sweep.failure_kind"] == "oom"
    assert len(tags["sweep.reason"]) == convert.REASON_MAX
    assert tags[convert.NOTE_TAG].startswith("oom: CUDA out of memory")
    assert tags[convert.NOTE_TAG].count("x") == convert.NOTE_MAX


@pytest.mark.parametrize(
    ("new", "existing", "fresh", "flag"),
    [
        ({"a": "1", "b": "2"}, {}, {"a": "1", "b": "2"}, {}),
        ({"a": "1", "b": "2"}, {"a": "1"}, {"b": "2"}, {}),
        ({"a": "1", "b": "2"}, {"a": "9", "b": "8"}, {}, {"sweep.param_mismatch": "a,b"}),
    ],
)
def test_param_diff(new: dict[str, str], existing: dict[str, str], fresh: dict[str, str], flag: dict[str, str]) -> None:
    assert convert.param_diff(new, existing) == (fresh, flag)


@pytest.mark.parametrize(
    ("uri", "path"),
    [
        ("sqlite:///runs/demo/mlflow.db", Path("runs/demo/mlflow.db")),
        ("sqlite:////abs/mlflow.db", Path("/abs/mlflow.db")),
        ("sqlite:///mlflow.db?timeout=5", Path("mlflow.db")),
        ("sqlite:///:memory:", None),
        ("sqlite:///", None),
        ("http://127.0.0.1:5000", None),
        ("postgresql://u:p@db/mlflow", None),
    ],
)
def test_sqlite_path(uri: str, path: Path | None) -> None:
    assert convert.sqlite_path(uri) == path


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("plain", "plain"),
        ("it's", "it\\'s"),
        ("a\\b", "a\\\\b"),
    ],
)
def test_quote_filter(value: str, text: str) -> None:
    assert convert.quote_filter(value) == text


def test_filters() -> None:
    assert convert.parent_filters(None, None) == ["tags.`sweep.kind` = 'sweep'"]
    assert convert.parent_filters("it's", "RUNNING")[1:] == [
        "attributes.run_name = 'it\\'s'",
        "attributes.status = 'RUNNING'",
    ]
    assert convert.trial_filter("abc", 7, "search") == (
        "tags.`mlflow.parentRunId` = 'abc' and tags.`sweep.trial_number` = '7' and tags.`sweep.role` = 'search'"
    )


@pytest.mark.parametrize(
    ("name", "safe"),
    [
        ("tok_s by trial", "tok_s_by_trial"),
        ("a/b\\c", "a_b_c"),
        ("...", "figure"),
        ("ok-1.2", "ok-1.2"),
    ],
)
def test_safe_name(name: str, safe: str) -> None:
    assert convert.safe_name(name) == safe


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (160.0, "160"),
        (1.23456789, "1.23457"),
        (float("inf"), "inf"),
        (3, "3"),
        ("x", "x"),
    ],
)
def test_number_text(value: Any, text: str) -> None:
    assert convert.number_text(value) == text


def test_version_tags() -> None:
    config = ServingConfig(
        experiment="demo",
        trial_number=2,
        run_id="r",
        engine="simulator",
        sglang_version="0.5.23",
        params={"NCCL_PROTO": "LL", "speculative_num_steps": 3, "NCCL_ALGO": None},
        env={},
        sglang_args=(),
        metrics={"decode_tok_s": 160.0, "gain": 0.125},
        fingerprint_hash="fp",
        created_at="2025-06-01T03:04:05+00:00",
    )
    assert convert.version_tags(config) == {
        "sweep.trial_number": "2",
        "sweep.experiment": "demo",
        "sweep.engine": "simulator",
        "sweep.fingerprint_hash": "fp",
        "metric.decode_tok_s": "160",
        "metric.gain": "0.125",
        "knob.NCCL_PROTO": "LL",  # the version's page shows the knobs it sets; unset ones are left out
        "knob.speculative_num_steps": "3",
    }


@pytest.mark.parametrize(
    ("error", "text"),
    [
        (ValueError("a\n  b"), "a b"),
        (RuntimeError(), "RuntimeError"),
        ("x" * 400, "x" * 297 + "..."),
        (ConnectionError("http://u:secret@host/ refused"), "http://u:***@host/ refused"),
    ],
)
def test_short(error: BaseException | str, text: str) -> None:
    assert convert.short(error) == text


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (2.909090909, 2.909),
        (181.2534, 181.3),
        (0.0123456, 0.01235),
        (12.0, 12.0),
        (1234567.0, 1234567.0),
        (math.inf, math.inf),
    ],
)
def test_metrics_are_rounded_to_what_a_reader_compares(value: float, shown: float) -> None:
    assert convert.rounded(value) == shown


def test_trial_metrics_speedup_in_percent_and_no_interval_from_one_measurement() -> None:
    one = _outcome().model_copy(
        update={
            "summary": MeasurementSummary(
                repeats=1,
                median={"decode_tok_s": 150.0},
                ci95_low={"decode_tok_s": 150.0},
                ci95_high={"decode_tok_s": 150.0},
            )
        }
    )
    metrics = convert.trial_metrics(one, {"speedup_vs_baseline": 1.23456})
    assert metrics["speedup_pct"] == 23.5 and "speedup_vs_baseline" not in metrics
    # One decimal as every view shows it (results.select.speedup_pct), not 4 significant digits.
    assert convert.trial_metrics(one, {"speedup_vs_baseline": 13.345})["speedup_pct"] == 1234.5
    assert not any("ci95" in k for k in metrics), "one measurement has no interval"
    three = one.model_copy(
        update={
            "summary": one.summary.model_copy(
                update={  # type: ignore[union-attr]
                    "repeats": 3,
                    "ci95_low": {"decode_tok_s": 146.0},
                    "ci95_high": {"decode_tok_s": 154.0},
                }
            )
        }
    )
    assert convert.trial_metrics(three, {})["decode_tok_s_ci95_low"] == 146.0


def test_a_run_created_after_its_measurement_keeps_a_non_negative_duration() -> None:
    late = _outcome().model_copy(update={"started_at": 100.0, "finished_at": 90.0})
    assert convert.outcome_metrics(late)["time_total_s"] == 0.0


def test_trials_view_ranks_trials_without_confirmations_by_the_objective() -> None:
    view = json.loads(convert.trials_view("verify_ms", "minimize"))
    assert view["orderByKey"] == "metrics.`verify_ms`" and view["orderByAsc"] is True
    assert "tags.`sweep.role` != 'confirm'" in view["searchFilter"]
    assert {
        "metrics.`decode_tok_s`",
        "metrics.`speedup_pct`",
        "metrics.`accept_length`",
        "metrics.`verify_ms`",
        "tags.`sweep.champion`",
    } <= set(view["selectedColumns"])
    assert convert.trials_view_path("7") == (
        "#/experiments/7/runs?viewStateShareKey=sweep-trials&workflowType=machine_learning"
    ), "MLflow 3.17 reads the training view from the URL, not from the experiment's tag"


def test_the_published_trials_view_shows_every_knob_and_sorts_by_rank() -> None:
    view = json.loads(convert.trials_view("decode_tok_s", knobs=("NCCL_PROTO", "speculative_num_steps"), ranked=True))
    assert view["orderByKey"] == "metrics.`sweep_rank`" and view["orderByAsc"] is True
    assert {"params.`NCCL_PROTO`", "params.`speculative_num_steps`"} <= set(view["selectedColumns"])


@pytest.mark.parametrize(
    ("runs", "direction", "deployed", "order"),
    [
        # the deployed run first even when another trial measured more in the search
        ([("a", 10.0, True), ("b", 12.0, True), ("c", None, False)], "maximize", "a", ["a", "b", "c"]),
        ([("a", 10.0, True), ("b", 12.0, True), ("c", None, False)], "maximize", None, ["b", "a", "c"]),
        # a latency objective: lower first; a failed trial with a value still goes last
        ([("a", 10.0, True), ("b", 12.0, True), ("c", 1.0, False)], "minimize", None, ["a", "b", "c"]),
        # a deployed run that is not among the trials (a confirmation round) changes nothing
        ([("a", 10.0, True), ("b", 12.0, True)], "maximize", "zz", ["b", "a"]),
        ([("a", float("nan"), True), ("b", 1.0, True)], "maximize", None, ["b", "a"]),
    ],
)
def test_ranks_put_the_deployed_run_first_then_the_objective(runs, direction, deployed, order) -> None:
    ranks = convert.ranks(runs, direction, deployed)
    assert sorted(ranks, key=ranks.__getitem__) == order
    assert sorted(ranks.values()) == list(range(1, len(runs) + 1))


def test_the_experiment_note_links_the_sweeps_run_in_the_training_view() -> None:
    note = convert.experiment_note("7", "abc123")
    assert "(#/experiments/7/runs/abc123?workflowType=machine_learning)" in note
    assert "viewStateShareKey=sweep-trials&workflowType=machine_learning" in note
