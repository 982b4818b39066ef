"""Pure conversions from the sweep's values to what MLflow stores: params, metrics, tags, names.

No MLflow here, so every rule is table-tested without a store.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator import redact
from orchestrator.records import FailureKind, ServingConfig, TrialOutcome, TrialStatus
from orchestrator.results.select import speedup_pct

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

_ROLE_RUN_PREFIX = {"search": "trial"}
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
"""MLflow 3 opens an experiment without this tag in its GenAI view (traces, evaluation runs); this
value is the classic training view: the runs table and the charts (mlflow/server/js, `ExperimentKind`)."""
SHARED_VIEW_TAG = "mlflow.sharedViewState."
"""An experiment tag MLflow's runs page reads when its URL carries `?viewStateShareKey=<key>`:
the columns, the filter and the sort a reader sees first."""
TRIALS_VIEW_KEY = "sweep-trials"
CHAMPION_TAG = "sweep.champion"
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def trial_run_name(role: Any, number: int, trial_dir: str = "") -> str:
    """`trial-0007` for a searched trial, `baseline-0000`; a confirmation round is named after
    its folder (`confirm-00-champion`) since its rounds share a trial number."""
    role = role_text(role)
    if role == "confirm" and trial_dir:
        return f"confirm-{Path(trial_dir).name}"
    return f"{_ROLE_RUN_PREFIX.get(role, role)}-{int(number):04d}"


def role_text(role: Any) -> str:
    """A trial role (enum or its value) as the text stored in the `sweep.role` tag."""
    return str(getattr(role, "value", role))


def run_status(outcome: TrialOutcome) -> str:
    """The MLflow run status that closes a trial's run: FINISHED, FAILED or KILLED."""
    if outcome.failure_kind == FailureKind.interrupted:
        return "KILLED"
    return "FINISHED" if outcome.status == TrialStatus.COMPLETE else "FAILED"


def params(values: Mapping[str, Any]) -> dict[str, str]:
    """Every knob as an MLflow param: None becomes "unset", secret-named values are masked."""
    out = {}
    for name, value in values.items():
        if redact.is_secret_name(name):
            out[name] = redact.MASK
        else:
            out[name] = UNSET if value is None else redact.redact_text(_value_text(value))
    return out


def tags(values: Mapping[str, Any]) -> dict[str, str]:
    """Tags as strings; None dropped, secrets masked, long values cut to what MLflow stores."""
    out = {}
    for name, value in values.items():
        if value is None:
            continue
        text = redact.MASK if redact.is_secret_name(name) else redact.redact_text(_value_text(value))
        out[str(name)] = text[:TAG_MAX]
    return out


def _value_text(value: Any) -> str:
    return str(getattr(value, "value", value))


