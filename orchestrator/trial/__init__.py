"""One trial on one host; no Optuna, MLflow or Ray in here.

- `plan`: trial parameters -> LaunchPlan (flags and environment as data, the argv rendered from them).
- `server`: server process supervision (start, readiness, kill the whole group).
- `clients`: the benchmark clients behind one interface (builtin `bench`, SGLang's bench_serving).
- `metrics`: bench records + /metrics -> Metrics (`decodelog`: the scheduler's Decode batch lines);
  `failures`: exit status, log, records -> failure kind.
- `observe`: what really ran (environment per rank, NCCL's lines; `fingerprint`: the host); `allreduce`: which
  all-reduce carried decode/verify, and plan warnings; `procs`: the trial's reader of other processes.
- `runner`: the phases of one trial: TrialSpec in, TrialOutcome out.
- `outputs`: greedy outputs of a fixed prompt set for the correctness gate; `_bench_serving_repeats`: every
  repeat of SGLang's bench_serving in one process.
"""

__all__ = [
    "allreduce",
    "bench",
    "clients",
    "decodelog",
    "failures",
    "fingerprint",
    "metrics",
    "observe",
    "plan",
    "procs",
    "runner",
    "server",
]
