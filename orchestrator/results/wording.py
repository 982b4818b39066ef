"""The verdict's sentences: where the gain stops paying, adaptive against fixed steps, the gate's level,
and the verdict in words.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.results.figures import LevelGain, streams


def stops_paying(levels: Sequence[LevelGain], what: str, *, figures: bool = True) -> str:
    """One sentence: where the champion's gain over the baseline holds and where it stops paying
    (and, when measured, whether adaptive steps beat the fixed count at each level). `figures=False`
    leaves the per-level gains out (the verdict states them beside the gate's own figures)."""
    if not levels:
        return ""
    ordered = sorted(levels, key=lambda lv: lv.concurrency)
    gains = f" ({'; '.join(lv.text() for lv in ordered)})" if figures else ""
    lost = next((lv for lv in ordered if not lv.interval.low > 0.0), None)
    if lost is None:
        sentence = f"{what} pays at every level measured{gains}"
    else:
        paying = [lv.concurrency for lv in ordered if lv.concurrency < lost.concurrency and lv.interval.low > 0.0]
        where = f"pays up to concurrency {paying[-1]} and " if paying else ""
        sentence = f"{what} {where}stops paying from concurrency {lost.concurrency}{gains}"
    steps = steps_sentence(ordered)
    return f"{sentence}. {steps}" if steps else sentence


def steps_sentence(levels: Sequence[LevelGain]) -> str:
    """Whether adaptive steps beat the fixed count, at each level that measured both ("" if none did)."""
    steps = [(lv.concurrency, lv.steps) for lv in sorted(levels, key=lambda lv: lv.concurrency) if lv.steps is not None]
    if not steps:
        return ""
    return f"Adaptive steps (--speculative-adaptive) against {steps[0][1].fixed}: " + ", ".join(
        g.text(c) for c, g in steps
    )


def at_level(message: str, concurrency: int | None, metric: str) -> str:
    """A decision's message ("promoted: +12.4% [...] ...", "not better: ...", "undecided after 8
    rounds: ...") with the load it was decided at after its head: "promoted at 32 concurrent streams
    (objective output_tok_s): +12.4% ...". Unchanged when `concurrency` is None (the level goes
    unnamed) or the message has no head."""
    head, sep, rest = message.partition(": ")
    if concurrency is None or not sep:
        return message
    return f"{head} at {streams(concurrency)} (objective {metric}): {rest}"


def verdict_text(
    message: str,
    *,
    concurrency: int | None,
    metric: str,
    others: Sequence[LevelGain] = (),
    why: str = "",
    after: str = "",
) -> str:
    """The verdict in words: the gate's decision at the level it decided at (`concurrency`; None leaves
    it unnamed), the champion's gain at the other promotion.concurrency levels beside it, why it won
    (the contributions), then `after` (where the gain stops paying; adaptive or fixed steps)."""
    text = at_level(message, concurrency, metric)
    if others:
        ordered = sorted(others, key=lambda lv: lv.concurrency)
        rounds = min(lv.interval.rounds for lv in ordered)
        text += (
            "; "
            + "; ".join(f"at {streams(lv.concurrency, short=True)} {lv.interval.text()}" for lv in ordered)
            + f" (promotion.concurrency: 95% intervals over {rounds} rounds)"
        )
    if why:
        text += f". Why (95% intervals): {why}"
    if after:
        text += f". {after}"
    return text
