"""`sweep validate`, `sweep plan` and `sweep truth`: what an experiment means, before anything runs."""

from __future__ import annotations

import importlib.metadata
import json
import random
import sys
from pathlib import Path

import typer
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
    as_json: bool = typer.Option(False, "--json", help="print a JSON list of {params, argv, env}"),
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
    """Dry run: space size, infeasible combinations and why, the all-reduce path per message class, the
    first launch commands. Starts nothing."""
    s = load_experiment(experiment)
    rng = random.Random(s.sampler.seed)
    points = [sp.baseline_params(s.space)]
    draws = (p for p in (sp.random_point(s.space, rng) for _ in range(10_000)) if sp.infeasible_reason(p) is None)
    algo = s.space.params.get("speculative_algorithm")  # one example per algorithm first, then any
    strata = [v for v in algo.values() if v is not None] if algo is not None else []
    points += stratified((p for p in draws if p != points[0]), "speculative_algorithm", strata, limit - 1)
    points = points[:limit]
    plans = [planner.make(s, p, port=s.server.port_range[0] + i, seed=i) for i, p in enumerate(points)]
    if as_json:
        print(
            json.dumps([{"params": p, "argv": list(lp.argv), "env": lp.env} for p, lp in zip(points, plans)], indent=2)
        )
        return
    ctx = comm_context(s, host, arch)
    total, feasible, reasons = sp.census(s.space, ctx)
    out.print(f"[bold]{s.name}[/]: {total} distinct combinations, {feasible} feasible, {total - feasible} infeasible")
    for rule, n in reasons.most_common():
        out.print(f"  {n:>6} infeasible: {rule}")
    for warning in knobs.deprecation_warnings(s.space.params):
        out.print(f"[yellow]warning:[/] {warning}", soft_wrap=True)
    if ctx is not None:
        _print_comm(s, ctx)
    _print_cost(s, host)
    swept_env = {n: "" for n in s.space.params if n.startswith(("NCCL_", "SGLANG_"))}
    hardware = ctx.host.interconnect if ctx is not None else planner.hardware(s)
    if (
        hardware is None and ctx is None
    ):  # a GPU host: its own topology tells NVLink from PCIe (sweep plan runs on the head)
        hardware = observe.fingerprint().get("topology")
        if hardware is None and swept_env:
            out.print(
                "[dim]note: no nvidia-smi here, so the interconnect is unknown; on NVLink hosts SGLang's custom "
                "all-reduce carries decode/verify all-reduces and NCCL variables only matter with "
                "all_reduce_path: nccl (--disable-custom-all-reduce)[/]",
                soft_wrap=True,
            )
    # With the host described, the all-reduce paragraph above says who carries what (the fusion included).
    seen_warnings: set[str] = set(
        observe.plan_warnings(
            swept_env, {**s.server.flags, "tp-size": s.server.tp}, hardware, path_known=ctx is not None
        )
    )
    seen_warnings.update(_nccl_mismatch(s))
    for w in sorted(seen_warnings):
        out.print(f"[yellow]warning:[/] {w}", soft_wrap=True)
    for lp in plans:
        for w in lp.warnings:
            if w not in seen_warnings:
                seen_warnings.add(w)
                out.print(f"[yellow]warning:[/] {w}", soft_wrap=True)
    for i, (p, lp) in enumerate(zip(points, plans)):
        label = "baseline" if i == 0 else f"example {i}"
        out.print(
            f"\n[bold]{label}[/]: {', '.join(f'{k}={v}' for k, v in p.items() if v is not None) or 'engine defaults'}"
        )
        out.print(planner.launch_command(lp), soft_wrap=True)


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


def _print_cost(s: spec_mod.SweepSpec, host: str | None = None) -> None:
    """`sweep plan`: one trial's expected GPU-time, the night's schedule (probe, search, each
    confirmation arm: sweep.schedule) and a refusal when even its minimum does not fit. `--host` names
    the hardware profile the cost model times (else simulator.hardware_profile)."""
    if host is not None:
        s = s.model_copy(update={"simulator": s.simulator.model_copy(update={"hardware_profile": host})})
    profile_named = "model_profile" in s.simulator.model_fields_set
    for line in cost.plan_lines(
        s, sp.baseline_params(s.space), probe_settings=planned_settings(s), profile_named=profile_named
    ):
        out.print(line, soft_wrap=True)
    if s.engine == "sglang" and not profile_named:
        return  # no model profile: the cost of a trial is unknown, and so is the schedule
    night = schedule.night_plan(s, probe_settings=planned_settings(s))
    for line in night.lines():
        out.print(line, soft_wrap=True, highlight=False, markup=False)
    if not night.fits:
        raise UserError(
            f"{s.source or 'the experiment'}: the night's minimum does not fit budget.wall_time "
            f"({s.budget.wall_time / 3600:.2f} h): lower promotion.min_rounds, promotion.concurrency "
            f"or benchmark.requests / repeats, or raise budget.wall_time"
        )


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
