"""`sweep probe` in MLflow: one run with the ranking as a table, every measured row as JSON, and a
plot of all-reduce latency against message size (the NCCL defaults, the best setting and its
runners-up)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from orchestrator.errors import TrackingError
from orchestrator.probe import DEFAULTS_LABEL, ProbeResult, RankedSetting
from orchestrator.tracking._client import Store
from orchestrator.tracking.outage import classify

PLOTTED = 4
"""Settings drawn in the latency plot besides the NCCL defaults."""


def _plot(result: ProbeResult, ranked: Sequence[RankedSetting], path: Path) -> None:
    import matplotlib  # deferred: only the probe's MLflow run draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.setting for r in ranked if r.score_us is not None][:PLOTTED]
    if DEFAULTS_LABEL not in names:
        names.append(DEFAULTS_LABEL)
    mode = "graph" if any(r.mode == "graph" for r in result.rows) else "eager"
    fig, ax = plt.subplots(figsize=(9, 5))
    for name in names:
        rows = sorted((r for r in result.rows if r.setting == name and r.mode == mode and r.median_us is not None),
                      key=lambda r: r.nbytes)
        if rows:
            ax.plot([r.nbytes for r in rows], [r.median_us or 0.0 for r in rows], marker="o",
                    label=name if len(name) < 70 else name[:67] + "...")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("all-reduce message (bytes)")
    ax.set_ylabel(f"median latency (us, {mode})")
    ax.set_title(f"{result.experiment} on {result.host}, tp {result.tp}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def log_probe(tracking_uri: str, experiment: str, result: ProbeResult, ranked: Sequence[RankedSetting], *,
              keep_within: float) -> str:
    """Log the probe as one MLflow run of `experiment`; returns the run id. TrackingError when the
    store cannot be used."""
    store = Store(tracking_uri, experiment)
    try:
        client = store.client()
        run = client.create_run(store.experiment_id(), run_name=f"probe-{time.strftime('%Y%m%d-%H%M%S')}",
                                tags={"sweep.kind": "probe", "sweep.engine": result.engine})
        run_id = run.info.run_id
        best = next((r for r in ranked if r.score_us is not None), None)
        defaults = next((r for r in ranked if r.setting == DEFAULTS_LABEL), None)
        for key, value in (("host", result.host), ("tp", result.tp), ("nccl_version", result.nccl_version or "?"),
                           ("settings_in_space", result.space_settings), ("keep_within", keep_within),
                           ("best_setting", best.setting if best else "-")):
            client.log_param(run_id, key, str(value)[:500])
        metrics = {"settings_probed": float(len(result.settings)), "seconds": result.seconds,
                   "seconds_per_setting": result.seconds_per_setting,
                   "kept": float(sum(r.kept for r in ranked))}
        if best and best.score_us is not None:
            metrics["best_verify_us"] = best.score_us
        if defaults and defaults.score_us is not None:
            metrics["defaults_verify_us"] = defaults.score_us
        for key, value in metrics.items():
            client.log_metric(run_id, key, value)
        table = {"rank": [r.rank for r in ranked], "setting": [r.setting for r in ranked],
                 "score_us": [r.score_us for r in ranked], "relative": [r.relative for r in ranked],
                 "kept": [r.kept for r in ranked]}
        client.log_table(run_id, data=table, artifact_file="probe_ranking.json")
        with tempfile.TemporaryDirectory() as tmp:
            rows = Path(tmp) / "probe.json"
            rows.write_text(result.model_dump_json(indent=1), encoding="utf-8")
            client.log_artifact(run_id, str(rows))
            plot = Path(tmp) / "probe_latency.png"
            _plot(result, ranked, plot)
            client.log_artifact(run_id, str(plot))
        client.set_terminated(run_id, "FINISHED")
        return str(run_id)
    except TrackingError:
        raise
    except Exception as exc:  # noqa: BLE001 - MLflow's many store errors, worded once
        kind = classify(exc).value
        raise TrackingError(f"{store.where()}: the probe's run could not be logged ({kind}: "
                            f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''})") from None
