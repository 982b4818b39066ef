"""Where results are recorded (the only MLflow importer).

- `tracker`: `Tracker`, the thin facade the driver and the CLI use.
- `runs`: the parent run per sweep, a child run per trial, the summary, reading child runs back.
- `outbox`: typed outbox lines (`OutboxEntry`), the back-off after an outage, replay.
- `outage`: tells an outage (queued) from a refusal by MLflow and from a bug (raised).
- `registry`: promote a serving config to a model version with an alias; resolve it back.
- `convert`: pure conversions of params, metrics, tags and names to what MLflow stores.
- `_client`: the MLflow client and experiment of one store, created on first use.
- `probe_run`: `sweep probe` as one MLflow run (the ranking table, probe.json, the latency plot).

Importing this package does not import MLflow; the first call that needs it does. It re-exports
nothing: its modules import each other as `from orchestrator.tracking import convert`, which runs this
file first, so a re-export of `Tracker` here would close an import cycle through it.
"""

__all__ = ["convert", "outage", "outbox", "registry", "runs", "tracker"]
