"""A simulated night: the full experiments/kimi-k2.5-tp8.yaml space (670,464 feasible points), an
8-hour wall time at real-scale costs, judged by the TRUE value of the champion the sweep promotes.

No server is started. What is simulated: each full trial's result is the simulator's noise-free
model (results.truth) divided by a seeded run factor N(1, noise) and the host drift (1 + drift x
hours), as the simulated server does; its GPU-time is the cost model's (simulator.cost.trial_cost:
load + graph capture + warm-up + 3 repeats of 16 x 512 tokens at the trial's true decode rate; a
failed start costs the load, an NCCL hang the load plus the stall timeout). What is the tool's own:
the proposal policy (search/proposal.py), the Optuna study and sampler (search/study.py, TPE told of
failures), the probe on the simulated engine (probe.run_probe, its time counted at the cost model's
real-scale seconds per setting), the two-stage restriction and warm start (sweep/_probe_stage.py),
and the promotion statistics (results/sequential.py: interleaved champion/baseline rounds, min_gain
2%). The confirmation rounds are counted inside the night: the search stops early enough to fit the
first three.

Policies: two-stage (probe + kept NCCL settings + warm start) with failure-aware TPE; TPE alone (the
tool before this change: no probe, failures invisible to TPE); random. Scenarios: `plain`; `hidden`,
with an OOM above 8 draft tokens at top-k 4 and an NCCL hang under NCCL_ALGO=Ring + NCCL_PROTO=LL128
(full trials spent in that region are counted; the optimum is then the best point outside it).

    .venv/bin/python bench/overnight.py [--seeds 10] [--profiles pcie-rtxpro6000-x8,pcie-rtxpro6000-x8-turin]
        [--jobs 2] [--out bench/results-overnight.json]

The true optimum needs every feasible point evaluated (about 15 s per profile); it is cached in
the temp directory (sglang-sweep-overnight-optimum.json), keyed by the profile and the space.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.config import eagle  # noqa: E402
from orchestrator.config import experiment as spec_mod  # noqa: E402
from orchestrator.probe import run_probe  # noqa: E402
from orchestrator.records import Metrics, ParamValue, TrialOutcome, TrialRole, TrialStatus  # noqa: E402
from orchestrator.results import cost as cost_mod  # noqa: E402
from orchestrator.results import select, sequential, truth  # noqa: E402
from orchestrator.search import space as sp  # noqa: E402
from orchestrator.search.proposal import Proposal, ProposalPolicy  # noqa: E402
from orchestrator.search.study import IN_MEMORY, Study  # noqa: E402
from orchestrator.simulator import evaluate, load_hardware, load_model, trial_cost  # noqa: E402
from orchestrator.sweep._probe_stage import apply_probe  # noqa: E402

PROFILES = ("pcie-rtxpro6000-x8", "pcie-rtxpro6000-x8-turin")
POLICIES = ("two-stage", "tpe", "random")
NOISE = 0.02
DRIFT_PER_HOUR = 0.005
"""The host slows 0.5% an hour (4% over the night): the simulator's --sim-drift."""
WALL_S = 8 * 3600.0
GPUS = 8
TARGET = 0.98
OOM_TOPK, OOM_ABOVE = 4, 8
HANG = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL128"}
CACHE = Path(tempfile.gettempdir()) / "sglang-sweep-overnight-optimum.json"


def experiment(profile: str, policy: str, seed: int, scenario: str, workdir: Path) -> spec_mod.SweepSpec:
    """experiments/kimi-k2.5-tp8.yaml on the simulated engine (its model paths are placeholders)."""
    data = yaml.safe_load((REPO / "experiments" / "kimi-k2.5-tp8.yaml").read_text(encoding="utf-8"))
    data["engine"] = "simulator"
    data["server"].update(model="moonshotai/Kimi-K2.5", draft_model="lightseekorg/kimi-k2.5-eagle3")
    data["search_space"] = [str(REPO / "search_spaces" / "nccl.yaml"), str(REPO / "search_spaces" / "eagle3.yaml")]
    data["simulator"] = {"hardware_profile": profile, "model_profile": "kimi-k2.5", "noise": NOISE,
                         "drift_per_hour": DRIFT_PER_HOUR}
    if scenario == "hidden":
        data["simulator"]["faults"] = [
            {"fault": f"oom_above_draft_tokens={OOM_ABOVE}", "when": {"speculative_eagle_topk": OOM_TOPK}},
            {"fault": "nccl_hang", "when": dict(HANG)}]
    data["sampler"] = {"kind": "random" if policy == "random" else "tpe", "seed": seed,
                       "startup_trials": data["sampler"].get("startup_trials", 10)}
    data["probe"] = {"enabled": policy == "two-stage"}
    # The field report's question, whatever load the experiment file judges at: one stream's decode speed.
    data["objective"] = {**data["objective"], "metric": "decode_tok_s", "concurrency": 1}
    data["benchmark"] = {**data["benchmark"], "requests": 16}
    path = workdir / "exp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return spec_mod.load(path)


