"""What the user reads and keeps (pure, except matplotlib drawing the figures).

- `select`: champion selection (the pooled fit over the search's trials, each run's own speed taken out),
  speed-up, drift and the near-tie re-measure; `figures`: the values of the verdict's figures (intervals,
  the confirmed figures users read, a part's check, a load level) and a load in words (`streams`). The
  confirmation itself (its rounds, gate, parts and words) is orchestrator.verdict's.
- `correctness`: whether a configuration changed the greedy outputs; `cost`: what a trial costs in time.
- `report`, `report_plots`, `report_html`: the results table, its plots and the page; `truth`: the
  simulator's noise-free optimum.
- `export`: the serving config as env / json / sglang-args; `formats`: the other deployment formats;
  `adaptive_export`: the `--speculative-adaptive-config` JSON; `entrypoint`: the deployment's entrypoint
  that loads an exported file (serve-champion); `deployable`: what a configuration may carry and what only
  a deployment sets.
"""

__all__ = ["export", "formats", "report", "select", "truth"]
