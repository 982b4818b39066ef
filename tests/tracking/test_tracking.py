"""MLflow tracking against real stores: a sqlite store in tmp_path and a real `mlflow server`.

Everything is read back with MlflowClient, the way the UI and notebooks see it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import matplotlib
import pandas as pd
import pytest
import urllib3.util.connection
from matplotlib.figure import Figure
from mlflow.tracking import MlflowClient
from mlflow_fixtures import (  # noqa: F401 (fixtures are used by name)
    MlflowServer,
    copy_store,
    sqlite_store_template,
)
from ports import free_port
from trial_files import KNOBS, write_trial

from orchestrator.errors import TrackingError
from orchestrator.records import (
    FailureKind,
    ServingConfig,
    TrialOutcome,
    TrialRole,
    TrialStatus,
)
from orchestrator.results import export
from orchestrator.tracking import convert
from orchestrator.tracking.outbox import OUTBOX_FILE, REJECTED_FILE
from orchestrator.tracking.tracker import Tracker

matplotlib.use("Agg")

BASELINE_KNOBS = {k: None for k in KNOBS}

TRIES_PER_CALL = 2
"""At most this many TCP connections per call to a server that is down: one try and one retry. What a stopped
server costs the sweep is how often each call knocks (MLflow's own default: 1 + 7 retries with exponential
backoff, minutes per call), which a loaded machine cannot change, unlike the seconds it takes."""


class Knocks:
    """Counts the TCP connections this process opens to one port through urllib3 (MLflow's HTTP client)."""

    def __init__(self) -> None:
        self.port = 0
        self._ports: list[int] = []
        self._seen = 0

    def record(self, port: int) -> None:
        self._ports.append(port)

    def since_last(self) -> int:
        """Connections to `port` since the previous call."""
        n = self._ports[self._seen :].count(self.port)
        self._seen = len(self._ports)
        return n


@pytest.fixture
def knocks(monkeypatch: pytest.MonkeyPatch) -> Knocks:
    seen = Knocks()
    real = urllib3.util.connection.create_connection

    def counting(address, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.record(int(address[1]))
        return real(address, *args, **kwargs)

    monkeypatch.setattr(urllib3.util.connection, "create_connection", counting)
    return seen


@pytest.fixture(scope="module", autouse=True)
def booting_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, sqlite_store_template: Path
) -> Iterator[MlflowServer | None]:
    """Launch the real server before the first test, so it boots while the sqlite tests run
    (a start costs 5-15 s on a 2-core machine); only if a selected test needs it."""
    if not any(item.module is request.module and "live_server" in item.fixturenames for item in request.session.items):
        yield None
        return
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"), store_template=sqlite_store_template)
    server.launch()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def live_server(booting_server: MlflowServer) -> MlflowServer:
    booting_server.wait_ready()
    return booting_server


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path / "runs" / "demo"


@pytest.fixture
def tracker(workdir: Path, sqlite_store_template: Path) -> Tracker:
    return Tracker(copy_store(sqlite_store_template, workdir), "demo", outbox_dir=workdir)


def client_of(tracker: Tracker) -> MlflowClient:
    return MlflowClient(tracking_uri=tracker.tracking_uri, registry_uri=tracker.tracking_uri)


def children(client: MlflowClient, parent_run_id: str) -> dict[str, object]:
    experiment_id = client.get_run(parent_run_id).info.experiment_id
    runs = client.search_runs([experiment_id], f"tags.`mlflow.parentRunId` = '{parent_run_id}'")
    return {run.info.run_name: run for run in runs}


def test_a_sweep_reads_back_as_parent_and_one_child_per_trial(tracker: Tracker, workdir: Path) -> None:
    parent = tracker.start_sweep(run_name="demo-sweep", params={"n_trials": 20}, tags={"sweep.experiment": "demo"})
    baseline = write_trial(workdir, 0, role=TrialRole.baseline, params=BASELINE_KNOBS, decode_tok_s=100.0)
    run0 = tracker.start_trial(parent, number=0, params=BASELINE_KNOBS, role="baseline", tags={})
    assert run0 is not None
    assert client_of(tracker).get_run(run0).info.status == "RUNNING"
    tracker.log_trial(parent, baseline, run_id=run0, extra_metrics={"speedup_vs_baseline": 1.0}, extra_tags={})
    good = write_trial(workdir, 1, decode_tok_s=150.0)
    run1 = tracker.start_trial(parent, number=1, params=KNOBS, role=TrialRole.search, tags={})
    tracker.log_trial(
        parent, good, run_id=run1, extra_metrics={"speedup_vs_baseline": 1.5}, extra_tags={"sweep.drift": "none"}
    )
    oom = write_trial(workdir, 2, status=TrialStatus.FAILED, failure_kind=FailureKind.oom)
    tracker.log_trial(parent, oom, run_id=None, extra_metrics={}, extra_tags={})
    cut = write_trial(workdir, 3, status=TrialStatus.FAILED, failure_kind=FailureKind.interrupted)
    tracker.log_trial(parent, cut, run_id=None, extra_metrics={}, extra_tags={})
    tracker.end_sweep(parent, "FINISHED")

    client = client_of(tracker)
    experiment = client.get_experiment_by_name("demo")
    assert experiment.artifact_location == str(workdir.resolve() / "mlartifacts")
    parent_run = client.get_run(parent)
    assert parent_run.info.status == "FINISHED"
    assert parent_run.data.params == {"n_trials": "20"}
    assert parent_run.data.tags["sweep.kind"] == "sweep"

    runs = children(client, parent)
    assert sorted(runs) == ["baseline-0000", "trial-0001", "trial-0002", "trial-0003"]
    assert {name: run.info.status for name, run in runs.items()} == {
        "baseline-0000": "FINISHED",
        "trial-0001": "FINISHED",
        "trial-0002": "FAILED",
        "trial-0003": "KILLED",
    }

    data = runs["trial-0001"].data
    assert data.params == {
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": "unset",
        "NCCL_MAX_NCHANNELS": "16",
        "speculative_num_steps": "3",
        "speculative_eagle_topk": "1",
    }
    assert runs["baseline-0000"].data.params["NCCL_PROTO"] == "unset"
    assert data.metrics["decode_tok_s"] == 150.0
    assert data.metrics["decode_tok_s_ci95_low"] == 146.0
    assert data.metrics["decode_tok_s_ci95_high"] == 154.0
    assert data.metrics["speedup_pct"] == 50.0, "the speed-up reads as a percentage"
    assert "speedup_vs_baseline" not in data.metrics
    history = client.get_metric_history(run1, "decode_tok_s")
    assert [m.step for m in history] == [1], "logged at step = trial number, so charts draw the sweep"
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development", "opens in the training view"
    assert "viewStateShareKey=sweep-trials" in experiment.tags["mlflow.note.content"]
    assert data.metrics["accept_length"] == 2.61
    assert data.metrics["requests_ok"] == 8
    assert "verify_ms" not in data.metrics, "a metric nobody measured is not logged as 0"
    for key, value in {
        "sweep.status": "COMPLETE",
        "sweep.engine": "simulator",
        "sweep.fingerprint_hash": "fp-1234",
        "sweep.trial_number": "1",
        "sweep.role": "search",
        "sweep.allreduce_path": "nccl",
        "sweep.node": "127.0.0.2",
        "sweep.drift": "none",
    }.items():
        assert data.tags[key] == value, key
    artifacts = {f.path for f in client.list_artifacts(run1, "trial")}
    assert artifacts == {"trial/spec.json", "trial/server.log", "trial/bench.jsonl", "trial/outcome.json"}
    assert list((workdir / "mlartifacts").rglob("server.log")), "artifacts live in the workdir"

    failed = runs["trial-0002"].data
    assert failed.tags["sweep.status"] == "FAILED"
    assert failed.tags["sweep.failure_kind"] == "oom"
    assert failed.tags["sweep.reason"].startswith("CUDA out of memory")
    assert "OutOfMemoryError" in failed.tags["mlflow.note.content"]
    assert runs["trial-0003"].data.tags["sweep.failure_kind"] == "interrupted"


def test_logging_the_same_trial_twice_leaves_one_run_with_the_same_contents(tracker: Tracker, workdir: Path) -> None:
    parent = tracker.start_sweep(run_name="s", params={}, tags={})
    outcome = write_trial(workdir, 7)
    for _ in range(2):
        tracker.log_trial(parent, outcome, run_id=None, extra_metrics={"speedup_vs_baseline": 1.2}, extra_tags={})
    # A resumed driver that started the run before the crash passes no id either.
    assert tracker.start_trial(parent, number=7, params=KNOBS, role="search", tags={}) is not None
    tracker.log_trial(parent, outcome, run_id=None, extra_metrics={"speedup_vs_baseline": 1.2}, extra_tags={})
    client = client_of(tracker)
    runs = children(client, parent)
    assert list(runs) == ["trial-0007"]
    run = runs["trial-0007"]
    assert run.info.status == "FINISHED"
    assert len(client.get_metric_history(run.info.run_id, "decode_tok_s")) == 1
    assert tracker.pending() == 0


def test_confirmation_rounds_of_one_trial_get_one_run_each(tracker: Tracker, workdir: Path) -> None:
    parent = tracker.start_sweep(run_name="s", params={}, tags={})
    rounds = []
    for i in range(2):
        outcome = write_trial(workdir, 7, role=TrialRole.confirm)
        confirm_dir = workdir / "confirm" / f"{i:02d}-champion"
        confirm_dir.parent.mkdir(exist_ok=True)
        Path(outcome.trial_dir).rename(confirm_dir)
        rounds.append(outcome.model_copy(update={"trial_dir": str(confirm_dir)}))
    for outcome in rounds + rounds[:1]:  # round 0 logged twice (a replay)
        tracker.log_trial(parent, outcome, run_id=None, extra_metrics={}, extra_tags={})
    runs = children(client_of(tracker), parent)
    assert sorted(runs) == ["confirm-00-champion", "confirm-01-champion"]
    assert {run.data.tags["sweep.trial_number"] for run in runs.values()} == {"7"}


def test_changed_params_are_flagged_not_fatal(tracker: Tracker, workdir: Path) -> None:
    parent = tracker.start_sweep(run_name="s", params={}, tags={})
    run_id = tracker.start_trial(parent, number=4, params={**KNOBS, "NCCL_PROTO": "Simple"}, role="search", tags={})
    tracker.log_trial(parent, write_trial(workdir, 4), run_id=run_id, extra_metrics={}, extra_tags={})
    run = client_of(tracker).get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["sweep.param_mismatch"] == "NCCL_PROTO"
    assert tracker.pending() == 0


def test_resume_reopens_the_parent_and_keeps_its_params(tracker: Tracker) -> None:
    parent = tracker.start_sweep(run_name="s", params={"n_trials": 20}, tags={})
    tracker.end_sweep(parent, "KILLED")
    again = tracker.start_sweep(run_name="s", params={"n_trials": 30, "seed": 1}, tags={}, resume_run_id=parent)
    assert again == parent
    client = client_of(tracker)
    run = client.get_run(parent)
    assert run.info.status == "RUNNING"
    assert run.data.params == {"n_trials": "20", "seed": "1"}, "params already logged stay"
    assert "sweep.resumed_at" in run.data.tags


def test_child_runs_table_for_sweep_status(tracker: Tracker, workdir: Path) -> None:
    parent = tracker.start_sweep(run_name="s", params={}, tags={})
    for number in (2, 0, 1):
        tracker.log_trial(
            parent,
            write_trial(workdir, number, decode_tok_s=100.0 + number),
            run_id=None,
            extra_metrics={},
            extra_tags={},
        )
    frame = tracker.child_runs(parent)
    assert list(frame["trial_number"]) == [0, 1, 2]
    assert list(frame["run_name"]) == ["trial-0000", "trial-0001", "trial-0002"]
    assert list(frame["metrics.decode_tok_s"]) == [100.0, 101.0, 102.0]
    assert set(frame["params.NCCL_PROTO"]) == {"LL"}
    assert set(frame["tags.sweep.status"]) == {"COMPLETE"}
    assert (frame["status"] == "FINISHED").all()


def test_sweep_summary_lands_on_the_parent(tracker: Tracker) -> None:
    parent = tracker.start_sweep(run_name="s", params={}, tags={})
    table = pd.DataFrame({"trial": [0, 1], "decode_tok_s": [100.0, 150.5], "NCCL_PROTO": [None, "LL"]})
    figure = Figure()
    figure.add_subplot().plot([0, 1], [100.0, 150.5])
    tracker.log_sweep_summary(
        parent,
        metrics={"best_decode_tok_s": 150.5, "confirmed_decode_tok_s": 79.718345, "confirmed_gain": 0.041234567},
        tags={"sweep.champion_trial": 1},
        table=table,
        figures={"tok_s by trial": figure},
    )
    client = client_of(tracker)
    run = client.get_run(parent)
    assert run.data.metrics["best_decode_tok_s"] == 150.5
    # The confirmed figures to 4 significant digits, as every trial's (docs/results.md).
    assert (run.data.metrics["confirmed_decode_tok_s"], run.data.metrics["confirmed_gain"]) == (79.72, 0.04123)
    assert run.data.tags["sweep.champion_trial"] == "1"
    paths = {f.path for f in client.list_artifacts(parent)}
    assert {"results.csv", "results.html", "results.json", "figures"} <= paths
    figures = [f.path for f in client.list_artifacts(parent, "figures")]
    assert figures == ["figures/tok_s_by_trial.png"]
    csv = Path(client.download_artifacts(parent, "results.csv", str(tracker.outbox_dir / "dl")))
    assert pd.read_csv(csv)["decode_tok_s"].tolist() == [100.0, 150.5]
    assert not (tracker.outbox_dir / "outbox-files").exists() or not any(
        (tracker.outbox_dir / "outbox-files").iterdir()
    ), "staged files are cleaned up"


def stored_config(run_id: str, trial_number: int, tok_s: float) -> dict:
    """A serving config as serving_config.json holds it."""
    return {
        "experiment": "demo",
        "trial_number": trial_number,
        "run_id": run_id,
        "model_version": None,
        "engine": "simulator",
        "sglang_version": "0.5.23",
        "params": KNOBS,
        "env": {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "16"},
        "sglang_args": ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"],
        "metrics": {"decode_tok_s": tok_s, "speedup_vs_baseline": 1.5},
        "fingerprint_hash": "fp-1234",
        "created_at": "2025-06-01T03:04:05+00:00",
    }


def serving_config(run_id: str, trial_number: int, tok_s: float) -> ServingConfig:
    return export.validate_serving_config(stored_config(run_id, trial_number, tok_s))


def test_promote_then_resolve_through_the_alias(tracker: Tracker, workdir: Path) -> None:
    parent = tracker.start_sweep(run_name="s", params={}, tags={})
    runs = []
    for number in (1, 2):
        tracker.log_trial(parent, write_trial(workdir, number), run_id=None, extra_metrics={}, extra_tags={})
        runs.append(tracker.find_trial(parent, number))
    first = tracker.promote(runs[0], model_name="demo-serving", serving_config=serving_config(runs[0], 1, 150.0))
    assert first == "1"
    assert tracker.resolve("demo-serving") == serving_config(runs[0], 1, 150.0).model_copy(
        update={"model_version": "1"}
    )
    version = client_of(tracker).get_model_version("demo-serving", "1")
    assert version.source == f"runs:/{runs[0]}/serving_config"

    second = tracker.promote(
        runs[1],
        model_name="demo-serving",
        serving_config=serving_config(runs[1], 2, 160.0),
        description="beats trial 1",
    )
    assert second == "2"
    resolved = tracker.resolve("demo-serving", "champion")
    assert (resolved.model_version, resolved.trial_number, resolved.run_id) == ("2", 2, runs[1])
    version = client_of(tracker).get_model_version("demo-serving", "2")
    assert version.tags["sweep.trial_number"] == "2"
    assert version.tags["metric.decode_tok_s"] == "160"
    assert version.description == "beats trial 1"

    # What `sweep export` does with it: the env file parses back to the champion's settings.
    text = export.render(resolved, "env")
    env, args = export.split_args(export.parse_env(text))
    assert env == {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "16"}
    assert args == ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"]
    assert "model version: 2" in text


def test_promote_refuses_a_config_of_another_run(tracker: Tracker, workdir: Path) -> None:
    parent = tracker.start_sweep(run_name="s", params={}, tags={})
    run_id = tracker.start_trial(parent, number=1, params=KNOBS, role="search", tags={})
    with pytest.raises(ValueError, match="belongs to run 'other'"):
        tracker.promote(run_id, model_name="m", serving_config=serving_config("other", 1, 1.0))


def test_resolve_says_what_is_missing_and_how_to_fix_it(tracker: Tracker, tmp_path: Path, workdir: Path) -> None:
    nowhere = Tracker(f"sqlite:///{tmp_path / 'absent' / 'mlflow.db'}", "demo", outbox_dir=tmp_path / "absent")
    with pytest.raises(TrackingError, match="There is no MLflow store at .*absent.*--workdir"):
        nowhere.resolve("demo-serving")
    assert not (tmp_path / "absent" / "mlflow.db").exists(), "resolve never creates a store"

    parent = tracker.start_sweep(run_name="s", params={}, tags={})
    with pytest.raises(TrackingError, match="No registered model 'demo-serving' in MLflow at sqlite:///.*Fix: \\(1\\)"):
        tracker.resolve("demo-serving")
    tracker.log_trial(parent, write_trial(workdir, 1), run_id=None, extra_metrics={}, extra_tags={})
    run_id = tracker.find_trial(parent, 1)
    tracker.promote(run_id, model_name="demo-serving", alias="staging", serving_config=serving_config(run_id, 1, 150.0))
    with pytest.raises(TrackingError, match="has no alias 'champion' \\(it has: staging\\)"):
        tracker.resolve("demo-serving")


def test_promote_takes_the_serving_config_model_and_stores_the_same_json(tracker: Tracker, workdir: Path) -> None:
    parent = tracker.start_sweep(run_name="s", params={}, tags={})
    tracker.log_trial(parent, write_trial(workdir, 1), run_id=None, extra_metrics={}, extra_tags={})
    run_id = tracker.find_trial(parent, 1)
    as_dict = stored_config(run_id, 1, 150.0)
    assert (
        tracker.promote(run_id, model_name="demo-serving", serving_config=ServingConfig.model_validate(as_dict)) == "1"
    )
    resolved = tracker.resolve("demo-serving")
    assert resolved == export.validate_serving_config({**as_dict, "model_version": "1"})
    stored = Path(
        client_of(tracker).download_artifacts(run_id, "serving_config/serving_config.json", str(workdir / "dl"))
    )
    # The file holds the model as it validates: the given fields, and the defaults of the fields they leave out.
    assert json.loads(stored.read_text()) == ServingConfig.model_validate(as_dict).model_dump(mode="json")
    assert json.loads(stored.read_text()).items() >= as_dict.items()


def test_a_bug_of_ours_raises_and_is_not_queued_as_an_outage(
    tracker: Tracker, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = tracker.start_sweep(run_name="s", params={}, tags={})

    def broken(outcome: TrialOutcome) -> dict[str, str]:
        raise KeyError("sweep.status")

    monkeypatch.setattr(convert, "outcome_tags", broken)
    with pytest.raises(KeyError, match="sweep.status"):
        tracker.log_trial(parent, write_trial(workdir, 1), run_id=None, extra_metrics={}, extra_tags={})
    assert tracker.pending() == 0
    assert not (workdir / OUTBOX_FILE).exists()
    # No back-off either: the next trial goes to MLflow at once.
    assert tracker.start_trial(parent, number=2, params=KNOBS, role="search", tags={}) is not None


def test_mlflow_refusing_a_write_raises_tracking_error_and_queues_nothing(tracker: Tracker, workdir: Path) -> None:
    tracker.start_sweep(run_name="s", params={}, tags={})
    with pytest.raises(TrackingError, match="refused to log trial 1: .*Fix: \\(1\\)"):
        tracker.log_trial("0" * 32, write_trial(workdir, 1), run_id=None, extra_metrics={}, extra_tags={})
    assert tracker.pending() == 0


def test_an_unreachable_server_queues_writes_at_once(tmp_path: Path, knocks: Knocks) -> None:
    workdir = tmp_path / "runs" / "demo"
    knocks.port = free_port()
    nobody = f"http://127.0.0.1:{knocks.port}"
    tracker = Tracker(nobody, "demo", outbox_dir=workdir)
    with pytest.raises(TrackingError, match=f"Could not start the sweep run in MLflow at {nobody}"):
        tracker.start_sweep(run_name="s", params={}, tags={})
    assert 1 <= knocks.since_last() <= TRIES_PER_CALL
    assert tracker.start_trial("p" * 32, number=1, params=KNOBS, role="search", tags={}) is None
    assert knocks.since_last() <= TRIES_PER_CALL
    tracker.log_trial(
        "p" * 32,
        write_trial(workdir, 1),
        run_id=None,
        extra_metrics={"speedup_vs_baseline": 1.5},
        extra_tags={"sweep.x": "y"},
    )
    assert knocks.since_last() <= TRIES_PER_CALL
    tracker.end_sweep("p" * 32, "FAILED")
    assert knocks.since_last() <= TRIES_PER_CALL
    lines = [json.loads(line) for line in (workdir / OUTBOX_FILE).read_text().splitlines()]
    assert [line["op"] for line in lines] == ["log_trial", "end_sweep"]
    assert {k: v for k, v in lines[0].items() if k not in ("queued_at", "error")} == {
        "op": "log_trial",
        "parent_run_id": "p" * 32,
        "run_id": None,
        "outcome_path": str((workdir / "trials" / "1" / "outcome.json").resolve()),
        "extra_metrics": {"speedup_vs_baseline": 1.5},
        "extra_tags": {"sweep.x": "y"},
    }
    assert lines[1]["status"] == "FAILED" and lines[1]["queued_at"]
    assert tracker.replay_outbox() == (0, 2)


def test_outbox_lines_of_the_previous_version_replay(tracker: Tracker, workdir: Path) -> None:
    parent = tracker.start_sweep(run_name="s", params={}, tags={})
    running = tracker.start_trial(parent, number=5, params=KNOBS, role="search", tags={})
    stage = workdir / "outbox-files" / f"summary-{parent}"
    stage.mkdir(parents=True)
    pd.DataFrame({"trial": [5], "decode_tok_s": [150.5]}).to_csv(stage / "results.csv", index=False)
    (stage / "results.html").write_text("<table></table>")
    lines = [  # as the single-class Tracker wrote them: dicts dumped with sorted keys
        {"error": "e", "op": "kill_trial", "queued_at": "t", "run_id": running},
        {
            "error": "e",
            "metrics": {"best_decode_tok_s": 150.5},
            "op": "log_sweep_summary",
            "parent_run_id": parent,
            "queued_at": "t",
            "summary_dir": str(stage.resolve()),
            "tags": {"sweep.champion_trial": "5"},
        },
        {"error": "e", "op": "end_sweep", "parent_run_id": parent, "queued_at": "t", "status": "FINISHED"},
    ]
    (workdir / OUTBOX_FILE).write_text("".join(json.dumps(x, sort_keys=True) + "\n" for x in lines))
    assert tracker.replay_outbox() == (3, 0)
    client = client_of(tracker)
    assert client.get_run(running).info.status == "KILLED"
    run = client.get_run(parent)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["best_decode_tok_s"] == 150.5
    assert run.data.tags["sweep.champion_trial"] == "5"
    assert {"results.csv", "results.html", "results.json"} <= {f.path for f in client.list_artifacts(parent)}
    assert not stage.exists(), "sent files are cleaned up"


def test_unreadable_outbox_lines_are_set_aside(tracker: Tracker, workdir: Path) -> None:
    parent = tracker.start_sweep(run_name="s", params={}, tags={})
    good = write_trial(workdir, 1)
    lines = [
        '{"op": "log_trial", "parent_run_id": "' + parent + '", "run_id": null, '
        '"outcome_path": "' + str(Path(good.trial_dir) / "outcome.json") + '", '
        '"extra_metrics": {"speedup_vs_baseline": 1.1}, "extra_tags": {}}',
        '{"op": "log_trial", "parent_run_id": "' + parent + '", "run_id": null, '
        '"outcome_path": "/gone/outcome.json", "extra_metrics": {}, "extra_tags": {}}',
        '{"op": "log_tri',  # torn by a crash mid-write
    ]
    (workdir / OUTBOX_FILE).write_text("\n".join(lines) + "\n")
    assert tracker.pending() == 3
    assert tracker.replay_outbox() == (1, 0)
    assert tracker.pending() == 0
    assert len((workdir / REJECTED_FILE).read_text().splitlines()) == 2
    run = client_of(tracker).get_run(tracker.find_trial(parent, 1))
    assert run.data.metrics["speedup_pct"] == 10.0


@pytest.mark.slow
def test_server_down_mid_sweep_queues_fast_and_replays_when_back(
    live_server: MlflowServer, tmp_path: Path, knocks: Knocks
) -> None:
    workdir = tmp_path / "runs" / "demo"
    tracker = Tracker(live_server.uri, "demo", outbox_dir=workdir)
    parent = tracker.start_sweep(run_name="s", params={"n_trials": 3}, tags={})
    first = write_trial(workdir, 0, role=TrialRole.baseline, params=BASELINE_KNOBS)
    run0 = tracker.start_trial(parent, number=0, params=BASELINE_KNOBS, role="baseline", tags={})
    tracker.log_trial(parent, first, run_id=run0, extra_metrics={}, extra_tags={})
    run1 = tracker.start_trial(parent, number=1, params=KNOBS, role="search", tags={})
    assert run1 is not None

    live_server.stop()
    outcome1 = write_trial(workdir, 1)
    outcome2 = write_trial(workdir, 2, status=TrialStatus.FAILED, failure_kind=FailureKind.nccl_hang)
    knocks.port = live_server.port
    knocks.since_last()  # connections from here on are to a stopped server
    tracker.log_trial(parent, outcome1, run_id=run1, extra_metrics={"speedup_vs_baseline": 1.5}, extra_tags={})
    assert knocks.since_last() <= TRIES_PER_CALL, "a stopped server stalled log_trial"
    assert tracker.start_trial(parent, number=2, params=KNOBS, role="search", tags={}) is None
    assert knocks.since_last() <= TRIES_PER_CALL
    tracker.log_trial(parent, outcome2, run_id=None, extra_metrics={}, extra_tags={})
    assert knocks.since_last() <= TRIES_PER_CALL
    tracker.end_sweep(parent, "FINISHED")
    assert knocks.since_last() <= TRIES_PER_CALL
    assert tracker.pending() == 3
    lines = [json.loads(line) for line in (workdir / OUTBOX_FILE).read_text().splitlines()]
    assert lines[0]["op"] == "log_trial"
    assert lines[0]["parent_run_id"] == parent and lines[0]["run_id"] == run1
    assert lines[0]["outcome_path"] == str((workdir / "trials" / "1" / "outcome.json").resolve())
    assert lines[0]["extra_metrics"] == {"speedup_vs_baseline": 1.5}
    assert lines[0]["extra_tags"] == {}
    assert [line["op"] for line in lines] == ["log_trial", "log_trial", "end_sweep"]
    assert tracker.replay_outbox() == (0, 3), "still down: nothing lost, nothing sent"
    knocks.since_last()  # the replay's own connections: not what this test bounds
    # Reads and the registry cannot be queued: they fail at once with what, where and the fix.
    with pytest.raises(
        TrackingError, match=f"Could not read the trial runs .* {parent} in MLflow at {live_server.uri}.*Fix"
    ):
        tracker.child_runs(parent)
    assert knocks.since_last() <= TRIES_PER_CALL
    with pytest.raises(
        TrackingError, match=f"Could not reach MLflow at {live_server.uri} to resolve models:/demo-serving@champion"
    ):
        tracker.resolve("demo-serving")
    assert knocks.since_last() <= TRIES_PER_CALL
    with pytest.raises(TrackingError, match="Could not start the sweep run in MLflow at http"):
        Tracker(live_server.uri, "other", outbox_dir=tmp_path / "other").start_sweep(run_name="s", params={}, tags={})
    assert knocks.since_last() <= TRIES_PER_CALL

    live_server.start()  # same port, same store
    assert tracker.replay_outbox() == (3, 0)
    assert tracker.pending() == 0

    client = MlflowClient(tracking_uri=live_server.uri)
    assert client.get_run(parent).info.status == "FINISHED"
    runs = children(client, parent)
    assert sorted(runs) == ["baseline-0000", "trial-0001", "trial-0002"]
    assert runs["trial-0001"].info.run_id == run1
    assert runs["trial-0001"].info.status == "FINISHED"
    assert runs["trial-0001"].data.metrics["speedup_pct"] == 50.0
    assert runs["trial-0002"].info.status == "FAILED"
    assert runs["trial-0002"].data.tags["sweep.failure_kind"] == "nccl_hang"
    assert {f.path for f in client.list_artifacts(run1, "trial")} >= {"trial/server.log", "trial/outcome.json"}
    assert tracker.replay_outbox() == (0, 0)
