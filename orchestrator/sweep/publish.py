"""The sweep's report, from what its work directory holds: `report.html` (which, how much, why), and the
same on the parent MLflow run with its description, Optuna's plots and the champion's tag.

Reads experiment.json, summary.json, sweep.json, trials/*/outcome.json and the Optuna storage; imports
MLflow only to publish (`publish`; the tracker defers it), so `sweep report --no-mlflow` needs no MLflow.
"""

from __future__ import annotations

import base64
import io
import json
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator.config.experiment import SweepSpec
from orchestrator.errors import StorageError, SweepError
from orchestrator.fsio import write_atomic
from orchestrator.nccllog import version_mismatch
from orchestrator.probe.result import probed_nccl
from orchestrator.records import TrialOutcome, TrialStatus
from orchestrator.results import contrib, report, report_html
from orchestrator.results import truth as truth_mod
from orchestrator.search import plots as optuna_plots
from orchestrator.search import space as sp
from orchestrator.search.study import read_only
from orchestrator.sweep._workdir import Paths
from orchestrator.sweep.state import SweepState, SweepSummary
from orchestrator.sweep.status import read_state, recorded_speedups
from orchestrator.tracking.tracker import Tracker

log = logging.getLogger("sweep")

REPORT = "report.html"


@dataclass(frozen=True)
class Report:
    """The report of one sweep: the page's values, the page, and Optuna's plots (also MLflow artifacts)."""

    content: report_html.ReportInput
    page: str
    plots: list[optuna_plots.Plot]
    state: SweepState
    summary: SweepSummary | None


def _spec(workdir: Path) -> SweepSpec:
    path = workdir / "experiment.json"
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise SweepError(
            f"{workdir}: no sweep here (experiment.json missing); pass the --workdir `sweep run` used"
        ) from None
    except (OSError, ValueError) as exc:  # a directory, unreadable, cut short, not UTF-8, not JSON
        why = exc.strerror if isinstance(exc, OSError) else str(exc).splitlines()[0][:200]
        raise SweepError(
            f"{path} cannot be read ({why}): it was cut short, overwritten or is not a file; "
            "`sweep run EXPERIMENT --resume` with the same experiment writes it again"
        ) from None
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise SweepError(
            f"{path} was written by another version of sweep and cannot be read: "
            f"{str(exc).splitlines()[0][:200]}; run the sweep again with this version"
        ) from None


def _summary(workdir: Path) -> SweepSummary | None:
    try:
        return SweepSummary.model_validate_json((workdir / "summary.json").read_bytes())
    except FileNotFoundError:
        return None  # still running: the report shows the search so far
    except (OSError, ValidationError) as exc:
        log.warning(
            "%s/summary.json not read (%s); the report leaves the promotion out",
            workdir,
            exc.strerror if isinstance(exc, OSError) else exc.errors()[0]["msg"],
        )
        return None


def outcomes(workdir: Path) -> list[TrialOutcome]:
    """Every trial's outcome in trials/*/outcome.json, by trial number (confirmation rounds not included)."""
    found = []
    for path in sorted((workdir / "trials").glob("*/outcome.json")):
        try:
            found.append(TrialOutcome.model_validate_json(path.read_bytes()))
        except (ValidationError, OSError) as exc:
            log.warning("%s not read: %s", path, str(exc).splitlines()[0][:200])
    return sorted(found, key=lambda o: o.number)


def _failures(done: Sequence[TrialOutcome]) -> list[report_html.Failure]:
    by_kind: dict[str, list[TrialOutcome]] = defaultdict(list)
    for o in done:
        if o.status is TrialStatus.FAILED:
            by_kind[o.failure_kind.value if o.failure_kind else "failed"].append(o)
    return [
        report_html.Failure(kind=k, count=len(v), trial=v[0].number, reason=v[0].reason)
        for k, v in sorted(by_kind.items(), key=lambda kv: -len(kv[1]))
    ]


