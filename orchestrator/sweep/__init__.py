"""The overnight loop.

- `driver`: `Sweep`, a thin driver over private verbs: `_workdir` (paths, lock, sweep.log),
  `_context` (what the verbs share, with owners), `_resume`, `_signals`, `_loop` (keep N in flight),
  `_record` (outcomes, failure budget, best so far, baseline re-measure), `_probe_stage` (the probe's
  ranking warm-starts the search), `_screen` (the search's correctness screen).
- `_promote`: the end of a sweep: the promotion (orchestrator.verdict) through `_port` (the sweep's side of
  the verdict's port: the rounds on the sweep's executor, the clock, MLflow), the Verdict kept in
  summary.json; `_decided`: a --resume after the verdict neither measures nor registers again.
- `schedule`: the night's plan, as orchestrator.verdict.schedule computes it (read here by the CLI).
- `state`: the contracts: StopReason, SweepState (sweep.json), SweepSummary (summary.json), progress events.
- `status`: `status_report` for `sweep status`, without Ray or MLflow.
- `publish`: report.html and the parent MLflow run's description, rendered from the Verdict.

Import the driver from `orchestrator.sweep.driver`: this package imports nothing heavy itself.
"""

__all__ = ["driver", "state", "status"]
