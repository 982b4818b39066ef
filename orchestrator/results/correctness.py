"""The correctness gate's rule: are a configuration's greedy outputs still the baseline's?

Two checks, in order (promotion.correctness):

1. equal token streams: the configuration's greedy output of every prompt is token for token the
   baseline's (both captured in the first confirmation round, trial.outputs);
2. where they differ (SGLang is not bit-deterministic across batch shapes and all-reduce settings:
   a near tie may fall the other way), the baseline's server scores the configuration's output
   (input logprobs through /generate, in a later confirmation round): every token of it must lie
   within `tolerance_nats` of the baseline's own top choice at its position. A near tie costs
   hundredths of a nat; a corrupted token costs several.

A configuration that fails, or whose outputs were not captured or not scored, is never promoted.

`screen` is the search's cheaper check of every search trial (promotion.correctness.screen), with no
baseline server to score against: the first baseline's capture keeps its best few tokens at each output
position (top_logprobs_num), and where a trial's output first leaves the baseline's (the contexts are
equal up to there), the trial's token is rated from that list: a near tie is within tolerance, a token
outside the list lies at least as far below the top choice as the list's last one. A trial refused by
the screen is never a candidate; one it passes is still checked in full by `compare` before promotion
(the screen sees only the first differing token of each prompt).

`compare` and `screen` are pure and returns a frozen `Correctness` whose `text()` names the check and its figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.records import OutputsRecord, PromptOutput, ScoredOutput

__all__ = ["EQUAL", "MISSING", "SCORED", "SCREEN", "Correctness", "compare", "first_difference", "screen"]

EQUAL = "equal token streams"
SCORED = "the baseline's logprob score"
MISSING = "outputs captured"
SCREEN = "first differing tokens against the baseline's top choices"


@dataclass(frozen=True)
class Correctness:
    """The correctness gate's verdict on one configuration against the baseline."""

    passed: bool
    check: str
    """Which check decided: EQUAL, SCORED or MISSING."""
    figure: str
    """What it found, with the numbers ("outputs differ from the baseline's on 3 of 8 prompts ...")."""
    prompts: int = 0
    differing: int = 0
    first_at: int | None = None
    """The earliest token index (0-based) where an output left the baseline's, over all prompts."""
    worst_nats: float | None = None
    """The largest gap between the baseline's top choice and the configuration's token, when scored."""

    def text(self) -> str:
        what = "correctness screen" if self.check == SCREEN else "correctness gate"
        return f"{what} ({self.check}): {'passed' if self.passed else 'REFUSED'}: {self.figure}"

    def record(self) -> dict[str, object]:
        return {
            "passed": self.passed,
            "check": self.check,
            "figure": self.figure,
            "prompts": self.prompts,
            "differing": self.differing,
            "first_at": self.first_at,
            "worst_nats": self.worst_nats,
        }


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where two token streams differ (a shorter one differs where it ends); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _missing(who: str, record: OutputsRecord | None, prompts: int) -> str | None:
    """Why `who`'s outputs cannot be compared (None when all `prompts` are there)."""
    if record is None:
        return f"no greedy outputs of the {who} were captured (no outputs.json)"
    if len(record.prompts) < prompts:
        why = f": {record.error}" if record.error else ""
        return f"the {who}'s greedy outputs cover {len(record.prompts)} of {prompts} prompts{why}"
    return None


def compare(
    arm: str,
    candidate: OutputsRecord | None,
    baseline: OutputsRecord | None,
    scores: Sequence[ScoredOutput],
    *,
    prompts: int,
    tolerance_nats: float,
) -> Correctness:
    """The verdict on `arm`'s outputs against the baseline's; `scores` are the baseline server's
    ratings of `arm`'s outputs (any arm's may be passed: only `arm`'s are read)."""
    missing = _missing(arm, candidate, prompts) or _missing("baseline", baseline, prompts)
    if missing is not None or candidate is None or baseline is None:
        return Correctness(
            False,
            MISSING,
            f"{missing}; a configuration whose outputs are not checked is "
            f"not promoted (promotion.correctness.enabled: false promotes on "
            f"speed alone)",
        )
    base = {p.prompt: p for p in baseline.prompts}
    diffs: dict[int, int] = {}
    for p in candidate.prompts[:prompts]:
        b = base.get(p.prompt)
        if b is None or b.prompt_ids != p.prompt_ids:
            return Correctness(False, MISSING, f"prompt {p.prompt} was not tokenized the same by both servers")
        at = first_difference(p.output_ids, b.output_ids)
        if at is not None:
            diffs[p.prompt] = at
    tokens = len(candidate.prompts[0].output_ids) if candidate.prompts else 0
    if not diffs:
        return Correctness(
            True,
            EQUAL,
            f"{prompts} of {prompts} prompts decode to the baseline's {tokens} tokens, token for token",
            prompts=prompts,
        )
    first = min(diffs.values())
    differ = f"outputs differ from the baseline's on {len(diffs)} of {prompts} prompts (first at token {first})"
    return _scored(arm, candidate, diffs, scores, differ, prompts=prompts, first=first, tolerance_nats=tolerance_nats)


