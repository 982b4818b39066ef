"""An arm of the confirmation: one configuration measured in the interleaved rounds, as a value; and one
run of it, as summary.json keeps it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.records import Frozen, ParamValue, TrialStatus


@dataclass(frozen=True)
class Arm:
    """One configuration measured in the rounds."""

    name: str
    """champion | baseline | no_speculation | default_communication | runner_up | champion@8 | baseline@8 ..."""
    params: dict[str, ParamValue]
    number: int
    """The trial it comes from (-1: the baseline)."""
    concurrency: int
    main: bool = False
    """The champion/baseline pair the verdict is about: measured until decided."""

    @property
    def kind(self) -> str:
        """What it is, without the load it is measured at ("champion" for "champion@8")."""
        return self.name.split("@")[0]


class ConfirmationRow(Frozen):
    """One confirmation run: which arm, in which round, how it ended (summary.json's `confirmations`)."""

    round: int
    """0-based."""
    who: str
    """The arm's name (champion, baseline, no_speculation, champion@8, ...)."""
    status: TrialStatus
    concurrency: int | None = None
    """Concurrent requests it was measured at; None when the executor lost the run before it reported."""
    value: float | None = None
    """The objective's value, when the run completed with a positive one."""
    reason: str | None = None
    """Why it gave no value (at most 200 characters)."""
    ttft_ms: float | None = None
    """The run's median TTFT, when it gave a value and recorded one: its own speed (verdict.speed)."""

    @property
    def lost(self) -> bool:
        """The executor lost the run: no outcome, so no level and no value either."""
        return self.concurrency is None

    def record(self, metric: str) -> dict[str, Any]:
        """The row as summary.json holds it: the value under the objective's name."""
        out: dict[str, Any] = {"round": self.round, "who": self.who}
        if not self.lost:
            out.update(concurrency=self.concurrency, status=self.status.value)
            out[metric] = self.value
        else:
            out["status"] = self.status.value
        if self.reason is not None:
            out["reason"] = self.reason
        if self.ttft_ms is not None:
            out["ttft_ms_p50"] = self.ttft_ms
        return out
