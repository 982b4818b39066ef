"""report.html for a long night: 400 trials, two objectives, the parts and the load levels drawn; the page
stays small, carries no script, and draws every plot as SVG that scales to its column (no fixed width)."""

from __future__ import annotations

import re
from pathlib import Path

from report_helpers import outcome as _outcome
from report_helpers import spec as _spec

from orchestrator.records import TrialRole, TrialStatus
from orchestrator.results import report, report_html, report_plots

MAX_BYTES = 1_500_000


def _night(trials: int = 400) -> list:
    return [
        _outcome(n, TrialRole.baseline if n % 15 == 0 else TrialRole.search, 60 + (n * 37 % 41), 40 + n % 30, 100.0 + n)
        for n in range(trials)
    ]


def test_a_long_nights_page_is_light_and_scales_to_the_window(tmp_path: Path) -> None:
    spec = _spec(secondary="ttft_ms_p99", secondary_direction="minimize")
    outcomes = _night()
    table = report.results_table(spec, outcomes, [(100.0, 60.0)])
    page = report_html.render(
        report_html.ReportInput(
            experiment="long",
            objective="decode_tok_s",
            direction="maximize",
            table=table,
            champion_trial=int(table.trial[0]),
            parts=[report_plots.Bar("NCCL settings", 0.05, 0.02, 0.08), report_plots.Bar("EAGLE-3", 0.3, 0.2, 0.4)],
            levels=[
                report_plots.Bar("1 stream", 0.3, 0.2, 0.4, "the gate level"),
                report_plots.Bar("8", -0.02, -0.05, 0.01),
            ],
            secondary="ttft_ms_p99",
            plots=[("Optimization history", "<div>" + "x" * 100_000 + "</div>")],  # named, never inlined
        ),
        plotly_js="y" * 4_000_000,
    )
    assert len(page.encode()) < MAX_BYTES
    assert "<script" not in page and "x" * 1000 not in page
    charts = re.findall(r"<svg class=\"chart\" viewBox=\"[^\"]+\"", page)
    assert len(charts) == 4, "history, parts, load levels, Pareto front"
    assert not re.search(r"<svg[^>]* width=", page), "an SVG with a fixed width would not follow the window"
    assert "Optimization history" in page, "where Optuna's interactive views are"


def test_history_marks_the_deployed_trial_and_failures() -> None:
    outcomes = _night(20)
    failed = outcomes[5].model_copy(update={"status": TrialStatus.FAILED, "metrics": None})
    table = report.results_table(_spec(), [*outcomes[:5], failed, *outcomes[6:]], [(100.0, 60.0)])
    svg = report_plots.history(table, "decode_tok_s", deployed=7)
    assert "<title>trial 5: failed</title>" in svg
    assert svg.count('r="9"') == 1, "one ring: the deployed trial"
    assert report_plots.history(table.head(1), "decode_tok_s") == "", "nothing to draw from one trial"
