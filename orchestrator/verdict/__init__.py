"""What to deploy and why: from the search's pick to the registry, and the one `Verdict` every view renders.

The pipeline (`promote`), each step a function returning a frozen value (`steps`), each step's helpers in its
own module, which the pipeline enters once and in this order (scripts/walk.py follows it):
- `pick`: everything read of the search's trials: the pick with its baseline and MLflow run, its runner-up
  from another region (without promotion.explain: its rival) and what the search says of the two, the
  run-speed note; the verdict without a gate;
- `arms`: what the rounds measure (the pair, the ablations, the runner-up, speculation at SGLang's default,
  the other loads, adaptive or fixed steps), fitted to the night's time left; `arm`: an arm as a value;
- `schedule`: one clock for the night (the confirmation's cost, held back before the first launch);
- `gate`: the statistics of the rounds: each look's decision and its bound, the noise of every arm in a
  pair's rounds, an arm's interval over another, whether the runner-up leads on all the evidence;
- `rounds`: the interleaved rounds until the gate decides, and the questions still open beside it (the
  parts' equivalence test, the runner-up's near-tie); the rounds the gate will need;
- `choose`: the gate's decision with each part's contribution, then the configuration to deploy (the
  runner-up, a simpler arm shown equivalent, or the champion) and its confirmed figures;
- `correctness_gate`: which runs capture greedy outputs, and the gate that never promotes a configuration
  that changes them;
- `deployed`: the deployed configuration at each load, the verdict in words about it, its registration;
- `register`: the registry version (its description rendered from the Verdict) and champion.env.

What it is and how it reads:
- `value`: `Outcome` and `Verdict` (frozen, typed): the deployed configuration and its own figures first,
  the search's pick and why it was replaced, the gate, the parts, the load levels; kept in summary.json;
- `render`: the words every view shares (the run's final print, `sweep status`, report.html, the MLflow
  parent run and model version, `sweep truth`).

It talks to the sweep through one door, `port` (run these arms for a round, the clock and the time left,
the trials measured, the registry), never the sweep's Context; it imports nothing from sweep/.
"""
