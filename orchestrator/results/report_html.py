"""The sweep's report as one self-contained HTML page (`report.html`) that answers, at the top, which
configuration won, by how much (the confirmed gain and its interval) and why (the contributions and
the knobs' importances), then the history, failures by kind, fingerprint and drift, and every trial.

Pure: it takes values and pre-drawn plot fragments and returns text. `table_page` is the styled
`results.html` of the parent run.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from orchestrator.results import report_plots
from orchestrator.results.figures import streams

STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;background:#f6f7f9;color:#1d2430}
main{max-width:1200px;margin:0 auto;padding:24px}
h1{font-size:24px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 10px;border-bottom:1px solid #dde1e6;padding-bottom:4px}
.sub{color:#5c6675;margin-bottom:18px}
.cards{display:flex;gap:16px;flex-wrap:wrap}
.card{background:#fff;border:1px solid #dde1e6;border-radius:8px;padding:16px 20px;flex:1;min-width:260px}
.card .big{font-size:30px;font-weight:600} .card .label{color:#5c6675;font-size:13px;text-transform:uppercase}
.good{color:#137333} .bad{color:#b3261e} .warn{color:#a05a00}
table{border-collapse:collapse;background:#fff;font-size:13px;width:100%}
th,td{border:1px solid #e3e6ea;padding:4px 8px;text-align:right;white-space:nowrap}
th{background:#eef1f4;position:sticky;top:0} td.l,th.l{text-align:left}
tr.champion td{background:#fff6d6;font-weight:600} tr.failed td{color:#8a8f98}
.scroll{overflow-x:auto;max-height:640px;overflow-y:auto;border:1px solid #dde1e6}
code,pre{background:#eef1f4;border-radius:4px;padding:1px 4px;font-size:12px} pre{padding:8px;white-space:pre-wrap}
.plot{background:#fff;border:1px solid #dde1e6;border-radius:8px;margin:10px 0;padding:6px}
.plot svg.chart{display:block;width:100%;height:auto}
.plot h3{font-size:14px;margin:4px 6px;color:#5c6675;font-weight:600}
.card,.card code,li,p{overflow-wrap:anywhere}
"""

FRONT_COLUMNS = ("champion", "trial", "role", "status", "failure_kind", "speedup_pct")
SYNTHETIC = "synthetic prompts"
"""records.Metrics.acceptance_label of acceptance measured on the builtin generator's prompts."""


@dataclass(frozen=True)
class Failure:
    """One kind of failure: how many trials, and one of them as the example."""

    kind: str
    count: int
    trial: int
    reason: str


@dataclass(frozen=True)
class ReportInput:
    """What the report shows; every field is optional but the experiment and the table."""

    experiment: str
    objective: str
    direction: str
    table: pd.DataFrame
    """`report.results_table`: one row per trial, best first."""
    champion_trial: int | None = None
    champion_label: str = ""
    """The verdict's configuration in words ("trial 13", "trial 16 without speculation")."""
    champion_params: Mapping[str, Any] = field(default_factory=dict)
    champion_value: float | None = None
    which: str = "deployed"
    """What the "which" card names: "deployed", or "the search's pick (not deployed)"."""
    gated: bool = True
    """Whether a gate measured the gain (interleaved rounds); "confirmed" is said only then."""
    verdict: str = ""
    promoted: bool = False
    gain: float | None = None
    """Confirmed relative gain over the baseline (0.041 = +4.1 %)."""
    gain_low: float | None = None
    gain_high: float | None = None
    confirm_rounds: int = 0
    concurrency: int | None = None
    """Concurrent streams the confirmed gain was measured at (the gate's level), when known."""
    model: str = ""
    model_version: str | None = None
    env_file: str | None = None
    findings: Mapping[str, Any] = field(default_factory=dict)
    """Further results of the promotion (contributions, concurrency levels, ...): name -> value."""
    importances: Mapping[str, float] = field(default_factory=dict)
    failures: Sequence[Failure] = ()
    skipped: int = 0
    stop_reason: str = ""
    drift: float | None = None
    drift_flagged: bool = False
    fingerprint_changes: Sequence[str] = ()
    truth: str = ""
    """On the simulator: how close the champion came to the space's true optimum."""
    plots: Sequence[tuple[str, str]] = ()
    """(title, HTML fragment) of Optuna's interactive views: named on the page, not inlined (plotly.js alone
    is 4 MB); they are on the parent MLflow run under `optuna/` and in `sweep dashboard`."""
    figures: Mapping[str, str] = field(default_factory=dict)
    """title -> base64 PNG of matplotlib figures (report.figures): not drawn, the page draws its own SVG."""
    parts: Sequence[report_plots.Bar] = ()
    """Why it won: each part's gain with its interval (the verdict's contributions)."""
    levels: Sequence[report_plots.Bar] = ()
    """The deployed configuration against the baseline at each load level."""
    secondary: str | None = None
    """The second objective, when the sweep has two (the Pareto front is drawn)."""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _pct(x: float | None) -> str:
    return "" if x is None or not math.isfinite(x) else f"{x * 100:+.1f}%"


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool):
        return "yes" if value else ""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.6g}"
    return _e(value)


