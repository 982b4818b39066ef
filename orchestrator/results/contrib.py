"""Why the champion won, and at which load: the confirmed figures, the contribution of each of its
parts and its gain per concurrency level, each with its interval, from the interleaved rounds.

The confirmation measures, in the same rounds as the champion and the baseline, the champion with
speculation off (its NCCL settings kept), its speculation with NCCL at defaults, and the best
runner-up from another region. Comparing arms measured in the same rounds pairs them in time, so a
host drifting during the night cancels out (as in `results.sequential`).

Pure: numbers and parameters in, figures and sentences out. The driver owns the measuring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from orchestrator.records import Frozen, ParamValue, TrialOutcome, TrialRole, TrialStatus
from orchestrator.results import select, sequential

Direction = Literal["maximize", "minimize"]

SPECULATION_PREFIX = "speculative_"
"""Knobs of speculative decoding; the others (NCCL_*, all_reduce_path) are the communication settings."""

LEVEL = 0.95
"""Two-sided confidence of the contribution and per-concurrency intervals."""

RUNNER_UP_DISTANCE = 2
"""A runner-up is from another region when at least this many knobs differ from the champion's."""


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

    def text(self) -> str:
        if self.label == "unconfirmed":
            return (f"UNCONFIRMED (search phase, one measurement): {self.metric} {self.champion_median:.2f} vs "
                    f"baseline {self.baseline_median:.2f}, {_pct(self.gain)}")
        interval = (f" [{_pct(self.low)}, {_pct(self.high)}] (the gate's bounds)"
                    if self.low is not None and self.high is not None else "")
        return (f"confirmed over {self.rounds} interleaved rounds: {self.metric} median {self.champion_median:.2f} vs "
                f"baseline {self.baseline_median:.2f}, {_pct(self.gain)}{interval}")

    def metrics(self) -> dict[str, float]:
        """The figures as serving-config metrics (the env file header and the registry show them)."""
        prefix = self.label
        out = {f"{prefix}_{self.metric}": self.champion_median,
               f"{prefix}_baseline_{self.metric}": self.baseline_median,
               f"{prefix}_gain": self.gain, f"{prefix}_rounds": float(self.rounds)}
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


class LevelGain(Frozen):
    """The champion against the baseline at one concurrency level."""

    concurrency: int
    interval: Interval

    def text(self) -> str:
        return f"at concurrency {self.concurrency}: {self.interval.text()}"


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x * 100:+.1f}%"


# ------------------------------------------------------------------------------ the arms


def speculates(params: Mapping[str, ParamValue]) -> bool:
    return params.get("speculative_algorithm") is not None