def _findings(summary: SweepSummary) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if summary.contributions:
        found["contributions"] = [
            f"{c.part}: {c.interval.gain * 100:+.1f}% (95% interval {c.interval.low * 100:+.1f}% "
            f"to {c.interval.high * 100:+.1f}%, {c.a} vs {c.b})"
            for c in summary.contributions
        ]
    if summary.deployed and summary.promoted_config != "champion":
        found["promoted configuration"] = f"{summary.deployed['label']}: " + ", ".join(
            f"{k}={v}" for k, v in summary.deployed["params"].items()
        )
    elif summary.promoted_config and summary.promoted_config != "champion":
        found["promoted configuration"] = summary.promoted_config
    if summary.concurrency:
        gate = summary.confirmed.concurrency if summary.confirmed else None
        found["gain per concurrency"] = [
            f"{contrib.streams(g.concurrency, short=True)}{' (the gate level)' if g.concurrency == gate else ''}: "
            f"{g.interval.gain * 100:+.1f}% ({g.interval.low * 100:+.1f}% to {g.interval.high * 100:+.1f}%)"
            + (f"; adaptive steps against {g.steps.fixed}: {g.steps.text(g.concurrency)}" if g.steps else "")
            for g in summary.concurrency
        ]
    if summary.concurrency_verdict:
        found["concurrency"] = summary.concurrency_verdict
    if summary.search_value is not None:
        found["search-phase measurement (one run, optimistic)"] = summary.search_value
    return found


def _verdict(summary: SweepSummary | None) -> str:
    """The verdict in words, led by its kind (promoted, unconfirmed, not better, undecided, no champion)."""
    if summary is None:
        return "sweep still running: no verdict yet"
    text = summary.verdict or ""
    if summary.outcome is None or text.lower().startswith(summary.outcome.value.replace("_", " ")):
        return text
    return f"{summary.outcome.value.replace('_', ' ')}: {text}"


def _truth(spec: SweepSpec, champion: dict[str, Any] | None) -> str:
    """On the simulator: the champion's true objective as a share of the space's true optimum."""
    if spec.engine != "simulator" or champion is None or spec.objective.metric not in truth_mod.MODELLED:
        return ""
    try:
        t = truth_mod.compute(spec)
        value = truth_mod.evaluator(spec)(sp.complete(spec.space, champion.get("params", {})))
    except (ValueError, KeyError) as exc:
        return f"true optimum not computed: {exc}"
    ratio = value / t.optimum if t.maximize else t.optimum / value
    return (
        f"simulator: the champion's noise-free {spec.objective.metric} is {value:.1f}, {ratio * 100:.1f}% of "
        f"the true optimum {t.optimum:.1f} (rank {t.rank_of_value(value)} of {len(t.values)} feasible points)"
    )


def _kept_speedups(url: str, study: str) -> dict[int, float] | None:
    """Each trial's speed-up ratio as the study kept it when the trial was told (what MLflow and `sweep
    status` show), or None where the study cannot be read (the table then computes them itself)."""
    if ":***@" in url:
        return None  # its password is never written down
    try:
        read = read_only(url, study)
    except StorageError as exc:
        log.warning("the study is not readable (%s): the report computes each speed-up over the nearest baseline", exc)
        return None
    return recorded_speedups(read[0]) if read else None


def _png(figure: Any) -> str:
    buf = io.BytesIO()
    figure.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _plots_and_figures(
    spec: SweepSpec, state: SweepState, done: Sequence[TrialOutcome], baselines: Any, url: str
) -> tuple[list[optuna_plots.Plot], dict[str, str]]:
    """Optuna's plots from the storage at `url` (none where its password is never written down) and, only
    when there are none, the page's own figures as base64 PNG."""
    plots = [] if ":***@" in url else optuna_plots.sweep_plots(url, state.experiment, spec.objective.metric)
    figures = {} if plots else {name: _png(f) for name, f in report.figures(spec, done, baselines).items()}
    return plots, figures


def _champion_fields(spec: SweepSpec, champ: dict[str, Any] | None) -> dict[str, Any]:
    """The champion's trial number, knobs and objective value for the page; empty without a champion."""
    if not champ:
        return {"champion_trial": None, "champion_params": {}, "champion_value": None}
    return {
        "champion_trial": champ["number"],
        "champion_params": champ["params"],
        "champion_value": champ.get(spec.objective.metric),
    }


def _gain(summary: SweepSummary) -> tuple[Any, Any, Any]:
    """The confirmed gain and its gate bounds (gain, low, high): the confirmation's, else the gate's."""
    confirmed = summary.confirmed
    if confirmed:
        return confirmed.gain, confirmed.low, confirmed.high
    gate = summary.gate or {}
    return gate.get("gain"), gate.get("ci_low"), gate.get("ci_high")


