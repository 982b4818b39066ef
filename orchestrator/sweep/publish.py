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
from orchestrator.results import report, report_html, report_plots
from orchestrator.results import truth as truth_mod
from orchestrator.results.figures import streams
from orchestrator.search import plots as optuna_plots
from orchestrator.search import space as sp
from orchestrator.search.study import read_only
from orchestrator.sweep._workdir import Paths
from orchestrator.sweep.state import SweepState, SweepSummary
from orchestrator.sweep.status import read_state, recorded_speedups
from orchestrator.tracking.tracker import Tracker
from orchestrator.verdict import render as verdict_render
from orchestrator.verdict.value import Configuration, Verdict

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
    verdict: Verdict | None = None


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


def _findings(v: Verdict) -> dict[str, Any]:
    """The verdict's findings for the page's "why" card: whose parts, the search's pick, the load levels."""
    found: dict[str, Any] = {}
    if v.parts:
        found[v.parts_heading()] = [
            f"{c.part}: {c.interval.gain * 100:+.1f}% (95% interval {c.interval.low * 100:+.1f}% "
            f"to {c.interval.high * 100:+.1f}%, {c.a} vs {c.b})"
            for c in v.parts
        ]
    if v.replaced:
        found["why this configuration"] = v.replaced
    if (pick := verdict_render.pick_line(v)) is not None:
        found["search's pick"] = pick.removeprefix("the search's pick: ")
    if v.levels:
        gate = v.figures.concurrency if v.figures else None
        found["gain per concurrency"] = [
            f"{streams(g.concurrency, short=True)}{' (the gate level)' if g.concurrency == gate else ''}: "
            f"{g.interval.gain * 100:+.1f}% ({g.interval.low * 100:+.1f}% to {g.interval.high * 100:+.1f}%)"
            + (f"; adaptive steps against {g.steps.fixed}: {g.steps.text(g.concurrency)}" if g.steps else "")
            for g in v.levels
        ]
    if v.by_load:
        found["concurrency"] = v.by_load
    if v.not_measured:
        found["not measured"] = list(v.not_measured)
    return found


def _verdict(v: Verdict | None) -> str:
    """The verdict in words, led by its kind (promoted, unconfirmed, not better, undecided, no champion)."""
    if v is None:
        return "sweep still running: no verdict yet"
    words = v.outcome.words if v.outcome is not None else "interrupted"
    return v.text if v.text.lower().startswith(words) else f"{words}: {v.text}"


