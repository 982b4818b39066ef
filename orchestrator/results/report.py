"""The sweep's results as a table and plots for the parent MLflow run and the terminal summary."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from orchestrator.config.experiment import SweepSpec
from orchestrator.records import TrialOutcome, TrialRole, TrialStatus, launched_params
from orchestrator.results import select

_METRIC_COLUMNS = (
    "decode_tok_s",
    "output_tok_s",
    "accept_length",
    "accept_rate",
    "verify_ms",
    "cycle_ms",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "itl_ms_p50",
    "itl_ms_p99",
)


def results_table(
    spec: SweepSpec,
    outcomes: Sequence[TrialOutcome],
    baselines: Sequence[tuple[float, float]],
    speedups: Mapping[int, float] | None = None,
) -> pd.DataFrame:
    """One row per trial, best objective first (failures last): the champion mark, number, role, status,
    failure kind, the speed-up of the objective over the baseline in percent, every metric, every knob,
    why the correctness screen refused its outputs (`outputs_changed`, empty when it did not), the best
    searched objective up to that trial among the ones not refused (`best_so_far`) and, with two objectives, whether the
    trial is on the Pareto front. Confirmation runs are not trials and are left out.

    `speedups`: trial number -> the speed-up ratio the driver kept in the study when it told the trial
    (what MLflow and `sweep status` show); `speedup_pct` is select.speedup_pct of it. Only without them
    (a study that cannot be read) is each ratio computed here, over the nearest of `baselines`."""
    metric, direction = spec.objective.metric, spec.objective.direction
    trials = sorted((o for o in outcomes if o.role is not TrialRole.confirm), key=lambda o: o.number)
    front = {o.number for o in _pareto(spec, trials)} if spec.objective.secondary else None
    champion = _champion(spec, trials)
    rows: list[dict[str, Any]] = []
    best: float | None = None
    for o in trials:
        best = _better(best, _searched_value(o, metric), direction)
        row = _row(o, champion == o.number, _speedup(o, baselines, speedups, metric, direction))
        row["best_so_far"] = best
        row["outputs_changed"] = o.outputs_changed  # the search's correctness screen refused it: never a candidate
        row["allreduce_path"] = o.allreduce_path
        row.update({k: ("unset" if v is None else v) for k, v in launched_params(o).items()})
        if front is not None:
            row["pareto_front"] = o.number in front
        rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    if metric not in df:
        df[metric] = None
    df = df.sort_values([metric, "trial"], ascending=[direction == "minimize", True], na_position="last", kind="stable")
    return df.reset_index(drop=True)


def _row(o: TrialOutcome, champion: bool, ratio: float | None) -> dict[str, Any]:
    """A trial's leading columns and its metrics (none for a trial that measured nothing)."""
    row: dict[str, Any] = {
        "champion": "★" if champion else "",
        "trial": o.number,
        "role": o.role.value,
        "status": o.status.value,
        "failure_kind": o.failure_kind.value if o.failure_kind else "",
        "speedup_pct": None if ratio is None else select.speedup_pct(ratio),
    }
    if o.metrics is not None:
        row.update({c: getattr(o.metrics, c) for c in _METRIC_COLUMNS})
        row["acceptance"] = o.metrics.acceptance_label  # "synthetic prompts": inflated against real text
    return row


def _searched_value(o: TrialOutcome, metric: str) -> float | None:
    """The objective of a complete searched trial the correctness screen kept: what `best_so_far` follows."""
    if o.role is not TrialRole.search or o.status is not TrialStatus.COMPLETE or o.outputs_changed:
        return None
    return getattr(o.metrics, metric) if o.metrics is not None else None


def _better(best: float | None, value: float | None, direction: str) -> float | None:
    """The better of the best so far and `value` (either may be None)."""
    if value is None:
        return best
    if best is None:
        return value
    return max(best, value) if direction == "maximize" else min(best, value)


def _speedup(
    o: TrialOutcome,
    baselines: Sequence[tuple[float, float]],
    speedups: Mapping[int, float] | None,
    metric: str,
    direction: select.Direction,
) -> float | None:
    """The trial's speed-up ratio: the one kept when it was told, else (no study) over the nearest baseline."""
    if o.metrics is None:
        return None
    if speedups is not None:
        return speedups.get(o.number)
    value = getattr(o.metrics, metric)
    base = select.nearest_baseline(o.finished_at, list(baselines))
    return select.speedup(value, base, direction=direction) if base and value is not None else None


def _champion(spec: SweepSpec, outcomes: Sequence[TrialOutcome]) -> int | None:
    """The trial the promotion picks (the best eligible searched one), by the same rule."""
    pick = select.pick_champion(
        [o for o in outcomes if o.role is TrialRole.search],
        metric=spec.objective.metric,
        direction=spec.objective.direction,
        constraints=spec.objective.bounds(),
        concurrency=spec.benchmark.concurrency,
    )
    return None if pick is None else pick.number


GATE_BOUNDS = ("champion_gain_gate_low_pct", "champion_gain_gate_high_pct")
"""The parent run's names of the gate's bounds on the confirmed gain: one-sided bounds at the gate's level
per look, 1 - 0.05 / (max_rounds - min_rounds + 1) each side (99.5% at 3 to 12 rounds), wider than a 95%
interval (verdict.gate). Sweeps before issue 21 logged them as champion_gain_ci95_low/high_pct;
nothing reads those back, so old runs keep them as they are."""


