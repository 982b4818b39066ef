"""The overnight loop.

- `driver`: `Sweep`, a thin driver over private verbs: `_workdir` (paths, lock, sweep.log),
  `_context` (what the verbs share, with owners), `_resume`, `_signals`, `_loop` (keep N in flight),
  `_record` (outcomes, failure budget, best so far, baseline re-measure), `_probe_stage` (the probe's
  ranking warm-starts the search), `_screen` (the search's correctness screen).
- The promotion, from the search's pick to the registry: `_promote` (the pipeline, the summary),
  `_pick` (the pick, the verdict without a gate, the arms), `_confirm` (the interleaved rounds),
  `_contender` (the runner-up against the pick), `_choose` (the gate's decision, the parts, what to
  deploy, it at each load), `_correctness` and `_outputs` (the correctness gate and its captures),
  `_register` (registry version, champion.env), `_promotion` (the pipeline's values), `_decided`
  (a --resume after the verdict). The Verdict they end in is orchestrator.verdict's.
- `schedule`: one clock for the night (the confirmation's cost held back before the first launch).
- `state`: the contracts: StopReason, SweepState (sweep.json), SweepSummary (summary.json), progress events.
- `status`: `status_report` for `sweep status`, without Ray or MLflow.
- `publish`: report.html and the parent MLflow run's description, rendered from the Verdict.

Import the driver from `orchestrator.sweep.driver`: this package imports nothing heavy itself.
"""

__all__ = ["driver", "state", "status"]
