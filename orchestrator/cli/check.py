"""`sweep validate`, `sweep plan` and `sweep truth`: what an experiment means, before anything runs."""

from __future__ import annotations

import importlib.metadata
import json
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from orchestrator import nccllog
from orchestrator.cli._app import WORKDIR, app, err, guard, load_experiment, out
from orchestrator.config import commplan, knobs
from orchestrator.config import experiment as spec_mod
from orchestrator.config.allreduce import CommContext
from orchestrator.config.space import check_enumerable, stratified
from orchestrator.errors import UserError
from orchestrator.probe import comm
from orchestrator.probe.comm import ProfileError
from orchestrator.probe.result import PROBE_FILE, probed_nccl
from orchestrator.probe.settings import planned_settings
from orchestrator.records import LaunchPlan, ParamValue
from orchestrator.results import cost
from orchestrator.results import truth as truth_mod
from orchestrator.search import space as sp
from orchestrator.sweep import schedule
from orchestrator.sweep._workdir import default_workdir
from orchestrator.sweep.status import status_report, verdict_of
from orchestrator.trial import observe
from orchestrator.trial import plan as planner


@app.command()
@guard
def validate(experiment: Path = typer.Argument(..., help="experiment YAML")) -> None:
    """Check an experiment and its search spaces; print what it would sweep."""
    s = load_experiment(experiment, here=True)
    total, feasible, _ = sp.census(s.space)
    out.print(
        f"[green]OK[/] {experiment}: experiment [bold]{s.name}[/], engine {s.engine}, "
        f"sglang {s.sglang_version}, tp {s.server.tp}, {len(s.space.params)} knobs "
        f"({', '.join(s.space.params)}), {total} distinct combinations of which {feasible} feasible"
    )
    for warning in knobs.deprecation_warnings(s.space.params):
        out.print(f"[yellow]warning:[/] {warning}", soft_wrap=True)


@app.command()
@guard
def plan(
    experiment: Path = typer.Argument(..., help="experiment YAML"),
    limit: int = typer.Option(5, "--limit", min=0, help="how many launch commands to show"),
    as_json: bool = typer.Option(
        False, "--json", help="print the plan as JSON: the space, one trial's minutes, the night, warnings, launches"
    ),
    host: str | None = typer.Option(
        None,
        "--host",
        help="the host to plan for: a hardware profile name "
        "(h200-nvlink-x8, pcie-rtxpro6000-x8, pcie-rtxpro6000-x8-turin) or a "
        "profile file; default: the simulator's profile (engine: simulator)",
    ),
    arch: str | None = typer.Option(
        None,
        "--arch",
        help="the model's architecture (config.json "
        "architectures[0]); default: the model directory's config.json, else the "
        "simulator's model profile",
    ),
) -> None:
    """Dry run: space size, infeasible combinations and why, the all-reduce path per message class, one
    trial's minutes, the night's schedule, the first launch commands. Starts nothing."""
    s = load_experiment(experiment)
    ctx = comm_context(s, host, arch)
    inert = comm.collapsed(s, ctx) if ctx is not None else None
    searched = sp.collapse_all(s.space, inert) if inert else s.space  # the launches the sweep can make
    points = _examples(s, searched, limit)
    plans = [planner.make(s, p, port=s.server.port_range[0] + i, seed=i) for i, p in enumerate(points)]
    night = _night(s, host)
    if as_json:
        total, feasible, reasons = sp.census(s.space, ctx)
        print(
            json.dumps(_plan_json(s, (total, feasible, reasons), night, _warnings(s, ctx, plans, host), points, plans))
        )
        return
    _print_plan(s, ctx, night, _warnings(s, ctx, plans, host), points, plans)
    if isinstance(night, _Night) and not night.plan.fits:
        raise UserError(
            f"{s.source or 'the experiment'}: the night's minimum does not fit budget.wall_time "
            f"({s.budget.wall_time / 3600:.2f} h): lower promotion.min_rounds, promotion.concurrency "
            f"or benchmark.requests / repeats, or raise budget.wall_time"
        )


def _print_plan(
    s: spec_mod.SweepSpec,
    ctx: CommContext | None,
    night: _Night | str,
    warnings: list[str],
    points: list[dict[str, ParamValue]],
    plans: list[LaunchPlan],
) -> None:
    """`sweep plan`'s text: the space, the communication path, the night, the warnings, the launches."""
    total, feasible, reasons = sp.census(s.space, ctx)
    out.print(f"[bold]{s.name}[/]: {total} distinct combinations, {feasible} feasible, {total - feasible} infeasible")
    for rule, n in reasons.most_common():
        out.print(f"  {n:>6} infeasible: {rule}")
    if ctx is not None:
        _print_comm(s, ctx)
    _print_night(s, night)
    for w in warnings:
        out.print(f"[yellow]warning:[/] {escape(w)}", soft_wrap=True)
    for i, (p, lp) in enumerate(zip(points, plans)):
        label = "baseline" if i == 0 else f"example {i}"
        out.print(
            f"\n[bold]{label}[/]: {', '.join(f'{k}={v}' for k, v in p.items() if v is not None) or 'engine defaults'}"
        )
        out.print(planner.launch_command(lp), soft_wrap=True, markup=False)


