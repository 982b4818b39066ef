"""`sweep probe`, `sweep run`, `sweep status` and `sweep sync`: the night itself and how it is going."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import typer
from rich.markup import escape
from rich.status import Status
from rich.table import Table

from orchestrator.cli._app import (
    WORKDIR,
    app,
    err,
    guard,
    load_experiment,
    open_tracker,
    out,
    publish_report,
    resolve_workdir,
)
from orchestrator.config import experiment as spec_mod
from orchestrator.config.fields import tracking_uri_problem
from orchestrator.errors import NoChampion, SweepError, SweepToolError, UserError
from orchestrator.probe import nccl_dimensions, rank_settings, run_probe
from orchestrator.probe.result import ProbeResult, RankedSetting, backend_lines
from orchestrator.records import TrialStatus
from orchestrator.sweep import state as st
from orchestrator.sweep._probe_stage import probe_log
from orchestrator.sweep.status import LiveProgress, StatusReport, moved_from, read_state, status_report
from orchestrator.tracking import probe_run
from orchestrator.tracking.probe_run import ProbeLog
from orchestrator.verdict import render as verdict_render


@app.command()
@guard
def probe(
    experiment: Path = typer.Argument(..., help="experiment YAML"),
    workdir: Path | None = typer.Option(
        None, "--workdir", parser=WORKDIR, help="where probe.json goes (default runs/<name>)"
    ),
    budget: int | None = typer.Option(
        None, "--budget", min=1, help="NCCL settings to probe (default probe.budget, else 48)"
    ),
    keep_within: float | None = typer.Option(
        None, "--keep-within", help="keep settings within this ratio of the best latency (default probe.keep_within)"
    ),
    top: int = typer.Option(15, "--top", min=1, help="rows of the ranking to print"),
    no_mlflow: bool = typer.Option(False, "--no-mlflow", help="do not log the probe to MLflow"),
) -> None:
    """Measure the host's tensor-parallel all-reduce per NCCL setting without loading a model; rank the
    settings by latency at the verify sizes; write probe.json and log an MLflow run."""
    s = load_experiment(experiment, here=True)
    ratio = keep_within if keep_within is not None else s.probe.keep_within
    if not ratio >= 1.0:
        raise UserError(f"--keep-within is a ratio to the best latency and must be >= 1.0, but got {ratio}")
    if not nccl_dimensions(s):
        raise UserError(
            f"{experiment}: the search space has no NCCL variable to probe (add e.g. "
            f"search_spaces/nccl.yaml to search_space)"
        )
    wd = resolve_workdir(workdir, s)
    result = run_probe(s, wd, budget=budget or s.probe.budget)
    if result.skipped:
        raise SweepError(f"probe on {result.host}: {result.skipped} (wrote {wd / 'probe.json'})")
    ranked = rank_settings(result, keep_within=ratio)
    out.print(_probe_table(s, result, ranked, top))
    for line in backend_lines(result, keep_within=ratio):  # the other backends at the same sizes (issue 19)
        out.print(line, soft_wrap=True, highlight=False, markup=False)
    kept = sum(r.kept for r in ranked)
    out.print(
        f"{kept} setting(s) within {ratio:g}x of the best (NCCL defaults always kept); score: mean latency at "
        f"the verify sizes; {result.seconds:.1f} s, {result.seconds_per_setting:.3f} s per setting; "
        f"wrote {wd / 'probe.json'}",
        soft_wrap=True,
    )
    if not no_mlflow:
        _log_probe(s, wd, probe_log(result, ranked, keep_within=ratio))


def _probe_table(s: spec_mod.SweepSpec, result: ProbeResult, ranked: tuple[RankedSetting, ...], top: int) -> Table:
    """The probe's ranking, best first, `top` rows."""
    table = Table(
        title=f"{s.name}: {len(result.settings)} of {result.space_settings} NCCL settings on "
        f"{result.host} (tp {result.tp}, NCCL {result.nccl_version or '?'})"
    )
    for col in ("rank", "us", "x best", "kept", "setting"):
        table.add_column(col, justify="right" if col in ("rank", "us", "x best") else "left")
    for r in ranked[:top]:
        table.add_row(
            str(r.rank),
            f"{r.score_us:.1f}" if r.score_us is not None else "failed",
            f"{r.relative:.2f}" if r.relative is not None else "-",
            "yes" if r.kept else "",
            escape(r.setting),
        )
    return table


