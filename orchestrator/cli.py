"""The `sweep` command: thin commands that turn errors into one message and an exit code.

Exit codes: 0 success, 2 user error (bad experiment, bad arguments, nothing to resume), 1 failure.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.status import Status
from rich.table import Table

from orchestrator import fsio
from orchestrator.config import experiment as spec_mod
from orchestrator.config.fields import tracking_uri_problem
from orchestrator.config.space import check_enumerable
from orchestrator.errors import NoChampion, SweepError, SweepToolError, UserError
from orchestrator.probe import nccl_dimensions, rank_settings, run_probe
from orchestrator.probe.settings import planned_settings
from orchestrator.probe.tuner import tuner_file_from
from orchestrator.records import TrialStatus
from orchestrator.results import cost, formats
from orchestrator.results import truth as truth_mod
from orchestrator.search import space as sp
from orchestrator.sweep import state as st
from orchestrator.sweep._probe_stage import probe_log
from orchestrator.sweep.status import LiveProgress, read_state, status_report
from orchestrator.tracking import probe_run
from orchestrator.tracking.convert import trials_view_path
from orchestrator.trial import observe
from orchestrator.trial import plan as planner

if TYPE_CHECKING:  # the tracker imports MLflow: `status`, `validate` and `plan` must start without it
    from orchestrator.tracking.tracker import Tracker

P = ParamSpec("P")
R = TypeVar("R")

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find the fastest way to serve a model with SGLang: NCCL and speculative-decoding sweeps.")
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def _guard(fn: Callable[P, R]) -> Callable[P, R]:
    """Run a command body; a SweepToolError becomes one message and its exit code, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except SweepToolError as exc:
            raise _fail(str(exc), exc.exit_code) from None
        except KeyboardInterrupt:
            raise _fail("interrupted", 130) from None
        except OSError as exc:  # the environment (disk full, permissions, a path in the way), not a bug of ours
            where = f"{exc.filename}: " if exc.filename else ""
            raise _fail(f"{where}{exc.strerror or exc}", 1) from None
    return wrapper


def _load(path: Path) -> spec_mod.SweepSpec:
    return spec_mod.load(path)


def _workdir(workdir: Path | None, experiment: spec_mod.SweepSpec | None = None) -> Path:
    if workdir is not None:
        if workdir.is_dir():
            return workdir
        if experiment is None:  # status, sync, ui, export: the sweep must be there
            what = "is a file" if workdir.is_file() else "does not exist"
            raise UserError(f"--workdir {workdir}: {what}, not a sweep's work directory; pass the --workdir "
                            f"`sweep run` used")
        existing = next(p for p in (workdir, *workdir.parents) if p.exists() or p == p.parent)
        if existing.exists() and not existing.is_dir():
            raise UserError(f"--workdir {workdir}: {existing} is a file, not a directory; pass a directory "
                            f"path, e.g. --workdir runs/{experiment.name}")
        return workdir
    if experiment is not None:
        return Path("runs") / experiment.name
    runs = Path("runs")
    candidates = sorted(p for p in runs.iterdir() if (p / "sweep.json").exists()) if runs.is_dir() else []
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise UserError("no sweep found under ./runs; pass --workdir DIR (the directory `sweep run` used)")
    names = ", ".join(str(c) for c in candidates)
    raise UserError(f"several sweeps under ./runs ({names}); pass --workdir DIR to choose one")


def _tracker(uri: str, experiment: str, outbox_dir: Path) -> Tracker:
    # MLflow is imported by the commands that talk to it only.
    from orchestrator.tracking.tracker import Tracker

    return Tracker(uri, experiment, outbox_dir=outbox_dir)


# ---------------------------------------------------------------------------- validate / plan


@app.command()
@_guard
def validate(experiment: Path = typer.Argument(..., help="experiment YAML")) -> None:
    """Check an experiment and its search spaces; print what it would sweep."""
    s = _load(experiment)
    total, feasible, _ = sp.census(s.space)
    out.print(f"[green]OK[/] {experiment}: experiment [bold]{s.name}[/], engine {s.engine}, "
              f"sglang {s.sglang_version}, tp {s.server.tp}, {len(s.space.params)} knobs "
              f"({', '.join(s.space.params)}), {total} distinct combinations of which {feasible} feasible")


