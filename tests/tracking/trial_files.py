"""What the tracking tests share: the knobs of a trial and a trial folder as the runner leaves it."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.records import (
    FailureKind,
    LaunchPlan,
    MeasurementSummary,
    Metrics,
    TrialOutcome,
    TrialRole,
    TrialStatus,
)

KNOBS = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": None,
    "NCCL_MAX_NCHANNELS": 16,
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
}


def write_trial(
    workdir: Path,
    number: int,
    *,
    role: TrialRole = TrialRole.search,
    status: TrialStatus = TrialStatus.COMPLETE,
    failure_kind: FailureKind | None = None,
    params: dict | None = None,
    decode_tok_s: float = 150.0,
) -> TrialOutcome:
    """A trial folder as trial.py leaves it, outcome.json included."""
    trial_dir = workdir / "trials" / str(number)
    trial_dir.mkdir(parents=True, exist_ok=True)
    (trial_dir / "spec.json").write_text(json.dumps({"number": number}))
    (trial_dir / "server.log").write_text("Decode batch, #running-req: 1, accept len: 2.61\n")
    (trial_dir / "bench.jsonl").write_text('{"index": 0, "ok": true}\n')
    complete = status == TrialStatus.COMPLETE
    outcome = TrialOutcome(
        number=number,
        params=params if params is not None else KNOBS,
        role=role,
        status=status,
        failure_kind=failure_kind,
        reason="" if complete else "CUDA out of memory while allocating the draft KV cache",
        log_tail="" if complete else "torch.OutOfMemoryError: CUDA out of memory",
        metrics=Metrics(
            decode_tok_s=decode_tok_s,
            output_tok_s=290.5,
            ttft_ms_p50=41.0,
            itl_ms_p99=9.5,
            accept_length=2.61,
            verify_ms=None,
            requests_ok=8,
            sources={"accept_length": "meta_info"},
        )
        if complete
        else None,
        summary=MeasurementSummary(
            repeats=3,
            median={"decode_tok_s": decode_tok_s},
            ci95_low={"decode_tok_s": decode_tok_s - 4},
            ci95_high={"decode_tok_s": decode_tok_s + 4},
        )
        if complete
        else None,
        fingerprint_hash="fp-1234",
        allreduce_path="nccl",
        launch=LaunchPlan(argv=("python", "-m", "orchestrator.simulator"), port=30000, engine="simulator"),
        trial_dir=str(trial_dir),
        node="127.0.0.2",
        started_at=1_750_000_000.0 + number * 100,
        finished_at=1_750_000_060.0 + number * 100,
        timings={"server_start": 3.5, "bench": 20.0},
    )
    (trial_dir / "outcome.json").write_text(outcome.model_dump_json(indent=2))
    return outcome