def without_speculation(params: Mapping[str, ParamValue], baseline: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
    """The champion with speculation off (its baseline values), its communication settings kept."""
    return {k: (baseline.get(k) if k.startswith(SPECULATION_PREFIX) else v) for k, v in params.items()}


def with_default_communication(params: Mapping[str, ParamValue],
                               baseline: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
    """The champion's speculation with NCCL and the all-reduce path at their baseline values."""
    return {k: (v if k.startswith(SPECULATION_PREFIX) else baseline.get(k)) for k, v in params.items()}


def knobs_set(params: Mapping[str, ParamValue], baseline: Mapping[str, ParamValue]) -> int:
    """How many knobs differ from the baseline (a simpler configuration sets fewer)."""
    return sum(1 for k, v in params.items() if v != baseline.get(k))


def distance(a: Mapping[str, ParamValue], b: Mapping[str, ParamValue]) -> int:
    return sum(1 for k in set(a) | set(b) if a.get(k) != b.get(k))


def runner_up(outcomes: Sequence[TrialOutcome], champion: TrialOutcome, *, metric: str, direction: Direction,
              constraints: Mapping[str, tuple[float | None, float | None]]) -> TrialOutcome | None:
    """The best eligible searched trial at least RUNNER_UP_DISTANCE knobs away from the champion."""
    far = [o for o in outcomes if o.role is TrialRole.search and o.status is TrialStatus.COMPLETE
           and o.number != champion.number and distance(o.params, champion.params) >= RUNNER_UP_DISTANCE]
    return select.pick_champion(far, metric=metric, direction=direction, constraints=constraints)


# ------------------------------------------------------------------------------ the figures


def paired(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[list[float], list[float]]:
    """The values of the rounds that measured both arms, in round order."""
    rounds = sorted(set(a) & set(b))
    return [a[i] for i in rounds], [b[i] for i in rounds]


def compare(a: Sequence[float], b: Sequence[float], *, direction: Direction, level: float = LEVEL) -> Interval | None:
    """A's gain over B with its two-sided interval; None with fewer than 2 paired rounds."""
    if len(a) < 2 or len(a) != len(b):
        return None
    ev = sequential.evidence(a, b, direction=direction, level=1.0 - (1.0 - level) / 2.0)
    return Interval(gain=ev.gain, low=ev.low, high=ev.high, rounds=ev.rounds, a_median=ev.champion_median,
                    b_median=ev.baseline_median)


def confirmed(ev: sequential.Evidence, metric: str) -> Confirmed:
    return Confirmed(label="confirmed", metric=metric, champion_median=ev.champion_median,
                     baseline_median=ev.baseline_median, rounds=ev.rounds, gain=ev.gain, low=ev.low, high=ev.high)


def unconfirmed(champion: float, baseline: float, metric: str, direction: Direction) -> Confirmed:
    gain = champion / baseline - 1.0 if direction == "maximize" else baseline / champion - 1.0
    return Confirmed(label="unconfirmed", metric=metric, champion_median=champion, baseline_median=baseline,
                     rounds=0, gain=gain)


def contributions(values: Mapping[str, Mapping[int, float]], *, speculation: str, sole_part: str,
                  direction: Direction) -> list[Contribution]:
    """Each part's contribution from the arms measured (champion, baseline, no_speculation,
    default_communication, runner_up); parts whose arms were not measured are left out. `sole_part`
    names the champion's whole gain when it sets only one part."""
    spec_name = speculation or "speculation"
    parts = [("NCCL settings", "no_speculation", "baseline"),
             (f"{spec_name} on top", "champion", "no_speculation"),
             (f"{spec_name} alone (NCCL at defaults)", "default_communication", "baseline"),
             (f"NCCL settings on top of {spec_name}", "champion", "default_communication"),
             ("champion over the runner-up", "champion", "runner_up")]
    if "no_speculation" not in values and "default_communication" not in values:
        # At most one part is set: the champion's whole gain is that part's.
        parts = [(sole_part, "champion", "baseline"), parts[-1]]
    out = []
    for part, a, b in parts:
        if a not in values or b not in values:
            continue
        interval = compare(*paired(values[a], values[b]), direction=direction)
        if interval is not None:
            out.append(Contribution(part=part, a=a, b=b, interval=interval))
    return out


def simpler_choice(values: Mapping[str, Mapping[int, float]], contribs: Sequence[Contribution],
                   plan: sequential.RoundsPlan, *, direction: Direction) -> tuple[str, sequential.Decision] | None:
    """The simpler arm to promote instead of the champion, when one part adds nothing significant
    and the configuration without it still passes the gate; None to promote the champion.

    Speculation off is preferred (fewer moving parts in production), then NCCL at defaults."""
    by_arm = {c.b: c for c in contribs if c.a == "champion"}
    for arm in ("no_speculation", "default_communication"):
        part = by_arm.get(arm)
        if part is None or part.interval.low > 0.0:
            continue  # not measured, or the part it leaves out adds a significant gain
        a, b = paired(values[arm], values["baseline"])
        if len(a) < plan.min_rounds:
            continue
        decision = sequential.decide(a, b, plan, direction=direction)
        if decision.verdict is sequential.Verdict.promoted:
            return arm, decision
    return None


def stops_paying(levels: Sequence[LevelGain], what: str) -> str:
    """One sentence: where the champion's gain over the baseline holds and where it stops paying."""
    if not levels:
        return ""
    ordered = sorted(levels, key=lambda lv: lv.concurrency)
    figures = "; ".join(lv.text() for lv in ordered)
    lost = next((lv for lv in ordered if not lv.interval.low > 0.0), None)
    if lost is None:
        return f"{what} pays at every level measured ({figures})"
    paying = [lv.concurrency for lv in ordered if lv.concurrency < lost.concurrency and lv.interval.low > 0.0]
    where = f"pays up to concurrency {paying[-1]} and " if paying else ""
    return f"{what} {where}stops paying from concurrency {lost.concurrency} ({figures})"
