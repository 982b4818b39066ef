"""What the user reads and keeps (pure, except matplotlib drawing the figures).

- `select`: champion selection, speed-up, drift and the promotion gate; `sequential`: interleaved
  confirmation rounds until the evidence decides; `contrib`: why the champion won (each part's
  contribution), its gain per concurrency level; `figures`: the values of those figures (intervals, the
  confirmed figures users read, a part's check); `wording`: the verdict's sentences.
- `correctness`: whether a configuration changed the greedy outputs; `cost`: what a trial costs in time.
- `report`, `report_plots`, `report_html`: the results table, its plots and the page; `truth`: the
  simulator's noise-free optimum.
- `export`: the serving config as env / json / sglang-args; `formats`: the other deployment formats;
  `adaptive_export`: the `--speculative-adaptive-config` JSON; `entrypoint`: the deployment's entrypoint
  that loads an exported file (serve-champion); `deployable`: what a configuration may carry and what only
  a deployment sets.
"""

__all__ = ["contrib", "export", "formats", "report", "select", "sequential", "truth"]