def table_html(table: pd.DataFrame) -> str:
    """The results table: champion row highlighted, failures greyed, numbers to 4 significant digits."""
    if table.empty:
        return "<p>No trials.</p>"
    cols = [c for c in FRONT_COLUMNS if c in table] + [c for c in table.columns if c not in FRONT_COLUMNS]
    head = "".join(f'<th class="{"l" if c in ("role", "status", "failure_kind") else ""}">{_e(c)}</th>' for c in cols)
    rows = []
    for _, r in table.iterrows():
        cls = "champion" if r.get("champion") else ("failed" if r.get("status") not in (None, "COMPLETE") else "")
        cells = "".join(
            f'<td class="{"l" if c in ("role", "status", "failure_kind") else ""}">{_cell(r[c])}</td>' for c in cols
        )
        rows.append(f'<tr class="{cls}">{cells}</tr>')
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'


def table_page(table: pd.DataFrame, title: str = "Sweep results") -> str:
    """results.html: the styled table alone, best objective first."""
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title><style>{STYLE}</style>"
        f"</head><body><main><h1>{_e(title)}</h1><p class='sub'>One row per trial, best first; ★ marks the "
        f"champion; speedup_pct is the objective's gain in percent over the baseline measured nearest in time when "
        f"the trial was recorded, the figure MLflow and sweep status show.</p>{table_html(table)}"
        f"</main></body></html>"
    )


def _champion_cards(r: ReportInput) -> str:
    if r.champion_trial is None:
        return (
            f'<div class="cards"><div class="card"><div class="label">Champion</div><div class="big">none</div>'
            f"<p>{_e(r.verdict)}</p></div></div>"
        )
    knobs = (
        "".join(f"<li><code>{_e(k)}={_e(v)}</code></li>" for k, v in r.champion_params.items())
        or "<li>engine defaults</li>"
    )
    value = f"{r.champion_value:.1f} {_e(r.objective)}" if r.champion_value is not None else ""
    return f"""<div class="cards">
<div class="card" id="champion"><div class="label">Which: {_e(r.which)}</div><div class="big">{_e(r.champion_label or f"trial {r.champion_trial}")}</div>
<div>{value}</div><ul>{knobs}</ul></div>
{_gain_card(r)}
<div class="card" id="why"><div class="label">Why</div>{_why(r)}</div>
</div>"""


def _gain_card(r: ReportInput) -> str:
    """How much: the gain of what the verdict is about, "confirmed" only where a gate measured it."""
    gain_cls = "good" if r.promoted else "warn"
    interval = (
        f"gate bounds {_pct(r.gain_low)} to {_pct(r.gain_high)}"  # sequential: wider than 95%
        if r.gain_low is not None and r.gain_high is not None and r.gain_low != r.gain_high
        else ""
    )
    promoted = f"promoted as <code>{_e(r.model)}</code> version {_e(r.model_version)}" if r.promoted else "not promoted"
    env = f"<br>env file: <code>{_e(r.env_file)}</code>" if r.env_file else ""
    rounds = f" over {r.confirm_rounds} confirmation rounds" if r.confirm_rounds else ""
    at = "" if r.concurrency is None else f" at {streams(r.concurrency, short=True)}"
    label = "confirmed" if r.gated else "UNCONFIRMED"
    return f"""<div class="card" id="gain"><div class="label">How much: {label} gain{_e(at)}</div>
<div class="big {gain_cls}">{_pct(r.gain) or "n/a"}</div><div>{interval}{_e(rounds)}</div>
<p>{_e(r.verdict)}</p><p>{promoted}{env}</p></div>"""


def _why(r: ReportInput) -> str:
    parts = []
    for name, value in r.findings.items():
        parts.append(f"<p><b>{_e(name.replace('_', ' '))}</b>: {_finding(value)}</p>")
    if r.importances:
        top = sorted(r.importances.items(), key=lambda kv: -kv[1])[:5]
        parts.append(
            "<p><b>knob importances</b> (fANOVA):</p><ul>"
            + "".join(f"<li><code>{_e(k)}</code> {v * 100:.0f}%</li>" for k, v in top)
            + "</ul>"
        )
    return "".join(parts) or "<p>Too few trials completed to tell which knobs mattered.</p>"