@app.command()
@_guard
def plan(
    experiment: Path = typer.Argument(..., help="experiment YAML"),
    limit: int = typer.Option(5, "--limit", min=0, help="how many launch commands to show"),
    as_json: bool = typer.Option(False, "--json", help="print a JSON list of {params, argv, env}"),
) -> None:
    """Dry run: space size, infeasible combinations and why, the first launch commands. Starts nothing."""
    s = _load(experiment)
    rng = random.Random(s.sampler.seed)
    points = [sp.baseline_params(s.space)]
    seen = {sp.key(points[0])}
    for _ in range(10_000):  # a few feasible examples drawn from the space, after the baseline
        if len(points) >= limit:
            break
        p = sp.random_point(s.space, rng)
        if sp.infeasible_reason(p) is None and sp.key(p) not in seen:
            seen.add(sp.key(p))
            points.append(p)
    points = points[:limit]
    plans = [planner.make(s, p, port=s.server.port_range[0] + i, seed=i) for i, p in enumerate(points)]
    if as_json:
        print(json.dumps([{"params": p, "argv": list(lp.argv), "env": lp.env} for p, lp in zip(points, plans)],
                         indent=2))
        return
    total, feasible, reasons = sp.census(s.space)
    out.print(f"[bold]{s.name}[/]: {total} distinct combinations, {feasible} feasible, {total - feasible} infeasible")
    for rule, n in reasons.most_common():
        out.print(f"  {n:>6} infeasible: {rule}")
    _print_cost(s)
    swept_env = {n: "" for n in s.space.params if n.startswith(("NCCL_", "SGLANG_"))}
    hardware = planner.hardware(s)
    if hardware is None:  # a GPU host: its own topology tells NVLink from PCIe (sweep plan runs on the head)
        hardware = observe.fingerprint().get("topology")
        if hardware is None and swept_env:
            out.print("[dim]note: no nvidia-smi here, so the interconnect is unknown; on NVLink hosts SGLang's custom "
                      "all-reduce carries decode/verify all-reduces and NCCL variables only matter with "
                      "all_reduce_path: nccl (--disable-custom-all-reduce)[/]", soft_wrap=True)
    seen_warnings: set[str] = set(observe.plan_warnings(swept_env, {**s.server.flags, "tp-size": s.server.tp},
                                                        hardware))
    for w in sorted(seen_warnings):
        out.print(f"[yellow]warning:[/] {w}", soft_wrap=True)
    for lp in plans:
        for w in lp.warnings:
            if w not in seen_warnings:
                seen_warnings.add(w)
                out.print(f"[yellow]warning:[/] {w}", soft_wrap=True)
    for i, (p, lp) in enumerate(zip(points, plans)):
        label = "baseline" if i == 0 else f"example {i}"
        out.print(f"\n[bold]{label}[/]: {', '.join(f'{k}={v}' for k, v in p.items() if v is not None) or 'engine defaults'}")
        out.print(planner.launch_command(lp), soft_wrap=True)


def _print_cost(s: spec_mod.SweepSpec) -> None:
    """`sweep plan`: one trial's expected GPU-time and how many fit the wall time (results.cost)."""
    for line in cost.plan_lines(s, sp.baseline_params(s.space), probe_settings=planned_settings(s),
                                profile_named="model_profile" in s.simulator.model_fields_set):
        out.print(line, soft_wrap=True)


# ---------------------------------------------------------------------------- probe


