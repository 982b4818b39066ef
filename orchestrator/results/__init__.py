"""What the user reads and keeps (pure, except matplotlib drawing the figures).

- `select`: champion selection, speed-up, drift and the promotion gate; `sequential`: interleaved
  confirmation rounds until the evidence decides.
- `report`: the results table and plots; `truth`: the simulator's noise-free optimum.
- `export`: the serving config as env / json / sglang-args; `formats`: the other deployment formats.
"""

__all__ = ["export", "formats", "report", "select", "sequential", "truth"]
