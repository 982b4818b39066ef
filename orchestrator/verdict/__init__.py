"""What to deploy and why: from the search's pick to the registry, and the one `Verdict` every view renders.

The pipeline (`promote`), each step a function returning a frozen value (`steps`):
- `pick`: the search's pick with its baseline and MLflow run, the verdict without a gate, the arms;
- `arm`: an arm of the rounds as a value; `rounds`: the interleaved rounds until the gate decides;
- `contender`: the runner-up against the pick (a near-tie settled by measurement);
- `choose`: the gate's decision, the parts' contributions, the configuration to deploy, it at each load;
- `correctness_gate` and `outputs`: a configuration that changes the greedy outputs is never promoted;
- `register`: the registry version (its description rendered from the Verdict) and champion.env;
- `schedule`: one clock for the night (the confirmation's cost, held back before the first launch).

What it is and how it reads:
- `value`: `Outcome` and `Verdict` (frozen, typed): the deployed configuration and its own figures first,
  the search's pick and why it was replaced, the gate, the parts, the load levels; kept in summary.json;
- `render`: the words every view shares (the run's final print, `sweep status`, report.html, the MLflow
  parent run and model version, `sweep truth`).

It talks to the sweep through one door, `port` (run these arms for a round, the clock and the time left,
the trials measured, the registry), never the sweep's Context; it imports nothing from sweep/.
"""
