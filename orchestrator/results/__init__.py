"""What the user reads and keeps (pure, except matplotlib drawing the figures).

- `select`: champion selection, speed-up, drift and the promotion gate; `sequential`: interleaved
  confirmation rounds until the evidence decides; `contrib`: why the champion won (each part's
  contribution), its gain per concurrency level, and the confirmed figures users read.
- `report`: the results table and plots; `truth`: the simulator's noise-free optimum.
- `export`: the serving config as env / json / sglang-args; `formats`: the other deployment formats.
"""

__all__ = ["contrib", "export", "formats", "report", "select", "sequential", "truth"]
