"""The correctness gate of the promotion: a configuration that changes the outputs is never promoted.

Called once the speed gate chose what to register (sweep._promote): the chosen configuration's greedy
outputs, captured in the first confirmation round, are compared with the baseline's
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

from orchestrator.fsio import write_json
from orchestrator.records import ScoredOutput
from orchestrator.results import contrib, correctness, sequential
from orchestrator.trial import outputs
from orchestrator.verdict import rounds
from orchestrator.verdict.outputs import run_dir, scored
from orchestrator.verdict.port import Port
from orchestrator.verdict.steps import Arms, Champion, Choice, Gate, Promotion
from orchestrator.verdict.value import Outcome

log = logging.getLogger("sweep")

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
    plan: sequential.RoundsPlan,
    chosen: Choice,
) -> Choice | Promotion:
    """`chosen` when its outputs are the baseline's; else the next configuration that passed the speed
    gate and this one, its verdict saying why the first was refused; else the Promotion refusing them."""
    if not port.spec.promotion.correctness.enabled:
        return chosen
    verdicts: dict[str, correctness.Correctness] = {}
    for choice in [chosen, *_alternatives(port, champion, measuring, measured.values, passed, plan, chosen)]:
        verdicts[choice.name] = verdict = check(port, choice.name)
        if verdict.passed:
            _keep(port, verdicts)
            log.info("%s: %s", choice.name, verdict.text())
            if choice is chosen:
                return replace(chosen, verdict=f"{chosen.verdict}. {verdict.text()}")
            refused = "; ".join(f"{name}: {v.text()}" for name, v in verdicts.items() if not v.passed)
            who = f"{choice.label} (the runner-up)" if choice.name == "runner_up" else choice.label
            return replace(
                choice,
                verdict=f"promoted {who} instead of {chosen.label}, which changes the "
                f"outputs ({refused}). {choice.verdict}. {verdict.text()}",
            )
    _keep(port, verdicts)
    refused = "; ".join(f"{name}: {v.text()}" for name, v in verdicts.items())
    why = (
        f"not promoted: the configuration passed the speed gate but not the correctness gate, and no "
        f"simpler form of it passed both ({refused}). Speed: {passed.verdict}"
    )
    log.warning("no promotion: %s", why)
    return Promotion(
        Outcome.outputs_changed, why, champion, measured.rows, passed, passed.figures, not_measured=measuring.dropped
    )


_DERIVATION = {"no_speculation": "without speculation", "default_communication": "with NCCL at defaults"}
"""How each simpler arm differs from the champion (as sweep._promote.choose names them)."""


def _alternatives(
    port: Port,
    champion: Champion,
    measuring: Arms,
    values: Mapping[str, Mapping[int, float]],
    passed: Gate,
    plan: sequential.RoundsPlan,
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
        decision = contrib.gate_of(values, arm, plan, direction=spec.objective.direction)
        if decision is not None and decision.verdict is sequential.Verdict.promoted and decision.evidence is not None:
            figures = contrib.confirmed(
                decision.evidence, spec.objective.metric, concurrency=spec.benchmark.concurrency
            )
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


def _keep(port: Port, verdicts: Mapping[str, correctness.Correctness]) -> None:
    write_json(port.workdir / "confirm" / "correctness.json", {k: v.record() for k, v in verdicts.items()})
