"""A simulated night of the real driver: the experiments/kimi-k2.5-tp8.yaml space with EAGLE-3's part (--space
eagle3: 808,704 combinations, 684,288 feasible; on the PCIe profiles, whose all-reduce backend is inert, the
driver searches 404,352 / 342,144)
on the simulated engine at real scale, judged by the TRUE value of what it deploys.

Each night is `sweep.Sweep` itself (probe stage, proposal policy, Optuna study, record, baselines,
confirmation with the experiment's arms, gate, verdict, registry and env file, real Optuna and MLflow
sqlite stores in a temporary work directory) on the model-backed executor
(orchestrator/testing/model_executor.py): no server starts; each trial is the simulator's model of
the tool's own launch plan, times the simulated server's seeded run noise and host drift, and takes
the simulated server's seconds at simulator.time_scale 1 (real-scale load + graph capture, warm-up,
repeats of 16 x 512 tokens) on a virtual clock; the probe stage counts the cost model's probe seconds.
The budget is `--timeout` as `sweep run --timeout` takes it, and the wall time reported is the whole
run, confirmation included, as the tool spent it (nothing here holds time back or stops the search:
the driver does, or not).

Policies: two-stage (probe + kept NCCL settings + warm start, failure-aware TPE: the tool's default);
tpe (the same failure-aware TPE without the probe); random. Scenarios (SCENARIOS): `plain`; `hidden`, with
an OOM above 8 draft tokens at top-k 4 and an NCCL hang under NCCL_ALGO=Ring + NCCL_PROTO=LL128; issue 34's
failure shapes: `fastest-hang`, a failing region that holds the unconstrained optimum under the probe's
fastest NCCL settings (a hang under NCCL_PROTO=LL + NCCL_P2P_LEVEL=SYS + NCCL_MAX_CTAS=4 in the full server
only, and an OOM above 6 draft tokens at top-k 2), `fastest-hang-probed`, the same with the hang also seen
by the probe (a simulator fault: the probe records it and keeps the next settings), and `oom-edge`, an OOM
above 5 draft tokens at top-k 2 alone, whose edge (5 draft tokens) is near-optimal. Trials spent in a
region are counted; the optimum is then the best point outside it. --probe-mismatch M scales each probed
setting's latencies by a seeded factor in [1 - M, 1 + M] (the probe's ranking off from the server's). The optimum never
counts a point whose outputs the simulator corrupts (NCCL_PROTO forcing LL128 on a PCIe host,
results/truth.changes_outputs): the correctness gate refuses it, so no tool may deploy it; the optimum
with those points is kept beside it (`with_corrupting`). Worlds: --noise,
--hours, --profiles, --objective (decode_tok_s at 1 stream, or output_tok_s at 32; both: decode@1,output@32);
--remeasure-every sets
sampler.remeasure_every (0: the search without re-measured near-ties, the policy before it shipped). --space
algorithms searches the speculative algorithm too (search_spaces/speculation.yaml: none, EAGLE3, DFLASH, NGRAM,
each with its own knobs, on the kimi model profile's drafters) instead of EAGLE-3 alone; the optimum is then over
that space, and each algorithm's best deployable point is reported beside it (`algorithms`).

    .venv/bin/python bench/overnight.py [--seeds 10] [--first-seed 0] [--profiles pcie-rtxpro6000-x8,...]
        [--policies two-stage,tpe] [--scenarios plain,hidden,fastest-hang,...] [--noise 0.02] [--hours 8]
        [--probe-mismatch 0.2]
        [--objective decode@1|output@32] [--remeasure-every K] [--space eagle3|algorithms] [--jobs 2]
        [-o bench/results-overnight-noise4.json]

The true optimum needs every feasible point evaluated (about 15 s per profile and objective); it is
cached in the temp directory (sglang-sweep-overnight-optimum.json), keyed by the world and the space.
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import json
import logging
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import _result  # noqa: E402  (bench/_result.py: the result file and what made it)

from orchestrator.config import eagle  # noqa: E402
from orchestrator.config import experiment as spec_mod  # noqa: E402
from orchestrator.probe import PROBE_FILE, read_probe, run_probe, write_probe  # noqa: E402
from orchestrator.records import FailureKind, ParamValue, TrialOutcome, TrialRole, TrialStatus  # noqa: E402
from orchestrator.results import cost as cost_mod  # noqa: E402
from orchestrator.results import truth  # noqa: E402
from orchestrator.search import space as sp  # noqa: E402
from orchestrator.search.study import read_only  # noqa: E402
from orchestrator.sweep._probe_stage import probe_cost_s, speculation_start  # noqa: E402 - the stage's own policy
from orchestrator.sweep.driver import Sweep  # noqa: E402
from orchestrator.testing import ModelExecutor  # noqa: E402
from orchestrator.tracking.tracker import Tracker  # noqa: E402

PROFILES = ("pcie-rtxpro6000-x8", "pcie-rtxpro6000-x8-turin")
POLICIES = ("two-stage", "tpe", "random")
OBJECTIVES = {"decode@1": ("decode_tok_s", 1), "output@32": ("output_tok_s", 32)}
NOISE = 0.02
DRIFT_PER_HOUR = 0.005
"""The host slows 0.5% an hour (4% over the night): the simulator's --sim-drift."""
HOURS = 8.0
GPUS = 8
TARGET = 0.98
OOM_TOPK, OOM_ABOVE = 4, 8
HANG = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL128"}
FASTEST = {"NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_CTAS": 4}
"""The NCCL settings the probe ranks fastest on the PCIe profiles (and the optimum's): issue 34's hang region."""