def hidden_failure(params: Mapping[str, ParamValue]) -> str | None:
    """The hidden scenario's failure for `params`: oom, nccl_hang or None."""
    eff = eagle.effective(dict(params))
    if eff.get("speculative_eagle_topk") == OOM_TOPK and int(eff.get("speculative_num_draft_tokens") or 0) > OOM_ABOVE:
        return "oom"
    if all(params.get(k) == v for k, v in HANG.items()):
        return "nccl_hang"
    return None


# ---------------------------------------------------------------- the true optimum (cached)

def _space_hash(spec: spec_mod.SweepSpec) -> str:
    return hashlib.sha256(spec.space.model_dump_json().encode()).hexdigest()[:16]


def _optimum_of(profile: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        spec = experiment(profile, "tpe", 0, "plain", Path(tmp))
    value = truth.evaluator(spec)
    best = best_hidden = (0.0, {})
    for p in truth.feasible_points(spec):
        v = value(p)
        if v > best[0]:
            best = (v, dict(p))
        if v > best_hidden[0] and hidden_failure(p) is None:
            best_hidden = (v, dict(p))
    return {"space": _space_hash(spec), "plain": best[0], "plain_params": best[1],
            "hidden": best_hidden[0], "hidden_params": best_hidden[1]}


def optima(profiles: tuple[str, ...], jobs: int) -> dict[str, dict[str, Any]]:
    cached = json.loads(CACHE.read_text()) if CACHE.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        want = _space_hash(experiment(profiles[0], "tpe", 0, "plain", Path(tmp)))
    todo = [p for p in profiles if cached.get(p, {}).get("space") != want]
    if todo:
        print(f"computing the true optimum of {', '.join(todo)} (every feasible point; cached afterwards)", flush=True)
        with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(todo)))) as pool:
            for profile, found in zip(todo, pool.map(_optimum_of, todo)):
                cached[profile] = found
        CACHE.write_text(json.dumps(cached, indent=1))
    return {p: cached[p] for p in profiles}


# ---------------------------------------------------------------- one night

@dataclass
class Night:
    profile: str
    policy: str
    seed: int
    scenario: str
    optimum: float
    trials: int = 0
    failed: int = 0
    failed_in_region: int = 0
    probe_s: float = 0.0
    search_s: float = 0.0
    confirm_s: float = 0.0
    hours_to_target: float | None = None
    """GPU-hours until the best measured search trial (the champion candidate) was truly within TARGET."""
    champion_true: float = 0.0
    """True value of what the night deploys: the promoted champion, else the baseline (nothing promoted)."""
    candidate_true: float = 0.0
    verdict: str = ""
    kept: int | None = None
    history: list[tuple[float, float]] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.champion_true / self.optimum


class Bench:
    """The costs and measurements of one experiment: true values, noisy measurements, GPU-seconds."""

    def __init__(self, spec: spec_mod.SweepSpec, scenario: str, rng: random.Random):
        self.spec, self.scenario, self.rng = spec, scenario, rng
        self.hw = load_hardware(spec.simulator.hardware_profile)
        self.model = load_model(spec.simulator.model_profile)
        self.value = truth.evaluator(spec)

    def rate(self, params: Mapping[str, ParamValue]) -> float:
        return self.value(params)

    def failure(self, params: Mapping[str, ParamValue]) -> str | None:
        if self.scenario == "hidden" and (kind := hidden_failure(params)) is not None:
            return kind
        pred = evaluate({**eagle.effective(dict(params)), "tp": self.spec.server.tp}, self.hw, self.model)
        return None if pred.ok else "server_crash"

    def seconds(self, params: Mapping[str, ParamValue], failure: str | None) -> float:
        load = self.model.load_weights_s + self.model.graph_capture_s
        if failure == "nccl_hang":
            return load + self.spec.benchmark.stall_timeout_s
        if failure is not None:
            return load
        b = self.spec.benchmark
        return trial_cost(self.model, self.hw, decode_tok_s=self.rate(params), requests=b.requests,
                          output_len=b.output_len, concurrency=b.concurrency, repeats=b.repeats,
                          warmup_requests=b.warmup_requests, input_len=b.input_len,
                          tp=self.spec.server.tp).total_s

    def measure(self, params: Mapping[str, ParamValue], at_s: float) -> float:
        run_factor = max(self.rng.gauss(1.0, NOISE), 0.5)
        return self.rate(params) / (run_factor * (1.0 + DRIFT_PER_HOUR * at_s / 3600.0))