@app.command()
@_guard
def probe(
    experiment: Path = typer.Argument(..., help="experiment YAML"),
    workdir: Path | None = typer.Option(None, "--workdir", help="where probe.json goes (default runs/<name>)"),
    budget: int | None = typer.Option(None, "--budget", min=1, help="NCCL settings to probe (default probe.budget, "
                                                                    "else 48)"),
    keep_within: float | None = typer.Option(None, "--keep-within", help="keep settings within this ratio of the "
                                                                         "best latency (default probe.keep_within)"),
    top: int = typer.Option(15, "--top", min=1, help="rows of the ranking to print"),
    no_mlflow: bool = typer.Option(False, "--no-mlflow", help="do not log the probe to MLflow"),
) -> None:
    """Measure the host's tensor-parallel all-reduce per NCCL setting without loading a model; rank the
    settings by latency at the verify sizes; write probe.json and log an MLflow run."""
    s = _load(experiment)
    ratio = keep_within if keep_within is not None else s.probe.keep_within
    if not ratio >= 1.0:
        raise UserError(f"--keep-within is a ratio to the best latency and must be >= 1.0, but got {ratio}")
    if not nccl_dimensions(s):
        raise UserError(f"{experiment}: the search space has no NCCL variable to probe (add e.g. "
                        f"search_spaces/nccl.yaml to search_space)")
    wd = _workdir(workdir, s)
    result = run_probe(s, wd, budget=budget or s.probe.budget)
    if result.skipped:
        raise SweepError(f"probe on {result.host}: {result.skipped} (wrote {wd / 'probe.json'})")
    ranked = rank_settings(result, keep_within=ratio)
    table = Table(title=f"{s.name}: {len(result.settings)} of {result.space_settings} NCCL settings on "
                        f"{result.host} (tp {result.tp}, NCCL {result.nccl_version or '?'})")
    for col in ("rank", "us", "x best", "kept", "setting"):
        table.add_column(col, justify="right" if col in ("rank", "us", "x best") else "left")
    for r in ranked[:top]:
        table.add_row(str(r.rank), f"{r.score_us:.1f}" if r.score_us is not None else "failed",
                      f"{r.relative:.2f}" if r.relative is not None else "-", "yes" if r.kept else "",
                      escape(r.setting))
    out.print(table)
    kept = sum(r.kept for r in ranked)
    out.print(f"{kept} setting(s) within {ratio:g}x of the best (NCCL defaults always kept); score: mean latency at "
              f"the verify sizes; {result.seconds:.1f} s, {result.seconds_per_setting:.3f} s per setting; "
              f"wrote {wd / 'probe.json'}", soft_wrap=True)
    if not no_mlflow:
        uri = s.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(wd / 'mlflow.db').resolve()}"
        try:
            run_id = probe_run.log_probe(uri, s.tracking.experiment or s.name,
                                         probe_log(result, ranked, keep_within=ratio))
        except SweepToolError as exc:
            err.print(f"[yellow]warning:[/] {escape(str(exc))}; probe.json holds the result", soft_wrap=True)
        else:
            out.print(f"MLflow run {run_id} (ranking table and latency plot)")


# ---------------------------------------------------------------------------- run


def _progress_printer(live: LiveProgress | None = None, line: Status | None = None) -> Callable[[st.Event], None]:
    """Print each event; with `live` and `line` (a terminal), keep the live line (trials in flight, best so
    far, ETA, phase) under the printed ones."""

    def on_event(event: st.Event) -> None:
        if live is not None:
            live.on(event, time.monotonic())
            if line is not None:
                line.start()
                line.update(live.line(time.monotonic()))
        if isinstance(event, st.ExecutorReady):
            out.print(f"[dim]Ray at {event.address}: {event.gpus:g} GPUs, {event.slots} trial(s) at a time[/]")
        elif isinstance(event, st.ProbeStage):
            out.print(f"[bold]◆ {escape(event.text)}[/]", soft_wrap=True)
        elif isinstance(event, st.TrialLaunched):
            knobs = ", ".join(f"{k}={v}" for k, v in event.params.items() if v is not None) or "engine defaults"
            out.print(f"[cyan]▶ trial {event.number:>3}[/] {event.role:<8} {knobs}", soft_wrap=True)
        elif isinstance(event, st.TrialFinished):
            o = event.outcome
            took = max(o.finished_at - o.started_at, 0.0) if o.started_at and o.finished_at else 0.0
            if o.status is TrialStatus.COMPLETE and o.metrics is not None:
                sp_txt = f" ({(event.speedup - 1) * 100:+.1f}% vs baseline)" if event.speedup else ""
                al = f", accept len {o.metrics.accept_length:.2f}" if o.metrics.accept_length else ""
                out.print(f"[green]✔ trial {o.number:>3}[/] {o.metrics.decode_tok_s:7.1f} tok/s{sp_txt}{al}"
                          f"  [dim]took {took:4.0f}s[/]")
            else:
                kind_txt = o.failure_kind.value if o.failure_kind else o.status.value
                out.print(f"[red]✘ trial {o.number:>3}[/] {kind_txt}: {o.reason}  [dim]took {took:.0f}s[/]",
                          soft_wrap=True)
        elif isinstance(event, st.TrackingWait):
            out.print(f"[yellow]MLflow unreachable: {event.pending} result(s) in the outbox; waiting up to "
                      f"{event.wait_s:.0f}s before promoting (`sweep sync` sends them later)[/]")
        elif isinstance(event, st.ConfirmationRun):
            out.print(f"[magenta]⇄ confirmation {event.round}/{event.of}: {event.who}[/]")
        elif isinstance(event, st.Interrupted):
            msg = ("stopping after the trials in flight (Ctrl-C again to abort them)" if event.press == 1
                   else "aborting the trials in flight")
            out.print(f"[yellow]{msg}[/]")

    return on_event