@dataclass(frozen=True)
class Scenario:
    """What fails in a night's world: an OOM above `oom[1]` draft tokens at top-k `oom[0]`, an NCCL hang
    where every `hang` variable has its value; `probe_sees`: the hang is also a simulator fault, which the
    probe records (otherwise only the full server hangs)."""

    oom: tuple[int, int] | None = None
    hang: Mapping[str, ParamValue] | None = None
    probe_sees: bool = False

    def failure(self, params: Mapping[str, ParamValue]) -> tuple[FailureKind, str] | None:
        """This scenario's failure for `params`: oom, nccl_hang or None."""
        eff = eagle.effective(dict(params))
        draft = int(eff.get("speculative_num_draft_tokens") or 0)
        if self.oom is not None and eff.get("speculative_eagle_topk") == self.oom[0] and draft > self.oom[1]:
            return FailureKind.oom, "torch.OutOfMemoryError: CUDA out of memory (the hidden region)"
        if self.hang is not None and all(params.get(k) == v for k, v in self.hang.items()):
            return FailureKind.nccl_hang, "no token for 300s: a collective that never completes (the hidden region)"
        return None

    def faults(self) -> list[dict[str, str]]:
        """simulator.faults of the experiment: the hang where the probe sees it."""
        if not (self.probe_sees and self.hang):
            return []
        return [{"fault": "nccl_hang_when=" + ",".join(f"{k}:{v}" for k, v in self.hang.items())}]


SCENARIOS = {
    "plain": Scenario(),
    "hidden": Scenario(oom=(OOM_TOPK, OOM_ABOVE), hang=HANG),
    "fastest-hang": Scenario(oom=(2, 6), hang=FASTEST),
    "fastest-hang-probed": Scenario(oom=(2, 6), hang=FASTEST, probe_sees=True),
    "oom-edge": Scenario(oom=(2, 5)),
}
CACHE = Path(tempfile.gettempdir()) / "sglang-sweep-overnight-optimum.json"
SPACES = {"eagle3": "eagle3.yaml", "algorithms": "speculation.yaml"}
"""--space: the speculation part of the night's space (search_spaces/): EAGLE-3 or none (eagle3.yaml), or the
algorithm as a dimension (speculation.yaml: none, EAGLE3, DFLASH, NGRAM, each with its own knobs; issue 35)."""


