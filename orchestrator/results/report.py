"""The sweep's results as a table and plots for the parent MLflow run and the terminal summary."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from orchestrator.config.experiment import SweepSpec
from orchestrator.records import TrialOutcome, TrialRole, TrialStatus
from orchestrator.results import select

_METRIC_COLUMNS = ("decode_tok_s", "output_tok_s", "accept_length", "accept_rate", "verify_ms", "cycle_ms",
                   "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99")


def results_table(spec: SweepSpec, outcomes: Sequence[TrialOutcome],
                  baselines: Sequence[tuple[float, float]]) -> pd.DataFrame:
    """One row per trial: number, role, status, failure kind, every knob, every metric, the speed-up of the
    objective over the nearest baseline and, with two objectives, whether the trial is on the Pareto front."""
    metric, direction = spec.objective.metric, spec.objective.direction
    front = {o.number for o in _pareto(spec, outcomes)}
    rows: list[dict[str, Any]] = []
    for o in outcomes:
        row: dict[str, Any] = {"trial": o.number, "role": o.role.value, "status": o.status.value,
                               "failure_kind": o.failure_kind.value if o.failure_kind else "",
                               "allreduce_path": o.allreduce_path}
        row.update({k: ("unset" if v is None else v) for k, v in o.params.items()})
        if o.metrics is not None:
            for c in _METRIC_COLUMNS:
                row[c] = getattr(o.metrics, c)
            base = select.nearest_baseline(o.finished_at, list(baselines))
            value = getattr(o.metrics, metric)
            row["speedup_vs_baseline"] = (select.speedup(value, base, direction=direction)
                                          if base and value is not None else None)
        if spec.objective.secondary:
            row["pareto_front"] = o.number in front
        rows.append(row)
    df = pd.DataFrame(rows)
    return df.sort_values("trial").reset_index(drop=True) if not df.empty else df


def parent_metrics(summary: dict[str, Any], outcomes: Sequence[TrialOutcome]) -> dict[str, float]:
    out = {"trials_complete": float(summary["complete"]), "trials_failed": float(summary["failed"]),
           "proposals_skipped": float(summary["skipped"])}
    search = [o for o in outcomes if o.role is TrialRole.search and o.metrics is not None]
    if search:
        out["best_decode_tok_s"] = max(o.metrics.decode_tok_s for o in search)  # type: ignore[union-attr]
    gate = summary.get("gate")
    if gate:
        out["champion_gain"] = float(gate["gain"])
        out["champion_gain_ci95_low"] = float(gate["ci_low"])
        out["champion_gain_ci95_high"] = float(gate["ci_high"])
    drift = summary.get("baseline_drift") or {}
    if drift.get("max_relative_change") is not None:
        out["baseline_drift"] = float(drift["max_relative_change"])
    return out


def figures(spec: SweepSpec, outcomes: Sequence[TrialOutcome], baselines: Sequence[tuple[float, float]]) -> dict:
    """Objective over trials (with the running best and the baselines) and, if two objectives, the Pareto front."""
    import matplotlib  # deferred: matplotlib is slow to import and only the end of a sweep draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred, after the headless backend is chosen

    metric = spec.objective.metric
    done = sorted((o for o in outcomes if o.status is TrialStatus.COMPLETE and o.metrics is not None
                   and o.role is not TrialRole.confirm), key=lambda o: o.number)
    figs: dict[str, Any] = {}
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = [o.number for o in done]
    ys = [getattr(o.metrics, metric) for o in done]
    colors = ["tab:gray" if o.role is TrialRole.baseline else "tab:blue" for o in done]
    ax.scatter(xs, ys, c=colors, s=18, label="trials (grey: baseline)")
    best: float | None = None
    running: list[float] = []
    for y in ys:
        if y is not None:
            best = y if best is None else (max(best, y) if spec.objective.direction == "maximize" else min(best, y))
        running.append(math.nan if best is None else best)  # not drawn before the first value
    ax.step(xs, running, where="post", color="tab:orange", label="best so far")
    failed = [o.number for o in outcomes if o.status is TrialStatus.FAILED]
    if failed and ys:
        ax.scatter(failed, [min(y for y in ys if y is not None)] * len(failed), marker="x", c="tab:red",
                   label="failed")
    ax.set_xlabel("trial")
    ax.set_ylabel(metric)
    ax.set_title(f"{spec.name}: {metric} by trial")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    figs["objective_by_trial.png"] = fig
    if spec.objective.secondary:
        sec = spec.objective.secondary
        pts = [{metric: getattr(o.metrics, metric), sec: getattr(o.metrics, sec), "trial": o.number} for o in done
               if getattr(o.metrics, sec) is not None]
        front = select.pareto_front(pts, [(metric, spec.objective.direction),
                                          (sec, spec.objective.secondary_direction)])
        fig2, ax2 = plt.subplots(figsize=(6, 4.5))
        ax2.scatter([p[metric] for p in pts], [p[sec] for p in pts], s=14, c="tab:blue", label="trials")
        fp = sorted((pts[i] for i in front), key=lambda p: p[metric])
        ax2.plot([p[metric] for p in fp], [p[sec] for p in fp], "o-", c="tab:orange", label="Pareto front")
        ax2.set_xlabel(metric)
        ax2.set_ylabel(sec)
        ax2.legend(fontsize=8)
        fig2.tight_layout()
        figs["pareto_front.png"] = fig2
    return figs


def _pareto(spec: SweepSpec, outcomes: Sequence[TrialOutcome]) -> list[TrialOutcome]:
    """The trials on the Pareto front of the two objectives (none with one objective)."""
    if not spec.objective.secondary:
        return []
    metric, sec = spec.objective.metric, spec.objective.secondary
    done = [o for o in outcomes if o.status is TrialStatus.COMPLETE and o.metrics is not None
            and o.role is TrialRole.search]
    pts: list[dict[str, float | None]] = [{metric: getattr(o.metrics, metric), sec: getattr(o.metrics, sec)}
                                          for o in done]
    front = select.pareto_front(pts, [(metric, spec.objective.direction), (sec, spec.objective.secondary_direction)])
    return [done[i] for i in front]
