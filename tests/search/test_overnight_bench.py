"""bench/overnight.py's night, one seed: the real driver (sweep.Sweep) on the model-backed executor
at real scale, kept from rotting (the figures themselves are in docs/benchmarks.md)."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import overnight  # noqa: E402

PCIE = overnight.World("pcie-rtxpro6000-x8")
BEFORE = 0
"""sampler.remeasure_every of the nights the confirmation tests below were recorded on (the search without
re-measured near-ties): each is about the confirmation's handling of what that search handed it."""


def test_a_two_stage_night_probes_first_and_avoids_the_hidden_failing_region():
    night = overnight.night(PCIE, "two-stage", 0, "hidden", optimum=100.0)
    assert night.probe_s == 58.0 and night.kept is not None and 1 < night.kept < 48
    assert 15 <= night.trials <= 60  # an 8-hour night of ~10-minute trials, less the confirmation held back
    assert night.launches > night.trials  # the confirmation's runs are server launches too
    assert night.failed_in_region <= 3 and night.verdict == "promoted"
    assert night.probe_s + night.search_s + night.confirm_s == night.wall_s
    assert night.champion_true > 90.0  # the simulator's truth on this profile: optimum 100.70 tok/s


def test_tpe_alone_has_no_probe_stage():
    night = overnight.night(PCIE, "tpe", 0, "plain", optimum=100.0)
    assert night.probe_s == 0.0 and night.kept is None and night.trials >= 15


def test_a_round_short_of_time_keeps_the_runner_up_before_the_ablations():
    """Turin, seed 15 (a report seed of docs/benchmarks.md, looked at in this change): the search picked
    trial 2 (74.9 tok/s true) over trial 10, the optimum (78.5), measured twice; trial 10 was the runner-up
    and measured better than the pick in rounds 1 and 2. Round 3 had time for the main pair and some, not
    all, of the other arms. sweep/_confirm._fitting_round used to keep the main pair alone, so the runner-up
    had 2 rounds, too few for its own gate, and the 0.954 pick was deployed; now the other arms go by value
    (sweep.schedule.VALUE_ORDER: the runner-up first), only default_communication is left out.
    Since the searches have changed (the inert dimensions collapsed, the runner-up ranked in the fit over
    every searched trial), the night's pick is itself the optimum (trial 10, deployed as the champion)
    and the runner-up another point; the round short of time still keeps the runner-up and leaves out
    default_communication. With the shipped search (sampler.remeasure_every 4) the near-tie is settled
    during the search: the optimum is picked and deployed as the champion. Since the refinement tries new
    speculation shapes first (issue 34's short night) seed 10's is the case above; which arm the short round
    leaves out (default_communication or the adaptive counterpart) follows the plan's value order of the day,
    the runner-up never."""
    turin = overnight.World("pcie-rtxpro6000-x8-turin", remeasure_every=BEFORE)
    with _sweep_log() as lines:
        night = overnight._night(turin, "two-stage", 10, "plain", optimum=78.45)
    assert night.verdict == "promoted", night.verdict_text
    assert night.champion_true >= 0.98 * 78.45  # the deployed configuration's true value
    assert night.wall_s <= 8 * 3600 + 3600  # the night, plus one trial's deadline at most
    short = [line for line in lines if line.startswith("confirmation: round 3 leaves out")]
    left_out = short[0].removeprefix("confirmation: round 3 leaves out ").split(" (")[0] if short else ""
    assert left_out in ("default_communication", "adaptive") and "runner_up" not in short[0], lines
    shipped = overnight.night(overnight.World("pcie-rtxpro6000-x8-turin"), "two-stage", 10, "plain", optimum=78.45)
    assert shipped.promoted_config == "champion" and shipped.candidate_true >= 0.98 * 78.45, shipped.verdict_text
    assert shipped.champion_true >= 0.98 * 78.45 and shipped.wall_s <= 8 * 3600 + 3600


def test_a_noisy_nights_gate_decides_on_the_noise_of_every_arm_in_its_rounds():
    """pcie x8 at 4% noise, seed 22 (a report seed of docs/benchmarks.md): the search measured the optimum
    (trial 10) and picked it; three confirmation rounds measured it at +67% over the baseline, but three
    log ratios spread 0.43-0.63 left t(2)'s 99.5% bounds at [-9%, +207%]: undecided, nothing deployed
    (0.594 of the optimum). Then the third round planned a fourth for the gate from the noise of all the
    arms of rounds 1-2 (sweep/_confirm._gate_hold; promoted after 4 rounds). Now the gate's bound itself
    takes that noise (verdict.gate.evidence with gate.pair_noise: 6 arms in rounds 1-3, t on 10
    degrees of freedom instead of 2) and promotes at the first look. Here the pair's own spread is the
    larger of the two, and the bound takes it (gate.BoundNoise's floor), on the 10 degrees of freedom."""
    night = overnight.night(
        overnight.World("pcie-rtxpro6000-x8", noise=0.04, remeasure_every=BEFORE),
        "two-stage",
        22,
        "plain",
        optimum=100.70,
    )
    assert night.verdict == "promoted", night.verdict_text
    assert (
        "(gate bounds, 99.5% each side, the pair's own spread, above the noise of 6 arms in these rounds, "
        "t on 10 df) after 3 rounds"
    ) in night.verdict_text, night.verdict_text
    assert night.champion_true >= 0.98 * 100.70
    assert night.wall_s <= 8 * 3600 + 3600


def test_a_small_gain_gets_the_gates_rounds_before_the_other_arms():
    """pcie x8 at 32 streams, seed 25 (a report seed of docs/benchmarks.md, looked at in this change): the
    champion's gain is about +6% against the required +2%, which 3 rounds at 1.4% noise cannot show
    (rounds_needed: 12). The night used to measure the runner-up and with_speculation in rounds 1-3 and
    ended undecided after 7 rounds (+5.9% [+1.3%, +10.7%]), nothing deployed. Now round 3 keeps the time
    for the gate's later rounds and leaves those arms out; the gate promotes after 8 rounds. Two cuts of
    the hold failed by rounding: kept exactly to the round's own pair, the pair did not fit, and the round
    fell back to no hold at all (seed 25), or ended the night undecided after 2 rounds (seed 9)."""
    with _sweep_log() as lines:  # overnight._night: night() without the console kept quiet
        night = overnight._night(
            overnight.World("pcie-rtxpro6000-x8", objective="output@32", remeasure_every=BEFORE),
            "two-stage",
            25,
            "plain",
            optimum=752.71,
        )
    assert night.verdict == "promoted", night.verdict_text
    assert night.champion_true >= 0.98 * 752.71
    assert night.wall_s <= 8 * 3600 + 3600
    assert any("so the gate is expected to need 12 rounds" in line for line in lines)
    assert any(line.startswith("confirmation: round 3 leaves out runner_up") for line in lines), lines


@contextlib.contextmanager
def _sweep_log() -> Iterator[list[str]]:
    """The sweep's warnings while a night runs (bench/overnight.night keeps the console quiet)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Keep(logging.WARNING)
    logger = logging.getLogger("sweep")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