@dataclass(frozen=True)
class World:
    profile: str
    noise: float = NOISE
    hours: float = HOURS
    objective: str = "decode@1"
    remeasure_every: int | None = None
    """sampler.remeasure_every of the night; None: as experiments/kimi-k2.5-tp8.yaml ships it."""
    prefill_correlation: float = 1.0
    """simulator.noise_prefill_correlation: how far a run's TTFT shares its decode noise (1: one speed)."""
    probe_mismatch: float = 0.0
    """Each probed setting's latencies scaled by a seeded factor in [1 - M, 1 + M] (0: the probe as measured)."""
    space: str = "eagle3"
    """The speculation part of the space (SPACES): eagle3, or algorithms (the algorithm searched too)."""


def experiment(world: World, policy: str, seed: int, scenario: str, workdir: Path) -> spec_mod.SweepSpec:
    """experiments/kimi-k2.5-tp8.yaml on the simulated engine at real scale (its model paths are placeholders)."""
    data = yaml.safe_load((REPO / "experiments" / "kimi-k2.5-tp8.yaml").read_text(encoding="utf-8"))
    data["engine"] = "simulator"
    data["server"].update(model="moonshotai/Kimi-K2.5", draft_model="lightseekorg/kimi-k2.5-eagle3")
    data["search_space"] = [str(REPO / "search_spaces" / name) for name in ("nccl.yaml", SPACES[world.space])]
    data["simulator"] = {
        "hardware_profile": world.profile,
        "model_profile": "kimi-k2.5",
        "noise": world.noise,
        "drift_per_hour": DRIFT_PER_HOUR,
        "time_scale": 1.0,
        "noise_prefill_correlation": world.prefill_correlation,
        "faults": SCENARIOS[scenario].faults(),
    }
    data["sampler"] = {**data["sampler"], "kind": "random" if policy == "random" else "tpe", "seed": seed}
    if world.remeasure_every is not None:
        data["sampler"]["remeasure_every"] = world.remeasure_every
    data["probe"] = {**data.get("probe", {}), "enabled": policy == "two-stage"}
    metric, level = OBJECTIVES[world.objective]
    data["objective"] = {**data["objective"], "metric": metric, "concurrency": level}
    if level > 1:  # the shipped ITL bound is one stream's; a host serving 32 streams judges throughput alone
        data["objective"].pop("constraints", None)
    data["benchmark"] = {**data["benchmark"], "requests": max(16, level)}
    data["budget"] = {**data["budget"], "trials": 100_000, "wall_time": f"{world.hours:g}h"}
    data["tracking"] = {"experiment": f"overnight-{seed}"}
    path = workdir / "exp.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return spec_mod.load(path)


def hidden_failure(params: Mapping[str, ParamValue]) -> tuple[FailureKind, str] | None:
    """The hidden scenario's failure for `params`: oom, nccl_hang or None."""
    return SCENARIOS["hidden"].failure(params)


def mismatched_probe(spec: spec_mod.SweepSpec, workdir: Path, mismatch: float, seed: int) -> float:
    """Probe `spec` into `workdir` (the sweep then reuses probe.json) with each setting's latencies scaled by
    a factor drawn in [1 - mismatch, 1 + mismatch] from (seed, setting); the probe's seconds on the clock."""
    result = run_probe(spec, workdir, budget=spec.probe.budget)
    factor = {s.setting: 1 + mismatch * random.Random(f"{seed}|{s.setting}").uniform(-1, 1) for s in result.settings}
    rows = tuple(
        r.model_copy(update={"median_us": r.median_us * factor.get(r.setting, 1.0)}) if r.median_us else r
        for r in result.rows
    )
    write_probe(result.model_copy(update={"rows": rows}), workdir / PROBE_FILE)
    return probe_cost_s(spec, result)


# ---------------------------------------------------------------- the true optimum (cached)


def _key(world: World) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        spec = experiment(world, "tpe", 0, "plain", Path(tmp))
    space = hashlib.sha256(spec.space.model_dump_json().encode()).hexdigest()[:16]
    return f"{world.profile}|{world.objective}|{space}|nccl-only|outputs-kept"


