"""The sweep's runs in MLflow: the parent run per sweep, a nested child run per trial, the summary
on the parent, and the child runs read back as a table.

Each function does its MLflow calls and lets their errors through; the `Tracker` decides whether a
failure is queued (an outage) or raised.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.records import TrialOutcome, launched_params
from orchestrator.results import report_html
from orchestrator.tracking import convert
from orchestrator.tracking._client import Store
from orchestrator.tracking.convert import KIND_TAG, NOTE_TAG, PARENT_TAG, ROLE_TAG, TRIAL_DIR_TAG, TRIAL_TAG
from orchestrator.tracking.outage import Failure, classify

if TYPE_CHECKING:
    import pandas
    from matplotlib.figure import Figure
    from mlflow.entities import Run

log = logging.getLogger(__name__)


def start_sweep(
    store: Store, *, run_name: str, params: Mapping[str, Any], tags: Mapping[str, Any], resume_run_id: str | None = None
) -> str:
    """Create the sweep's parent run (or mark `resume_run_id` RUNNING again); return its id.

    On resume, params already on the run are kept (MLflow params cannot change); new ones are added.
    """
    run_tags = {**convert.tags(tags), KIND_TAG: "sweep"}
    run_params = convert.params(params)
    client = store.client()
    objective = str(params.get("objective") or "decode_tok_s")
    if resume_run_id is None:
        run = client.create_run(store.experiment_id(), run_name=run_name, tags=run_tags)
        store.log_batch(run.info.run_id, params=run_params)
        _tag_experiment(store, objective, str(run.info.run_id))
        return str(run.info.run_id)
    run = client.get_run(resume_run_id)
    client.update_run(resume_run_id, status="RUNNING")
    new = {k: v for k, v in run_params.items() if k not in run.data.params}
    store.log_batch(resume_run_id, params=new, tags={**run_tags, "sweep.resumed_at": convert.now_iso()})
    _tag_experiment(store, objective, resume_run_id)
    return resume_run_id


def _direction(objective: str) -> str:
    """The objective's direction, which is not among the sweep's params: latencies (`*_ms`) are minimized,
    rates maximized."""
    return "minimize" if objective.endswith("_ms") else "maximize"


def _tag_experiment(store: Store, objective: str, parent_run_id: str) -> None:
    """Open the experiment in MLflow's training view, with the trials view and a description that links
    the sweep's parent run."""
    experiment_id = store.experiment_id()
    client = store.client()
    for key, value in {
        convert.EXPERIMENT_KIND_TAG: convert.EXPERIMENT_KIND,
        convert.SHARED_VIEW_TAG + convert.TRIALS_VIEW_KEY: convert.trials_view(objective, _direction(objective)),
        convert.NOTE_TAG: convert.experiment_note(experiment_id, parent_run_id),
    }.items():
        client.set_experiment_tag(experiment_id, key, value)


def rank_trials(store: Store, parent_run_id: str, deployed_run_id: str | None) -> None:
    """Log RANK_METRIC on the sweep's trial runs (the deployed configuration's run first, then by the
    objective) and point the trials view at it, with every knob the trials logged as a column."""
    client = store.client()
    parent = client.get_run(parent_run_id)
    objective = parent.data.params.get("objective") or "decode_tok_s"
    direction = _direction(objective)
    trials = [
        r
        for r in _child_run_objects(store, parent_run_id)
        if r.data.tags.get(KIND_TAG) == "trial" and r.data.tags.get(ROLE_TAG) != "confirm"
    ]
    trials.sort(key=lambda r: int(r.data.tags.get(TRIAL_TAG, -1)))
    rows = [(r.info.run_id, r.data.metrics.get(objective), r.info.status == "FINISHED") for r in trials]
    for run_id, rank in convert.ranks(rows, direction, deployed_run_id).items():
        store.log_batch(run_id, metrics={convert.RANK_METRIC: float(rank)}, timestamp_ms=convert.ms(time.time()))
    knobs = tuple(dict.fromkeys(k for r in trials for k in sorted(r.data.params)))
    view = convert.trials_view(objective, direction, knobs=knobs, ranked=True)
    client.set_experiment_tag(parent.info.experiment_id, convert.SHARED_VIEW_TAG + convert.TRIALS_VIEW_KEY, view)


