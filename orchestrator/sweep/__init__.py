"""The overnight loop.

- `driver`: `Sweep`, a thin driver over private verbs: `_workdir` (paths, lock, sweep.log),
  `_resume`, `_signals`, `_loop` (keep N in flight), `_record` (outcomes, failure budget, best so far,
  baseline re-measure), `_promote` (confirmation, promotion, summary).
- `state`: the contracts: StopReason, SweepState (sweep.json), SweepSummary (summary.json), progress events.
- `status`: `status_report` for `sweep status`, without Ray or MLflow.

Import the driver from `orchestrator.sweep.driver`: this package imports nothing heavy itself.
"""

__all__ = ["driver", "state", "status"]
