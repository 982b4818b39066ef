"""The report's plots as inline SVG: a few kilobytes each, drawn without a script, scaled to the window.

Pure: values in, SVG text out. `history` draws the objective of every trial in launch order with the best
so far, the baselines (drift shows as their trend) and the deployed trial; `intervals` draws gains with
their intervals (the parts of the verdict, the load levels); `pareto` the two objectives' front. Optuna's
interactive views stay on the parent MLflow run (`optuna/`) and in `sweep dashboard`.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from orchestrator.results.figures import Contribution, LevelGain, streams

W, H = 900, 320
"""The drawing's own units (the viewBox); the page scales it to its column's width."""
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 30, 45
COLORS = {"search": "#1a73e8", "baseline": "#80868b", "refused": "#a05a00", "failed": "#b3261e", "best": "#e8710a"}


@dataclass(frozen=True)
class Bar:
    """One gain with its interval: `gain`, `low`, `high` relative (0.041 = +4.1 %)."""

    label: str
    gain: float
    low: float
    high: float
    note: str = ""
    """Said after the label ("the gate level", "2 rounds")."""


@dataclass(frozen=True)
class _Axis:
    lo: float
    hi: float
    start: float
    length: float

    def at(self, value: float) -> float:
        span = self.hi - self.lo or 1.0
        return self.start + (value - self.lo) / span * self.length


def _e(value: object) -> str:
    return html.escape(str(value))


def _svg(body: str, title: str, height: int = H) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {W} {height}" role="img" aria-label="{_e(title)}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{_e(title)}</title>'
        f"<style>text{{font:12px system-ui,sans-serif;fill:#1d2430}}</style>{body}</svg>"
    )


def _padded(values: Sequence[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.08 or abs(hi) * 0.05 or 1.0
    return lo - pad, hi + pad


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    raw = (hi - lo) / n
    step = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    step *= next(m for m in (1, 2, 5, 10) if raw <= m * step)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def _frame(x: _Axis, y: _Axis, x_label: str, y_label: str, y_fmt: str = "{:.4g}") -> str:
    """Axes, the y grid with its labels, and the axis names."""
    parts = [
        f'<line x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}" stroke="#9aa0a6"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{H - BOTTOM}" stroke="#9aa0a6"/>',
    ]
    for t in _ticks(min(y.lo, y.hi), max(y.lo, y.hi)):
        py = y.at(t)
        parts.append(f'<line x1="{LEFT}" y1="{py:.1f}" x2="{W - RIGHT}" y2="{py:.1f}" stroke="#eceff1"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{py + 4:.1f}" text-anchor="end">{_e(y_fmt.format(t))}</text>')
    for t in _ticks(x.lo, x.hi):
        if t == int(t):
            parts.append(f'<text x="{x.at(t):.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{int(t)}</text>')
    parts.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 8}" text-anchor="middle">{_e(x_label)}</text>')
    mid = (TOP + H - BOTTOM) / 2
    parts.append(f'<text x="16" y="{mid}" text-anchor="middle" transform="rotate(-90 16 {mid})">{_e(y_label)}</text>')
    return "".join(parts)


def _legend(items: Sequence[tuple[str, str]]) -> str:
    out, x = [], LEFT + 10
    for label, color in items:
        out.append(f'<circle cx="{x}" cy="{TOP - 14}" r="4" fill="{color}"/>')
        out.append(f'<text x="{x + 8}" y="{TOP - 10}">{_e(label)}</text>')
        x += 16 + 7 * len(label)
    return "".join(out)


def _kind(row: pd.Series) -> str:
    """How a trial is drawn: search, baseline, refused (its outputs changed) or failed."""
    if row.get("status") != "COMPLETE":
        return "failed"
    if row.get("outputs_changed"):
        return "refused"
    return "baseline" if row.get("role") == "baseline" else "search"


def history(table: pd.DataFrame, objective: str, deployed: int | None = None) -> str:
    """The objective by trial (launch order): trials, baselines, trials the correctness screen refused,
    failures along the bottom, the best so far as a step line, the deployed trial ringed. Empty below two
    measured trials."""
    if table.empty or objective not in table or "trial" not in table:
        return ""
    rows = table[table["trial"] >= 0].sort_values("trial")
    values = pd.to_numeric(rows[objective], errors="coerce").dropna()
    if len(values) < 2:
        return ""
    x = _Axis(float(rows["trial"].min()), float(rows["trial"].max()) or 1.0, LEFT + 8, W - RIGHT - LEFT - 16)
    lo, hi = _padded(list(values.astype(float)))
    y = _Axis(hi, lo, TOP, H - TOP - BOTTOM)  # the top of the drawing is the highest value
    body = [_frame(x, y, "trial (launch order)", objective), _best_line(rows, x, y)]
    body += [_trial_mark(row, objective, x, y, deployed) for _, row in rows.iterrows()]
    legend = [("search", COLORS["search"]), ("baseline", COLORS["baseline"]), ("best so far", COLORS["best"])]
    if any(_kind(row) == "refused" for _, row in rows.iterrows()):
        legend.append(("refused: outputs changed", COLORS["refused"]))
    if deployed is not None:
        legend.append(("deployed", DEPLOYED))
    body.append(_legend(legend))
    return _svg("".join(body), f"{objective} by trial")


DEPLOYED = "#137333"


def _best_line(rows: pd.DataFrame, x: _Axis, y: _Axis) -> str:
    """The best searched objective so far, as a line along the trials."""
    if "best_so_far" not in rows:
        return ""
    best = rows[["trial", "best_so_far"]].dropna()
    if best.empty:
        return ""
    steps: list[str] = []
    for t, v in zip(best["trial"], best["best_so_far"]):  # a step: level until the next better trial
        if steps:
            steps.append(f"{x.at(float(t)):.1f},{steps[-1].split(',')[1]}")
        steps.append(f"{x.at(float(t)):.1f},{y.at(float(v)):.1f}")
    points = " ".join(steps)
    return f'<polyline points="{points}" fill="none" stroke="{COLORS["best"]}" stroke-width="2"/>'


def _trial_mark(row: pd.Series, objective: str, x: _Axis, y: _Axis, deployed: int | None) -> str:
    """One trial: a dot at its objective (hollow when refused), a cross along the bottom when it failed,
    a ring around the deployed one; its number and kind on hover."""
    kind, px = _kind(row), x.at(float(row["trial"]))
    tip = f"<title>trial {int(row['trial'])}: {kind}</title>"
    value = pd.to_numeric(row.get(objective), errors="coerce")
    if kind == "failed" or pd.isna(value):
        return f'<text x="{px:.1f}" y="{H - BOTTOM - 4}" text-anchor="middle" fill="{COLORS["failed"]}">×{tip}</text>'
    py = y.at(float(value))
    fill = "none" if kind == "refused" else COLORS[kind]
    mark = f'<circle cx="{px:.1f}" cy="{py:.1f}" r="4" fill="{fill}" stroke="{COLORS[kind]}">{tip}</circle>'
    if deployed is not None and int(row["trial"]) == deployed:
        mark += f'<circle cx="{px:.1f}" cy="{py:.1f}" r="9" fill="none" stroke="{DEPLOYED}" stroke-width="2"/>'
    return mark


def intervals(bars: Sequence[Bar], title: str) -> str:
    """Gains as dots with their intervals, one row each, around a zero line; empty without bars."""
    if not bars:
        return ""
    row_h, top = 34, 20
    height = top + row_h * len(bars) + 40
    label_w = 300
    edges = [v * 100 for b in bars for v in (b.low, b.high, b.gain) if math.isfinite(v)] + [0.0]
    lo, hi = _padded(edges)
    x = _Axis(lo, hi, label_w, W - RIGHT - label_w)
    body = [f'<line x1="{x.at(0):.1f}" y1="{top - 6}" x2="{x.at(0):.1f}" y2="{height - 34}" stroke="#9aa0a6"/>']
    for t in _ticks(lo, hi):
        body.append(f'<text x="{x.at(t):.1f}" y="{height - 18}" text-anchor="middle">{t:+g}%</text>')
    for i, b in enumerate(bars):
        cy = top + row_h * i + row_h / 2
        color = "#137333" if b.low > 0 else ("#b3261e" if b.high < 0 else "#5c6675")
        label = f"{b.label} ({b.note})" if b.note else b.label
        body.append(f'<text x="{label_w - 10}" y="{cy + 4:.1f}" text-anchor="end">{_e(label[:48])}</text>')
        body.append(
            f'<line x1="{x.at(b.low * 100):.1f}" y1="{cy:.1f}" x2="{x.at(b.high * 100):.1f}" y2="{cy:.1f}" '
            f'stroke="{color}" stroke-width="3"/>'
        )
        body.append(
            f'<circle cx="{x.at(b.gain * 100):.1f}" cy="{cy:.1f}" r="5" fill="{color}">'
            f"<title>{_e(label)}: {b.gain * 100:+.1f}% ({b.low * 100:+.1f}% to {b.high * 100:+.1f}%)</title></circle>"
        )
    return _svg("".join(body), title, height)


def pareto(table: pd.DataFrame, objective: str, secondary: str) -> str:
    """The two objectives of every complete trial, the Pareto front's trials filled; empty without both."""
    if table.empty or objective not in table or secondary not in table or "pareto_front" not in table:
        return ""
    pts = table[["trial", objective, secondary, "pareto_front"]].dropna(subset=[objective, secondary])
    if len(pts) < 2:
        return ""
    xlo, xhi = _padded(list(pts[objective].astype(float)))
    ylo, yhi = _padded(list(pts[secondary].astype(float)))
    x = _Axis(xlo, xhi, LEFT, W - RIGHT - LEFT)
    y = _Axis(yhi, ylo, TOP, H - TOP - BOTTOM)
    body = [_frame(x, y, objective, secondary)]
    for _, p in pts.iterrows():
        fill = COLORS["best"] if p["pareto_front"] is True else "none"
        body.append(
            f'<circle cx="{x.at(float(p[objective])):.1f}" cy="{y.at(float(p[secondary])):.1f}" r="4" '
            f'fill="{fill}" stroke="{COLORS["best"] if fill != "none" else COLORS["search"]}">'
            f"<title>trial {int(p['trial'])}</title></circle>"
        )
    body.append(_legend([("trial", COLORS["search"]), ("Pareto front", COLORS["best"])]))
    return _svg("".join(body), f"{secondary} against {objective}")


def contribution_bars(contributions: Sequence[Contribution]) -> list[Bar]:
    """The verdict's parts as bars: each part's gain and interval."""
    return [Bar(c.part, c.interval.gain, c.interval.low, c.interval.high, f"{c.a} vs {c.b}") for c in contributions]


def level_bars(levels: Sequence[LevelGain], gate_level: int | None = None) -> list[Bar]:
    """The load levels as bars: the deployed configuration against the baseline at each level."""
    return [
        Bar(
            streams(g.concurrency, short=True),
            g.interval.gain,
            g.interval.low,
            g.interval.high,
            "the gate level" if g.concurrency == gate_level else "",
        )
        for g in levels
    ]