def _optimum_of(world: World) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        spec = experiment(world, "tpe", 0, "plain", Path(tmp))
    value, corrupts = truth.evaluator(spec), truth.changes_outputs(spec)
    best: tuple[float, dict[str, Any]] = (0.0, {})
    regions = {name: sc for name, sc in SCENARIOS.items() if name != "plain"}
    best_in = dict.fromkeys(regions, best)  # the best point outside each scenario's failing region
    best_any = best  # corrupting points included: what the optimum would be without the correctness gate
    # The old NCCL-only space (issue 19): the NCCL knobs searched, everything else as the baseline runs
    # (no speculation, SGLang's own all-reduce choice) or with the model's default EAGLE-3 speculation.
    fixed = {
        "baseline": sp.baseline_params(spec.space),
        "default_eagle3": speculation_start(spec, sp.baseline_params(spec.space)),
    }
    old = dict.fromkeys(fixed, 0.0)
    by_algorithm: dict[str, tuple[float, dict[str, Any]]] = {}  # the best deployable point of each algorithm
    for p in truth.feasible_points(spec):
        v = value(p)
        if v > best_any[0]:
            best_any = (v, dict(p))
        if corrupts(p):
            continue  # the correctness gate refuses it: no tool may deploy it, so it is no optimum to reach
        if v > best[0]:
            best = (v, dict(p))
        algorithm = str(p.get("speculative_algorithm") or "none")
        if v > by_algorithm.get(algorithm, (0.0,))[0]:
            by_algorithm[algorithm] = (v, dict(p))
        for name, sc in regions.items():
            if v > best_in[name][0] and sc.failure(p) is None:
                best_in[name] = (v, dict(p))
        for name, rest in fixed.items():
            if v > old[name] and all(p.get(k) == x for k, x in rest.items() if not k.startswith("NCCL_")):
                old[name] = v
    return {
        "plain": best[0],
        "plain_params": best[1],
        **{name: found[0] for name, found in best_in.items()},
        **{f"{name}_params": found[1] for name, found in best_in.items()},
        "nccl_only_baseline": old["baseline"],
        "nccl_only_default_eagle3": old["default_eagle3"],
        "with_corrupting": best_any[0],
        "with_corrupting_params": best_any[1],
        "algorithms": {name: found[0] for name, found in sorted(by_algorithm.items())},
        "algorithms_params": {name: found[1] for name, found in sorted(by_algorithm.items())},
    }


def optima(worlds: list[World], jobs: int) -> dict[str, dict[str, Any]]:
    cached = json.loads(CACHE.read_text()) if CACHE.exists() else {}
    keys = {w: _key(w) for w in worlds}
    todo = sorted(
        {w for w in worlds if not {*SCENARIOS, "algorithms"} <= set(cached.get(keys[w], {}))}, key=lambda w: keys[w]
    )
    todo = list({keys[w]: w for w in todo}.values())
    if todo:
        print(
            f"computing the true optimum of {len(todo)} world(s) (every feasible point; cached afterwards)", flush=True
        )
        with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(todo)))) as pool:
            for w, found in zip(todo, pool.map(_optimum_of, todo)):
                cached[keys[w]] = found
        CACHE.write_text(json.dumps(cached, indent=1))
    return {keys[w]: cached[keys[w]] for w in worlds}


# ---------------------------------------------------------------- one night


@dataclass
class Night:
    world: World
    policy: str
    seed: int
    scenario: str
    optimum: float
    launches: int = 0
    """Every server launch: search trials, baselines and confirmation runs."""
    trials: int = 0
    """Search and baseline trials."""
    failed: int = 0
    failed_in_region: int = 0
    probe_s: float = 0.0
    search_s: float = 0.0
    confirm_s: float = 0.0
    wall_s: float = 0.0
    """The whole run on the sweep's clock, from start to the verdict: never above the night, or the tool overran."""
    hours_to_target: float | None = None
    """GPU-hours until the best measured search trial was truly within TARGET of the optimum."""
    champion_true: float = 0.0
    """True value of what the night deploys: the registered configuration, else the baseline."""
    candidate_true: float = 0.0
    """True value of the search's champion (before the gate and the simpler-configuration rule)."""
    promoted_config: str = ""
    deployed_algorithm: str = "none"
    """The speculative algorithm of what the night deploys (none: the baseline or a point without speculation)."""
    candidate_algorithm: str = ""
    verdict: str = ""
    verdict_text: str = ""
    """The verdict's own sentence (why promoted, not better or undecided)."""
    stop_reason: str = ""
    kept: int | None = None
    history: list[tuple[float, float]] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.champion_true / self.optimum


