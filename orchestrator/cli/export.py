"""`sweep export`: the champion in the form the place that loads it reads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from orchestrator import fsio
from orchestrator.cli._app import WORKDIR, app, check_output, guard, open_tracker, out, resolve_workdir
from orchestrator.config.fields import tracking_uri_problem
from orchestrator.errors import NoChampion, SweepToolError, UserError
from orchestrator.probe.result import ProbeRow, read_probe
from orchestrator.probe.tuner import render_tuner_config, tuner_file_from
from orchestrator.records import ServingConfig
from orchestrator.results import adaptive_export, formats
from orchestrator.results.deployable import deploy_only
from orchestrator.sweep import state as st
from orchestrator.sweep.status import read_state

if TYPE_CHECKING:  # the tracker imports MLflow: `export` opens it through open_tracker
    from orchestrator.tracking.tracker import Tracker


@app.command()
@guard
def export(
    output: Path = typer.Option(..., "-o", "--output", help="file to write (atomically)"),
    fmt: str = typer.Option(
        "env",
        "--format",
        help="env | docker-env | k8s | json | sglang-args (one argument a line, for mapfile) | nccl-tuner (rules "
        "from the work directory's probe.json) | adaptive-config (--speculative-adaptive-config slots from the work "
        "directory's measured loads)",
    ),
    tuner_file: str | None = typer.Option(
        None,
        "--tuner-file",
        help="the nccl-tuner rule file the server loads: sets NCCL_TUNER_CONFIG_FILE and "
        "leaves out NCCL_ALGO / NCCL_PROTO, which mask the plugin",
    ),
    keep_observation: bool = typer.Option(
        False,
        "--keep-observation",
        help="keep what the sweep set only to observe (NCCL_DEBUG*, the device timer, --enable-metrics)",
    ),
    workdir: Path | None = typer.Option(None, "--workdir", parser=WORKDIR, help="the sweep's work directory"),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow tracking URI (instead of --workdir)"),
    model: str | None = typer.Option(None, "--model", help="registered model name (with --tracking-uri)"),
    alias: str = typer.Option("champion", "--alias"),
    with_adaptive: Path | None = typer.Option(
        None,
        "--with-adaptive-config",
        help="carry this --speculative-adaptive-config JSON (sweep export --format adaptive-config): copied "
        "beside -o as NAME.adaptive.json, the champion's flags gain --speculative-adaptive and "
        "--speculative-adaptive-config pointing at it",
    ),
    adaptive_path: str | None = typer.Option(
        None,
        "--adaptive-config-path",
        help="where the server reads the carried adaptive config (absolute; default: the copy beside -o; in a "
        "container, where you mount it, e.g. /config/champion.adaptive.json)",
    ),
) -> None:
    """Write the configuration registered under models:/<name>@<alias> for where it is loaded: a shell env
    file, a docker --env-file, a Kubernetes ConfigMap, json or SGLang's arguments one a line. Production by
    default: what the sweep set only to observe is left out and named in the header."""
    if fmt not in formats.EXPORT_FORMATS:
        raise UserError(f"--format must be one of {', '.join(formats.EXPORT_FORMATS)}, but got {fmt!r}")
    check_output(output)
    _check_adaptive_options(fmt, with_adaptive, adaptive_path)
    if fmt == formats.TUNER_FORMAT:
        _export_tuner(output, workdir)
        return
    if fmt == formats.ADAPTIVE_FORMAT:
        _export_adaptive(output, workdir)
        return
    tracker, wd, model = _registry(workdir, tracking_uri, model)
    config = _champion(tracker, wd, model, alias)
    carried = _carry_adaptive(config, output, with_adaptive, adaptive_path) if with_adaptive is not None else None
    if carried is not None:
        config = carried.config
    try:
        text = formats.render_for(config, fmt, keep_observation=keep_observation, tuner_file=tuner_file)
    except ValueError as exc:
        raise UserError(f"cannot export as {fmt}: {exc}") from None
    if carried is not None:
        _write(carried.copy, carried.text)
        text = (carried.note if fmt in ("env", "docker-env", "k8s") else "") + text
    _write(output, text)
    out.print(f"wrote {output} ({fmt}) from models:/{model}@{alias}: trial {config.trial_number}, run {config.run_id}")
    if carried is not None:
        out.print(
            f"wrote {carried.copy} (the adaptive config); the flags read it at "
            f"{config.params['speculative_adaptive_config']}: ship it with the configuration (serve-champion: "
            "mount it there)",
            soft_wrap=True,
        )
    if left_out := deploy_only(config)[1]:  # json and sglang-args have no header to say it in
        out.print(
            f"left out, as only a deployment sets them (they load or run code): {' '.join(left_out)}; pass them "
            "with serve-champion --path-env NAME=VALUE, or after the image name",
            soft_wrap=True,
        )


def _check_adaptive_options(fmt: str, with_adaptive: Path | None, adaptive_path: str | None) -> None:
    """UserError for --with-adaptive-config / --adaptive-config-path where they mean nothing."""
    if (with_adaptive is not None or adaptive_path is not None) and fmt not in formats.FORMATS:
        raise UserError(f"--with-adaptive-config carries the adaptive config in a serving configuration, not in {fmt}")
    if adaptive_path is not None and with_adaptive is None:
        raise UserError("--adaptive-config-path needs --with-adaptive-config FILE (the adaptive config to carry)")


def _champion(tracker: Tracker, wd: Path | None, model: str, alias: str) -> ServingConfig:
    """The configuration registered under models:/<model>@<alias>; NoChampion naming the last verdict."""
    try:
        return tracker.resolve(model, alias)
    except SweepToolError:
        last = _last_verdict(wd) if wd is not None else None
        if last is None:
            raise
        raise NoChampion(f"nothing to export from {wd}: {last}") from None


def _registry(workdir: Path | None, tracking_uri: str | None, model: str | None) -> tuple[Tracker, Path | None, str]:
    """(the tracker, the work directory or None, the registered model's name) that --workdir, or
    --tracking-uri with --model, point at."""
    if tracking_uri:
        if not model:
            raise UserError("--tracking-uri needs --model NAME (the registered model name)")
        if problem := tracking_uri_problem(tracking_uri):
            raise UserError(f"--tracking-uri {problem}")
        return open_tracker(tracking_uri, "sglang-sweep", Path.cwd()), None, model
    wd = resolve_workdir(workdir)
    state = read_state(wd)
    model = model or state.model_name
    if not state.tracking_uri or not model:
        missing = " and ".join(n for n, v in (("tracking_uri", state.tracking_uri), ("model_name", model)) if not v)
        raise UserError(
            f"{wd / 'sweep.json'} names no {missing}, so there is no registry to export from: it "
            f"was overwritten or written before the sweep opened MLflow; pass --tracking-uri URI "
            f"--model NAME, or `sweep run EXPERIMENT --resume` writes it again"
        )
    return open_tracker(state.tracking_uri, state.experiment_in_mlflow, wd), wd, model


@dataclass(frozen=True)
class _Carried:
    """The serving config with the adaptive config carried, the copy to write and the header's line."""

    config: ServingConfig
    copy: Path
    text: str
    note: str


def _carry_adaptive(config: ServingConfig, output: Path, source: Path, at: str | None) -> _Carried:
    """--with-adaptive-config SOURCE: its JSON (checked as 0.5.23's loader checks it) copied beside `output`, and
    `config` running adaptive speculation from it at `at` (default: the copy's absolute path)."""
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UserError(
            f"--with-adaptive-config {source}: cannot read it ({reason}); write it with sweep export --format "
            "adaptive-config -o FILE"
        ) from None
    copy = output.with_name(f"{output.stem}.adaptive.json")
    check_output(copy, "champion.adaptive.json")
    path = at if at is not None else str(copy.resolve())
    try:
        carried = adaptive_export.carried(config, text, path)
    except ValueError as exc:
        raise UserError(f"--with-adaptive-config {source}: {exc}") from None
    note = (
        f"# adaptive speculation: --speculative-adaptive-config {path} (a copy of {source} written to {copy}); "
        "the server must find it at that path\n"
    )
    return _Carried(carried, copy, text, " ".join(note.splitlines()) + "\n")


def _write(output: Path, text: str) -> None:
    try:
        fsio.write_atomic(output, text)
    except OSError as exc:
        raise UserError(
            f"-o {output}: cannot write it ({exc.strerror or exc}); name a regular file in a folder you can write to"
        ) from None


def _export_tuner(output: Path, workdir: Path | None) -> None:
    """`sweep export --format nccl-tuner`: the probe's per-size rules for NCCL's example tuner plugin, never
    choosing a protocol or algorithm the search's correctness screen refused."""
    # Deferred with the modules it pulls in (MLflow): only the nccl-tuner format reads the trials.
    from orchestrator.sweep.publish import outcomes

    wd = workdir or resolve_workdir(None)
    text, path = tuner_file_from(wd)
    refused = formats.screen_refused(outcomes(wd))
    if refused:
        text = _without_refused(path, refused)
    _write(output, text)
    rules = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    out.print(
        f"wrote {output} (nccl-tuner, {rules} rules from {path}); load it with "
        f"NCCL_TUNER_PLUGIN=<libnccl-tuner-example.so> NCCL_TUNER_CONFIG_FILE={output} and NCCL_ALGO / "
        f"NCCL_PROTO unset (sweep export --tuner-file {output} writes such an env file)",
        soft_wrap=True,
    )


def _without_refused(path: Path, refused: dict[str, dict[str, list[int]]]) -> str:
    """The rules of probe.json at `path` from the rows whose NCCL choice uses nothing in `refused`
    (formats.screen_refused), headed by what was left out and why."""
    result = read_probe(path)

    def allowed(row: ProbeRow) -> bool:
        choice = row.nccl_choice
        return choice is None or (
            formats.tuner_name(choice.protocol) not in refused.get("protocol", {})
            and formats.tuner_name(choice.algorithm) not in refused.get("algorithm", {})
        )

    why = [
        f"# left out {kind} {value}: the correctness screen refused every search trial that set "
        f"{'NCCL_PROTO' if kind == 'protocol' else 'NCCL_ALGO'} to it (trials {', '.join(map(str, trials))})"
        for kind, values in refused.items()
        for value, trials in values.items()
    ]
    try:
        text = render_tuner_config(result.model_copy(update={"rows": tuple(filter(allowed, result.rows))}))
    except ValueError:
        raise UserError(
            f"cannot derive tuner rules from {path}: every probed size's choices use what the correctness "
            f"screen refused ({'; '.join(line[2:] for line in why)})"
        ) from None
    return "\n".join(why) + "\n" + text


def _export_adaptive(output: Path, workdir: Path | None) -> None:
    """`sweep export --format adaptive-config`: --speculative-adaptive-config slots from the measured loads."""
    wd = workdir or resolve_workdir(None)
    try:
        text, slots = adaptive_export.export_from_workdir(wd)
    except ValueError as exc:
        raise UserError(f"cannot export as adaptive-config from {wd}: {exc}") from None
    fsio.write_atomic(output, text)
    chosen = "; ".join(f"batch {s.batch_size}: steps {list(s.candidate_steps)}" for s in slots)
    out.print(f"wrote {output} (adaptive-config: {chosen}); pass it as --speculative-adaptive-config", soft_wrap=True)


def _last_verdict(wd: Path) -> str | None:
    """The verdict the last sweep in `wd` reached without promoting (summary.json), or None."""
    try:
        summary = st.SweepSummary.model_validate_json((wd / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if summary.promoted:
        return None
    outcome = summary.outcome.value.replace("_", " ") if summary.outcome else "no verdict"
    return f"the last sweep finished without a champion ({outcome}): {summary.verdict or summary.stop_reason}"
