"""Orchestration overhead per trial: everything but the server's start and the benchmark itself.

Runs a real sweep of the demo experiment on the simulator (local Ray, sqlite Optuna and MLflow), then
reads the driver's per-trial timing records (`overhead.jsonl` in the work directory) and the trials'
own phase timings (outcome.json) and reports the median of each part:

  driver:  ask (Optuna ask + feasibility), mlflow_start (child run opened), dispatch (submit until the
           worker starts the trial: Ray scheduling), return (worker done until the driver has the
           outcome: Ray), files, tell (Optuna), mlflow_log (params, metrics, tags, artifacts)
  worker:  observe (environment, NCCL log, fingerprint), shutdown (stopping the process group)

    .venv/bin/python bench/orchestration_overhead.py [--trials 16] [--workdir DIR] [-o FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import _result  # bench/_result.py: the result file and what made it
from demo_sweep import write_demo_experiment

REPO = Path(__file__).resolve().parents[1]
DRIVER_PARTS = ("ask_s", "mlflow_start_s", "dispatch_s", "return_s", "files_s", "tell_s", "mlflow_log_s")
WORKER_PARTS = ("observe", "shutdown")


def run_sweep(trials: int, workdir: Path) -> None:
    exp = write_demo_experiment(workdir.parent / "overhead.yaml", "overhead", trials)
    subprocess.run(
        [str(Path(sys.executable).parent / "sweep"), "run", str(exp), "--workdir", str(workdir)],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--workdir", type=Path, help="read an existing sweep instead of running one")
    _result.add_output(ap)
    args = ap.parse_args()
    run = _result.start()
    wd = args.workdir or Path(tempfile.mkdtemp(prefix="overhead-")) / "wd"
    if args.workdir is None:
        run_sweep(args.trials, wd)
    rows = [json.loads(line) for line in (wd / "overhead.jsonl").read_text().splitlines() if line.strip()]
    per_trial = []
    for row in rows:
        outcome = json.loads((wd / "trials" / f"{row['number']:04d}" / "outcome.json").read_text())
        t = outcome.get("timings", {})
        row.update({p: t.get(p, 0.0) for p in WORKER_PARTS})
        row["server_start"], row["bench"] = t.get("server_start", 0.0), t.get("bench", 0.0)
        row["driver_total"] = sum(row[p] for p in DRIVER_PARTS)
        row["total"] = row["driver_total"] + sum(row[p] for p in WORKER_PARTS)
        per_trial.append(row)
    med = {
        k: statistics.median(r[k] for r in per_trial)
        for k in (*DRIVER_PARTS, *WORKER_PARTS, "driver_total", "total", "server_start", "bench")
    }
    print(f"{len(per_trial)} trials from {wd}")
    print("median seconds per trial:")
    for k in (*DRIVER_PARTS, "driver_total", *WORKER_PARTS, "total"):
        print(f"  {k:<16} {med[k]:7.3f}")
    print(f"  (not overhead: server_start {med['server_start']:.2f}, bench {med['bench']:.2f})")
    _result.write(args.out, {"trials": len(per_trial), "median_s": med}, run, indent=2)


if __name__ == "__main__":
    main()