@app.command()
@_guard
def run(
    experiment: Path = typer.Argument(..., help="experiment YAML"),
    n_trials: int | None = typer.Option(None, "--n-trials", min=1, help="override budget.trials"),
    timeout: str | None = typer.Option(None, "--timeout", help="wall-time budget, e.g. 8h, 90m"),
    workdir: Path | None = typer.Option(None, "--workdir", help="default runs/<experiment name>/"),
    ray_address: str | None = typer.Option(None, "--ray-address", help="existing Ray cluster, e.g. auto"),
    storage: str | None = typer.Option(None, "--storage", envvar="SWEEP_OPTUNA_STORAGE",
                                          help="Optuna RDB URL (e.g. postgresql://...); default sqlite in the work directory"),
    resume: bool = typer.Option(False, "--resume", help="continue the sweep in the work directory"),
) -> None:
    """Run (or resume) a sweep: trials on Ray, Optuna proposing, MLflow recording, champion promoted."""
    # The driver stack imports Ray and MLflow: only `sweep run` needs them.
    from orchestrator.execute.ray_actor import RayExecutor
    from orchestrator.sweep.driver import Sweep  # deferred with Ray: MLflow

    # The sweep prints its own progress; MLflow's schema-migration chatter is not news to a user.
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # Ray's note that its local cluster uses token authentication is not the user's concern here.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)

    s = _load(experiment)
    try:
        timeout_s = spec_mod.parse_duration(timeout) if timeout else None
    except ValueError as exc:
        raise UserError(f"--timeout: {exc}") from None
    wd = _workdir(workdir, s)
    line = out.status("starting...") if out.is_terminal else None
    sweep = Sweep(s, wd, executor=RayExecutor.for_sweep(s, ray_address), storage=storage, resume=resume,
                  n_trials=n_trials, timeout_s=timeout_s,
                  on_event=_progress_printer(LiveProgress(budget=n_trials or s.budget.trials, objective=s.objective.metric,
                                                          maximize=s.objective.direction == "maximize"), line))
    out.print(f"[bold]sweep {s.name}[/] ({s.engine}) in {wd}: up to {sweep.budget_trials} trials, "
              f"{s.budget.concurrent_trials} at a time, objective {s.objective.direction} {s.objective.metric}")
    try:
        summary = sweep.run()
    finally:
        if line is not None:
            line.stop()
    _print_summary(s, summary, wd)
    _publish_report(wd, storage)
    if summary.stopped_by_failure:
        raise typer.Exit(1)
    if not summary.promoted:
        raise typer.Exit(NoChampion.exit_code)  # finished without a champion (README: exit codes)


def _publish_report(wd: Path, storage: str | None) -> None:
    """report.html in the work directory and on the parent MLflow run; a failure to publish is a warning."""
    from orchestrator.sweep import publish  # deferred: plotly and MLflow

    try:
        path = publish.publish(wd, storage)
    except SweepToolError as exc:
        err.print(f"[yellow]warning:[/] report not published: {escape(str(exc))}", soft_wrap=True)
        return
    out.print(f"report: [bold]{path}[/]  (also on the parent MLflow run)")


