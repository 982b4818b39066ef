"""One trial on one host; no Optuna, MLflow or Ray in here.

- `plan`: trial parameters -> LaunchPlan (argv list + environment).
- `server`: SGLang server process supervision (start, readiness, kill the group).
- `bench`: the builtin load generator; `metrics`: bench records + /metrics -> Metrics.
- `observe`: what really ran (environment per rank, NCCL's lines, all-reduce path, fingerprint).
- `runner`: the phases of one trial: TrialSpec in, TrialOutcome out.
"""