def _running_fields(state: SweepState) -> dict[str, Any]:
    """The page's promotion fields while the sweep runs (no summary.json yet): none but the search's
    skipped proposals and stop reason from sweep.json."""
    return {
        "promoted": False,
        "gain": None,
        "gain_low": None,
        "gain_high": None,
        "confirm_rounds": 0,
        "concurrency": None,
        "model_version": None,
        "env_file": None,
        "findings": {},
        "importances": {},
        "skipped": state.skipped,
        "stop_reason": state.stop_reason,
        "drift": None,
        "drift_flagged": False,
        "fingerprint_changes": [],
    }


def _finished_fields(summary: SweepSummary) -> dict[str, Any]:
    """The page's promotion fields from summary.json: gain and bounds, rounds and level, the registered
    version and env file, findings, importances, skipped proposals, stop reason, drift and fingerprints."""
    confirmed = summary.confirmed
    gain, low, high = _gain(summary)
    return {
        "promoted": bool(summary.promoted),
        "gain": gain,
        "gain_low": low,
        "gain_high": high,
        "confirm_rounds": confirmed.rounds if confirmed else 0,
        "concurrency": confirmed.concurrency if confirmed else None,
        "model_version": summary.model_version,
        "env_file": summary.env_file,
        "findings": _findings(summary),
        "importances": summary.importances,
        "skipped": summary.skipped,
        "stop_reason": summary.stop_reason,
        "drift": summary.baseline_drift.max_relative_change,
        "drift_flagged": bool(summary.baseline_drift.flagged),
        "fingerprint_changes": summary.fingerprint_changes,
    }


def _with_nccl_mismatch(fields: dict[str, Any], workdir: Path, done: Sequence[TrialOutcome]) -> dict[str, Any]:
    """`fields` with a warning beside the fingerprint changes where the NCCL probe.json measured is not the
    one the trials' servers loaded (their fingerprints' `nccl`, from NCCL's version line), or their ranks
    disagreed (issue 19)."""
    loaded = {f"trial {o.number}": o.fingerprint.get("nccl") for o in done if o.fingerprint.get("nccl")}
    problems = version_mismatch(probed_nccl(workdir), loaded, probe_where="probe.json")
    return {**fields, "fingerprint_changes": [*fields["fingerprint_changes"], *problems]} if problems else fields


def build(workdir: Path, storage: str | None = None, *, truth: bool = False) -> Report:
    """The report of the sweep in `workdir` (finished or running). `truth`: on the simulator, also rank the
    champion against the space's true optimum (evaluates every feasible point: a minute on large spaces)."""
    workdir = Path(workdir).resolve()
    state = read_state(workdir)
    spec = _spec(workdir)
    summary = _summary(workdir)
    done = outcomes(workdir)
    baselines = summary.baseline_drift.baselines if summary else state.baselines
    url = storage or state.optuna_storage or Paths(workdir).optuna_url
    table = report.results_table(spec, done, baselines, _kept_speedups(url, state.experiment))
    plots, figures = _plots_and_figures(spec, state, done, baselines, url)
    champ = summary.champion if summary else None
    content = report_html.ReportInput(
        experiment=spec.name,
        objective=spec.objective.metric,
        direction=spec.objective.direction,
        table=table,
        **_champion_fields(spec, champ),
        verdict=_verdict(summary),
        model=spec.promotion.model_name,
        **_with_nccl_mismatch(_finished_fields(summary) if summary else _running_fields(state), workdir, done),
        failures=_failures(done),
        truth=_truth(spec, champ) if truth else "",
        plots=[(p.title, p.html) for p in plots],
        figures=figures,
    )
    page = report_html.render(content, optuna_plots.plotly_js() if plots else "")
    return Report(content=content, page=page, plots=plots, state=state, summary=summary)


def _heading(c: report_html.ReportInput, deployed: str | None = None) -> str:
    """The description's title: the experiment and its champion trial (and what was deployed, where the
    verdict deployed another configuration than the search's champion), or that there is none."""
    title = f"champion trial {c.champion_trial}" if c.champion_trial is not None else "no champion"
    return f"## {c.experiment}: {title}" + (f", deployed: {deployed}" if deployed else "")


def _gate_bounds(c: report_html.ReportInput) -> str:
    """` (gate bounds low% to high%, N rounds)` after the confirmed gain, or nothing without both bounds."""
    if c.gain_low is None or c.gain_high is None:
        return ""
    # The gate's sequential bounds (each look spends a share of the error budget): wider than 95%.
    rounds = f", {c.confirm_rounds} rounds" if c.confirm_rounds else ""
    return f" (gate bounds {c.gain_low * 100:+.1f}% to {c.gain_high * 100:+.1f}%{rounds})"