def _log_probe(s: spec_mod.SweepSpec, wd: Path, logged: ProbeLog) -> None:
    """The probe as an MLflow run (a warning, not a failure, when MLflow refuses: probe.json holds it)."""
    uri = s.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(wd / 'mlflow.db').resolve()}"
    try:
        run_id = probe_run.log_probe(uri, s.tracking.experiment or s.name, logged)
    except SweepToolError as exc:
        err.print(f"[yellow]warning:[/] {escape(str(exc))}; probe.json holds the result", soft_wrap=True)
    else:
        out.print(f"MLflow run {run_id} (ranking table and latency plot)")


# ---------------------------------------------------------------------------- run


def _progress_printer(
    live: LiveProgress | None = None, line: Status | None = None, *, objective: str = "decode_tok_s"
) -> Callable[[st.Event], None]:
    """Print each event; with `live` and `line` (a terminal), keep the live line (trials in flight, best so
    far, ETA, phase) under the printed ones. A finished trial shows the `objective` metric, the one its
    percentage against the baseline is of."""

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
        elif isinstance(event, st.ArmDropped):
            out.print(
                f"[yellow]· confirmation: {escape(event.name)} not measured: {escape(event.why)}[/]", soft_wrap=True
            )
        elif isinstance(event, st.TrialLaunched):
            knobs = ", ".join(f"{k}={v}" for k, v in event.params.items() if v is not None) or "engine defaults"
            out.print(f"[cyan]▶ trial {event.number:>3}[/] {event.role:<8} {knobs}", soft_wrap=True)
        elif isinstance(event, st.TrialSkipped):
            out.print(f"[dim]· trial {event.number:>3} skipped: {escape(event.why)}[/]", soft_wrap=True)
        elif isinstance(event, st.TrialFinished):
            o = event.outcome
            took = max(o.finished_at - o.started_at, 0.0) if o.started_at and o.finished_at else 0.0
            if o.status is TrialStatus.COMPLETE and o.metrics is not None:
                sp_txt = f" ({(event.speedup - 1) * 100:+.1f}% vs baseline)" if event.speedup else ""
                label = o.metrics.acceptance_label
                al = (
                    f", accept len {o.metrics.accept_length:.2f}{f' ({label})' if label else ''}"
                    if o.metrics.accept_length
                    else ""
                )
                value = getattr(o.metrics, objective)
                shown = (
                    f"{value:7.1f} tok/s"
                    if objective == "decode_tok_s"
                    else (f"{objective} {value:.2f}" if value is not None else f"{objective} not measured")
                )
                out.print(f"[green]✔ trial {o.number:>3}[/] {shown}{sp_txt}{al}  [dim]took {took:4.0f}s[/]")
            else:
                kind_txt = o.failure_kind.value if o.failure_kind else o.status.value
                out.print(
                    f"[red]✘ trial {o.number:>3}[/] {kind_txt}: {o.reason}  [dim]took {took:.0f}s[/]", soft_wrap=True
                )
        elif isinstance(event, st.TrackingWait):
            out.print(
                f"[yellow]MLflow unreachable: {event.pending} result(s) in the outbox; waiting up to "
                f"{event.wait_s:.0f}s before promoting (`sweep sync` sends them later)[/]"
            )
        elif isinstance(event, st.ConfirmationRun):
            out.print(f"[magenta]⇄ confirmation {event.round}/{event.of}: {event.who}[/]")
        elif isinstance(event, st.Interrupted):
            msg = (
                "stopping after the trials in flight (Ctrl-C again to abort them)"
                if event.press == 1
                else "aborting the trials in flight"
            )
            out.print(f"[yellow]{msg}[/]")

    return on_event