LEARNED = frozenset({"oom", "nccl_hang", "startup_timeout", "server_crash"})


def night(profile: str, policy: str, seed: int, scenario: str, optimum: float, pick: str = "pooled") -> Night:
    """One simulated night. `pick`: the champion is the sweep's own pick (`pooled`: results/select.py's
    pick_champion, a confidence bound pooled over speculation and communication settings), the search
    trial with the best single measured value (`value`: the pick before it), or the best speed-up over
    the nearest baseline measurement (`speedup`: select.speedup / nearest_baseline)."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = experiment(profile, policy, seed, scenario, Path(tmp))
        result = Night(profile, policy, seed, scenario, optimum)
        bench = Bench(spec, scenario, random.Random(f"{seed}:{profile}:{policy}:{scenario}"))
        study = Study(IN_MEMORY, "night", spec.space, spec.sampler, ["maximize"])
        study.open()
        proposals = ProposalPolicy(study)
        clock = 0.0
        if spec.probe.enabled:
            probed = run_probe(spec, Path(tmp), budget=spec.probe.budget)
            result.probe_s = clock = cost_mod.probe_seconds(spec, len(probed.settings))
            result.kept = apply_probe(study, spec, probed).get("kept")
        baseline = sp.baseline_params(spec.space)
        study.enqueue(baseline, {"role": "baseline"})
        learn = policy == "two-stage"
        reserve = 2 * 3 * bench.seconds(baseline, None)  # the first three confirmation rounds
        searched: list[tuple[float, float, dict[str, ParamValue]]] = []
        baselines: list[tuple[float, float]] = []
        best: tuple[float, dict[str, ParamValue]] | None = None
        skips = finished = 0
        while clock + reserve < WALL_S and skips < 200:
            got = proposals.next()
            if got is None:
                break
            if not isinstance(got, Proposal):
                skips += 1
                continue
            skips = 0
            params = got.params
            failure = bench.failure(params)
            clock += bench.seconds(params, failure)
            result.trials += 1
            finished += 1
            if failure is not None:
                result.failed += 1
                result.failed_in_region += scenario == "hidden" and hidden_failure(params) is not None
                told = learn and failure in LEARNED and got.role == "search"
                study.tell_failed(got.number, {"failure_kind": failure}, learn=told)
                proposals.remember(params, got.number, None, learn=told)
            else:
                measured = bench.measure(params, clock)
                study.tell_complete(got.number, [measured], {})
                proposals.remember(params, got.number, [measured])
                if got.role == "search":
                    searched.append((clock, measured, dict(params)))
                else:
                    baselines.append((clock, measured))
                if got.role == "search" and (best is None or measured > best[0]):
                    best = (measured, dict(params))
                    true = bench.rate(params)
                    result.history.append((round(clock * GPUS / 3600, 3), round(true / optimum, 4)))
                    if result.hours_to_target is None and true >= TARGET * optimum:
                        result.hours_to_target = clock * GPUS / 3600
            if finished % spec.budget.baseline_every == 0:
                study.enqueue(baseline, {"role": "baseline"})
        result.search_s = clock - result.probe_s
        result.champion_true = bench.rate(baseline)
        if best is not None and pick == "pooled":  # the sweep's own pick (results/select.py)
            trials = [TrialOutcome(number=i, params=params, role=TrialRole.search, status=TrialStatus.COMPLETE,
                                   metrics=Metrics(decode_tok_s=value, output_tok_s=value), effective_env={"ok": True})
                      for i, (_, value, params) in enumerate(searched)]
            picked = select.pick_champion(trials, metric="decode_tok_s", direction="maximize")
            assert picked is not None
            best = (searched[picked.number][1], searched[picked.number][2])
        if best is not None and pick == "speedup":
            gains = [(select.speedup(value, select.nearest_baseline(at, baselines) or value), params)
                     for at, value, params in searched]
            best = max(gains, key=lambda vp: vp[0])
        if best is not None:
            champion = best[1]
            result.candidate_true = bench.rate(champion)
            plan = sequential.RoundsPlan(spec.promotion.min_rounds, spec.promotion.max_rounds, spec.promotion.min_gain)
            champ_vals: list[float] = []
            base_vals: list[float] = []
            while True:
                for who in sequential.round_order(len(champ_vals)):
                    params = champion if who == "champion" else baseline
                    clock += bench.seconds(params, None)
                    (champ_vals if who == "champion" else base_vals).append(bench.measure(params, clock))
                decision = sequential.decide(champ_vals, base_vals, plan)
                if decision.verdict is not None:
                    break
            result.verdict = decision.verdict.value
            result.confirm_s = clock - result.probe_s - result.search_s
            if decision.verdict is sequential.Verdict.promoted:
                result.champion_true = result.candidate_true
        return result


def _run(task: tuple[str, str, int, str, float, str]) -> Night:
    return night(*task)


# ---------------------------------------------------------------- report

def _median(values: list[float | None]) -> float | None:
    finite = [v if v is not None else math.inf for v in values]
    m = statistics.median(finite) if finite else math.inf
    return None if math.isinf(m) else m


def summarize(nights: list[Night]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in nights:
        out.setdefault(n.scenario, {}).setdefault(n.profile, {}).setdefault(n.policy, []).append(n)
    table: dict[str, Any] = {}
    for scenario, by_profile in out.items():
        for profile, by_policy in by_profile.items():
            for policy, group in by_policy.items():
                table.setdefault(scenario, {}).setdefault(profile, {})[policy] = {
                    "seeds": len(group),
                    "champion_at_98pct": sum(n.ratio >= TARGET for n in group),
                    "champion_ratio_median": round(statistics.median(n.ratio for n in group), 4),
                    "champion_ratio_min": round(min(n.ratio for n in group), 4),
                    "candidate_ratio_median": round(statistics.median(n.candidate_true / n.optimum for n in group), 4),
                    "promoted": sum(n.verdict == "promoted" for n in group),
                    "gpu_hours_to_98pct_median": _median([n.hours_to_target for n in group]),
                    "reached_98pct": sum(n.hours_to_target is not None for n in group),
                    "full_trials_median": statistics.median(n.trials for n in group),
                    "failed_trials_in_region_median": statistics.median(n.failed_in_region for n in group),
                    "failed_trials_in_region_max": max(n.failed_in_region for n in group),
                    "probe_hours": round(statistics.median(n.probe_s for n in group) / 3600, 3),
                    "confirm_hours_median": round(statistics.median(n.confirm_s for n in group) / 3600, 2),
                }
    return table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--scenarios", default="plain,hidden")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--pick", choices=("pooled", "value", "speedup"), default="pooled",
                    help="champion by the sweep's pooled pick (results/select.pick_champion), by best single measured "
                         "value, or by speed-up over the nearest baseline")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results-overnight.json")
    args = ap.parse_args()
    profiles = tuple(args.profiles.split(","))
    started = time.time()
    best = optima(profiles, args.jobs)
    tasks = [(profile, policy, seed, scenario, best[profile][scenario], args.pick)
             for scenario in args.scenarios.split(",") for profile in profiles
             for policy in args.policies.split(",") for seed in range(args.seeds)]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        nights = list(pool.map(_run, tasks))
    table = summarize(nights)
    for scenario, by_profile in table.items():
        for profile, by_policy in by_profile.items():
            print(f"\n{scenario} / {profile} (true optimum {best[profile][scenario]:.2f} tok/s)")
            for policy, row in by_policy.items():
                print(f"  {policy:9s} champion>=98%: {row['champion_at_98pct']}/{row['seeds']} "
                      f"(median {row['champion_ratio_median']:.3f}, min {row['champion_ratio_min']:.3f}); "
                      f"GPU-h to 98%: {row['gpu_hours_to_98pct_median']} ({row['reached_98pct']} reached); "
                      f"trials {row['full_trials_median']}; failing-region trials median "
                      f"{row['failed_trials_in_region_median']} max {row['failed_trials_in_region_max']}")
    args.out.write_text(json.dumps({
        "command": "bench/overnight.py " + " ".join(sys.argv[1:]),
        "noise": NOISE, "drift_per_hour": DRIFT_PER_HOUR, "wall_hours": WALL_S / 3600, "target": TARGET,
        "optima": best, "summary": table, "nights": [asdict(n) for n in nights],
        "seconds": round(time.time() - started, 1)}, indent=1))
    print(f"\nwrote {args.out} in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
