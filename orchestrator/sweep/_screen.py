"""The search's correctness screen (promotion.correctness.screen): a search trial whose greedy outputs
changed is measured but never a candidate.

Every search trial captures the fixed prompts' greedy outputs after its benchmark, and the baselines
capture theirs with their best tokens at each position (top_logprobs_num) until one capture is
complete: the reference. When a search trial is recorded (the first baseline is recorded before any
search trial, sweep._loop), results.correctness.screen compares its outputs with the reference. A
refused trial keeps its measurement (outcome.json, MLflow, the study) with `outputs_changed` saying
why; results.select leaves it out of every pick (champion, runner-up, speculation donor), and the
study marks it with OUTPUTS_CHANGED_ATTR, which the samplers read as a violated constraint (TPE
proposes that region less; the refinement does not start from it). The confirmation's correctness gate
(verdict.correctness_gate) still checks whatever it promotes in full.
"""

from __future__ import annotations

import logging
from pathlib import Path

from orchestrator.records import OutputsRecord, OutputsRequest, TrialOutcome, TrialRole, TrialStatus
from orchestrator.results import correctness
from orchestrator.sweep._context import Context
from orchestrator.trial import outputs

log = logging.getLogger("sweep")

__all__ = ["judge", "request"]


def _on(ctx: Context) -> bool:
    c = ctx.spec.promotion.correctness
    return c.enabled and c.screen


def request(ctx: Context, role: TrialRole) -> OutputsRequest | None:
    """What a search-phase trial of `role` captures: a search trial its outputs, a baseline its outputs
    with the top tokens until the reference exists; None when the screen is off."""
    if not _on(ctx):
        return None
    c = ctx.spec.promotion.correctness
    if role is TrialRole.search:
        return OutputsRequest(prompts=c.prompts, max_new_tokens=c.max_new_tokens)
    if role is TrialRole.baseline and reference(ctx) is None:
        return OutputsRequest(prompts=c.prompts, max_new_tokens=c.max_new_tokens, top_logprobs=c.top_logprobs)
    return None


def reference(ctx: Context) -> OutputsRecord | None:
    """The first complete baseline capture with top tokens, among the measured baselines (kept in the
    context once found: every launch and record asks)."""
    if ctx.screen_reference is not None:
        return ctx.screen_reference
    prompts = ctx.spec.promotion.correctness.prompts
    for o in ctx.outcomes:
        if o.role is TrialRole.baseline and o.status is TrialStatus.COMPLETE:
            record = outputs.read(Path(o.trial_dir) if o.trial_dir else ctx.paths.trial_dir(o.number))
            if (
                record is not None
                and not record.error
                and len(record.prompts) >= prompts
                and all(p.output_top for p in record.prompts)
            ):
                ctx.screen_reference = record
                return record
    return None


def judge(ctx: Context, outcome: TrialOutcome, trial_dir: Path) -> TrialOutcome:
    """`outcome`, with `outputs_changed` set when the screen refuses its outputs."""
    if (
        not _on(ctx)
        or outcome.role is not TrialRole.search
        or outcome.status is not TrialStatus.COMPLETE
        or outcome.outputs_changed
    ):
        return outcome
    base = reference(ctx)
    if base is None:
        log.info("trial %d: correctness screen skipped: no baseline capture with top tokens yet", outcome.number)
        return outcome
    c = ctx.spec.promotion.correctness
    verdict = correctness.screen(outputs.read(trial_dir), base, prompts=c.prompts, tolerance_nats=c.tolerance_nats)
    if verdict.passed:
        if verdict.differing:
            log.info("trial %d: %s", outcome.number, verdict.text())
        return outcome
    log.warning("trial %d: %s; measured, but never a candidate", outcome.number, verdict.text())
    return outcome.model_copy(update={"outputs_changed": verdict.figure})
