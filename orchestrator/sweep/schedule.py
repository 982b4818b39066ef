"""One clock for the night: the confirmation's plan lives in the verdict's room (orchestrator.verdict.schedule);
the sweep, the CLI and the benchmarks read it here as before."""

from orchestrator.verdict.schedule import (
    PAIR,
    ConfirmationPlan,
    Dropped,
    NightPlan,
    PlannedArm,
    at_concurrency,
    candidate_arms,
    night_plan,
    plan,
    reserve,
    rounds_fit,
    run_seconds,
    value_rank,
)

__all__ = [
    "PAIR",
    "ConfirmationPlan",
    "Dropped",
    "NightPlan",
    "PlannedArm",
    "at_concurrency",
    "candidate_arms",
    "night_plan",
    "plan",
    "reserve",
    "rounds_fit",
    "run_seconds",
    "value_rank",
]