def _examples(s: spec_mod.SweepSpec, space: spec_mod.SearchSpace, limit: int) -> list[dict[str, ParamValue]]:
    """The baseline, then feasible points drawn from `space` (the one the sweep searches, inert knobs
    collapsed), one per speculative algorithm first; `limit` in all."""
    rng = random.Random(s.sampler.seed)
    points = [sp.baseline_params(s.space)]
    draws = (p for p in (sp.random_point(space, rng) for _ in range(10_000)) if sp.infeasible_reason(p) is None)
    algo = space.params.get("speculative_algorithm")  # one example per algorithm first, then any
    strata = [v for v in algo.values() if v is not None] if algo is not None else []
    points += stratified((p for p in draws if p != points[0]), "speculative_algorithm", strata, limit - 1)
    return points[:limit]


def _warnings(s: spec_mod.SweepSpec, ctx: CommContext | None, plans: list[LaunchPlan], host: str | None) -> list[str]:
    """What `sweep plan` warns of, each once: deprecated knobs, knobs the host makes inert, a mismatched
    NCCL, the launches' own warnings, model paths that are placeholders or missing."""
    found = list(knobs.deprecation_warnings(s.space.params))
    swept_env = {n: "" for n in s.space.params if n.startswith(("NCCL_", "SGLANG_"))}
    hardware = ctx.host.interconnect if ctx is not None else planner.hardware(s)
    if hardware is None and ctx is None:  # a GPU host: its own topology tells NVLink from PCIe (plan runs on the head)
        hardware = observe.fingerprint().get("topology")
        if hardware is None and swept_env:
            found.append(
                "no nvidia-smi here, so the interconnect is unknown; on NVLink hosts SGLang's custom all-reduce "
                "carries decode/verify all-reduces and NCCL variables only matter with all_reduce_path: nccl "
                "(--disable-custom-all-reduce)"
            )
    # With the host described, the all-reduce paragraph says who carries what (the fusion included).
    flags = {**s.server.flags, "tp-size": s.server.tp}
    found += sorted(observe.plan_warnings(swept_env, flags, hardware, path_known=ctx is not None))
    found += _nccl_mismatch(s)
    found += [w for lp in plans for w in lp.warnings]
    found += model_path_warnings(s, host)
    return list(dict.fromkeys(found))


_PLACEHOLDER = re.compile(r"fill[ _-]?in|path/to|<[^>]*>|\byour[-_]|changeme|todo|xxx", re.IGNORECASE)


def model_path_warnings(s: spec_mod.SweepSpec, host: str | None) -> list[str]:
    """engine sglang: server.model and server.draft_model that look like placeholders, or are no directory
    here (said as a check to make on the GPU host where --host names another one)."""
    if s.engine != "sglang":
        return []
    found = []
    for field, path in (("server.model", s.server.model), ("server.draft_model", s.server.draft_model)):
        if not path:
            continue
        if _PLACEHOLDER.search(path):
            found.append(f"{field}: {path} looks like a placeholder; give the model's directory on the GPU hosts")
        elif not Path(path).is_dir():
            found.append(
                f"{field}: {path} is no directory on this machine; check that it exists at that path on every "
                f"{host} host before `sweep run`"
                if host is not None
                else f"{field}: {path} is no directory on this machine, so every trial would fail to load it; "
                f"give the model's directory (the same path on every GPU host)"
            )
    return found


@dataclass(frozen=True)
class _Night:
    """`sweep plan`'s figures of the night: one trial's cost (start-up and benchmark, in the night's
    seconds: the simulator's load sleeps simulator.time_scale of the model's) and the schedule."""

    plan: schedule.NightPlan
    bench_s: float
    source: str
    note: str = ""

    @property
    def startup_s(self) -> float:
        return max(self.plan.trial_s - self.bench_s, 0.0)


