"""What to deploy and why: the one `Verdict` every view renders.

- `value`: `Outcome` (how the promotion ended) and `Verdict` (frozen, typed): the deployed configuration
  and its own figures first, the search's pick and why it was replaced, the gate, the parts, the load levels,
  the correctness note; built once at the end of the promotion from its fields (`Verdict.of`).
- `render`: the words every view shares (the headline, the knobs, the gain line, the parts' heading), so
  the run's final print, `sweep status`, report.html, the MLflow parent run and model version, `sweep
  truth` and summary.json cannot disagree about which configuration won.

The rounds, the gate and the choice still run in sweep/ (`_promote`, `_confirm`); this room holds the value
they end in and imports only config, results and the leaves.
"""
