"""--resume of a sweep that already reached its verdict: the promotion's outcome is kept in the study
(DECISION_ATTR) and in summary.json; resuming with nothing new measured neither measures nor registers
again (sweep/_promote.finish reads it here)."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from orchestrator.sweep._context import Context
from orchestrator.sweep.state import Outcome, SweepSummary
from orchestrator.verdict.steps import Decided, Promotion

log = logging.getLogger("sweep")

DECISION_ATTR = "promotion_decision"
"""The study attribute that keeps the promotion's outcome (a Decided), so a --resume finds it without summary.json."""


_PROMOTION_FIELDS = (
    "champion",
    "promoted",
    "verdict",
    "outcome",
    "confirmed",
    "search_value",
    "contributions",
    "promoted_config",
    "concurrency",
    "concurrency_verdict",
    "gate",
    "confirmations",
    "model_version",
    "env_file",
    "run_id",
    "deployed",
    "not_measured",
)


def already_decided(ctx: Context) -> dict[str, Any] | None:
    """Resuming a sweep that already reached a verdict, with nothing new measured since: that verdict's
    summary fields, neither measured again nor registered again (None otherwise). The verdict is read
    from summary.json, or, when that is missing or unreadable, from the study (DECISION_ATTR)."""
    if not ctx.resume:
        return None
    before = _summary_before(ctx)
    decided = _decided_in_study(ctx) if before is None else _decided_in_summary(before)
    if decided is None or not _final(ctx, decided):
        return None  # interrupted, cut short by the wall time, or not registered: confirm (again) now
    log.info(
        "the sweep had already reached its verdict and nothing new was measured: not confirmed or "
        "registered again (%s)",
        decided.outcome.value,
    )
    kept = (
        before.model_dump(include=set(_PROMOTION_FIELDS), exclude_unset=True)
        if before is not None
        else decided.summary_fields()
    )
    kept["verdict"] = (
        f"already decided before this --resume, nothing measured or registered again: "
        f"{decided.verdict or decided.outcome.value}"
    )
    return kept


def _summary_before(ctx: Context) -> SweepSummary | None:
    """The summary.json of the run before, or None when missing or unreadable."""
    try:
        return SweepSummary.model_validate_json(ctx.paths.summary.read_text())
    except (OSError, ValueError):
        return None


def _decided_in_summary(before: SweepSummary) -> Decided | None:
    """The promotion's outcome summary.json holds, or None (no promotion ended there)."""
    if before.outcome is None:
        return None
    return Decided(
        outcome=before.outcome,
        verdict=before.verdict or "",
        rounds=int((before.gate or {}).get("rounds") or 0),
        launched=before.launched,
        complete=before.complete,
        failed=before.failed,
    )


def _decided_in_study(ctx: Context) -> Decided | None:
    """The promotion's outcome the study keeps, or None (never decided, or not readable)."""
    kept = ctx.study.get_attr(DECISION_ATTR)
    if kept is None:
        return None
    try:
        return Decided.model_validate(kept)
    except ValidationError:
        log.warning("the study's %s is not a promotion decision: promoting again", DECISION_ATTR)
        return None


def _final(ctx: Context, decided: Decided) -> bool:
    """Whether the verdict stands: reached at the counts of now, and not one more rounds could change."""
    p = ctx.progress
    if (decided.launched, decided.complete, decided.failed) != (p.launched, p.complete, p.failed):
        return False
    return decided.outcome in (Outcome.promoted, Outcome.unconfirmed, Outcome.not_better, Outcome.outputs_changed) or (
        decided.outcome is Outcome.undecided and decided.rounds >= ctx.spec.promotion.max_rounds
    )


def remember(ctx: Context, promotion: Promotion) -> None:
    """Keep the promotion's outcome in the study, which --resume reads when summary.json is unreadable."""
    if promotion.outcome is None:
        return  # interrupted: nothing decided
    p = ctx.progress
    r = promotion.registered
    decided = Decided(
        outcome=promotion.outcome,
        verdict=promotion.verdict,
        rounds=promotion.rounds,
        model_version=r.model_version if r else None,
        run_id=r.run_id if r else None,
        env_file=r.env_file if r else None,
        promoted_config=r.promoted_config if r else None,
        champion=promotion.champion.summary() if promotion.champion else None,
        launched=p.launched,
        complete=p.complete,
        failed=p.failed,
    )
    ctx.study.set_attr(DECISION_ATTR, decided.model_dump(mode="json"))