_TEMPLATE: dict[str, Path] = {}


def _store_template() -> Path:
    """A migrated, empty MLflow sqlite store per process (migrating one costs seconds; copying, ms)."""
    if "path" not in _TEMPLATE:
        from mlflow.tracking import MlflowClient  # deferred: only the template needs MLflow here

        path = Path(tempfile.mkdtemp(prefix="overnight-mlflow-")) / "mlflow.db"
        atexit.register(shutil.rmtree, path.parent, True)  # each bench worker process (and test worker) has one
        MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
        _TEMPLATE["path"] = path
    return _TEMPLATE["path"]


def _outcomes(workdir: Path) -> list[TrialOutcome]:
    found = []
    for f in sorted((workdir / "trials").glob("*/outcome.json")):
        found.append(TrialOutcome.model_validate_json(f.read_text()))
    return found


def night(world: World, policy: str, seed: int, scenario: str, optimum: float) -> Night:
    """One night of the real driver in `world`."""
    quiet = logging.getLogger("sweep")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # a night logs hundreds of lines; restored after (tests run nights in-process)
    try:
        return _night(world, policy, seed, scenario, optimum)
    finally:
        quiet.setLevel(level)


def _night(world: World, policy: str, seed: int, scenario: str, optimum: float) -> Night:
    with tempfile.TemporaryDirectory() as tmp:
        spec = experiment(world, policy, seed, scenario, Path(tmp))
        wd = Path(tmp) / "wd"
        wd.mkdir()
        shutil.copyfile(_store_template(), wd / "mlflow.db")
        failing = SCENARIOS[scenario]
        executor = ModelExecutor(
            spec.budget.concurrent_trials, failures=failing.failure if scenario != "plain" else None
        )
        epoch = executor.clock.time()
        if world.probe_mismatch and spec.probe.enabled:
            executor.clock.spend(mismatched_probe(spec, wd, world.probe_mismatch, seed))
        summary = Sweep(spec, wd, executor=executor).run()
        true_value, corrupts = truth.evaluator(spec), truth.changes_outputs(spec)

        def value(params: Mapping[str, Any]) -> float:  # what deploying it is worth: nothing if its outputs change
            return 0.0 if corrupts(params) else true_value(params)

        result = Night(
            world,
            policy,
            seed,
            scenario,
            optimum,
            launches=executor.launched,
            wall_s=executor.clock.monotonic(),
            verdict=summary.outcome.value if summary.outcome else "",
            promoted_config=summary.promoted_config or "",
            stop_reason=summary.stop_reason,
            verdict_text=(summary.verdict or "")[:400],
        )
        if (wd / PROBE_FILE).exists():
            probe = read_probe(wd / PROBE_FILE)
            result.probe_s = cost_mod.probe_seconds(spec, len(probe.settings))
            views = read_only(f"sqlite:///{wd / 'optuna.db'}", spec.name)
            result.kept = (views[1].get("probe") or {}).get("kept") if views is not None else None
        searched = [o for o in _outcomes(wd) if o.role in (TrialRole.search, TrialRole.baseline)]
        result.trials = len(searched)
        result.failed = sum(o.status is TrialStatus.FAILED for o in searched)
        result.failed_in_region = (
            sum(o.status is TrialStatus.FAILED and failing.failure(o.params) is not None for o in searched)
            if scenario != "plain"
            else 0
        )
        last = max((o.finished_at for o in searched), default=epoch)
        result.search_s = last - epoch - result.probe_s
        result.confirm_s = result.wall_s - result.probe_s - result.search_s
        metric = spec.objective.metric
        best: float | None = None
        for o in sorted(
            (o for o in searched if o.role is TrialRole.search and o.metrics is not None), key=lambda o: o.finished_at
        ):
            measured = float(getattr(o.metrics, metric))
            if best is None or measured > best:
                best = measured
                true = value(o.params)
                hours = (o.finished_at - epoch) * GPUS / 3600
                result.history.append((round(hours, 3), round(true / optimum, 4)))
                if result.hours_to_target is None and true >= TARGET * optimum:
                    result.hours_to_target = hours
        baseline = next(o.params for o in searched if o.role is TrialRole.baseline)
        result.champion_true = value(baseline)
        if summary.champion:
            result.candidate_true = value(summary.champion["params"])
            result.candidate_algorithm = str(summary.champion["params"].get("speculative_algorithm") or "none")
        if summary.promoted:
            deployed = Tracker(f"sqlite:///{wd / 'mlflow.db'}", spec.name, outbox_dir=wd).resolve(
                spec.promotion.model_name, spec.promotion.alias
            )
            result.champion_true = value(deployed.params)
            result.deployed_algorithm = str(deployed.params.get("speculative_algorithm") or "none")
        return result