def _truth(spec: SweepSpec, subject: Configuration | None) -> str:
    """On the simulator: the verdict's configuration's true objective as a share of the space's true optimum."""
    if spec.engine != "simulator" or subject is None or spec.objective.metric not in truth_mod.MODELLED:
        return ""
    try:
        t = truth_mod.compute(spec)
        value = truth_mod.evaluator(spec)(sp.complete(spec.space, subject.params))
    except (ValueError, KeyError) as exc:
        return f"true optimum not computed: {exc}"
    ratio = value / t.optimum if t.maximize else t.optimum / value
    return (
        f"simulator: {subject.label}'s noise-free {spec.objective.metric} is {value:.1f}, {ratio * 100:.1f}% of "
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


def _champion_fields(v: Verdict | None) -> dict[str, Any]:
    """What the page's "which" card shows: the deployed configuration (the search's pick when nothing was
    deployed), its knobs and its own figure; empty without either."""
    subject = v.subject if v is not None else None
    if v is None or subject is None:
        return {"champion_trial": None, "champion_params": {}, "champion_value": None}
    value = v.figures.champion_median if v.figures is not None else v.pick_value
    which = "deployed" if v.deployed is not None else "the search's pick (not deployed)"
    return {
        "champion_trial": subject.number,
        "champion_label": subject.label,
        "champion_params": subject.params,
        "champion_value": value,
        "which": which,
        "gated": v.gated,
    }


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


def _figure_fields(v: Verdict | None) -> dict[str, Any]:
    """The gain card's figures: the gain of what the verdict is about, its gate bounds and rounds where a
    gate ran (none where it did not), the level it was measured at."""
    f = v.figures if v is not None else None
    if v is None or f is None:
        return {"gain": None, "gain_low": None, "gain_high": None, "confirm_rounds": 0, "concurrency": None}
    gated = v.gated
    return {
        "gain": f.gain,
        "gain_low": f.low if gated else None,
        "gain_high": f.high if gated else None,
        "confirm_rounds": f.rounds if gated else 0,
        "concurrency": f.concurrency,
    }


def _finished_fields(summary: SweepSummary, v: Verdict | None) -> dict[str, Any]:
    """The page's promotion fields from the verdict: the gain and bounds of what it is about, rounds and
    level, the registered version and env file, findings; and from summary.json importances, skipped
    proposals, stop reason, drift and fingerprints."""
    promoted = v is not None and v.promoted
    return {
        **_figure_fields(v),
        "promoted": promoted,
        "model_version": v.model_version if v is not None and promoted else None,
        "env_file": v.env_file if v is not None and promoted else None,
        "findings": _findings(v) if v is not None else {},
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


def _verdict_plots(spec: SweepSpec, v: Verdict | None) -> dict[str, Any]:
    """The page's bars of the verdict: each part's gain, the gain at each load level, and the secondary
    objective (two objectives: the Pareto front)."""
    if v is None:
        return {"secondary": spec.objective.secondary}
    gate_level = v.figures.concurrency if v.figures else None
    return {
        "parts": report_plots.contribution_bars(v.parts),
        "levels": report_plots.level_bars(v.levels, gate_level),
        "secondary": spec.objective.secondary,
    }


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
    verdict = summary.the_verdict() if summary else None
    content = report_html.ReportInput(
        experiment=spec.name,
        objective=spec.objective.metric,
        direction=spec.objective.direction,
        table=table,
        **_champion_fields(verdict),
        verdict=_verdict(verdict) if summary else _verdict(None),
        model=spec.promotion.model_name,
        **_with_nccl_mismatch(_finished_fields(summary, verdict) if summary else _running_fields(state), workdir, done),
        failures=_failures(done),
        truth=_truth(spec, verdict.subject if verdict else None) if truth else "",
        plots=[(p.title, p.html) for p in plots],
        **_verdict_plots(spec, verdict),
        figures=figures,
    )
    page = report_html.render(content, optuna_plots.plotly_js() if plots else "")
    return Report(content=content, page=page, plots=plots, state=state, summary=summary, verdict=verdict)


def _link_lines(r: Report, links: dict[str, str]) -> list[str]:
    """Links that exist: the promoted model version (with its env file), the verdict's run, all trials."""
    c, v = r.content, r.verdict
    lines = []
    if v is not None and v.promoted and "model" in links:
        env = f", env file `{v.env_file}`" if v.env_file else ""
        lines.append(f"Promoted: [{c.model} version {v.model_version}]({links['model']}){env}.")
    if "champion" in links and v is not None and v.subject is not None:
        whose = "Deployed" if v.deployed is not None else "The search's pick"
        lines.append(f"{whose} trial's run: [trial {v.subject.number}]({links['champion']}).")
    if "trials" in links:
        lines.append(f"All trials ranked: [{c.objective}, speed-up, accept length, verify ms]({links['trials']}).")
    return lines


def description(r: Report, links: dict[str, str]) -> str:
    """The parent run's description in markdown, rendered from the verdict: what is deployed and its own
    gain ("confirmed" only where a gate ran), why, its knobs, the links, the knob importances."""
    c, v = r.content, r.verdict
    subject = v.subject if v is not None else None
    title = f"deployed {v.deployed.label}" if v is not None and v.deployed is not None else "nothing deployed"
    lines = [f"## {c.experiment}: {title if v is not None else 'still running'}"]
    if v is not None:
        lines += verdict_render.markdown(v)
    lines += _link_lines(r, links)
    if c.importances:
        top = sorted(c.importances.items(), key=lambda kv: -kv[1])[:5]
        lines.append("**Knob importances**: " + ", ".join(f"`{k}` {share * 100:.0f}%" for k, share in top))
    if subject is None and c.champion_params:
        lines.append("**Knobs**:\n" + "\n".join(f"- `{k}={val}`" for k, val in c.champion_params.items()))
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
    v = r.verdict
    trial = v.subject.number if v is not None and v.subject is not None else None
    links = tracker.links(
        state.parent_run_id,
        champion_trial=trial,
        model=state.model_name if v is not None and v.promoted else None,
        version=v.model_version if v is not None else None,
    )
    tracker.publish_report(
        state.parent_run_id,
        description=description(r, links),
        report=path,
        plots={p.name: p.html for p in r.plots},
        plotly_js=optuna_plots.plotly_js() if r.plots else "",
        champion_trial=trial,
        star_run_id=v.run_id if v is not None and v.promoted else None,
    )
    return path
