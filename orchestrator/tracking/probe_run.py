"""`sweep probe` in MLflow: one run with the ranking as a table, the whole probe.json, and a plot of
all-reduce latency against message size (the NCCL defaults, the best setting and its runners-up).

Plain data in (the probe room is above this one): the caller turns its ProbeResult into a `ProbeLog`.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import TrackingError
from orchestrator.tracking._client import Store
from orchestrator.tracking.outage import classify


@dataclass(frozen=True)
class Curve:
    """One setting's median latency (us) by message size (bytes)."""

    label: str
    nbytes: Sequence[int]
    us: Sequence[float]


@dataclass(frozen=True)
class ProbeLog:
    """What the probe's MLflow run holds."""

    title: str
    params: Mapping[str, str]
    metrics: Mapping[str, float]
    table: Mapping[str, Sequence[Any]]
    """Columns of the ranking (rank, setting, score_us, relative, kept)."""
    probe_json: str
    curves: Sequence[Curve] = field(default_factory=tuple)
    mode: str = "graph"
    engine: str = "simulator"


def _plot(log: ProbeLog, path: Path) -> None:
    import matplotlib  # deferred: importing matplotlib takes ~0.5 s and only this run draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred with matplotlib (above)

    fig, ax = plt.subplots(figsize=(9, 5))
    for curve in log.curves:
        ax.plot(
            list(curve.nbytes),
            list(curve.us),
            marker="o",
            label=curve.label if len(curve.label) < 70 else curve.label[:67] + "...",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("all-reduce message (bytes)")
    ax.set_ylabel(f"median latency (us, {log.mode})")
    ax.set_title(log.title)
    if log.curves:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def log_probe(tracking_uri: str, experiment: str, log: ProbeLog) -> str:
    """Log the probe as one MLflow run of `experiment`; returns the run id. TrackingError when the
    store cannot be used."""
    store = Store(tracking_uri, experiment)
    try:
        client = store.client()
        run = client.create_run(
            store.experiment_id(),
            run_name=f"probe-{time.strftime('%Y%m%d-%H%M%S')}",
            tags={"sweep.kind": "probe", "sweep.engine": log.engine},
        )
        run_id = run.info.run_id
        for key, value in log.params.items():
            client.log_param(run_id, key, str(value)[:500])
        for key, number in log.metrics.items():
            client.log_metric(run_id, key, float(number))
        client.log_table(run_id, data=dict(log.table), artifact_file="probe_ranking.json")
        with tempfile.TemporaryDirectory() as tmp:
            rows = Path(tmp) / "probe.json"
            rows.write_text(log.probe_json, encoding="utf-8")
            client.log_artifact(run_id, str(rows))
            plot = Path(tmp) / "probe_latency.png"
            _plot(log, plot)
            client.log_artifact(run_id, str(plot))
        client.set_terminated(run_id, "FINISHED")
        return str(run_id)
    except TrackingError:
        raise
    except Exception as exc:  # noqa: BLE001 - MLflow's many store errors, worded once
        first = str(exc).splitlines()[0][:300] if str(exc) else ""
        raise TrackingError(
            f"{store.where()}: the probe's run could not be logged ({classify(exc).value}: "
            f"{type(exc).__name__}: {first})"
        ) from None
