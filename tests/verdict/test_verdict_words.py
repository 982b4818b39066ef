"""The verdict in words names the load the gate decided at, with the other levels' gains beside it,
for each of the gate's three decisions (the messages `gate.decide` really writes)."""

from __future__ import annotations

import pytest

from orchestrator.results import figures
from orchestrator.results.figures import Confirmed
from orchestrator.verdict import deployed
from orchestrator.verdict.gate import RoundsPlan, decide
from orchestrator.verdict.rounds import speculation_name

PLAN = RoundsPlan(min_rounds=3, max_rounds=4, min_gain=0.05)


def _level(c: int, gain: float, low: float, high: float) -> figures.LevelGain:
    return figures.LevelGain(
        concurrency=c,
        interval=figures.Interval(gain=gain, low=low, high=high, rounds=3, a_median=1 + gain, b_median=1.0),
    )


def test_promoted_at_32_streams_with_the_other_levels_beside_it():
    decision = decide([112.0, 113.0, 112.5, 112.2], [100.0, 100.5, 100.2, 99.8], PLAN)
    text = deployed.verdict_text(
        decision.message,
        concurrency=32,
        metric="output_tok_s",
        others=[_level(8, 0.2, 0.15, 0.25), _level(1, 0.31, 0.25, 0.37)],
        why="NCCL settings +12.0% [+8.0%, +16.0%]",
        after="By load: EAGLE-3 pays",
    )
    assert text.startswith("promoted at 32 concurrent streams (objective output_tok_s): +12.")
    assert (
        "after 4 rounds, above the required +5.0%; at 1 stream +31.0% [+25.0%, +37.0%]; "
        "at 8 streams +20.0% [+15.0%, +25.0%] (promotion.concurrency: 95% intervals over 3 rounds). "
        "Why (95% intervals): NCCL settings +12.0% [+8.0%, +16.0%]. By load: EAGLE-3 pays" in text
    )


@pytest.mark.parametrize(
    ("champion", "head"),
    [
        ([100.0, 101.0, 100.5], "not better at 1 stream (objective decode_tok_s): "),
        ([106.0, 103.0, 108.0, 102.0], "undecided after 4 rounds at 1 stream (objective decode_tok_s): "),
    ],
    ids=["not-better", "undecided"],
)
def test_every_decision_names_its_level(champion, head):
    decision = decide(champion, [100.0, 100.2, 99.9, 100.1][: len(champion)], PLAN)
    assert decision.verdict is not None, decision.message
    assert deployed.verdict_text(decision.message, concurrency=1, metric="decode_tok_s").startswith(head)


def test_the_level_goes_unnamed_when_there_is_nothing_to_tell_it_from():
    decision = decide([112.0, 113.0, 112.5, 112.2], [100.0, 100.5, 100.2, 99.8], PLAN)
    assert deployed.verdict_text(decision.message, concurrency=None, metric="decode_tok_s") == decision.message


def test_the_confirmed_figures_carry_their_level_into_the_env_header_metrics():
    figures = Confirmed(
        label="confirmed",
        metric="output_tok_s",
        champion_median=112.0,
        baseline_median=100.0,
        rounds=4,
        gain=0.12,
        low=0.08,
        high=0.17,
        concurrency=32,
    )
    assert figures.text().startswith("confirmed over 4 interleaved rounds at 32 concurrent streams: output_tok_s")
    assert figures.metrics()["confirmed_concurrency"] == 32.0


def test_a_speculation_is_named_by_its_label_in_the_registry() -> None:
    """verdict/rounds.speculation_name reads config/speculation.py's Algorithm.label ("EAGLE-3 on top")."""
    assert speculation_name({"speculative_algorithm": "EAGLE3"}) == "EAGLE-3"
    assert speculation_name({"speculative_algorithm": "DFLASH"}) == "DFLASH"
    assert speculation_name({"speculative_algorithm": None}) == "speculation"
    assert speculation_name({"speculative_algorithm": "MEDUSA"}) == "MEDUSA"  # never a KeyError in a sentence