def metrics(values: Mapping[str, Any]) -> dict[str, float]:
    """Numbers only (bools and None dropped), as floats; NaN kept (MLflow shows it as NaN)."""
    return {str(k): float(v) for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def outcome_metrics(outcome: TrialOutcome) -> dict[str, float]:
    """Every number of the outcome: its Metrics, repeats and timings, and `<name>_ci95_low/high`
    only where repeated measurements give an interval (one measurement has none)."""
    out: dict[str, float] = {}
    if outcome.metrics is not None:
        out.update(metrics(outcome.metrics.model_dump(exclude={"sources"})))
    if outcome.summary is not None:
        out["repeats"] = float(outcome.summary.repeats)
        if outcome.summary.repeats >= 2:
            out.update(metrics({f"{k}_ci95_low": v for k, v in outcome.summary.ci95_low.items()}))
            out.update(metrics({f"{k}_ci95_high": v for k, v in outcome.summary.ci95_high.items()}))
    out.update(metrics({f"time_{k}_s": v for k, v in outcome.timings.items()}))
    if outcome.started_at and outcome.finished_at:
        out["time_total_s"] = max(outcome.finished_at - outcome.started_at, 0.0)
    return out


SPEEDUP_RATIO = "speedup_vs_baseline"
SPEEDUP_PCT = "speedup_pct"
"""The speed-up over the baseline as MLflow shows it: +12.3 means 12.3 % faster."""


def trial_metrics(outcome: TrialOutcome, extra: Mapping[str, float]) -> dict[str, float]:
    """What a trial run shows: the outcome's numbers and the extra ones, rounded to what a reader
    compares (`rounded`), the speed-up ratio as `speedup_pct`."""
    values = {**outcome_metrics(outcome), **metrics(extra)}
    ratio = values.pop(SPEEDUP_RATIO, None)
    out = {k: rounded(v) for k, v in values.items()}
    if ratio is not None and math.isfinite(ratio):
        out[SPEEDUP_PCT] = speedup_pct(ratio)  # one decimal as every view shows it, not 4 digits (+1234.5)
    return out


def rounded(value: float) -> float:
    """4 significant digits (181.3 tok/s, 2.909 tokens, 0.01234 s); integers, NaN and inf kept."""
    if not math.isfinite(value) or value == int(value):
        return value
    return float(f"{value:.4g}")


def outcome_tags(outcome: TrialOutcome) -> dict[str, str]:
    """The trial run's tags: status, failure kind, engine, fingerprint, number, role, and for a
    failure the run's description (reason and log tail)."""
    values: dict[str, Any] = {
        "sweep.status": outcome.status.value,
        "sweep.failure_kind": outcome.failure_kind.value if outcome.failure_kind else None,
        "sweep.engine": outcome.launch.engine if outcome.launch is not None else None,
        "sweep.fingerprint_hash": outcome.fingerprint_hash or None,
        TRIAL_TAG: str(outcome.number),
        ROLE_TAG: role_text(outcome.role),
        TRIAL_DIR_TAG: outcome.trial_dir or None,
        "sweep.allreduce_path": outcome.allreduce_path or None,
        "sweep.node": outcome.node or None,
        "sweep.reason": outcome.reason[:REASON_MAX] if outcome.reason else None,
        "sweep.warnings": "; ".join(outcome.warnings) if outcome.warnings else None,
    }
    if outcome.metrics is not None and outcome.metrics.sources:
        values["sweep.metric_sources"] = json.dumps(outcome.metrics.sources, sort_keys=True)
        values["sweep.acceptance"] = outcome.metrics.acceptance_label  # "synthetic prompts" or "real text"
    if outcome.status != TrialStatus.COMPLETE and (outcome.reason or outcome.log_tail):
        # The run's description in the UI: why it failed and the end of its log.
        kind = outcome.failure_kind.value if outcome.failure_kind else "failed"
        values[NOTE_TAG] = f"{kind}: {outcome.reason}\n\n```\n{outcome.log_tail[-NOTE_MAX:]}\n```"
    return tags(values)


def param_diff(new: Mapping[str, str], existing: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(params not yet logged, a tag naming those logged with another value).

    MLflow params cannot change once logged; a clash (a bug upstream) is flagged rather than
    left to fail the whole log forever.
    """
    fresh = {k: v for k, v in new.items() if k not in existing}
    clash = sorted(k for k, v in new.items() if k in existing and existing[k] != v)
    return fresh, ({"sweep.param_mismatch": ",".join(clash)[:TAG_MAX]} if clash else {})


def version_tags(config: ServingConfig) -> dict[str, str]:
    """The tags of a registered serving-config version: trial, experiment, engine, fingerprint,
    `metric.<name>` per metric and `knob.<name>` per knob it sets (what the version's page shows of it)."""
    return tags(
        {
            TRIAL_TAG: str(config.trial_number),
            "sweep.experiment": config.experiment,
            "sweep.engine": config.engine,
            "sweep.fingerprint_hash": config.fingerprint_hash,
            **{f"metric.{k}": number_text(v) for k, v in config.metrics.items()},
            **{f"knob.{k}": v for k, v in config.params.items() if v is not None},
        }
    )


def parent_filters(run_name: str | None, status: str | None) -> list[str]:
    """MLflow search filters for the sweep (parent) runs, optionally of one name or status."""
    filters = [f"tags.`{KIND_TAG}` = 'sweep'"]
    if run_name is not None:
        filters.append(f"attributes.run_name = '{quote_filter(run_name)}'")
    if status is not None:
        filters.append(f"attributes.status = '{quote_filter(status)}'")
    return filters


def trial_filter(parent_run_id: str, number: int, role: str) -> str:
    """The MLflow search filter for the child runs of one trial number and role."""
    return (
        f"tags.`{PARENT_TAG}` = '{quote_filter(parent_run_id)}' and "
        f"tags.`{TRIAL_TAG}` = '{int(number)}' and "
        f"tags.`{ROLE_TAG}` = '{quote_filter(role)}'"
    )


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///relative` or `sqlite:////absolute` URI, else None."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    return Path(path)


def quote_filter(value: str) -> str:
    """A value quoted for a single-quoted string in an MLflow search filter."""
    return value.replace("\\", "\\\\").replace("'", "\\'")


def safe_name(name: str) -> str:
    """A file name made of letters, digits, `_`, `.` and `-` (`figure` if nothing is left)."""
    return _SAFE_NAME.sub("_", name).strip("._") or "figure"


def number_text(value: Any) -> str:
    """A finite float in 6 significant digits; anything else as str."""
    return f"{value:.6g}" if isinstance(value, float) and math.isfinite(value) else str(value)


def ms(seconds: float) -> int:
    """Seconds since the epoch as MLflow's milliseconds."""
    return int(seconds * 1000)


def now_iso() -> str:
    """The current UTC time, ISO-8601 to the second."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def short(error: BaseException | str, limit: int = 300) -> str:
    """An error as one line for a message: secrets redacted, whitespace folded, cut to `limit`."""
    text = error if isinstance(error, str) else (str(error) or type(error).__name__)
    text = " ".join(redact.redact_text(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


TRIAL_COLUMNS = ("decode_tok_s", SPEEDUP_PCT, "accept_length", "verify_ms")
"""The metric columns the trials view opens with, the objective first. Few: MLflow draws the metrics (in
alphabetical order) before the knobs, and the knobs must be in view without scrolling; the latencies are on
each run's page."""

RANK_METRIC = "sweep_rank"
"""A trial run's place in the trials view: 1 for the deployed configuration's run, then the trials by
objective (failures last). Logged when the report is published; the view sorts by it from then on."""

ML_VIEW = "workflowType=machine_learning"
"""The query that opens MLflow 3.17's classic training view. Its sidebar reads the workflow type from the
URL first, then from the browser's last choice (default GenAI), and no longer from the experiment's
`mlflow.experimentKind` tag: only a link that carries this query opens the right view for a new reader."""


def trials_view(objective: str, direction: str = "maximize", knobs: tuple[str, ...] = (), ranked: bool = False) -> str:
    """The JSON of the experiment's shared view `sweep-trials`: the searched trials and baselines only (no
    confirmation runs, no parent), the columns a reader compares (the champion tag, the metrics, every
    knob in `knobs`), sorted by RANK_METRIC once `ranked` (the deployed trial first), else by the objective."""
    metrics_first = [objective] + [c for c in TRIAL_COLUMNS if c != objective]
    columns = [
        f"tags.`{CHAMPION_TAG}`",
        *(f"metrics.`{m}`" for m in metrics_first),
        *(f"params.`{k}`" for k in knobs),
        f"tags.`{ROLE_TAG}`",
        "tags.`sweep.status`",
        "tags.`sweep.failure_kind`",
    ]
    return json.dumps(
        {
            "searchFilter": f"tags.`{KIND_TAG}` = 'trial' and tags.`{ROLE_TAG}` != 'confirm'",
            "orderByKey": f"metrics.`{RANK_METRIC}`" if ranked else f"metrics.`{objective}`",
            "orderByAsc": True if ranked else direction == "minimize",
            "selectedColumns": columns,
            "runListHidden": False,
        }
    )


def ranks(
    runs: list[tuple[str, float | None, bool]], direction: str = "maximize", deployed: str | None = None
) -> dict[str, int]:
    """RANK_METRIC per run id, from (run id, objective value or None, complete): the `deployed` run first,
    then complete runs by objective (best first), then the others in the order given."""

    def key(item: tuple[int, tuple[str, float | None, bool]]) -> tuple[int, float, int]:
        i, (run_id, value, complete) = item
        if run_id == deployed:
            return (0, 0.0, i)
        if complete and value is not None and math.isfinite(value):
            return (1, -value if direction == "maximize" else value, i)
        return (2, 0.0, i)

    return {run_id: n for n, (_, (run_id, _, _)) in enumerate(sorted(enumerate(runs), key=key), 1)}


def trials_view_path(experiment_id: str) -> str:
    """The MLflow UI path (after the host) of the experiment's trials view, in the training view."""
    return f"#/experiments/{experiment_id}/runs?viewStateShareKey={TRIALS_VIEW_KEY}&{ML_VIEW}"


def run_path(experiment_id: str, run_id: str) -> str:
    """The MLflow UI path (after the host) of one run's page, in the training view."""
    return f"#/experiments/{experiment_id}/runs/{run_id}?{ML_VIEW}"


def experiment_note(experiment_id: str, parent_run_id: str | None = None) -> str:
    """The experiment's description: where to look first (the latest sweep's run, the ranked trials)."""
    parent = (
        f"**[The latest sweep's run]({run_path(experiment_id, parent_run_id)})** describes the verdict: the "
        f"configuration deployed, the confirmed gain and why, with `report.html` and Optuna's plots under its "
        f"artifacts. "
        if parent_run_id
        else "Each sweep's parent run (`sweep-...`) describes the verdict, with `report.html` under its artifacts. "
    )
    return (
        f"Overnight sweep of SGLang serving settings. {parent}**[Trials ranked]({trials_view_path(experiment_id)})**: "
        f"the deployed configuration first, then by the objective, with every knob as a column (confirmation "
        f"runs left out)."
    )