def parent_metrics(summary: dict[str, Any], outcomes: Sequence[TrialOutcome]) -> dict[str, float]:
    """The parent run's single numbers: counts, the confirmed gain in percent with the gate's bounds
    (GATE_BOUNDS, only when the confirmation measured them), the baseline drift. The best objective is
    logged along the sweep (step = trial) from the results table, not here."""
    out = {
        "trials_complete": float(summary["complete"]),
        "trials_failed": float(summary["failed"]),
        "proposals_skipped": float(summary["skipped"]),
    }
    gate = summary.get("gate")
    if gate:
        out["champion_gain_pct"] = round(float(gate["gain"]) * 100, 1)
        if gate.get("ci_low") is not None and gate.get("ci_high") is not None and gate["ci_low"] != gate["ci_high"]:
            out[GATE_BOUNDS[0]] = round(float(gate["ci_low"]) * 100, 1)
            out[GATE_BOUNDS[1]] = round(float(gate["ci_high"]) * 100, 1)
    drift = summary.get("baseline_drift") or {}
    if drift.get("max_relative_change") is not None:
        out["baseline_drift_pct"] = round(float(drift["max_relative_change"]) * 100, 1)
    return out


def figures(spec: SweepSpec, outcomes: Sequence[TrialOutcome], baselines: Sequence[tuple[float, float]]) -> dict:
    """Objective over trials (with the running best and the baselines) and, if two objectives, the Pareto front."""
    import matplotlib  # deferred: matplotlib is slow to import and only the end of a sweep draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred, after the headless backend is chosen

    done = sorted(
        (
            o
            for o in outcomes
            if o.status is TrialStatus.COMPLETE and o.metrics is not None and o.role is not TrialRole.confirm
        ),
        key=lambda o: o.number,
    )
    figs: dict[str, Any] = {"objective_by_trial.png": _history_figure(plt, spec, done, outcomes)}
    if spec.objective.secondary:
        figs["pareto_front.png"] = _pareto_figure(plt, spec, done, spec.objective.secondary)
    return figs


def _history_figure(plt: Any, spec: SweepSpec, done: Sequence[TrialOutcome], outcomes: Sequence[TrialOutcome]) -> Any:
    """The objective of every complete trial by number (baselines grey), the best so far, failures as crosses."""
    metric = spec.objective.metric
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = [o.number for o in done]
    ys = [getattr(o.metrics, metric) for o in done]
    colors = ["tab:gray" if o.role is TrialRole.baseline else "tab:blue" for o in done]
    ax.scatter(xs, ys, c=colors, s=18, label="trials (grey: baseline)")
    best: float | None = None
    running: list[float] = []
    for y in ys:
        best = _better(best, y, spec.objective.direction)
        running.append(math.nan if best is None else best)  # not drawn before the first value
    ax.step(xs, running, where="post", color="tab:orange", label="best so far")
    failed = [o.number for o in outcomes if o.status is TrialStatus.FAILED]
    measured = [y for y in ys if y is not None]
    if failed and measured:
        ax.scatter(failed, [min(measured)] * len(failed), marker="x", c="tab:red", label="failed")
    ax.set_xlabel("trial")
    ax.set_ylabel(metric)
    ax.set_title(f"{spec.name}: {metric} by trial")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def _pareto_figure(plt: Any, spec: SweepSpec, done: Sequence[TrialOutcome], sec: str) -> Any:
    """The objective and the second one (`sec`) of every complete trial, the Pareto front joined."""
    metric = spec.objective.metric
    pts = [
        {metric: getattr(o.metrics, metric), sec: getattr(o.metrics, sec), "trial": o.number}
        for o in done
        if getattr(o.metrics, sec) is not None
    ]
    front = select.pareto_front(pts, [(metric, spec.objective.direction), (sec, spec.objective.secondary_direction)])
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ax.scatter([p[metric] for p in pts], [p[sec] for p in pts], s=14, c="tab:blue", label="trials")
    fp = sorted((pts[i] for i in front), key=lambda p: p[metric])
    ax.plot([p[metric] for p in fp], [p[sec] for p in fp], "o-", c="tab:orange", label="Pareto front")
    ax.set_xlabel(metric)
    ax.set_ylabel(sec)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _pareto(spec: SweepSpec, outcomes: Sequence[TrialOutcome]) -> list[TrialOutcome]:
    """The trials on the Pareto front of the two objectives (none with one objective)."""
    if not spec.objective.secondary:
        return []
    metric, sec = spec.objective.metric, spec.objective.secondary
    done = [
        o for o in outcomes if o.status is TrialStatus.COMPLETE and o.metrics is not None and o.role is TrialRole.search
    ]
    pts: list[dict[str, float | None]] = [
        {metric: getattr(o.metrics, metric), sec: getattr(o.metrics, sec)} for o in done
    ]
    front = select.pareto_front(pts, [(metric, spec.objective.direction), (sec, spec.objective.secondary_direction)])
    return [done[i] for i in front]
