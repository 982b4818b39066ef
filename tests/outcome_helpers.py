"""Searched trials as values, for tests of the pick, the runner-up and the rival (results.select,
verdict.pick) that need no sweep."""

from __future__ import annotations

from orchestrator.records import Metrics, ParamValue, TrialOutcome, TrialRole, TrialStatus


def searched(number: int, value: float, params: dict[str, ParamValue]) -> TrialOutcome:
    """A complete search trial measuring `value` tok/s (decode and output) at `params`, its env observed."""
    return TrialOutcome(
        number=number,
        params=params,
        role=TrialRole.search,
        status=TrialStatus.COMPLETE,
        metrics=Metrics(decode_tok_s=value, output_tok_s=value),
        effective_env={"ok": True},
    )