@app.command()
@guard
def run(
    experiment: Path = typer.Argument(..., help="experiment YAML"),
    n_trials: int | None = typer.Option(None, "--n-trials", min=1, help="override budget.trials"),
    timeout: str | None = typer.Option(None, "--timeout", help="wall-time budget, e.g. 8h, 90m"),
    workdir: Path | None = typer.Option(None, "--workdir", parser=WORKDIR, help="default runs/<experiment name>/"),
    ray_address: str | None = typer.Option(None, "--ray-address", help="existing Ray cluster, e.g. auto"),
    storage: str | None = typer.Option(
        None,
        "--storage",
        envvar="SWEEP_OPTUNA_STORAGE",
        help="Optuna RDB URL (e.g. postgresql://...); default sqlite in the work directory",
    ),
    resume: bool = typer.Option(False, "--resume", help="continue the sweep in the work directory"),
) -> None:
    """Run (or resume) a sweep: trials on Ray, Optuna proposing, MLflow recording, champion promoted."""
    # The driver stack imports Ray and MLflow: only `sweep run` needs them.
    from orchestrator.execute.ray_actor import RayExecutor
    from orchestrator.sweep.driver import Sweep  # deferred with Ray: MLflow

    # The sweep prints its own progress; MLflow's schema-migration chatter is not news to a user.
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # MLflow's sqlite session logs every OperationalError with its traceback before it re-raises it
    # (mlflow/store/db/utils.py, make_managed_session); the tracker turns the re-raised error into one
    # message (a full disk among them), so the traceback is noise on the user's console.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
    # Ray's note that its local cluster uses token authentication is not the user's concern here.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)

    if ray_address is not None:
        _check_ray_address(ray_address)
    s = load_experiment(experiment, here=ray_address is None)  # on a cluster the trials run on other hosts
    try:
        timeout_s = spec_mod.parse_duration(timeout) if timeout is not None else None  # --timeout '' is refused
    except ValueError as exc:
        raise UserError(f"--timeout: {exc}") from None
    wd = resolve_workdir(workdir, s)
    line = out.status("starting...") if out.is_terminal else None
    printer = _progress_printer(
        LiveProgress(
            budget=n_trials or s.budget.trials,
            objective=s.objective.metric,
            maximize=s.objective.direction == "maximize",
        ),
        line,
        objective=s.objective.metric,
    )
    banner: list[str] = []

    def on_event(event: st.Event) -> None:
        # The banner waits for the sweep's first event: a start refused before it (a work directory in
        # use, nothing to resume, Ray that does not start) prints only its one message.
        if banner:
            out.print(banner.pop())
        printer(event)

    sweep = Sweep(
        s,
        wd,
        executor=RayExecutor.for_sweep(s, ray_address),
        storage=storage,
        resume=resume,
        n_trials=n_trials,
        timeout_s=timeout_s,
        on_event=on_event,
    )
    banner.append(
        f"[bold]sweep {s.name}[/] ({s.engine}) in {wd}: up to {sweep.budget_trials} trials, "
        f"{s.budget.concurrent_trials} at a time, objective {s.objective.direction} {s.objective.metric}"
    )
    try:
        summary = sweep.run()
    finally:
        if line is not None:
            line.stop()
    _print_summary(s, summary, wd)
    publish_report(wd, storage)
    if summary.stopped_by_failure:
        raise typer.Exit(1)
    if not summary.promoted:
        raise typer.Exit(NoChampion.exit_code)  # finished without a champion (README: exit codes)