def _night(s: spec_mod.SweepSpec, host: str | None) -> _Night | str:
    """The night's plan on `host` (the hardware profile the cost model times, else simulator.hardware_profile),
    or the reason one trial's cost is unknown (engine sglang without a model profile)."""
    if host is not None:
        s = s.model_copy(update={"simulator": s.simulator.model_copy(update={"hardware_profile": host})})
    profile_named = "model_profile" in s.simulator.model_fields_set
    est = cost.expected_cost(s, sp.baseline_params(s.space), profile_named=profile_named)
    if est.cost is None:
        return f"expected time of one trial: {est.source}"
    c = est.cost
    night = schedule.night_plan(s, probe_settings=planned_settings(s))
    note = (
        f"; simulated (simulator.time_scale {s.simulator.time_scale:g}): a real host loads this model in "
        f"{c.load_s:.0f} s"
        if s.engine == "simulator"
        else ""
    )
    return _Night(night, c.warmup_s + c.benchmark_s, est.source, note)


def _budget_line(s: spec_mod.SweepSpec, night: schedule.NightPlan) -> tuple[str, bool]:
    """What budget.trials means for this night, and whether it is a warning (the trials do not fit)."""
    fit, wanted = night.trials, s.budget.trials
    if wanted is None:
        return f"the search runs until the wall time: about {fit} trial(s)", False
    if wanted > fit:
        return (
            f"budget.trials {wanted} cannot fit the night: about {fit} fit in budget.wall_time "
            f"{night.wall_s / 3600:.2f} h after the confirmation's {night.confirmation.seconds / 3600:.2f} h; the "
            f"search stops at the wall time. Raise budget.wall_time, lower budget.trials to {fit}, or add hosts "
            f"(budget.concurrent_trials)",
            True,
        )
    return f"budget.trials {wanted} ends the search before the night would ({fit} would fit)", False


def _print_night(s: spec_mod.SweepSpec, night: _Night | str | None) -> None:
    """`sweep plan`: one trial's minutes, the night's schedule (probe, search, each confirmation arm), and
    what budget.trials means for it; one figure per quantity, all from sweep.schedule's NightPlan."""
    if night is None or isinstance(night, str):
        out.print(night or "", soft_wrap=True, markup=False)
        return
    n = night.plan
    out.print(
        f"one trial: {n.trial_s / 60:.1f} min = start-up {night.startup_s:.0f} s + benchmark {night.bench_s:.0f} s "
        f"({s.benchmark.repeats} repeat(s)); {night.source}{night.note}",
        soft_wrap=True,
        markup=False,
    )
    for line in n.lines():
        out.print(line, soft_wrap=True, highlight=False, markup=False)
    line, warn = _budget_line(s, n)
    out.print(f"[yellow]warning:[/] {escape(line)}" if warn else escape(line), soft_wrap=True)


def _plan_json(
    s: spec_mod.SweepSpec,
    census: tuple[int, int, Any],
    night: _Night | str,
    warnings: list[str],
    points: list[dict[str, ParamValue]],
    plans: list[LaunchPlan],
) -> dict[str, Any]:
    """`sweep plan --json`: the same figures as the text, for scripts."""
    total, feasible, reasons = census
    schedule_json: dict[str, Any] | None = None
    if isinstance(night, _Night):
        n = night.plan
        schedule_json = {
            "trial_minutes": round(n.trial_s / 60, 3),
            "startup_s": round(night.startup_s, 1),
            "benchmark_s": round(night.bench_s, 1),
            "wall_time_h": round(n.wall_s / 3600, 3),
            "probe_h": round(n.probe_s / 3600, 3),
            "search_h": round(n.search_s / 3600, 3),
            "confirmation_h": round(n.confirmation.seconds / 3600, 3),
            "trials_fit": n.trials,
            "budget_trials": s.budget.trials,
            "fits": n.fits,
            "arms": [
                {"name": a.name, "concurrency": a.concurrency, "rounds": a.rounds, "run_s": round(a.run_s, 1)}
                for a in n.confirmation.arms
            ],
            "dropped": [{"name": d.name, "why": d.why} for d in n.confirmation.dropped],
        }
    return {
        "experiment": s.name,
        "combinations": total,
        "feasible": feasible,
        "infeasible": dict(reasons.most_common()),
        "night": schedule_json,
        "cost_unknown": night if isinstance(night, str) else None,
        "warnings": warnings,
        "launches": [{"params": p, "argv": list(lp.argv), "env": lp.env} for p, lp in zip(points, plans)],
    }


