"""The correctness gate of the promotion: a configuration that changes the outputs is never promoted.

Which confirmation runs capture greedy outputs (`request`, asked by the port as it launches each run): round
one's runs of the configurations that may be promoted (the champion and its simpler forms, the runner-up) and
of the baseline capture the fixed prompts' greedy outputs after their benchmark; each later baseline run,
until one has, scores the outputs that differ from its own round-one outputs (the baseline's server rating
another configuration's tokens). Everything travels in the TrialSpec (records.OutputsRequest) and comes back
in the run's outputs.json.

The gate (`gate`), called once the speed gate chose what to register (verdict.choose): the chosen
configuration's greedy outputs, captured in the first confirmation round, are compared with the baseline's
(results.correctness: equal token streams, else the baseline server's logprob score within
promotion.correctness.tolerance_nats). A refused configuration gives way to the next one that passed
the speed gate and passes this one (the champion, then its simpler forms), or to nothing; the verdict
names the check and its figure either way, and correctness.json in the confirm folder keeps every
verdict reached.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from orchestrator.fsio import write_json
from orchestrator.records import OutputsRecord, OutputsRequest, ScoredOutput, ScoreRequest
from orchestrator.results import correctness
from orchestrator.trial import outputs
from orchestrator.verdict import rounds
from orchestrator.verdict.choose import confirmed
from orchestrator.verdict.gate import RoundsPlan, Verdict, gate_of
from orchestrator.verdict.port import Port
from orchestrator.verdict.steps import Arms, Champion, Choice, Gate, Promotion
from orchestrator.verdict.value import Outcome

log = logging.getLogger("sweep")

CANDIDATES = ("champion", "no_speculation", "default_communication", "runner_up")
"""The confirmation arms that may be promoted: their outputs are checked."""

_ROUNDS_SCANNED = 256
"""Confirmation rounds searched for the baseline's scores: the gate's (at most 100) and the ones after."""


def check(port: Port, arm: str) -> correctness.Correctness:
    """The correctness verdict on confirmation arm `arm` against the baseline."""
    c = port.spec.promotion.correctness
    scores: list[ScoredOutput] = []
    for i in range(1, _ROUNDS_SCANNED):
        record = scored(port, i)
        if record is not None:
            scores = list(record.scored)
            break
    return correctness.compare(
        arm,
        outputs.read(run_dir(port, 0, arm)),
        outputs.read(run_dir(port, 0, "baseline")),
        scores,
        prompts=c.prompts,
        tolerance_nats=c.tolerance_nats,
    )


def gate(
    port: Port,
    champion: Champion,
    measuring: Arms,
    measured: rounds.Measured,
    passed: Gate,
    plan: RoundsPlan,
    chosen: Choice,
) -> Choice | Promotion:
    """`chosen` when its outputs are the baseline's; else the next configuration that passed the speed
    gate and this one, its verdict saying why the first was refused; else the Promotion refusing them."""
    if not port.spec.promotion.correctness.enabled:
        return chosen
    verdicts: dict[str, correctness.Correctness] = {}
    accepted: Choice | None = None
    for choice in [chosen, *_alternatives(port, champion, measuring, measured.values, passed, plan, chosen)]:
        verdicts[choice.name] = check(port, choice.name)
        if verdicts[choice.name].passed:
            accepted = choice
            break
    write_json(port.workdir / "confirm" / "correctness.json", {k: v.record() for k, v in verdicts.items()})
    if accepted is None:
        refused = "; ".join(f"{name}: {v.text()}" for name, v in verdicts.items())
        why = (
            f"not promoted: the configuration passed the speed gate but not the correctness gate, and no "
            f"simpler form of it passed both ({refused}). Speed: {passed.verdict}"
        )
        log.warning("no promotion: %s", why)
        return Promotion(
            Outcome.outputs_changed,
            why,
            champion,
            measured.rows,
            passed,
            passed.figures,
            not_measured=measuring.dropped,
        )
    verdict = verdicts[accepted.name]
    log.info("%s: %s", accepted.name, verdict.text())
    if accepted is chosen:
        return replace(chosen, verdict=f"{chosen.verdict}. {verdict.text()}")
    refused = "; ".join(f"{name}: {v.text()}" for name, v in verdicts.items() if not v.passed)
    who = f"{accepted.label} (the runner-up)" if accepted.name == "runner_up" else accepted.label
    return replace(
        accepted,
        verdict=f"promoted {who} instead of {chosen.label}, which changes the "
        f"outputs ({refused}). {accepted.verdict}. {verdict.text()}",
    )


_DERIVATION = {"no_speculation": "without speculation", "default_communication": "with NCCL at defaults"}
"""How each simpler arm differs from the champion (as sweep._promote.choose names them)."""


def _alternatives(
    port: Port,
    champion: Champion,
    measuring: Arms,
    values: Mapping[str, Mapping[int, float]],
    passed: Gate,
    plan: RoundsPlan,
    chosen: Choice,
) -> list[Choice]:
    """The other configurations that passed the speed gate against the baseline: the champion (when
    it passed), then its simpler forms and the runner-up, each when it passes the gate itself."""
    spec = port.spec
    number = champion.trial.number
    out = []
    if chosen.name != "champion" and passed.passed:
        out.append(
            Choice(
                "champion",
                measuring.params_of("champion"),
                passed.figures,
                passed.verdict,
                Outcome.promoted,
                number=number,
                decision=passed.decision,
            )
        )
    for arm, derivation in (*_DERIVATION.items(), ("runner_up", "")):
        if arm == chosen.name:
            continue
        decision = gate_of(values, arm, plan, direction=spec.objective.direction)
        if decision is not None and decision.verdict is Verdict.promoted and decision.evidence is not None:
            figures = confirmed(decision.evidence, spec.objective.metric, concurrency=spec.benchmark.concurrency)
            of = number if derivation else next(x.number for x in measuring.arms if x.name == arm)
            label = f"trial {of} {derivation}" if derivation else f"trial {of} (the runner-up)"
            out.append(
                Choice(
                    arm,
                    measuring.params_of(arm),
                    figures,
                    f"{label} against the baseline: {decision.message}",
                    Outcome.promoted,
                    number=of,
                    derivation=derivation,
                    decision=decision,
                )
            )
    return out


# ------------------------------------------------------------------------------ the outputs the runs capture


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
    folder = run_dir(port, round_i, "baseline")
    record = outputs.read(folder)
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
            if b is not None and correctness.first_difference(p.output_ids, b.output_ids) is not None:
                out.append(
                    ScoreRequest(
                        arm=arm,
                        prompt=p.prompt,
                        input_ids=(*p.prompt_ids, *p.output_ids),
                        continuation=len(p.output_ids),
                    )
                )
    return tuple(out)