def _check_ray_address(address: str) -> None:
    """UserError for a --ray-address the driver cannot join as a node of the cluster."""
    if "://" in address:
        scheme = address.split("://", 1)[0]
        what = "Ray Client addresses" if scheme == "ray" else f"{scheme}:// addresses"
        raise UserError(
            f"--ray-address {address}: {what} are not supported (the driver runs on a node of the "
            f"cluster); run sweep on a cluster node with --ray-address auto, or give the head's GCS "
            f"address as HOST:PORT, e.g. 10.0.0.1:6379"
        )
    host, sep, port = address.rpartition(":")
    if address != "auto" and not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise UserError(
            f"--ray-address {address!r}: must be auto or the head's GCS address HOST:PORT, e.g. 10.0.0.1:6379"
        )


def _print_summary(s: spec_mod.SweepSpec, summary: st.SweepSummary, wd: Path) -> None:
    out.rule("summary")
    out.print(f"stopped: {summary.stop_reason or 'done'}")
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(summary.failures.items()))
    out.print(
        f"trials: {summary.complete} complete, {summary.failed} failed"
        f"{f' ({kinds})' if kinds else ''}, {summary.skipped} proposals skipped (infeasible or repeated)"
    )
    drift = summary.baseline_drift
    if drift.flagged and drift.max_relative_change is not None:
        out.print(f"[yellow]baseline drifted by {drift.max_relative_change * 100:.1f}% during the sweep[/]")
    verdict = summary.the_verdict()
    for line in verdict_render.lines(verdict) if verdict is not None else []:
        out.print(line, soft_wrap=True, highlight=False, markup=False)
    if summary.importances:
        top = ", ".join(f"{k} {v:.2f}" for k, v in list(summary.importances.items())[:5])
        out.print(f"  parameter importances (Optuna, fANOVA): {top}", soft_wrap=True)
    if verdict is not None and verdict.promoted and verdict.deployed is not None:
        label = " [yellow]UNCONFIRMED[/]" if not verdict.gated else ""
        out.print(
            f"[green]promoted[/]{label} {s.promotion.model_name}@{s.promotion.alias} (version "
            f"{verdict.model_version}): {escape(verdict.deployed.label)}: {escape(verdict.text)}",
            soft_wrap=True,
        )
        out.print(f"env file: [bold]{verdict.env_file}[/]")
    elif verdict is not None:
        out.print(f"[yellow]not promoted ({_outcome_words(verdict)})[/]: {escape(verdict.text)}", soft_wrap=True)
    out.print(f"browse the results: [bold]sweep ui --workdir {wd}[/]")


# ---------------------------------------------------------------------------- status / sync / ui / export


def _print_schedule(lines: list[str]) -> None:
    """The night's plan as the running driver last wrote it (sweep.schedule)."""
    if lines:
        out.print("schedule: " + lines[0], soft_wrap=True, highlight=False, markup=False)
    for line in lines[1:]:
        out.print(f"    {line}", soft_wrap=True, highlight=False, markup=False)


@app.command()
@guard
def status(
    workdir: Path | None = typer.Option(None, "--workdir", parser=WORKDIR, help="the sweep's work directory"),
    storage: str | None = typer.Option(
        None,
        "--storage",
        envvar="SWEEP_OPTUNA_STORAGE",
        help="the Optuna RDB URL the sweep used, when not its sqlite file",
    ),
    as_json: bool = typer.Option(False, "--json", help="print the report and the verdict as one JSON object"),
) -> None:
    """Progress, ETA, best so far and failures of a sweep (running or finished), from its storage; once
    finished, its verdict: the deployed configuration, its knobs and its own figures."""
    wd = resolve_workdir(workdir)
    rep = status_report(wd, storage)
    verdict = rep.decision if rep.status != "running" else None
    if as_json:  # for scripts: the same report and Verdict as JSON, on one line
        payload = {"workdir": str(wd), **dataclasses.asdict(rep), "decision": _verdict_json(verdict)}
        typer.echo(json.dumps(payload, default=str))
        return
    if (line := moved_from(wd)) is not None:
        out.print(f"note: {line}", soft_wrap=True, highlight=False, markup=False)
    _print_progress(wd, rep)
    _print_best(rep, verdict)
    _print_health(rep)
    if verdict is not None:
        for line in verdict_render.lines(verdict):
            out.print(line, soft_wrap=True, highlight=False, markup=False)
        out.print(f"verdict ({_outcome_words(verdict)}): {escape(verdict.text)}", soft_wrap=True)
    env_file = verdict.env_file if verdict is not None and verdict.promoted else rep.env_file
    if env_file:
        out.print(f"env file: [bold]{env_file}[/]")


