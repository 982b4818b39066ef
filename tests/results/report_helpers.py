"""What the report tests share: a trial outcome with the figures the table reads, and the demo's experiment
with another objective."""

from __future__ import annotations

from pathlib import Path

from orchestrator.config import experiment as spec_mod
from orchestrator.records import Metrics, TrialOutcome, TrialRole, TrialStatus

DEMO = Path(__file__).resolve().parents[2] / "experiments" / "demo.yaml"


def outcome(number: int, role: TrialRole, tok_s: float, ttft_p99: float, t: float) -> TrialOutcome:
    return TrialOutcome(
        number=number,
        params={"NCCL_PROTO": None},
        role=role,
        status=TrialStatus.COMPLETE,
        metrics=Metrics(
            decode_tok_s=tok_s, output_tok_s=tok_s, ttft_ms_p99=ttft_p99, cycle_ms=1000 / tok_s, itl_ms_p99=20.0
        ),
        effective_env={"ok": True},
        started_at=t - 5,
        finished_at=t,
    )


def spec(**objective) -> spec_mod.SweepSpec:  # type: ignore[no-untyped-def]
    base = spec_mod.load(DEMO)
    return base.model_copy(update={"objective": base.objective.model_copy(update=objective)})
