"""Stage one of a two-stage sweep (`probe.enabled`): probe the NCCL settings, keep the fast ones,
restrict the study's NCCL knobs to them and warm-start it from the ranking.

The probe's own wall time counts against the sweep's (it runs inside the same invocation). A
probe.json already in the work directory is reused when it probed this experiment's NCCL space on
this engine and host (a resumed sweep, or `sweep probe` run first); a resumed study that already
holds its kept settings is not probed again.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from orchestrator.config import commplan
from orchestrator.config.allreduce import Backend
from orchestrator.config.experiment import SweepSpec
from orchestrator.probe import (
    DEFAULT_BUDGET,
    DEFAULTS_LABEL,
    PROBE_FILE,
    ProbeResult,
    RankedSetting,
    base_env,
    comm,
    nccl_dimensions,
    rank_settings,
    read_probe,
    run_probe,
)
from orchestrator.probe.result import backend_label, setting_score
from orchestrator.probe.settings import space_size
from orchestrator.records import ParamValue
from orchestrator.results import cost as cost_mod
from orchestrator.search import space as sp
from orchestrator.search.sampler import PROBE_LATENCY_ATTR
from orchestrator.search.study import Study
from orchestrator.sweep._context import Context
from orchestrator.sweep.state import ProbeStage
from orchestrator.tracking.probe_run import Curve, ProbeLog
from orchestrator.verdict.arms import sglang_default_speculation as speculation_start

log = logging.getLogger("sweep")

WARM_START = 3
"""Kept settings (fastest first) enqueued with the model's default speculation before the sampler proposes
(fewer on a short search: warm_start_size)."""
WARM_START_SHARE = 5
"""A warm start takes at most one launch in this many of budget.trials (at least one)."""


def warm_start_size(spec: SweepSpec) -> int:
    """How many kept settings the warm start launches: WARM_START, but at most a WARM_START_SHARE-th of
    budget.trials. The 20-launch night (11 trials: the baseline and 10 searched) spent 3 of its 10 on the
    probe's three fastest settings under one speculation shape, which the full server often ranks alike;
    with 2, the refinement's extra trial reached 98% of the optimum in 56 of 60 tuning nights against 52
    (bench/short_night.py, docs/benchmarks.md). A night bound by its wall time keeps 3. An objective judged
    at several streams (`_knob_by_knob`) adds one launch with the model's default speculation."""
    return max(1, min(WARM_START, spec.budget.trials // WARM_START_SHARE))


def reusable(result: ProbeResult, spec: SweepSpec) -> str | None:
    """Why probe.json `result` cannot stand for a probe of `spec`, or None when it can."""
    dims = nccl_dimensions(spec)
    if result.skipped:
        return f"it measured nothing ({result.skipped})"
    checks = [
        (result.experiment == spec.name, f"it probed experiment {result.experiment!r}"),
        (result.engine == spec.engine, f"it ran on engine {result.engine}"),
        (
            spec.engine != "simulator" or result.host == spec.simulator.hardware_profile,
            f"it probed host {result.host!r}, not {spec.simulator.hardware_profile!r}",
        ),
        (
            spec.engine != "sglang" or result.machine == socket.gethostname(),
            f"it was probed on {result.machine or 'a machine it does not name'}, not on this one "
            f"({socket.gethostname()})",
        ),
        (result.tp == spec.server.tp, f"it used tp {result.tp}, not {spec.server.tp}"),
        (result.base_env == base_env(spec), "the experiment's fixed NCCL environment changed"),
        (result.space_settings == space_size(dims), "the NCCL part of the space changed"),
        (all(set(s.env) <= set(dims) for s in result.settings), "it probed NCCL variables the space lacks"),
        (
            len(result.settings) >= min(spec.probe.budget or DEFAULT_BUDGET, space_size(dims)),
            f"it was cut short ({len(result.settings)} settings probed)",
        ),
    ]
    return next((why for ok, why in checks if not ok), None)


def probe_or_reuse(spec: SweepSpec, workdir: Path) -> tuple[ProbeResult, str, bool]:
    """probe.json of `workdir` when reusable, else a fresh probe; a line saying which; and whether it
    was probed now (its time then counts on the sweep's clock)."""
    path = workdir / PROBE_FILE
    if path.exists():
        try:
            old = read_probe(path)
        except (OSError, ValueError) as exc:
            why: str | None = f"it is unreadable ({type(exc).__name__})"
        else:
            why = reusable(old, spec)
            if why is None:
                return (
                    old,
                    (
                        f"probe: reusing {path} ({len(old.settings)} settings probed on {old.host}); "
                        f"delete it to probe again"
                    ),
                    False,
                )
        log.info("probe: not reusing %s: %s", path, why)
    result = run_probe(spec, workdir, budget=spec.probe.budget)
    return (
        result,
        (
            f"probe: {len(result.settings)} NCCL settings probed on {result.host} in "
            f"{result.seconds:.1f} s ({result.seconds_per_setting:.2f} s per setting)"
        ),
        True,
    )


def probe_cost_s(spec: SweepSpec, result: ProbeResult) -> float:
    """The seconds a fresh probe counts on the sweep's clock: what it took, or on the simulated engine
    at simulator.time_scale 1 (a simulated night at real scale) the cost model's real-scale seconds
    (results.cost.probe_seconds)."""
    if spec.engine != "simulator":
        return result.seconds
    return max(result.seconds, spec.simulator.time_scale * cost_mod.probe_seconds(spec, len(result.settings)))


def kept_settings(spec: SweepSpec, ranked: tuple[RankedSetting, ...]) -> dict[str, dict[str, ParamValue]]:
    """{label: every NCCL knob of the space -> its value} of the kept settings, fastest first. Where fewer
    than WARM_START of them (besides the NCCL defaults) are safe from the correctness screen
    (screen_refuses), the fastest safe settings probed are kept beside them (issue 34: on a PCIe host the
    probe's next settings after a hang forced LL128, and the search went back to them all night)."""
    dims = nccl_dimensions(spec)
    probed = [(r, _knob_values(dims, r)) for r in ranked if r.kept or r.score_us is not None]
    every = {r.setting: v for r, v in probed if v is not None}
    kept = [r.setting for r in ranked if r.kept and r.setting in every]
    beside = _safe_beside(every, kept, screen_refuses(spec))
    return {label: every[label] for label in every if label in kept or label in beside}


def _safe_beside(
    every: Mapping[str, Mapping[str, ParamValue]], kept: list[str], refused: Callable[[Mapping[str, ParamValue]], bool]
) -> list[str]:
    """The fastest probed settings, not kept, that bring the safe kept ones (NCCL defaults aside) to WARM_START."""
    safe = [label for label in kept if label != DEFAULTS_LABEL and not refused(every[label])]
    extra = [label for label in every if label not in kept and not refused(every[label])]
    return extra[: max(WARM_START - len(safe), 0)]


def _knob_values(dims: Mapping[str, Any], r: RankedSetting) -> dict[str, ParamValue] | None:
    """The space's value of every NCCL knob under setting `r`, or None when one is not a value of the space."""
    values: dict[str, ParamValue] = {}
    for name, choices in dims.items():
        text = r.env.get(name)
        match = [v for v in choices if (v is None and text is None) or (v is not None and str(v) == text)]
        if not match:
            return None
        values[name] = match[0]
    return values


def screen_refuses(spec: SweepSpec) -> Callable[[Mapping[str, ParamValue]], bool]:
    """Whether the correctness screen will refuse an NCCL setting on the described host: NCCL_PROTO forcing
    LL128 over PCIe (NCCL enables LL128 by default only where it is safe; forced on PCIe it can corrupt
    data, as simulator/tokens.py models after NCCL's documentation). Nothing on an undescribed host."""
    ctx = comm.comm_context(spec, None, None)
    pcie = ctx is not None and ctx.host.interconnect == "pcie"

    def refused(values: Mapping[str, ParamValue]) -> bool:
        return pcie and str(values.get("NCCL_PROTO") or "").upper() == "LL128"

    return refused


def warm_start(spec: SweepSpec, kept: Mapping[str, dict[str, ParamValue]]) -> list[str]:
    """The kept settings the warm start launches (warm_start_size): the fastest the screen will not refuse first."""
    refused = screen_refuses(spec)
    safe = [label for label, values in kept.items() if not refused(values)]
    return (safe + [label for label in kept if label not in safe])[: warm_start_size(spec)]


def size_latencies(result: ProbeResult, kept: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """{kept setting: {size label (decode, verify-<n>): median microseconds}}, inside CUDA graphs where
    measured there: what the refinement reads to give a speculation setting the NCCL setting fastest at
    its own verify size."""
    out: dict[str, dict[str, float]] = {}
    for mode in ("eager", "graph"):  # graph rows win where both exist
        for row in result.rows:
            if (
                row.setting in kept
                and row.mode == mode
                and row.median_us is not None
                and (row.size == "decode" or row.size.startswith("verify-"))
            ):
                out.setdefault(row.setting, {})[row.size] = row.median_us
    return out


def fixed_backend(spec: SweepSpec, result: ProbeResult) -> tuple[dict[str, ParamValue], str] | None:
    """({backend knob: None}, the line saying why) when the probe measured the path each other value of the
    space's all_reduce_backend puts the objective's messages on above probe.keep_within x the engine
    default's path at every message kind the objective depends on (decode, verify): the same keep rule as the
    NCCL settings', applied to the backend values, so the search stops spending trials on a path measured
    several times slower (on h200-nvlink-x8 flashinfer_fusion carries decode and verify at 9 us, the best NCCL
    setting probed at 36 us). None when the host is not described (a real host: which backend the engine
    default resolves to is known only from a trial's log), a class is carried by two backends, the objective
    depends on prefill, or a latency was not measured."""
    knob = "all_reduce_backend"
    planned = _backend_plan(spec, knob)
    if planned is None:
        return None
    cp, kinds = planned
    measured = {arm.value: _arm_path(result, arm, kinds) for arm in cp.arms}
    paths = {value: p for value, p in measured.items() if p is not None}
    default = paths.pop(None, None)
    if default is None or len(paths) != len(measured) - 1:
        return None
    ratio = spec.probe.keep_within
    slower = {value: p for value, p in paths.items() if all(p[k][1] > ratio * default[k][1] for k in kinds)}
    if len(slower) != len(paths):
        return None
    return {knob: None}, _slower_line(knob, kinds, default, slower, ratio)


BackendPath = dict[str, tuple[Backend, float]]  # {message kind: (the backend carrying it, its latency in us)}


def _backend_plan(spec: SweepSpec, knob: str) -> tuple[commplan.CommPlan, list[str]] | None:
    """The communication plan of the described host and the message kinds (decode, verify) the objective
    depends on, when every arm is a value of the backend `knob` the space searches with the engine default."""
    if knob not in spec.space.params or None not in spec.space.params[knob].values():
        return None
    ctx = comm.comm_context(spec, None, None)
    if ctx is None:
        return None
    cp = commplan.plan(spec, ctx)
    kinds = [c for c in cp.depends_on if c in ("decode", "verify")]
    if not kinds or len(kinds) != len(cp.depends_on) or any(arm.knob != knob for arm in cp.arms):
        return None
    return cp, kinds


def _slower_line(
    knob: str, kinds: list[str], default: BackendPath, slower: Mapping[Any, BackendPath], ratio: float
) -> str:
    said = "; ".join(
        f"{knob} {value}: {', '.join(f'{k} on {b.value} {us:.1f} us' for k, (b, us) in p.items())}"
        for value, p in slower.items()
    )
    return (
        f"probe: the engine default carries {' and '.join(kinds)} on "
        f"{', '.join(sorted({b.value for b, _ in default.values()}))} at "
        f"{', '.join(f'{us:.1f} us' for _, us in default.values())}; {said}: more than {ratio:g}x slower, so "
        f"the search keeps {knob} at the engine default (probe.keep_within)"
    )


def _latency(result: ProbeResult, backend: Backend, kind: str) -> float | None:
    """The probe's latency of `backend` at message `kind`: the best NCCL setting's for NCCL."""
    if backend is Backend.nccl:
        rows = ([r for r in result.rows if r.setting == s.setting] for s in result.settings if s.status == "ok")
        scores = [x for found in rows if (x := setting_score(found, result.sizes, kind)) is not None]
        return min(scores, default=None)
    mine = [r for r in result.backend_rows if r.setting == backend_label(backend.value)]
    return setting_score(mine, result.sizes, kind) if mine else None


def _arm_path(result: ProbeResult, arm: commplan.Arm, kinds: list[str]) -> BackendPath | None:
    """{message kind: (the one backend carrying it under `arm`, its probed latency)}, or None when a kind is
    carried by two backends or not measured."""
    out: BackendPath = {}
    for c in arm.classes:
        if c.message in kinds:
            carriers = {b for b, _, _ in c.backends}
            us = _latency(result, next(iter(carriers)), c.message) if len(carriers) == 1 else None
            if us is None:
                return None
            out[c.message] = (next(iter(carriers)), us)
    return out


def apply_probe(study: Study, spec: SweepSpec, result: ProbeResult) -> dict[str, Any]:
    """Restrict `study`'s NCCL knobs to the settings `result` keeps and enqueue the warm start (for an
    objective at several streams only the warm start: _knob_by_knob); the summary kept in the study
    (`skipped` says why nothing was restricted)."""
    # At several streams the load may decode without speculation: keep the decode-size winners too (issue 20).
    ranked = rank_settings(result, keep_within=spec.probe.keep_within, keep_decode=spec.benchmark.concurrency > 1)
    kept = kept_settings(spec, ranked)
    fixed = None if result.skipped else fixed_backend(spec, result)
    if fixed is not None:
        study.fix(fixed[0])
        log.info(fixed[1])
    if result.skipped or not kept:
        summary: dict[str, Any] = {"skipped": result.skipped or "no setting kept"}
        study.set_attr("probe", summary)
        return summary
    best = next((r for r in ranked if r.score_us is not None), None)
    summary = {
        "settings": len(result.settings),
        "kept": len(kept),
        "seconds": result.seconds,
        "keep_within": spec.probe.keep_within,
        "best": best.setting if best else None,
        "best_us": best.score_us if best else None,
        "host": result.host,
    }
    if fixed is not None:
        summary["fixed"] = fixed[0]
    start = speculation_start(spec, sp.baseline_params(spec.space))
    if spec.benchmark.concurrency > 1:
        return _knob_by_knob(study, spec, ranked, kept, start, summary)
    study.set_attr("probe", summary)
    study.set_attr(PROBE_LATENCY_ATTR, size_latencies(result, kept))
    study.restrict_nccl(kept)
    for rank, label in enumerate(warm_start(spec, kept)):
        study.enqueue({**start, **kept[label]}, {"role": "search", "warm_start": rank + 1, "probe_setting": label})
    return summary


def _knob_by_knob(
    study: Study,
    spec: SweepSpec,
    ranked: tuple[RankedSetting, ...],
    kept: Mapping[str, dict[str, ParamValue]],
    start: Mapping[str, ParamValue],
    summary: dict[str, Any],
) -> dict[str, Any]:
    """An objective judged at several streams: stage two searches the NCCL knobs one by one (the
    failure-aware TPE, as without a probe), warm-started from the settings fastest at the decode size
    without speculation, and the fastest with the model's default speculation.

    There the probe's own search of NCCL settings (ranked at the verify sizes) leaves the decode-size
    winners' neighbours unprobed, and the optimum may not speculate at all: on the pcie x8 profile at
    32 streams the kept settings held nothing above 0.970 of the optimum (LL128 + 4 CTAs + P2P SYS,
    never probed; tuning seed 0), where TPE over the knobs reached 0.998 (issue 20)."""
    summary = {**summary, "searched": "knob by knob"}
    study.set_attr("probe", summary)
    by_decode = sorted(
        (r for r in ranked if r.setting in kept and r.decode_relative is not None),
        key=lambda r: (r.decode_relative, r.rank),
    )
    labels = [r.setting for r in by_decode][: warm_start_size(spec)] or list(kept)[:1]
    plain = sp.baseline_params(spec.space)
    for rank, label in enumerate(labels):
        study.enqueue({**plain, **kept[label]}, {"role": "search", "warm_start": rank + 1, "probe_setting": label})
    if dict(start) != plain:
        study.enqueue(
            {**start, **kept[labels[0]]}, {"role": "search", "warm_start": len(labels) + 1, "probe_setting": labels[0]}
        )
    return summary


def run_probe_stage(ctx: Context) -> None:
    """Stage one, once per sweep: probe (or reuse probe.json), restrict the NCCL knobs, warm-start."""
    spec = ctx.spec
    if not spec.probe.enabled or not nccl_dimensions(spec):
        return
    if ctx.study.nccl_settings:
        log.info("probe: the study already searches %d kept NCCL settings (resumed)", len(ctx.study.nccl_settings))
        return
    if (ctx.study.get_attr("probe") or {}).get("searched"):
        log.info("probe: the study was warm-started from the probe already (resumed)")
        return
    result, how, fresh = probe_or_reuse(spec, ctx.paths.root)
    if fresh:
        ctx.clock.spend(probe_cost_s(spec, result))
    log.info(how)
    summary = apply_probe(ctx.study, spec, result)
    if "skipped" in summary:
        text = f"{how}; {summary['skipped']}: stage two searches every NCCL setting of the space"
        log.warning(text)
    else:
        text = (
            f"{how}; {summary['kept']} kept (within {spec.probe.keep_within:g}x of the best, {summary['best']} "
            f"at {summary['best_us'] or 0.0:.1f} us; NCCL defaults always kept)"
        )
        if summary.get("fixed"):
            text += (
                "; "
                + ", ".join(f"{k} kept at the engine default" for k in summary["fixed"])
                + " (the other backend's path measured slower at decode and verify)"
            )
        if summary.get("searched"):
            text += "; at several streams stage two searches the NCCL knobs one by one from the decode-size winners"
        log.info(text)
    ctx.emit(ProbeStage(text=text))


PLOTTED = 4
"""Settings drawn in the probe's latency plot besides the NCCL defaults."""


def _first_scored(ranked: tuple[RankedSetting, ...]) -> RankedSetting | None:
    """The fastest setting that has a score (ranked is fastest first), or None when every one failed."""
    return next((r for r in ranked if r.score_us is not None), None)


def _probe_metrics(result: ProbeResult, ranked: tuple[RankedSetting, ...]) -> dict[str, float]:
    """The probe run's metrics: settings probed, seconds, settings kept, and the best and the NCCL
    defaults' verify latency where they were measured."""
    metrics = {
        "settings_probed": float(len(result.settings)),
        "seconds": result.seconds,
        "seconds_per_setting": result.seconds_per_setting,
        "kept": float(sum(r.kept for r in ranked)),
    }
    best = _first_scored(ranked)
    if best is not None and best.score_us is not None:
        metrics["best_verify_us"] = best.score_us
    defaults = next((r for r in ranked if r.setting == DEFAULTS_LABEL), None)
    if defaults is not None and defaults.score_us is not None:
        metrics["defaults_verify_us"] = defaults.score_us
    return metrics


def _plotted_mode(result: ProbeResult) -> str:
    """The mode the plot draws: `graph` when anything was measured inside CUDA graphs, else `eager`."""
    return "graph" if any(r.mode == "graph" for r in result.rows) else "eager"


def _plotted_settings(ranked: tuple[RankedSetting, ...]) -> list[str]:
    """The settings the plot draws: the PLOTTED fastest that have a score, and the NCCL defaults."""
    names = [r.setting for r in ranked if r.score_us is not None][:PLOTTED]
    if DEFAULTS_LABEL not in names:
        names.append(DEFAULTS_LABEL)
    return names


def _curve(result: ProbeResult, setting: str, mode: str) -> Curve | None:
    """`setting`'s median latency by message size in `mode`, smallest first; None when no size was measured."""
    rows = sorted(
        (r for r in result.rows if r.setting == setting and r.mode == mode and r.median_us is not None),
        key=lambda r: r.nbytes,
    )
    if not rows:
        return None
    return Curve(setting, [r.nbytes for r in rows], [r.median_us or 0.0 for r in rows])


def _curves(result: ProbeResult, ranked: tuple[RankedSetting, ...], mode: str) -> list[Curve]:
    """The latency curves in `mode` of the plotted settings that have one."""
    curves = (_curve(result, name, mode) for name in _plotted_settings(ranked))
    return [c for c in curves if c is not None]


def _probe_params(result: ProbeResult, best: RankedSetting | None, keep_within: float) -> dict[str, str]:
    """The probe run's parameters: where it ran, the NCCL version, the space, the threshold, the best setting."""
    return {
        "host": result.host,
        "tp": str(result.tp),
        "nccl_version": result.nccl_version or "?",
        "settings_in_space": str(result.space_settings),
        "keep_within": f"{keep_within:g}",
        "best_setting": best.setting if best else "-",
    }


def _ranking_table(ranked: tuple[RankedSetting, ...]) -> dict[str, list[Any]]:
    """The ranking as columns: rank, setting, score_us, relative, kept."""
    return {
        "rank": [r.rank for r in ranked],
        "setting": [r.setting for r in ranked],
        "score_us": [r.score_us for r in ranked],
        "relative": [r.relative for r in ranked],
        "kept": [r.kept for r in ranked],
    }


def probe_log(result: ProbeResult, ranked: tuple[RankedSetting, ...], *, keep_within: float) -> ProbeLog:
    """The probe's MLflow run as plain data (tracking.probe_run logs it)."""
    mode = _plotted_mode(result)
    return ProbeLog(
        title=f"{result.experiment} on {result.host}, tp {result.tp}",
        params=_probe_params(result, _first_scored(ranked), keep_within),
        metrics=_probe_metrics(result, ranked),
        table=_ranking_table(ranked),
        probe_json=result.model_dump_json(indent=1),
        curves=_curves(result, ranked, mode),
        mode=mode,
        engine=result.engine,
    )