def open_trial(
    store: Store, parent_run_id: str, *, number: int, role: str, params: Mapping[str, Any], tags: Mapping[str, Any]
) -> str:
    """The trial's child run, found (and set RUNNING again) or created, with every knob as a param."""
    run_id = find_trial(store, parent_run_id, number, role)
    if run_id is None:
        run_id = _create_trial(store, parent_run_id, number, role, convert.tags(tags))
    else:
        store.client().update_run(run_id, status="RUNNING")
    new, clash_tags = convert.param_diff(convert.params(params), store.client().get_run(run_id).data.params)
    store.log_batch(run_id, params=new, tags=clash_tags)
    return run_id


def write_trial(
    store: Store,
    parent_run_id: str,
    outcome: TrialOutcome,
    run_id: str | None,
    extra_metrics: Mapping[str, float],
    extra_tags: Mapping[str, str],
) -> str:
    """Log a finished trial on its child run (`run_id`, else the one found, else a new one), upload
    its folder under `trial/` and close the run; return the run id. Idempotent."""
    role = convert.role_text(outcome.role)
    metrics = convert.trial_metrics(outcome, extra_metrics)
    tags = {**convert.outcome_tags(outcome), **extra_tags}
    existing: dict[str, str] | None = None
    if run_id is not None:
        existing = store.params_of(run_id)
        if existing is None:
            log.warning("MLflow run %s of trial %s is gone; logging to a new run", run_id, outcome.number)
            run_id = None
    if run_id is None:
        run_id = find_trial(store, parent_run_id, outcome.number, role, trial_dir=outcome.trial_dir)
        existing = None if run_id is None else store.params_of(run_id)
    if run_id is None:
        run_id = _create_trial(
            store,
            parent_run_id,
            outcome.number,
            role,
            convert.tags({TRIAL_DIR_TAG: outcome.trial_dir or None}),
            started_at=outcome.started_at or None,
        )
    new_params, clash_tags = convert.param_diff(convert.params(launched_params(outcome)), existing or {})
    # A fixed timestamp and step make a repeated log of the same outcome a no-op in MLflow.
    when = outcome.finished_at or outcome.started_at or time.time()
    # Step = trial number: MLflow's charts then draw each metric along the sweep.
    store.log_batch(
        run_id,
        metrics=metrics,
        params=new_params,
        tags={**tags, **clash_tags},
        timestamp_ms=convert.ms(when),
        step=max(int(outcome.number), 0),
    )
    client = store.client()
    trial_dir = Path(outcome.trial_dir) if outcome.trial_dir else None
    if trial_dir is not None and trial_dir.is_dir():
        client.log_artifacts(run_id, str(trial_dir), "trial")
    end = convert.ms(outcome.finished_at) if outcome.finished_at else None
    client.set_terminated(run_id, convert.run_status(outcome), end_time=end)
    return run_id


def _create_trial(
    store: Store, parent_run_id: str, number: int, role: str, tags: dict[str, str], started_at: float | None = None
) -> str:
    """A new child run; `started_at` when it is created after the measurement (a confirmation round,
    a replay), so its duration is the measurement's own."""
    run = store.client().create_run(
        store.experiment_of(parent_run_id),
        start_time=convert.ms(started_at) if started_at else None,
        run_name=convert.trial_run_name(role, number, tags.get(TRIAL_DIR_TAG, "")),
        tags={**tags, PARENT_TAG: parent_run_id, KIND_TAG: "trial", TRIAL_TAG: str(number), ROLE_TAG: role},
    )
    return str(run.info.run_id)