def _finding(value: Any) -> str:
    if isinstance(value, Mapping):
        return "<ul>" + "".join(f"<li>{_e(k)}: {_finding(v)}</li>" for k, v in value.items()) + "</ul>"
    if isinstance(value, (list, tuple)):
        return "<ul>" + "".join(f"<li>{_finding(v)}</li>" for v in value) + "</ul>"
    if isinstance(value, float):
        return _e(f"{value:.4g}")
    return _e(value)


def _failures(r: ReportInput) -> str:
    rows = "".join(
        f"<tr><td class='l'>{_e(f.kind)}</td><td>{f.count}</td><td>{f.trial}</td>"
        f"<td class='l'>{_e(f.reason[:300])}</td></tr>"
        for f in r.failures
    )
    table = (
        (
            f"<table><tr><th class='l'>kind</th><th>trials</th><th>example</th><th class='l'>reason</th></tr>{rows}"
            f"</table>"
        )
        if rows
        else "<p>No trial failed.</p>"
    )
    skipped = (
        (f"<p>{r.skipped} proposal(s) skipped without a launch (infeasible combination or already measured).</p>")
        if r.skipped
        else ""
    )
    return table + skipped


def _health(r: ReportInput) -> str:
    drift = (
        ""
        if r.drift is None
        else f"<p class='{'warn' if r.drift_flagged else ''}'>baseline drift over the night: {r.drift * 100:.1f}%"
        f"{' (flagged)' if r.drift_flagged else ''}</p>"
    )
    fps = "".join(f"<li class='warn'>{_e(c)}</li>" for c in r.fingerprint_changes)
    fp = f"<ul>{fps}</ul>" if fps else "<p>The host fingerprint did not change during the sweep.</p>"
    truth = f"<p>{_e(r.truth)}</p>" if r.truth else ""
    stop = f"<p>stopped: {_e(r.stop_reason)}</p>" if r.stop_reason else ""
    return stop + drift + fp + truth


def _plot(title: str, svg: str) -> str:
    return f'<div class="plot"><h3>{_e(title)}</h3>{svg}</div>' if svg else ""


def _plots(r: ReportInput) -> str:
    """The history, the parts, the load levels and (two objectives) the Pareto front, as light SVG; where
    Optuna's interactive views exist, the one line that says where they are."""
    deployed = r.champion_trial
    drawn = [
        _plot(f"{r.objective} by trial", report_plots.history(r.table, r.objective, deployed)),
        _plot("Why it won: the parts (gain with its interval)", report_plots.intervals(r.parts, "parts")),
        _plot("Load levels: against the baseline", report_plots.intervals(r.levels, "load levels")),
    ]
    if r.secondary:
        drawn.append(_plot("Pareto front", report_plots.pareto(r.table, r.objective, r.secondary)))
    body = "".join(drawn) or "<p>Too few complete trials to draw.</p>"
    if r.plots:
        names = ", ".join(_e(title) for title, _ in r.plots)
        body += (
            f"<p class='sub'>Optuna's interactive views ({names}) are on the sweep's MLflow run under "
            f"<code>optuna/</code>, and live in <code>sweep dashboard</code>.</p>"
        )
    return body


def _synthetic(r: ReportInput) -> str:
    """The line that labels acceptance measured on the builtin generator's synthetic prompts."""
    if "acceptance" not in r.table or not (r.table["acceptance"] == SYNTHETIC).any():
        return ""
    return (
        f"<p class='warn' id='synthetic'>Acceptance (accept_length, accept_rate) was measured on {SYNTHETIC}: the "
        "builtin generator's 25-word list, inflated against real text. Set benchmark.dataset_path to a prompt set "
        "of your traffic to measure it on real text.</p>"
    )


def render(r: ReportInput, plotly_js: str = "") -> str:
    """The report page: self-contained, no script, a few hundred kilobytes at most, as wide as the window.
    `plotly_js` is not inlined (kept for callers that still pass it)."""
    del plotly_js
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{_e(r.experiment)}: sweep report</title>
<meta name="viewport" content="width=device-width,initial-scale=1"><style>{STYLE}</style></head><body><main>
<h1>{_e(r.experiment)}: sweep report</h1>
<div class="sub">objective: {_e(r.direction)} <code>{_e(r.objective)}</code></div>
{_synthetic(r)}{_champion_cards(r)}
<h2 id="history">History, parts and load levels</h2>{_plots(r)}
<h2 id="failures">Failures by kind</h2>{_failures(r)}
<h2 id="health">Fingerprint, drift and the true optimum</h2>{_health(r)}
<h2 id="trials">Every trial, best first</h2>{table_html(r.table)}
</main></body></html>"""