def _gain_line(c: report_html.ReportInput, gain: float) -> str:
    """The confirmed gain over the baseline in bold, at the gate's level where known, with its gate bounds."""
    at = f" at {contrib.streams(c.concurrency)}" if c.concurrency is not None else ""
    return f"**Confirmed gain{at}: {gain * 100:+.1f}%** {c.objective} over the baseline{_gate_bounds(c)}."


def _link_lines(c: report_html.ReportInput, links: dict[str, str]) -> list[str]:
    """Links that exist: the promoted model version (with its env file), the champion's run, all trials."""
    lines = []
    if c.promoted and "model" in links:
        env = f", env file `{c.env_file}`" if c.env_file else ""
        lines.append(f"Promoted: [{c.model} version {c.model_version}]({links['model']}){env}.")
    if "champion" in links:
        lines.append(f"Champion's run: [trial {c.champion_trial}]({links['champion']}).")
    if "trials" in links:
        lines.append(f"All trials ranked: [{c.objective}, speed-up, accept length, verify ms]({links['trials']}).")
    return lines


def _finding_blocks(c: report_html.ReportInput) -> list[str]:
    """One bold-titled bullet list per finding of the promotion."""
    blocks = []
    for name, value in c.findings.items():
        items = value if isinstance(value, list) else [value]
        blocks.append(f"**{name.capitalize()}**:\n" + "\n".join(f"- {v}" for v in items))
    return blocks


def _knob_lines(c: report_html.ReportInput) -> list[str]:
    """The five most important knobs with their share, and the champion's knobs, where known."""
    lines = []
    if c.importances:
        top = sorted(c.importances.items(), key=lambda kv: -kv[1])[:5]
        lines.append("**Knob importances**: " + ", ".join(f"`{k}` {v * 100:.0f}%" for k, v in top))
    if c.champion_params:
        lines.append("**Knobs**:\n" + "\n".join(f"- `{k}={v}`" for k, v in c.champion_params.items()))
    return lines


def description(r: Report, links: dict[str, str]) -> str:
    """The parent run's description in markdown: champion, confirmed gain, why, knobs, links."""
    c = r.content
    deployed = r.summary.deployed if r.summary is not None and r.summary.promoted else None
    other = bool(deployed) and r.summary is not None and r.summary.promoted_config != "champion"
    lines = [_heading(c, deployed["label"] if deployed and other else None)]
    if deployed and other:
        lines.append(f"**Deployed: {deployed['label']}** (the figures below are its own).")
    if c.gain is not None:
        lines.append(_gain_line(c, c.gain))
    if c.verdict:
        lines.append(f"Verdict: {c.verdict}")
    lines += _link_lines(c, links) + _finding_blocks(c) + _knob_lines(c)
    lines.append("Report: `report.html` in the artifacts; Optuna's plots under `optuna/`.")
    return "\n\n".join(lines)


def write(
    workdir: Path, output: Path | None = None, storage: str | None = None, *, truth: bool = False
) -> tuple[Path, Report]:
    """Build the report and write it (atomically) to `output`, default <workdir>/report.html."""
    r = build(workdir, storage, truth=truth)
    path = output or Path(workdir) / REPORT
    write_atomic(path, r.page)
    return path, r


def publish(workdir: Path, storage: str | None = None) -> Path:
    """Write report.html and put it on the sweep's parent MLflow run, with the description, Optuna's
    plots (`optuna/<name>.html`) and the champion's tag. Raises TrackingError when MLflow refuses."""
    path, r = write(workdir, storage=storage)
    state = r.state
    if not state.parent_run_id:
        return path
    tracker = Tracker(state.tracking_uri, state.experiment_in_mlflow, outbox_dir=Path(workdir))
    links = tracker.links(
        state.parent_run_id,
        champion_trial=r.content.champion_trial,
        model=state.model_name if r.content.promoted else None,
        version=r.content.model_version,
    )
    tracker.publish_report(
        state.parent_run_id,
        description=description(r, links),
        report=path,
        plots={p.name: p.html for p in r.plots},
        plotly_js=optuna_plots.plotly_js() if r.plots else "",
        champion_trial=r.content.champion_trial,
        star_run_id=r.summary.run_id if r.summary is not None and r.summary.promoted else None,
    )
    return path