def _scored(
    arm: str,
    candidate: OutputsRecord,
    diffs: dict[int, int],
    scores: Sequence[ScoredOutput],
    differ: str,
    *,
    prompts: int,
    first: int,
    tolerance_nats: float,
) -> Correctness:
    """The differing outputs as the baseline's server scores them."""
    mine = {s.prompt: s for s in scores if s.arm == arm}
    outputs = {p.prompt: p for p in candidate.prompts}
    unscored = [p for p in diffs if p not in mine or len(mine[p].logprobs) != len(outputs[p].output_ids)]
    if unscored:
        return Correctness(
            False,
            SCORED,
            f"{differ}, and the baseline's server did not score "
            f"{len(unscored)} of them (prompt {unscored[0]} first); not promoted",
            prompts=prompts,
            differing=len(diffs),
            first_at=first,
        )
    worst, where = 0.0, (0, 0)
    for p in sorted(diffs):
        s = mine[p]
        for k, (lp, top) in enumerate(zip(s.logprobs, s.top_logprobs)):
            if top - lp > worst:
                worst, where = top - lp, (p, k)
    if worst <= tolerance_nats:
        return Correctness(
            True,
            SCORED,
            f"{differ}, but the baseline's server scores every token of them within "
            f"{worst:.3f} nats of its own top choice (tolerance {tolerance_nats:g}): "
            f"near ties, not changed outputs",
            prompts=prompts,
            differing=len(diffs),
            first_at=first,
            worst_nats=worst,
        )
    p, k = where
    return Correctness(
        False,
        SCORED,
        f"{differ}; the baseline's server scores token {k} of prompt {p} "
        f"{worst:.2f} nats below its own top choice (tolerance {tolerance_nats:g} "
        f"nats): the configuration changes the outputs",
        prompts=prompts,
        differing=len(diffs),
        first_at=first,
        worst_nats=worst,
    )


class _Screened:
    """What the screen found so far, prompt by prompt: how many differ, the first differing token, the
    worst rated gap (nats, prompt, token index, exact) and the gaps not judged."""

    def __init__(self) -> None:
        self.differing = 0
        self.unjudged = 0
        self.first: int | None = None
        self.worst: tuple[float, int, int, bool] | None = None

    def add(self, p: PromptOutput, b: PromptOutput, tolerance_nats: float) -> None:
        at = first_difference(p.output_ids, b.output_ids)
        if at is None:
            return
        self.differing += 1
        self.first = at if self.first is None else min(self.first, at)
        if at >= min(len(p.output_ids), len(b.output_ids), len(b.output_top)) or not b.output_top[at]:
            return  # one output ended early, or no top tokens kept there
        listed = dict(b.output_top[at])
        best = b.output_top[at][0][1]
        token = p.output_ids[at]
        gap, exact = (best - listed[token], True) if token in listed else (best - b.output_top[at][-1][1], False)
        if not exact and gap <= tolerance_nats:
            self.unjudged += 1  # below a listed token that is itself within tolerance: not known to be far
            return
        if self.worst is None or gap > self.worst[0]:
            self.worst = (gap, p.prompt, at, exact)


def _near_ties(seen: _Screened, differ: str, *, prompts: int, tolerance_nats: float) -> Correctness:
    """Passed: every rated first difference lies within the tolerance of the baseline's top choice."""
    worst = seen.worst
    within = (
        f"; the first differing tokens rated lie within {worst[0]:.3f} nats of the baseline's top choice"
        if worst is not None
        else ""
    )
    if seen.unjudged:
        within += f"; {seen.unjudged} lie outside the baseline's listed top tokens, not judged"
    return Correctness(
        True,
        SCREEN,
        f"{differ}{within} (tolerance {tolerance_nats:g}): near ties so far",
        prompts=prompts,
        differing=seen.differing,
        first_at=seen.first,
        worst_nats=worst[0] if worst else None,
    )


def screen(
    candidate: OutputsRecord | None, baseline: OutputsRecord | None, *, prompts: int, tolerance_nats: float
) -> Correctness:
    """The search's screen of one trial's outputs against the first baseline's capture (module doc):
    refused only when some prompt's first differing token lies more than `tolerance_nats` below the
    baseline's top choice (exactly, or at least by the baseline's last listed token); passed otherwise,
    including when either capture is incomplete or the baseline kept no top tokens (nothing to judge by)."""
    if candidate is None or baseline is None or len(candidate.prompts) < prompts or len(baseline.prompts) < prompts:
        return Correctness(True, SCREEN, "not screened: a capture is missing or incomplete (the gate checks it)")
    base = {p.prompt: p for p in baseline.prompts}
    seen = _Screened()
    for p in candidate.prompts[:prompts]:
        b = base.get(p.prompt)
        if b is None or b.prompt_ids != p.prompt_ids:
            return Correctness(True, SCREEN, f"not screened: prompt {p.prompt} was not tokenized the same")
        seen.add(p, b, tolerance_nats)
    differing, first, worst = seen.differing, seen.first, seen.worst
    if not differing:
        return Correctness(
            True, SCREEN, f"{prompts} of {prompts} prompts decode to the baseline's tokens", prompts=prompts
        )
    differ = f"outputs differ from the baseline's on {differing} of {prompts} prompts (first at token {first})"
    if worst is None or worst[0] <= tolerance_nats:
        return _near_ties(seen, differ, prompts=prompts, tolerance_nats=tolerance_nats)
    gap, prompt, at, exact = worst
    how = (
        f"{gap:.2f} nats" if exact else f"more than {gap:.2f} nats (outside its top {len(base[prompt].output_top[at])})"
    )
    return Correctness(
        False,
        SCREEN,
        f"{differ}; token {at} of prompt {prompt} is one the baseline puts {how} below "
        f"its own top choice there (tolerance {tolerance_nats:g} nats): the configuration "
        f"changes the outputs",
        prompts=prompts,
        differing=differing,
        first_at=first,
        worst_nats=gap,
    )
