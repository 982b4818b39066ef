"""The figures a verdict is made of, as values: an interval, the confirmed (or unconfirmed) figures, a
part's contribution, a level's gain, adaptive against fixed steps, a part's equivalence check.
"""

from __future__ import annotations

import enum
from typing import Literal

from orchestrator.records import Frozen

LEVEL = 0.95
"""Two-sided confidence of the contribution and per-concurrency intervals."""


class Interval(Frozen):
    """A's gain over B from the rounds that measured both, with its two-sided interval."""

    gain: float
    """Relative gain of A over B (positive = better whatever the direction)."""
    low: float
    high: float
    rounds: int
    a_median: float
    b_median: float

    @property
    def significant(self) -> bool:
        """The interval excludes zero."""
        return self.low > 0.0 or self.high < 0.0

    def text(self) -> str:
        figure = f"{_pct(self.gain)} [{_pct(self.low)}, {_pct(self.high)}]"
        return figure if self.significant else f"{figure}, not significant"


class Confirmed(Frozen):
    """The figures a user reads: confirmed medians, rounds and interval, or the search-phase ones
    labelled unconfirmed when the gate was switched off (promotion.max_rounds: 0)."""

    label: Literal["confirmed", "unconfirmed"]
    metric: str
    champion_median: float
    baseline_median: float
    rounds: int
    gain: float
    low: float | None = None
    high: float | None = None
    concurrency: int | None = None
    """Concurrent requests both were measured at (the gate's level); None in summaries written before."""

    def text(self) -> str:
        at = f" at {streams(self.concurrency)}" if self.concurrency is not None else ""
        if self.label == "unconfirmed":
            return (
                f"UNCONFIRMED (search phase, one measurement{at}): {self.metric} {self.champion_median:.2f} vs "
                f"baseline {self.baseline_median:.2f}, {_pct(self.gain)}"
            )
        interval = (
            f" [{_pct(self.low)}, {_pct(self.high)}] (the gate's bounds)"
            if self.low is not None and self.high is not None
            else ""
        )
        return (
            f"confirmed over {self.rounds} interleaved rounds{at}: {self.metric} median "
            f"{self.champion_median:.2f} vs baseline {self.baseline_median:.2f}, {_pct(self.gain)}{interval}"
        )

    def metrics(self) -> dict[str, float]:
        """The figures as serving-config metrics (the env file header and the registry show them)."""
        prefix = self.label
        out = {
            f"{prefix}_{self.metric}": self.champion_median,
            f"{prefix}_baseline_{self.metric}": self.baseline_median,
            f"{prefix}_gain": self.gain,
            f"{prefix}_rounds": float(self.rounds),
        }
        if self.concurrency is not None:
            out[f"{prefix}_concurrency"] = float(self.concurrency)
        if self.low is not None and self.high is not None:
            out.update({f"{prefix}_gain_low": self.low, f"{prefix}_gain_high": self.high})
        return out


class Contribution(Frozen):
    """One part's contribution: arm `a` against arm `b` in the same rounds."""

    part: str
    """In the user's words: "NCCL settings", "EAGLE-3 on top", ..."""
    a: str
    b: str
    interval: Interval

    def text(self) -> str:
        return f"{self.part} {self.interval.text()}"


class StepsGain(Frozen):
    """Adaptive speculation (--speculative-adaptive) against a fixed step count at one level."""

    fixed: str
    """The fixed side in words, e.g. "fixed 3 steps"."""
    interval: Interval
    """Adaptive's gain over the fixed count (positive: adaptive is better)."""

    def text(self, concurrency: int) -> str:
        iv = self.interval
        who = (
            "adaptive wins" if iv.low > 0.0 else f"{self.fixed} wins" if iv.high < 0.0 else "no significant difference"
        )
        return (
            f"x{1 + iv.gain:.2f} [x{1 + iv.low:.2f}, x{1 + iv.high:.2f}] at {streams(concurrency, short=True)} ({who})"
        )


class LevelGain(Frozen):
    """The champion against the baseline at one concurrency level."""

    concurrency: int
    interval: Interval
    steps: StepsGain | None = None
    """With a speculating champion: adaptive against fixed steps at this level, when measured."""

    def text(self) -> str:
        return f"at concurrency {self.concurrency}: {self.interval.text()}"


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x * 100:+.1f}%"


def streams(concurrency: int, *, short: bool = False) -> str:
    """A load in words: "1 stream", "32 concurrent streams" ("32 streams" when `short`)."""
    if concurrency == 1:
        return "1 stream"
    return f"{concurrency} streams" if short else f"{concurrency} concurrent streams"


class PartVerdict(str, enum.Enum):
    """What the confirmation showed about one part of the champion."""

    negligible = "negligible"
    """It adds less than promotion.equivalence_margin (the upper bound below it): dropped."""
    adds = "adds"
    """Its gain is significant (the lower bound above zero): kept."""
    open = "open"
    """Neither shown: kept (the fuller configuration is promoted), or measured for more rounds."""


class PartCheck(Frozen):
    """The equivalence test of one part: the champion against the arm without it, at the gate's
    one-sided level per look (verdict.gate.RoundsPlan.level), against promotion.equivalence_margin."""

    part: str
    """In the user's words: "EAGLE-3 on top", "NCCL settings on top of EAGLE-3"."""
    arm: str
    """The arm without the part: no_speculation | default_communication."""
    gain: float
    low: float
    high: float
    rounds: int
    margin: float

    @property
    def verdict(self) -> PartVerdict:
        if self.high < self.margin:
            return PartVerdict.negligible
        return PartVerdict.adds if self.low > 0.0 else PartVerdict.open

    def text(self) -> str:
        figure = (
            f"{self.part} {_pct(self.gain)} [{_pct(self.low)}, {_pct(self.high)}] (gate bounds, {self.rounds} rounds)"
        )
        margin = f"{_pct(self.margin)} (promotion.equivalence_margin)"
        if self.verdict is PartVerdict.negligible:
            return f"{figure}: shown to add less than {margin}"
        if self.verdict is PartVerdict.adds:
            return f"{figure}: adds a significant gain"
        return f"{figure}: not significant, but not shown to add less than {margin}, so it is kept"