def _verdict_json(verdict: st.Verdict | None) -> dict[str, object] | None:
    return None if verdict is None else verdict.model_dump(mode="json")


def _print_progress(wd: Path, rep: StatusReport) -> None:
    """Whose sweep, how far, how long, and the night's plan while it runs."""
    dead = (
        ""
        if rep.driver_alive or rep.status != "running"
        else " [red](driver not running: resume with `sweep run EXP --resume`)[/]"
    )
    out.print(f"[bold]{rep.experiment}[/] in {wd}: {rep.status}{dead}")
    out.print(
        f"progress: {rep.launched}/{rep.budget_trials} trials launched, {rep.complete} complete, "
        f"{rep.failed} failed, {rep.running} running, {rep.skipped} proposals skipped"
    )
    out.print(f"phase: {rep.phase}")
    if rep.eta_s is not None:
        out.print(f"elapsed {rep.elapsed_s / 60:.1f} min, ETA {rep.eta_s / 60:.1f} min")
    if rep.remaining is not None:
        r = rep.remaining
        out.print(
            f"measured per trial: start-up {r.startup_s:.0f} s + benchmark {r.bench_s:.0f} s (median of "
            f"{r.measured}); about {r.trials} more fit the wall time left"
        )
    _print_schedule(rep.schedule if rep.status == "running" else [])
    if rep.failures:
        out.print("failures by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(rep.failures.items())))


def _print_best(rep: StatusReport, verdict: st.Verdict | None) -> None:
    """The best single search measurement (with its knobs while the search runs; once decided, the verdict's
    knobs are what is shown) and the latest baseline."""
    best = rep.best
    if best:
        sp_txt = f" ({best.speedup_pct:+.1f}% vs baseline)" if best.speedup_pct is not None else ""
        label = "best so far" if rep.phase == "search" else "best single search measurement"
        out.print(f"{label}: trial {best.number}: {rep.objective} = {best.value:.2f}{sp_txt} (search phase)")
        for k, v in best.params.items() if verdict is None else ():
            out.print(f"    {k} = {v}")
    if rep.baseline is not None:
        out.print(f"baseline: {rep.baseline:.2f} ({len(rep.baselines)} measurement(s))")


def _print_health(rep: StatusReport) -> None:
    """Fingerprint changes during the sweep and why it stopped."""
    for node, hashes in rep.fingerprints.items():
        out.print(
            f"[yellow]warning: the fingerprint of {node or 'the host'} changed during the sweep "
            f"({', '.join(hashes)}): compare fingerprint.json of its trials[/]"
        )
    if rep.stop_reason:
        out.print(f"stop reason: {rep.stop_reason}")


def _outcome_words(verdict: st.Verdict) -> str:
    return verdict.outcome.words if verdict.outcome is not None else "interrupted"


@app.command()
@guard
def sync(
    workdir: Path | None = typer.Option(None, "--workdir", parser=WORKDIR),
    tracking_uri: str | None = typer.Option(
        None, "--tracking-uri", help="where the MLflow server is now, if it moved (default: the sweep's own)"
    ),
) -> None:
    """Replay results queued in the outbox while MLflow was unreachable."""
    if tracking_uri is not None and (problem := tracking_uri_problem(tracking_uri)):
        raise UserError(f"--tracking-uri {problem}")
    wd = resolve_workdir(workdir)
    state = read_state(wd)
    uri = tracking_uri or state.tracking_uri
    replayed, pending = open_tracker(uri, state.experiment_in_mlflow, wd).replay_outbox()
    out.print(f"replayed {replayed} result(s) to {uri}; {pending} still pending")
    if pending:
        raise typer.Exit(1)