def _run(task: tuple[World, str, int, str, float]) -> Night:
    return night(*task)


# ---------------------------------------------------------------- report


def _median(values: list[float | None]) -> float | None:
    finite = [v if v is not None else math.inf for v in values]
    m = statistics.median(finite) if finite else math.inf
    return None if math.isinf(m) else m


def _row(group: list[Night]) -> dict[str, Any]:
    return {
        "seeds": len(group),
        "champion_at_98pct": sum(n.ratio >= TARGET for n in group),
        "champion_ratio_median": round(statistics.median(n.ratio for n in group), 4),
        "champion_ratio_min": round(min(n.ratio for n in group), 4),
        "candidate_ratio_median": round(statistics.median(n.candidate_true / n.optimum for n in group), 4),
        "promoted": sum(n.verdict == "promoted" for n in group),
        "promoted_configs": dict(sorted(Counter(n.promoted_config or "-" for n in group).items())),
        "deployed_algorithms": dict(sorted(Counter(n.deployed_algorithm for n in group).items())),
        "gpu_hours_to_98pct_median": _median([n.hours_to_target for n in group]),
        "reached_98pct": sum(n.hours_to_target is not None for n in group),
        "trials_median": statistics.median(n.trials for n in group),
        "launches_median": statistics.median(n.launches for n in group),
        "failed_trials_in_region_median": statistics.median(n.failed_in_region for n in group),
        "failed_trials_in_region_max": max(n.failed_in_region for n in group),
        "probe_hours": round(statistics.median(n.probe_s for n in group) / 3600, 3),
        "search_hours_median": round(statistics.median(n.search_s for n in group) / 3600, 2),
        "confirm_hours_median": round(statistics.median(n.confirm_s for n in group) / 3600, 2),
        "wall_hours_median": round(statistics.median(n.wall_s for n in group) / 3600, 2),
        "wall_hours_max": round(max(n.wall_s for n in group) / 3600, 2),
    }


def world_name(w: World) -> str:
    again = "" if w.remeasure_every is None else f", remeasure_every {w.remeasure_every}"
    ttft = "" if w.prefill_correlation == 1 else f", TTFT noise correlation {w.prefill_correlation:g}"
    off = f", probe off by {w.probe_mismatch:.0%}" if w.probe_mismatch else ""
    space = "" if w.space == "eagle3" else f", space {w.space}"
    return f"{w.profile}, {w.objective}, noise {w.noise:g}{ttft}, {w.hours:g} h{again}{off}{space}"