def find_trial(store: Store, parent_run_id: str, number: int, role: str, trial_dir: str | None = None) -> str | None:
    """The child run of this trial number and role (and, when given, trial folder), or None.

    A run without a trial-folder tag (opened by `open_trial`) matches any folder; a run with
    another folder is another measurement (a confirmation round) and does not match.
    """
    runs = store.client().search_runs(
        [store.experiment_of(parent_run_id)],
        filter_string=convert.trial_filter(parent_run_id, number, role),
        max_results=1000,
        order_by=["attributes.start_time ASC"],
    )
    if not trial_dir:
        return str(runs[0].info.run_id) if runs else None
    wanted = convert.tags({TRIAL_DIR_TAG: trial_dir})[TRIAL_DIR_TAG]  # as it was stored
    for run in runs:
        if run.data.tags.get(TRIAL_DIR_TAG) == wanted:
            return str(run.info.run_id)
    for run in runs:
        if TRIAL_DIR_TAG not in run.data.tags:
            return str(run.info.run_id)
    return None


def stage_summary(stage: Path, table: pandas.DataFrame, figures: Mapping[str, Figure]) -> None:
    """Write the summary's files into `stage`: results.csv, results.html, figures/<name>.png."""
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "figures").mkdir(parents=True)
    table.to_csv(stage / "results.csv", index=False)
    (stage / "results.html").write_text(report_html.table_page(table), encoding="utf-8")
    for name, figure in figures.items():
        filename = convert.safe_name(name.removesuffix(".png")) + ".png"
        figure.savefig(stage / "figures" / filename, dpi=120, bbox_inches="tight")


def write_summary(
    store: Store,
    parent_run_id: str,
    stage: Path,
    metrics: Mapping[str, float],
    tags: Mapping[str, str],
    table: pandas.DataFrame | None = None,
) -> None:
    """Put the staged summary on the parent run: metrics, tags, the files, and the table as an
    MLflow table (`results.json`)."""
    client = store.client()
    store.log_batch(parent_run_id, metrics=metrics, tags=tags, timestamp_ms=convert.ms(time.time()))
    if table is None:
        import pandas as pd  # deferred: pandas is heavy and only needed on a replay

        table = pd.read_csv(stage / "results.csv")
    objective = client.get_run(parent_run_id).data.params.get("objective", "decode_tok_s")
    _log_history(store, parent_run_id, table, objective)
    figures = stage / "figures"
    if figures.is_dir() and not any(figures.iterdir()):
        figures.rmdir()
    client.log_artifacts(parent_run_id, str(stage))
    try:
        client.log_table(parent_run_id, table, "results.json")
    except Exception as e:
        if classify(e) is Failure.bug:
            raise
        # The CSV and HTML are already there; the table view is a bonus.
        log.warning("results table not logged as an MLflow table: %s", convert.short(e))


def _log_history(store: Store, parent_run_id: str, table: pandas.DataFrame, objective: str) -> None:
    """The optimization history on the parent run, step = trial number: `trial_<objective>` for each
    measured trial and `best_<objective>` for the best searched one so far (the table's `best_so_far`),
    so MLflow's chart view draws it as lines."""
    if "trial" not in table or objective not in table:
        return
    from mlflow.entities import Metric  # deferred with the client

    when = convert.ms(time.time())
    points = []
    for _, row in table.sort_values("trial").iterrows():
        values = {f"trial_{objective}": row.get(objective), f"best_{objective}": row.get("best_so_far")}
        points += [
            Metric(k, convert.rounded(float(v)), when, int(row["trial"]))
            for k, v in values.items()
            if isinstance(v, (int, float)) and v == v and int(row["trial"]) >= 0
        ]
    for i in range(0, len(points), 1000):  # MLflow takes 1000 metrics per call
        store.client().log_batch(parent_run_id, metrics=points[i : i + 1000])


