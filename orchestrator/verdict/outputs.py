"""Which confirmation runs capture greedy outputs for the correctness gate (promotion.correctness).

Round one's runs of the configurations that may be promoted (the champion and its simpler forms) and
of the baseline capture the fixed prompts' greedy outputs after their benchmark; each later baseline
run, until one has, scores the outputs that differ from its own round-one outputs (the baseline's
server rating another configuration's tokens, sweep._correctness reads it). Everything travels in the
TrialSpec (records.OutputsRequest) and comes back in the run's outputs.json.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.records import OutputsRecord, OutputsRequest, ScoreRequest
from orchestrator.results.correctness import first_difference
from orchestrator.trial import outputs
from orchestrator.verdict.port import Port

CANDIDATES = ("champion", "no_speculation", "default_communication", "runner_up")
"""The confirmation arms that may be promoted: their outputs are checked."""


def run_dir(port: Port, round_i: int, arm: str) -> Path:
    """Where the confirmation run of `arm` in round `round_i` keeps its files (the port names the folder)."""
    return port.arm_dir(round_i, arm)


def request(port: Port, arm: str, round_i: int) -> OutputsRequest | None:
    """What the run of `arm` in round `round_i` (0-based) captures or scores; None: nothing."""
    c = port.spec.promotion.correctness
    if not c.enabled:
        return None
    if round_i == 0:
        return (
            OutputsRequest(prompts=c.prompts, max_new_tokens=c.max_new_tokens)
            if arm in (*CANDIDATES, "baseline")
            else None
        )
    if arm != "baseline" or any(scored(port, r) for r in range(1, round_i)):
        return None
    to_score = _to_score(port)
    return OutputsRequest(prompts=0, max_new_tokens=c.max_new_tokens, score=to_score) if to_score else None


def scored(port: Port, round_i: int) -> OutputsRecord | None:
    """The scores of a later round's baseline run, when it completed them."""
    record = outputs.read(run_dir(port, round_i, "baseline"))
    return record if record is not None and record.scored and not record.error else None


def _to_score(port: Port) -> tuple[ScoreRequest, ...]:
    """Every round-one output of a candidate that differs from the baseline's own."""
    base = outputs.read(run_dir(port, 0, "baseline"))
    if base is None:
        return ()
    own = {p.prompt: p for p in base.prompts}
    out = []
    for arm in CANDIDATES:
        record = outputs.read(run_dir(port, 0, arm))
        for p in record.prompts if record is not None else ():
            b = own.get(p.prompt)
            if b is not None and first_difference(p.output_ids, b.output_ids) is not None:
                out.append(
                    ScoreRequest(
                        arm=arm,
                        prompt=p.prompt,
                        input_ids=(*p.prompt_ids, *p.output_ids),
                        continuation=len(p.output_ids),
                    )
                )
    return tuple(out)
