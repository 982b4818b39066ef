"""How often the sequential confirmation gets it wrong, measured by running it many times.

Each simulated confirmation measures a champion of true gain G over the baseline, interleaved
A B / B A, every measurement with multiplicative noise (default 2%) on a host that slows down
linearly during the night (drift, default 3% per hour, one measurement every `--measure-s` seconds).
It stops when `results.sequential.decide` returns a verdict. Reported per true gain: how often it
promotes, rejects, stays undecided, and the mean rounds spent.

    .venv/bin/python bench/gate_power.py --runs 4000 --max-rounds 12 --json bench/results-gate-power.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.results.sequential import RoundsPlan, Verdict, decide, round_order  # noqa: E402


def one_confirmation(rng: np.random.Generator, true_gain: float, plan: RoundsPlan, *, noise: float,
                     drift_per_h: float, measure_s: float, base: float = 90.0) -> tuple[Verdict, int]:
    champion: list[float] = []
    baseline: list[float] = []
    t = 0.0
    for i in range(plan.max_rounds):
        for who in round_order(i):
            slow = 1.0 - drift_per_h * t / 3600.0
            truth = base * (1.0 + true_gain) if who == "champion" else base
            value = truth * slow * float(np.exp(noise * rng.standard_normal()))
            (champion if who == "champion" else baseline).append(value)
            t += measure_s
        decision = decide(champion, baseline, plan)
        if decision.verdict is not None:
            return decision.verdict, i + 1
    raise AssertionError("decide() must reach a verdict by max_rounds")


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
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    plan = RoundsPlan(args.min_rounds, args.max_rounds, args.min_gain)
    rng = np.random.default_rng(args.seed)
    rows = []
    print(f"{args.runs} confirmations per row; noise {args.noise:.1%}, drift {args.drift_per_h:.1%}/h, "
          f"rounds {plan.min_rounds}..{plan.max_rounds}, required gain {plan.min_gain:+.1%}")
    print(f"{'true gain':>10} {'promoted':>9} {'not better':>11} {'undecided':>10} {'mean rounds':>12}")
    for gain in (-0.05, 0.0, 0.01, 0.03, 0.05, 0.059, 0.10, 0.20):
        counts = {v: 0 for v in Verdict}
        rounds = 0
        for _ in range(args.runs):
            verdict, n = one_confirmation(rng, gain, plan, noise=args.noise, drift_per_h=args.drift_per_h,
                                          measure_s=args.measure_s)
            counts[verdict] += 1
            rounds += n
        row = {"true_gain": gain, **{v.value: counts[v] / args.runs for v in Verdict},
               "mean_rounds": rounds / args.runs}
        rows.append(row)
        print(f"{gain:>+10.1%} {row['promoted']:>9.1%} {row['not_better']:>11.1%} {row['undecided']:>10.1%} "
              f"{row['mean_rounds']:>12.2f}")
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "settings": vars(args) | {"json": str(args.json)},
                                         "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
