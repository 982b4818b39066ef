"""How often the sequential confirmation gets it wrong, measured by running it many times.

Each simulated confirmation measures a champion of true gain G over the baseline, interleaved
A B / B A, every measurement with multiplicative noise (default 2%) on a host that slows down
linearly during the night (drift, default 3% per hour, one measurement every `--measure-s` seconds).
It stops when `verdict.gate.decide` returns a verdict. Reported per true gain: how often it
promotes, rejects, stays undecided, and the mean rounds spent.

    .venv/bin/python bench/gate_power.py --runs 4000 --max-rounds 12 -o /tmp/gate-power.json

With `--arms K`, K - 2 other arms are measured in the rounds up to min_rounds, as the confirmation measures
the ablations and the runner-up, and the gate's bound takes the noise of all of them (verdict.gate.evidence
with gate.pair_noise); `--pair-noise F` makes the pair F times noisier than the rest (the case the
bound's "never below the pair's own spread" guards):

    .venv/bin/python bench/gate_power.py --runs 4000 --arms 7 --noise 0.04 -o /tmp/gate-power-arms7.json

`--case ARMS:PAIR_NOISE:NOISE` (repeatable) writes several such tables into one file, each as the flags
would give it alone (the committed bench/results-gate-power.json: the command in docs/benchmarks.md).

With `--parts`, it measures the simpler-configuration rule instead (issue 21): a champion of true gain
`--champion-gain` over the baseline, one part of which (speculation) adds a true +0%, +1%, +3% or +5% on
top of the rest, the arm without it measured in the same rounds. Reported per part: how often the part
is dropped (the simpler configuration promoted) by the rule before (dropped when its 95% interval
includes zero: "not significant") and after (dropped only when its upper gate bound is below
`--margin`, promotion.equivalence_margin; an open part gets more rounds up to max_rounds, as
verdict/rounds.run_rounds gives it), with the mean rounds each spent. The decisions are the driver's
own (verdict.choose: contributions, simpler_choice[_before]; verdict.rounds: part_checks, open_parts;
verdict.gate.gate_of).

    .venv/bin/python bench/gate_power.py --parts --runs 1000 --max-rounds 12 -o bench/results-gate-power-parts.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _result  # noqa: E402  (bench/_result.py: the result file and what made it)

from orchestrator.results.figures import PartCheck  # noqa: E402
from orchestrator.verdict import choose, gate, rounds  # noqa: E402
from orchestrator.verdict.gate import RoundsPlan, Verdict  # noqa: E402


def one_confirmation(
    rng: np.random.Generator,
    true_gain: float,
    plan: RoundsPlan,
    *,
    noise: float,
    drift_per_h: float,
    measure_s: float,
    base: float = 90.0,
    arms: int = 2,
    pair_noise: float = 1.0,
) -> tuple[Verdict, int]:
    """One confirmation: the pair each round until the gate decides; with `arms` > 2, the other arms
    (levels drawn at 0.7-1.6x the baseline's) measured after the pair in the rounds up to min_rounds, as
    verdict/rounds.run_rounds measures the ablations and the runner-up, and the gate's bound on the noise
    of all of them (gate.pair_noise). The pair's noise is `pair_noise` x the others'."""
    truth = {
        "champion": base * (1.0 + true_gain),
        "baseline": base,
        **{f"arm{k}": base * float(rng.uniform(0.7, 1.6)) for k in range(arms - 2)},
    }
    values: dict[str, dict[int, float]] = {name: {} for name in truth}
    t = 0.0
    for i in range(plan.max_rounds):
        names = list(truth) if i < plan.min_rounds else ["champion", "baseline"]
        for who in names if i % 2 == 0 else list(reversed(names)):
            slow = 1.0 - drift_per_h * t / 3600.0
            sd = noise * (pair_noise if who in ("champion", "baseline") else 1.0)
            values[who][i] = truth[who] * slow * float(np.exp(sd * rng.standard_normal()))
            t += measure_s
        decision = gate.gate_of(values, "champion", plan, direction="maximize")
        if decision is not None and decision.verdict is not None:
            return decision.verdict, i + 1
    raise AssertionError("decide() must reach a verdict by max_rounds")


def one_part_check(
    rng: np.random.Generator,
    champion_gain: float,
    part: float,
    plan: RoundsPlan,
    *,
    noise: float,
    drift_per_h: float,
    measure_s: float,
    margin: float,
    base: float = 90.0,
) -> tuple[bool, bool, int]:
    """One confirmation with the arm without the part: (dropped by the rule before, dropped after, rounds
    the rule after measured). The main pair goes on until the gate decides; the arm for min_rounds
    rounds, then (after, once promoted) with the pair while its part is open, up to max_rounds."""
    truth = {
        "champion": base * (1.0 + champion_gain),
        "baseline": base,
        "no_speculation": base * (1.0 + champion_gain) / (1.0 + part),
    }
    values: dict[str, dict[int, float]] = {name: {} for name in truth}
    t = 0.0
    decision = None
    before: bool | None = None
    rounds = 0
    for i in range(plan.max_rounds):
        if decision is None:
            arms = ["champion", "baseline"] + (["no_speculation"] if i < plan.min_rounds else [])
        else:
            if decision.verdict is not Verdict.promoted or not rounds.open_parts(_checks(values, plan, margin)):
                break
            arms = ["champion", "baseline", "no_speculation"]
        for who in arms if i % 2 == 0 else list(reversed(arms)):
            slow = 1.0 - drift_per_h * t / 3600.0
            values[who][i] = truth[who] * slow * float(np.exp(noise * rng.standard_normal()))
            t += measure_s
        rounds = i + 1
        if decision is None:
            d = gate.gate_of(values, "champion", plan, direction="maximize")  # as verdict.rounds._decided
            if d is not None and d.verdict is not None:
                decision = d
                found = choose.contributions(values, speculation="EAGLE-3", sole_part="EAGLE-3", direction="maximize")
                before = (
                    d.verdict is Verdict.promoted
                    and choose.simpler_choice_before(values, found, plan, direction="maximize") is not None
                )
    after = (
        decision is not None
        and decision.verdict is Verdict.promoted
        and choose.simpler_choice(values, _checks(values, plan, margin), plan, direction="maximize") is not None
    )
    return bool(before), after, rounds


def _checks(values: dict[str, dict[int, float]], plan: RoundsPlan, margin: float) -> list[PartCheck]:
    return rounds.part_checks(values, speculation="EAGLE-3", margin=margin, level=plan.level, direction="maximize")


def parts_main(args: argparse.Namespace, plan: RoundsPlan) -> list[dict]:
    rng = np.random.default_rng(args.seed)
    rows = []
    print(
        f"{args.runs} confirmations per row; champion {args.champion_gain:+.0%} over the baseline; noise "
        f"{args.noise:.1%}, drift {args.drift_per_h:.1%}/h, rounds {plan.min_rounds}..{plan.max_rounds}, "
        f"required gain {plan.min_gain:+.1%}, equivalence margin {args.margin:+.1%}"
    )
    print(f"{'part adds':>10} {'dropped before':>15} {'dropped after':>14} {'mean rounds after':>18}")
    for part in (0.0, 0.01, 0.03, 0.05):
        before = after = rounds = 0
        for _ in range(args.runs):
            b, a, n = one_part_check(
                rng,
                args.champion_gain,
                part,
                plan,
                noise=args.noise,
                drift_per_h=args.drift_per_h,
                measure_s=args.measure_s,
                margin=args.margin,
            )
            before += b
            after += a
            rounds += n
        row = {
            "part_gain": part,
            "dropped_before": before / args.runs,
            "dropped_after": after / args.runs,
            "mean_rounds_after": rounds / args.runs,
        }
        rows.append(row)
        print(
            f"{part:>+10.1%} {row['dropped_before']:>15.1%} {row['dropped_after']:>14.1%} "
            f"{row['mean_rounds_after']:>18.2f}"
        )
    return rows


def gain_rows(args: argparse.Namespace, plan: RoundsPlan, arms: int, pair_noise: float, noise: float) -> list[dict]:
    """One table: per true gain, how often the gate promotes, rejects or stays undecided, and its rounds.
    A fresh generator seeded with --seed for every table, so a table is the same alone or in a --case list."""
    rng = np.random.default_rng(args.seed)
    rows = []
    print(
        f"{args.runs} confirmations per row; noise {noise:.1%} (the pair's x{pair_noise:g}), drift "
        f"{args.drift_per_h:.1%}/h, {arms} arms up to min_rounds, rounds {plan.min_rounds}..{plan.max_rounds}, "
        f"required gain {plan.min_gain:+.1%}"
    )
    print(f"{'true gain':>10} {'promoted':>9} {'not better':>11} {'undecided':>10} {'mean rounds':>12}")
    for gain in (-0.05, 0.0, 0.01, 0.03, 0.05, 0.059, 0.10, 0.20, 0.60):
        counts = {v: 0 for v in Verdict}
        rounds = 0
        for _ in range(args.runs):
            verdict, n = one_confirmation(
                rng,
                gain,
                plan,
                noise=noise,
                drift_per_h=args.drift_per_h,
                measure_s=args.measure_s,
                arms=arms,
                pair_noise=pair_noise,
            )
            counts[verdict] += 1
            rounds += n
        row = {
            "true_gain": gain,
            **{v.value: counts[v] / args.runs for v in Verdict},
            "mean_rounds": rounds / args.runs,
        }
        rows.append(row)
        print(
            f"{gain:>+10.1%} {row['promoted']:>9.1%} {row['not_better']:>11.1%} {row['undecided']:>10.1%} "
            f"{row['mean_rounds']:>12.2f}"
        )
    return rows


def parse_case(text: str) -> tuple[int, float, float]:
    """--case ARMS:PAIR_NOISE:NOISE, e.g. 7:2:0.04 (seven arms, the pair twice as noisy, 4% noise)."""
    try:
        arms, pair_noise, noise = text.split(":")
        return int(arms), float(pair_noise), float(noise)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected ARMS:PAIR_NOISE:NOISE, e.g. 7:2:0.04 (7 arms, pair 2x noisier, 4% noise)"
        ) from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=4000)
    ap.add_argument("--noise", type=float, default=0.02)
    ap.add_argument("--drift-per-h", type=float, default=0.03)
    ap.add_argument("--measure-s", type=float, default=120.0, help="seconds one measurement takes")
    ap.add_argument("--min-rounds", type=int, default=3)
    ap.add_argument("--max-rounds", type=int, default=12)
    ap.add_argument("--min-gain", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    _result.add_output(ap, "--json")
    ap.add_argument("--parts", action="store_true", help="measure the simpler-configuration rule (issue 21)")
    ap.add_argument("--champion-gain", type=float, default=0.20, help="--parts: the champion's true gain")
    ap.add_argument("--margin", type=float, default=0.01, help="--parts: promotion.equivalence_margin")
    ap.add_argument(
        "--arms",
        type=int,
        default=2,
        help="arms measured in the rounds up to min_rounds (2: the pair alone); the gate's bound takes "
        "the noise of all of them",
    )
    ap.add_argument(
        "--pair-noise",
        type=float,
        default=1.0,
        help="the pair's noise as a multiple of the other arms' (a pair noisier than the rest)",
    )
    ap.add_argument(
        "--case",
        type=parse_case,
        action="append",
        metavar="ARMS:PAIR_NOISE:NOISE",
        help="one table per --case (repeatable), each as --arms/--pair-noise/--noise would give it alone",
    )
    args = ap.parse_args()
    run = _result.start()
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    plan = RoundsPlan(args.min_rounds, args.max_rounds, args.min_gain)
    if args.parts:
        rows = parts_main(args, plan)
        _result.write(args.out, {"settings": settings, "rows": rows}, run, indent=2)
        return
    cases = args.case or [(args.arms, args.pair_noise, args.noise)]
    tables = []
    for arms, pair_noise, noise in cases:
        rows = gain_rows(args, plan, arms, pair_noise, noise)
        tables.append({"arms": arms, "pair_noise": pair_noise, "noise": noise, "rows": rows})
        print()
    _result.write(args.out, {"settings": settings, "cases": tables}, run, indent=2)


if __name__ == "__main__":
    main()