def summarize(nights: list[Night]) -> dict[str, Any]:
    groups: dict[tuple[str, str, str], list[Night]] = {}
    for n in nights:
        groups.setdefault((n.scenario, world_name(n.world), n.policy), []).append(n)
    table: dict[str, Any] = {}
    for (scenario, world, policy), group in groups.items():
        table.setdefault(scenario, {}).setdefault(world, {})[policy] = _row(group)
    return table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1")
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--policies", default="two-stage,tpe")
    ap.add_argument("--scenarios", default="plain")
    ap.add_argument("--noise", type=float, default=NOISE)
    ap.add_argument("--hours", type=float, default=HOURS)
    ap.add_argument(
        "--objective",
        default="decode@1",
        help=f"one or more of {', '.join(sorted(OBJECTIVES))}, comma-separated (each a world of its own)",
    )
    ap.add_argument(
        "--remeasure-every",
        type=int,
        default=None,
        help="sampler.remeasure_every of every night (default: as the kimi experiment ships it)",
    )
    ap.add_argument(
        "--prefill-correlation",
        type=float,
        default=1.0,
        help="how far a run's TTFT shares its decode noise (simulator.noise_prefill_correlation; "
        "default 1: one speed for the run; 0: TTFT says nothing of it)",
    )
    ap.add_argument(
        "--probe-mismatch",
        type=float,
        default=0.0,
        help="scale each probed setting's latencies by a seeded factor in [1 - M, 1 + M] (the probe's ranking "
        "off from the server's; default 0)",
    )
    ap.add_argument(
        "--space",
        choices=sorted(SPACES),
        default="eagle3",
        help="the speculation part of the space: eagle3 (EAGLE-3 or none, default) or algorithms (none, EAGLE3, "
        "DFLASH, NGRAM with their own knobs: search_spaces/speculation.yaml)",
    )
    ap.add_argument("--jobs", type=int, default=2)
    _result.add_output(ap)
    args = ap.parse_args()
    objectives = args.objective.split(",")
    if not set(objectives) <= set(OBJECTIVES):
        ap.error(f"--objective {args.objective}: each must be one of {', '.join(sorted(OBJECTIVES))}")
    run = _result.start()
    started = time.time()
    worlds = [
        World(
            p,
            args.noise,
            args.hours,
            objective,
            args.remeasure_every,
            args.prefill_correlation,
            args.probe_mismatch,
            args.space,
        )
        for p in args.profiles.split(",")
        for objective in objectives
    ]
    best = optima(worlds, args.jobs)
    keys = {w: _key(w) for w in worlds}
    tasks = [
        (w, policy, seed, scenario, best[keys[w]][scenario])
        for scenario in args.scenarios.split(",")
        for w in worlds
        for policy in args.policies.split(",")
        for seed in range(args.first_seed, args.first_seed + args.seeds)
    ]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        nights = list(pool.map(_run, tasks))
    table = summarize(nights)
    for w in worlds:
        o = best[keys[w]]
        print(
            f"{world_name(w)}: optimum {o['plain']:.1f}; the old NCCL-only space reaches "
            f"{o['nccl_only_baseline'] / o['plain']:.3f} of it without speculation, "
            f"{o['nccl_only_default_eagle3'] / o['plain']:.3f} with the default EAGLE-3"
        )
        print(
            "  best of each algorithm (true value, share of the optimum): "
            + "; ".join(f"{a} {v:.1f} ({v / o['plain']:.3f})" for a, v in o["algorithms"].items())
        )
    for scenario, by_world in table.items():
        for world, by_policy in by_world.items():
            print(f"\n{scenario} / {world}")
            for policy, row in by_policy.items():
                print(
                    f"  {policy:9s} deployed>=98%: {row['champion_at_98pct']}/{row['seeds']} "
                    f"(median {row['champion_ratio_median']:.3f}, worst {row['champion_ratio_min']:.3f}); "
                    f"GPU-h to 98%: {row['gpu_hours_to_98pct_median']} ({row['reached_98pct']} reached); "
                    f"trials {row['trials_median']}, launches {row['launches_median']}; wall h median "
                    f"{row['wall_hours_median']} max {row['wall_hours_max']} (search {row['search_hours_median']}, "
                    f"confirmation {row['confirm_hours_median']}); promoted {row['promoted_configs']}; "
                    f"deployed {row['deployed_algorithms']}"
                )
    _result.write(
        args.out,
        {
            "driver": "the real sweep.Sweep on orchestrator.testing.ModelExecutor (virtual clock)",
            "drift_per_hour": DRIFT_PER_HOUR,
            "target": TARGET,
            "optima": {world_name(w): best[keys[w]] for w in worlds},
            "summary": table,
            "nights": [asdict(n) for n in nights],
        },
        run,
    )
    print(f"\n{time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