def links(
    store: Store, parent_run_id: str, *, champion_trial: int | None, model: str | None, version: str | None
) -> dict[str, str]:
    """Relative MLflow UI links for the parent's description (see `Tracker.links`)."""
    experiment_id = store.experiment_of(parent_run_id)
    found = {"trials": convert.trials_view_path(experiment_id)}
    champion = find_trial(store, parent_run_id, champion_trial, "search") if champion_trial is not None else None
    if champion:
        found["champion"] = convert.run_path(experiment_id, champion)
    if model and version:
        found["model"] = f"#/models/{model}/versions/{version}?{convert.ML_VIEW}"
    return found


def publish_report(
    store: Store,
    parent_run_id: str,
    *,
    description: str,
    report: Path,
    plots: Mapping[str, str],
    plotly_js: str,
    champion_trial: int | None,
    star_run_id: str | None = None,
) -> None:
    """See `Tracker.publish_report`."""
    client = store.client()
    client.set_tag(parent_run_id, NOTE_TAG, description[: convert.TAG_MAX])
    client.log_artifact(parent_run_id, str(report))
    if plots:
        with tempfile.TemporaryDirectory(prefix="optuna-plots-") as tmp:
            for name, fragment in plots.items():
                page = (
                    f"<!doctype html><html><head><meta charset='utf-8'><script>{plotly_js}</script></head>"
                    f"<body>{fragment}</body></html>"
                )
                (Path(tmp) / f"{convert.safe_name(name)}.html").write_text(page, encoding="utf-8")
            client.log_artifacts(parent_run_id, tmp, "optuna")
    champion = star_run_id or (
        find_trial(store, parent_run_id, champion_trial, "search") if champion_trial is not None else None
    )
    if champion:
        client.set_tag(champion, convert.CHAMPION_TAG, "★ champion")
    rank_trials(store, parent_run_id, champion)


def child_runs(store: Store, parent_run_id: str) -> pandas.DataFrame:
    """The parent's trial runs as a DataFrame, one row per run ordered by trial number.

    Columns: run_id, run_name, status, start_time, end_time, trial_number, role, then
    `metrics.<name>`, `params.<knob>` and `tags.<key>` as in `mlflow.search_runs`.
    """
    import pandas as pd  # deferred: pandas is heavy

    rows = []
    for run in _child_run_objects(store, parent_run_id):
        info, data = run.info, run.data
        row: dict[str, Any] = {
            "run_id": info.run_id,
            "run_name": info.run_name,
            "status": info.status,
            "start_time": pd.Timestamp(info.start_time, unit="ms", tz="UTC") if info.start_time else pd.NaT,
            "end_time": pd.Timestamp(info.end_time, unit="ms", tz="UTC") if info.end_time else pd.NaT,
            "trial_number": int(data.tags.get(TRIAL_TAG, -1)),
            "role": data.tags.get(ROLE_TAG, ""),
        }
        row.update({f"metrics.{k}": v for k, v in data.metrics.items()})
        row.update({f"params.{k}": v for k, v in data.params.items()})
        row.update({f"tags.{k}": v for k, v in data.tags.items() if not k.startswith("mlflow.")})
        rows.append(row)
    columns = ["run_id", "run_name", "status", "start_time", "end_time", "trial_number", "role"]
    frame = pd.DataFrame(rows, columns=None if rows else columns)
    if rows:
        frame = frame.sort_values(["trial_number", "start_time"], kind="stable")
        frame = frame.reset_index(drop=True)
    return frame


def _child_run_objects(store: Store, parent_run_id: str) -> list[Run]:
    store.require_store()
    with store.reading(f"read the trial runs of sweep run {parent_run_id}"):
        client = store.client()
        experiment_id = client.get_run(parent_run_id).info.experiment_id
        runs: list[Run] = []
        token = None
        while True:
            page = client.search_runs(
                [experiment_id],
                filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
                max_results=1000,
                page_token=token,
            )
            runs.extend(page)
            token = page.token
            if not token:
                return runs