def _print_summary(s: spec_mod.SweepSpec, summary: st.SweepSummary, wd: Path) -> None:
    out.rule("summary")
    out.print(f"stopped: {summary.stop_reason or 'done'}")
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(summary.failures.items()))
    out.print(f"trials: {summary.complete} complete, {summary.failed} failed"
              f"{f' ({kinds})' if kinds else ''}, {summary.skipped} proposals skipped (infeasible or repeated)")
    drift = summary.baseline_drift
    if drift.flagged and drift.max_relative_change is not None:
        out.print(f"[yellow]baseline drifted by {drift.max_relative_change * 100:.1f}% during the sweep[/]")
    champ = summary.champion
    if champ:
        knobs = "\n".join(f"    {k} = {v}" for k, v in champ["params"].items()) or "    (engine defaults)"
        out.print(f"champion: trial {champ['number']}\n{knobs}")
        if summary.search_value is not None:
            out.print(f"  search phase (one measurement, the best of many): {s.objective.metric} "
                      f"{summary.search_value:.2f}")
    if summary.confirmed:
        color = "yellow" if summary.confirmed.label == "unconfirmed" else "bold"
        out.print(f"  [{color}]{escape(summary.confirmed.text())}[/]", soft_wrap=True)
    for part in summary.contributions:
        out.print(f"  why: {escape(part.text())}", soft_wrap=True)
    if summary.concurrency_verdict:
        out.print(f"  by load: {escape(summary.concurrency_verdict)}", soft_wrap=True)
    if summary.importances:
        top = ", ".join(f"{k} {v:.2f}" for k, v in list(summary.importances.items())[:5])
        out.print(f"  parameter importances (Optuna, fANOVA): {top}", soft_wrap=True)
    outcome = summary.outcome.value if summary.outcome else "no verdict"
    if summary.promoted:
        label = " [yellow]UNCONFIRMED[/]" if summary.outcome is st.Outcome.unconfirmed else ""
        # The figures are above; the verdict's words matter when a simpler configuration or no gate was used.
        said = "" if summary.promoted_config == "champion" else f": {escape(summary.verdict or '')}"
        out.print(f"[green]promoted[/]{label} {s.promotion.model_name}@{s.promotion.alias} "
                  f"(version {summary.model_version}){said}", soft_wrap=True)
        out.print(f"env file: [bold]{summary.env_file}[/]")
    elif summary.verdict:
        out.print(f"[yellow]not promoted ({outcome.replace('_', ' ')})[/]: {escape(summary.verdict)}", soft_wrap=True)
    out.print(f"browse the results: [bold]sweep ui --workdir {wd}[/]")


# ---------------------------------------------------------------------------- status / sync / ui / export