def _nccl_wheel() -> str | None:
    """This interpreter's NCCL wheel (torch's CUDA build loads it), else None."""
    for name in ("nvidia-nccl-cu13", "nvidia-nccl-cu12"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _nccl_mismatch(s: spec_mod.SweepSpec) -> list[str]:
    """`sweep plan` (engine sglang): the NCCL the probe measures (the work directory's probe.json, else the
    NCCL wheel of this interpreter, which runs the probe's ranks) against the one server.python loads."""
    if s.engine != "sglang":
        return []
    probed = probed_nccl(default_workdir(s))
    probe_where = f"{default_workdir(s) / PROBE_FILE}" if probed else f"the probe's interpreter ({sys.executable})"
    probed = probed or _nccl_wheel()
    if s.server.python is None:
        server = {"the server (this interpreter)": _nccl_wheel()}
    else:
        found, _ = observe.interpreter_versions(s.server.python)
        server = {f"server.python {s.server.python}": found.get("nccl_package")}
    return nccllog.version_mismatch(probed, server, probe_where=probe_where)


def comm_context(s: spec_mod.SweepSpec, host: str | None, arch: str | None) -> CommContext | None:
    """probe.comm.comm_context, a profile that does not load said as one message."""
    try:
        return comm.comm_context(s, host, arch)
    except ProfileError as exc:
        raise UserError(f"--host {host or s.simulator.hardware_profile}: {exc}") from None


def _print_comm(s: spec_mod.SweepSpec, ctx: CommContext) -> None:
    """`sweep plan`: which backend carries decode, verify and prefill, and the inert NCCL knobs."""
    cp = commplan.plan(s, ctx)
    _, source = comm.model_facts(s, None)
    out.print(f"[dim]model facts from {source}[/]", soft_wrap=True)
    for line in commplan.lines(cp, ctx):
        out.print(line, soft_wrap=True, highlight=False, markup=False)
    inert = comm.collapsed(s, ctx, cp)
    if inert.backend is not None:  # the NCCL knobs' line is in commplan.lines already
        out.print(
            f"  {inert.backend.line.removeprefix('communication path: ')}",
            soft_wrap=True,
            highlight=False,
            markup=False,
        )
    if inert:
        total, feasible, _ = sp.census(sp.collapse_all(s.space, inert), ctx)
        out.print(f"  collapsed search space: {total} distinct combinations, {feasible} feasible", soft_wrap=True)


# ---------------------------------------------------------------------------- probe


@app.command()
@guard
def truth(
    experiment: Path = typer.Argument(..., help="experiment YAML (engine: simulator)"),
    top: int = typer.Option(10, "--top", min=1, max=10_000, help="how many of the best points to list (1-10000)"),
    workdir: Path | None = typer.Option(None, "--workdir", parser=WORKDIR, help="also rank this sweep's best trial"),
) -> None:
    """Evaluate the simulator's noise-free model on every feasible point: the true optimum and ranks."""
    s = load_experiment(experiment)
    if s.engine != "simulator":
        raise UserError(f"{experiment}: `sweep truth` needs engine: simulator (the model is the simulator's)")
    if s.objective.metric not in truth_mod.MODELLED:
        raise UserError(
            f"{experiment}: objective.metric {s.objective.metric} is not predicted by the simulator's "
            f"noise-free model; `sweep truth` ranks by {', '.join(truth_mod.MODELLED)}"
        )
    with err.status("evaluating every feasible point of the space..."):
        check_enumerable(s.space, "sweep truth")
        t = truth_mod.compute(s)
    table = Table(
        title=f"{s.name}: {len(t.values)} feasible points on {s.simulator.hardware_profile} "
        f"(noise-free {s.objective.metric})"
    )
    table.add_column("rank", justify="right")
    table.add_column(s.objective.metric, justify="right")
    table.add_column("configuration")
    for i, (value, params) in enumerate(zip(t.values[:top], t.points[:top]), 1):
        table.add_row(
            str(i),
            f"{value:.2f}",
            ", ".join(f"{k}={v}" for k, v in params.items() if v is not None) or "engine defaults",
        )
    out.print(table)
    if workdir is not None:
        _rank_sweep(s, t, workdir)


def _rank_sweep(s: spec_mod.SweepSpec, t: truth_mod.Truth, workdir: Path) -> None:
    """The sweep's verdict ranked against the true optimum: what it deployed (the search's pick when nothing
    was deployed), or, before the end, its best measurement so far."""
    v = verdict_of(workdir)
    if v is not None and v.subject is not None:
        who = f"deployed ({v.subject.label})" if v.deployed is not None else f"the search's pick ({v.subject.label})"
        params = dict(v.subject.params)
    else:
        best = status_report(workdir).best
        if not best:
            return
        who, params = f"sweep best so far (trial {best.number}, no verdict yet)", dict(best.params)
    value = truth_mod.evaluator(s)(sp.complete(s.space, params))
    ratio = value / t.optimum if t.maximize else t.optimum / value
    out.print(
        f"{who}: true {s.objective.metric} {value:.2f} = "
        f"{ratio * 100:.1f}% of the optimum, rank {t.rank_of_value(value)} of {len(t.values)}",
        soft_wrap=True,
    )
