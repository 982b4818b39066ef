"""Search efficiency on the simulator's noise-free truth: measured trials needed to reach 98% of the
true optimum, median over seeds, for TPE, random and grid (exhaustive in shuffled order).

It drives the sweep's own Study (Optuna ask/tell, the same TPE settings the driver uses, in memory
rather than sqlite) with the driver's rules: infeasible proposals and repeats of a measured point cost no trial
(the repeat is told the earlier value). Only the server is replaced by the model's truth, optionally
with multiplicative measurement noise.

    .venv/bin/python bench/search_efficiency.py [--space bench/spaces/search-bench.yaml] [--seeds 10] [-o FILE]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import _result  # noqa: E402  (bench/_result.py: the result file and what made it)

from orchestrator.config import experiment as spec_mod  # noqa: E402
from orchestrator.results import truth  # noqa: E402
from orchestrator.search.proposal import Proposal, ProposalPolicy  # noqa: E402
from orchestrator.search.study import IN_MEMORY, Study  # noqa: E402


def experiment(space_file: Path, sampler: str, seed: int) -> spec_mod.SweepSpec:
    data = yaml.safe_load((REPO / "experiments" / "demo.yaml").read_text(encoding="utf-8"))
    data["search_space"] = [str(space_file.resolve())]
    data["sampler"] = {"kind": sampler, "seed": seed, "startup_trials": 8}
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder) / "exp.yaml"
        tmp.write_text(yaml.safe_dump(data))
        return spec_mod.load(tmp)


def run_one(
    space_file: Path, sampler: str, seed: int, target: float, max_trials: int, noise: float, value_of
) -> tuple[int | None, float]:
    spec = experiment(space_file, sampler, seed)
    study = Study(IN_MEMORY, "bench", spec.space, spec.sampler, ["maximize"])
    study.open()
    rng = random.Random(seed)
    policy = ProposalPolicy(study)  # the driver's: infeasible points and repeats cost no trial
    measured = 0
    best_true = 0.0
    asks = 0
    while measured < max_trials and asks < 50 * max_trials:
        asks += 1
        proposal = policy.next()
        if proposal is None:
            break
        if not isinstance(proposal, Proposal):
            continue
        number, params = proposal.number, proposal.params
        true = value_of(params)
        observed = true * (1 + rng.gauss(0, noise)) if noise else true
        measured += 1
        study.tell_complete(number, [observed], {})
        policy.remember(params, number, [observed])
        best_true = max(best_true, true)  # judged by truth: what the champion really does
        if best_true >= target:
            return measured, best_true
    return None, best_true


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", type=Path, default=REPO / "bench" / "spaces" / "search-bench.yaml")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--max-trials", type=int, default=200)
    ap.add_argument("--noise", type=float, default=0.0, help="multiplicative measurement noise (sd)")
    ap.add_argument("--fraction", type=float, default=0.98)
    ap.add_argument("--samplers", default="tpe,random,grid")
    _result.add_output(ap, "--json")
    args = ap.parse_args()
    run = _result.start()

    base = experiment(args.space, "tpe", 0)
    t0 = time.time()
    t = truth.compute(base)
    value_of = truth.evaluator(base)
    target = args.fraction * t.optimum
    print(
        f"space {args.space.name}: {len(t.values)} feasible points, true optimum {t.optimum:.2f} tok/s, "
        f"target {args.fraction:.0%} = {target:.2f} (truth in {time.time() - t0:.1f}s)"
    )
    results: dict[str, list] = {}
    for sampler in args.samplers.split(","):
        rows = []
        t0 = time.time()
        for seed in range(args.seeds):
            n, best = run_one(args.space, sampler, seed, target, args.max_trials, args.noise, value_of)
            rows.append({"seed": seed, "trials_to_target": n, "best_true": best})
        reached = [r["trials_to_target"] for r in rows if r["trials_to_target"] is not None]
        med = statistics.median([r["trials_to_target"] or args.max_trials + 1 for r in rows])
        results[sampler] = rows
        print(
            f"{sampler:>6}: median trials to {args.fraction:.0%} of the optimum = {med:g} "
            f"(reached in {len(reached)}/{len(rows)} seeds within {args.max_trials}; per seed "
            f"{[r['trials_to_target'] for r in rows]}) [{time.time() - t0:.0f}s]"
        )
    _result.write(
        args.out,
        {
            "space": str(args.space),
            "feasible": len(t.values),
            "optimum": t.optimum,
            "fraction": args.fraction,
            "noise": args.noise,
            "results": results,
        },
        run,
        indent=2,
    )


if __name__ == "__main__":
    main()