@app.command()
@_guard
def status(
    workdir: Path | None = typer.Option(None, "--workdir", help="the sweep's work directory"),
    storage: str | None = typer.Option(None, "--storage", envvar="SWEEP_OPTUNA_STORAGE",
                                          help="the Optuna RDB URL the sweep used, when not its sqlite file"),
) -> None:
    """Progress, ETA, best so far and failures of a sweep (running or finished), from its storage."""
    wd = _workdir(workdir)
    rep = status_report(wd, storage)
    out.print(f"[bold]{rep.experiment}[/] in {wd}: {rep.status}"
              + ("" if rep.driver_alive or rep.status != "running" else " [red](driver not running: "
                 "resume with `sweep run EXP --resume`)[/]"))
    out.print(f"progress: {rep.launched}/{rep.budget_trials} trials launched, {rep.complete} complete, "
              f"{rep.failed} failed, {rep.running} running, {rep.skipped} proposals skipped")
    out.print(f"phase: {rep.phase}")
    if rep.eta_s is not None:
        out.print(f"elapsed {rep.elapsed_s / 60:.1f} min, ETA {rep.eta_s / 60:.1f} min")
    if rep.remaining is not None:
        r = rep.remaining
        out.print(f"measured per trial: start-up {r.startup_s:.0f} s + benchmark {r.bench_s:.0f} s (median of "
                  f"{r.measured}); about {r.trials} more fit the wall time left")
    if rep.failures:
        out.print("failures by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(rep.failures.items())))
    best = rep.best
    if best:
        sp_txt = f" ({(best.speedup - 1) * 100:+.1f}% vs baseline)" if best.speedup else ""
        label = "best so far" if rep.phase == "search" else "best searched trial"
        out.print(f"{label}: trial {best.number}: {rep.objective} = {best.value:.2f}{sp_txt} (search phase)")
        for k, v in best.params.items():
            out.print(f"    {k} = {v}")
    if rep.baseline is not None:
        out.print(f"baseline: {rep.baseline:.2f} ({len(rep.baselines)} measurement(s))")
    for node, hashes in rep.fingerprints.items():
        out.print(f"[yellow]warning: the fingerprint of {node or 'the host'} changed during the sweep "
                  f"({', '.join(hashes)}): compare fingerprint.json of its trials[/]")
    if rep.stop_reason:
        out.print(f"stop reason: {rep.stop_reason}")
    try:
        summary = st.SweepSummary.model_validate_json((wd / "summary.json").read_text())
    except (OSError, ValueError):
        summary = None  # no verdict yet (running, or stopped before the end)
    if summary is not None and summary.outcome is not None and rep.status != "running":  # not a resumed run's old one
        if summary.confirmed:
            out.print(f"champion {escape(summary.confirmed.text())}", soft_wrap=True)
        out.print(f"verdict ({summary.outcome.value.replace('_', ' ')}): {escape(summary.verdict or '')}",
                  soft_wrap=True)
    if rep.env_file:
        out.print(f"env file: [bold]{rep.env_file}[/]")


@app.command()
@_guard
def sync(workdir: Path | None = typer.Option(None, "--workdir")) -> None:
    """Replay results queued in the outbox while MLflow was unreachable."""
    wd = _workdir(workdir)
    state = read_state(wd)
    replayed, pending = _tracker(state.tracking_uri, state.experiment_in_mlflow, wd).replay_outbox()
    out.print(f"replayed {replayed} result(s) to {state.tracking_uri}; {pending} still pending")
    if pending:
        raise typer.Exit(1)


@app.command()
@_guard
def ui(
    workdir: Path | None = typer.Option(None, "--workdir"),
    port: int = typer.Option(5000, "--port", min=1, max=65535),
    host: str = typer.Option("127.0.0.1", "--host", help="keep 127.0.0.1 unless you know who can reach it"),
) -> None:
    """Start the MLflow UI on the sweep's tracking store and print its URL."""
    wd = _workdir(workdir).resolve()
    state = read_state(wd)
    uri = state.tracking_uri
    exp_id = _tracker(uri, state.experiment_in_mlflow, wd).experiment_id()
    view = trials_view_path(exp_id)
    if not uri.startswith("sqlite:"):
        out.print(f"this sweep logs to the MLflow server {uri}: open {uri.rstrip('/')}/{view}")
        return
    _require_free_port(host, port)
    mlflow_bin = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or shutil.which("mlflow")
    if mlflow_bin is None:
        raise UserError("the `mlflow` command is not installed in this environment; run `make install`")
    argv = [mlflow_bin, "server", "--backend-store-uri", uri, "--default-artifact-root",
            (wd / "mlartifacts").as_uri(), "--host", host, "--port", str(port), "--workers", "1"]
    out.print(f"MLflow UI: [bold]http://{host}:{port}/{view}[/]  (trials ranked; Ctrl-C stops it)")
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    try:
        raise typer.Exit(subprocess.call(argv, env=env))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


def _require_free_port(host: str, port: int) -> None:
    """UserError when `host:port` is taken: a URL printed for it would show another server."""
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except (socket.gaierror, UnicodeError):
            raise UserError(f"--host {host}: not an address of this machine; keep 127.0.0.1, or give one of "
                            f"its interface addresses") from None
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise UserError(f"--host {host}: not an address of this machine; keep 127.0.0.1, or give one of "
                                f"its interface addresses") from None
            raise UserError(f"--port {port}: {host}:{port} is not free ({exc.strerror}); another server (an earlier "
                            f"`sweep ui`?) listens there. Fix: stop it, or pass --port with a free port") from None


@app.command()
@_guard
def dashboard(
    workdir: Path | None = typer.Option(None, "--workdir"),
    port: int = typer.Option(8080, "--port", min=1, max=65535),
    host: str = typer.Option("127.0.0.1", "--host", help="keep 127.0.0.1 unless you know who can reach it"),
    storage: str | None = typer.Option(None, "--storage", envvar="SWEEP_OPTUNA_STORAGE",
                                       help="the Optuna RDB URL the sweep used, when not its sqlite file"),
) -> None:
    """Start optuna-dashboard on the sweep's study and print its URL."""
    wd = _workdir(workdir).resolve()
    state = read_state(wd)
    url = storage or state.optuna_storage or f"sqlite:///{wd / 'optuna.db'}"
    if ":***@" in url:
        raise UserError("the sweep's Optuna storage needs a password that is never written down; pass --storage URL")
    binary = shutil.which("optuna-dashboard", path=str(Path(sys.executable).parent)) or shutil.which("optuna-dashboard")
    if binary is None:
        raise UserError("the `optuna-dashboard` command is not installed in this environment; run `make install`")
    _require_free_port(host, port)
    out.print(f"optuna-dashboard: [bold]http://{host}:{port}/dashboard/[/]  (study {state.experiment}; Ctrl-C stops it)")
    try:
        raise typer.Exit(subprocess.call([binary, url, "--host", host, "--port", str(port)]))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


@app.command()
@_guard
def report(
    output: Path | None = typer.Option(None, "-o", "--output", help="default <workdir>/report.html"),
    workdir: Path | None = typer.Option(None, "--workdir", help="the sweep's work directory"),
    storage: str | None = typer.Option(None, "--storage", envvar="SWEEP_OPTUNA_STORAGE",
                                       help="the Optuna RDB URL the sweep used, when not its sqlite file"),
    mlflow: bool = typer.Option(True, "--mlflow/--no-mlflow", help="also put it on the parent MLflow run"),
    truth: bool = typer.Option(False, "--truth", help="simulator: rank the champion against the true optimum "
                                                      "(evaluates every feasible point)"),
) -> None:
    """One self-contained HTML page: which configuration won, by how much, and why."""
    from orchestrator.sweep import publish  # deferred: plotly, and MLflow with --mlflow

    wd = _workdir(workdir)
    path, _ = publish.write(wd, output, storage, truth=truth)
    if mlflow:
        _publish_report(wd, storage)
    out.print(f"wrote {path}")


@app.command()
@_guard
def export(
    output: Path = typer.Option(..., "-o", "--output", help="file to write (atomically)"),
    fmt: str = typer.Option("env", "--format", help="env | docker-env | k8s | json | sglang-args | nccl-tuner "
                                                    "(rules from the work directory's probe.json)"),
    tuner_file: str | None = typer.Option(
        None, "--tuner-file", help="the nccl-tuner rule file the server loads: sets NCCL_TUNER_CONFIG_FILE and "
                                   "leaves out NCCL_ALGO / NCCL_PROTO, which mask the plugin"),
    keep_observation: bool = typer.Option(
        False, "--keep-observation",
        help="keep what the sweep set only to observe (NCCL_DEBUG*, the device timer, --enable-metrics)"),
    workdir: Path | None = typer.Option(None, "--workdir", help="the sweep's work directory"),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow tracking URI (instead of --workdir)"),
    model: str | None = typer.Option(None, "--model", help="registered model name (with --tracking-uri)"),
    alias: str = typer.Option("champion", "--alias"),
) -> None:
    """Write the configuration registered under models:/<name>@<alias> for where it is loaded: a shell env
    file, a docker --env-file, a Kubernetes ConfigMap, json or an SGLang argument line. Production by
    default: what the sweep set only to observe is left out and named in the header."""
    if fmt not in formats.EXPORT_FORMATS:
        raise UserError(f"--format must be one of {', '.join(formats.EXPORT_FORMATS)}, but got {fmt!r}")
    _check_output(output)
    if fmt == formats.TUNER_FORMAT:
        _export_tuner(output, workdir)
        return
    wd: Path | None = None
    if tracking_uri:
        if not model:
            raise UserError("--tracking-uri needs --model NAME (the registered model name)")
        if problem := tracking_uri_problem(tracking_uri):
            raise UserError(f"--tracking-uri {problem}")
        tracker = _tracker(tracking_uri, "sglang-sweep", Path.cwd())
    else:
        wd = _workdir(workdir)
        state = read_state(wd)
        tracker = _tracker(state.tracking_uri, state.experiment_in_mlflow, wd)
        model = model or state.model_name
    try:
        config = tracker.resolve(model, alias)
    except SweepToolError:
        last = _last_verdict(wd) if wd is not None else None
        if last is None:
            raise
        raise NoChampion(f"nothing to export from {wd}: {last}") from None
    try:
        text = formats.render_for(config, fmt, keep_observation=keep_observation, tuner_file=tuner_file)
    except ValueError as exc:
        raise UserError(f"cannot export as {fmt}: {exc}") from None
    try:
        fsio.write_atomic(output, text)
    except OSError as exc:
        raise UserError(f"-o {output}: cannot write it ({exc.strerror or exc}); name a regular file in a folder "
                        f"you can write to") from None
    out.print(f"wrote {output} ({fmt}) from models:/{model}@{alias}: trial {config.get('trial_number')}, "
              f"run {config.get('run_id')}")


def _export_tuner(output: Path, workdir: Path | None) -> None:
    """`sweep export --format nccl-tuner`: the probe's per-size rules for NCCL's example tuner plugin."""
    text, path = tuner_file_from(workdir or _workdir(None))
    fsio.write_atomic(output, text)
    rules = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    out.print(f"wrote {output} (nccl-tuner, {rules} rules from {path}); load it with "
              f"NCCL_TUNER_PLUGIN=<libnccl-tuner-example.so> NCCL_TUNER_CONFIG_FILE={output} and NCCL_ALGO / "
              f"NCCL_PROTO unset (sweep export --tuner-file {output} writes such an env file)", soft_wrap=True)


def _last_verdict(wd: Path) -> str | None:
    """The verdict the last sweep in `wd` reached without promoting (summary.json), or None."""
    try:
        summary = st.SweepSummary.model_validate_json((wd / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if summary.promoted:
        return None
    outcome = summary.outcome.value.replace("_", " ") if summary.outcome else "no verdict"
    return (f"the last sweep finished without a champion ({outcome}): {summary.verdict or summary.stop_reason}")


def _check_output(output: Path) -> None:
    """UserError unless `output` names a file that can be written in an existing folder (checked first,
    so a mistyped -o fails before MLflow is asked)."""
    if output.is_dir():
        raise UserError(f"-o {output}: is a directory; name the file to write, e.g. -o {output / 'champion.env'}")
    folder = output.parent
    if not folder.is_dir():
        raise UserError(f"-o {output}: the folder {folder} does not exist; create it or write elsewhere")
    if not os.access(folder, os.W_OK) or (output.exists() and not output.is_file()):
        raise UserError(f"-o {output}: cannot write there; name a regular file in a folder you can write to")


@app.command()
@_guard
def truth(
    experiment: Path = typer.Argument(..., help="experiment YAML (engine: simulator)"),
    top: int = typer.Option(10, "--top", help="how many of the best points to list"),
    workdir: Path | None = typer.Option(None, "--workdir", help="also rank this sweep's best trial"),
) -> None:
    """Evaluate the simulator's noise-free model on every feasible point: the true optimum and ranks."""
    s = _load(experiment)
    if s.engine != "simulator":
        raise UserError(f"{experiment}: `sweep truth` needs engine: simulator (the model is the simulator's)")
    if s.objective.metric not in truth_mod.MODELLED:
        raise UserError(f"{experiment}: objective.metric {s.objective.metric} is not predicted by the simulator's "
                        f"noise-free model; `sweep truth` ranks by {', '.join(truth_mod.MODELLED)}")
    with err.status("evaluating every feasible point of the space..."):
        check_enumerable(s.space, "sweep truth")
        t = truth_mod.compute(s)
    table = Table(title=f"{s.name}: {len(t.values)} feasible points on {s.simulator.hardware_profile} "
                        f"(noise-free {s.objective.metric})")
    table.add_column("rank", justify="right")
    table.add_column(s.objective.metric, justify="right")
    table.add_column("configuration")
    for i, (value, params) in enumerate(zip(t.values[:top], t.points[:top]), 1):
        table.add_row(str(i), f"{value:.2f}",
                      ", ".join(f"{k}={v}" for k, v in params.items() if v is not None) or "engine defaults")
    out.print(table)
    if workdir is not None:
        best = status_report(workdir).best
        if best:
            value = truth_mod.evaluator(s)(sp.complete(s.space, best.params))
            ratio = value / t.optimum if t.maximize else t.optimum / value
            out.print(f"sweep best (trial {best.number}): true {s.objective.metric} {value:.2f} = "
                      f"{ratio * 100:.1f}% of the optimum, rank {t.rank_of_value(value)} of {len(t.values)}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
