"""`sweep export --format adaptive-config`: a `--speculative-adaptive-config` JSON for SGLang 0.5.23, tuned per
batch-size slot from the load levels the sweep measured.

SGLang 0.5.23's adaptive speculation (`sglang/srt/speculative/adaptive_spec_params.py`) keeps one slot per
batch size; a running batch is served by the slot of the largest batch size at or below it, and each slot
moves the draft steps among its own `candidate_steps` (0: no drafting) from an EMA of the acceptance length.
Its default slots ({1: [1,3,5,7], 8: [0,1,3], 32: [0,1], 64: [0]}) are a guess for any model and host; this
writes the slots from measurements instead:

  - a measurement is one completed run (a search trial, or a confirmation round at a promotion.concurrency
    level) of a fixed EAGLE/EAGLE3 chain (top-k 1, not adaptive: the only
    drafts adaptive runs, `adaptive_unsupported_reason`) or of no speculation (steps 0), at the concurrency
    its benchmark held (the most requests its measured repeat had in flight, read from bench.jsonl);
  - one slot per concurrency measured, keyed by it (the running batch is the concurrency, within
    max_running_requests); its candidate_steps are the steps that won there: the best measured value's steps
    and every other steps measured within `within` (default 2%) of it, so the slot's EMA can move between
    near-equals and never to a steps count that lost;
  - the file names where each slot came from under the key `sglang_sweep` (0.5.23 skips keys that are not
    all digits as slots, and its slots read only their own knobs, so the trace costs nothing at run time).

`tune` is pure (measurements in, config out); `measurements_from_workdir` reads a work directory. `carried` puts
such a file into a serving configuration (`sweep export --format env --with-adaptive-config FILE`): the champion
then runs --speculative-adaptive with --speculative-adaptive-config at the path the server reads it from.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from orchestrator.config import adaptive, speculation, yamlfile
from orchestrator.records import BenchRecord, ServingConfig, TrialOutcome, TrialStatus, launched_params

FORMAT = "adaptive-config"
WITHIN = 0.02
"""Steps measured within this fraction of a level's best value stay candidates of its slot."""
TRACE_KEY = "sglang_sweep"
ADAPTIVE_FLAG = "--speculative-adaptive"
CONFIG_FLAG = "--speculative-adaptive-config"


@dataclass(frozen=True)
class LoadMeasurement:
    """One trial's value at one load: `steps` draft steps of a fixed chain (0: no speculation)."""

    concurrency: int
    steps: int
    value: float
    """Output tokens per second of all streams together (what a slot's batch delivers)."""
    run: str
    """Where it was measured: the run's folder in the work directory (trials/0012, confirm/03-champion@8)."""


@dataclass(frozen=True)
class SlotChoice:
    """One slot of the exported config and the measurements it rests on."""

    batch_size: int
    candidate_steps: tuple[int, ...]
    best: int
    """The steps of the best median value at this level."""
    medians: Mapping[int, float]
    """Steps -> median value of its trials at this level."""
    runs: tuple[str, ...]


def chain_steps(params: Mapping[str, Any]) -> int | None:
    """The draft steps of a fixed chain adaptive could run (0 without speculation), or None for anything else."""
    name = params.get("speculative_algorithm")
    if name is None:
        return 0
    algo = speculation.ALGORITHMS.get(str(name))  # the registry says which algorithms adaptive runs
    if algo is None or not algo.adaptive or params.get("speculative_adaptive"):
        return None
    steps, topk = params.get("speculative_num_steps"), params.get("speculative_eagle_topk")
    if steps is None or topk not in (None, 1):
        return None
    return int(steps)


def tune(measurements: Iterable[LoadMeasurement], *, within: float = WITHIN) -> tuple[SlotChoice, ...]:
    """One slot per concurrency measured: the steps that won there (ValueError when no fixed chain was measured:
    a slot of no speculation alone says nothing of drafting)."""
    by_level: dict[int, dict[int, list[LoadMeasurement]]] = {}
    for m in measurements:
        by_level.setdefault(m.concurrency, {}).setdefault(m.steps, []).append(m)
    if not any(steps for by_steps in by_level.values() for steps in by_steps):
        raise ValueError(
            "no completed trial of a fixed EAGLE/EAGLE3 chain (top-k 1, not adaptive) to tune the slots from "
            "(trials without speculation alone say nothing of drafting); run a sweep whose space has "
            "speculative_algorithm EAGLE3 at top-k 1, with promotion.concurrency naming the loads you serve"
        )
    slots = []
    for level, by_steps in sorted(by_level.items()):
        medians = {s: statistics.median(m.value for m in ms) for s, ms in sorted(by_steps.items())}
        best = max(medians, key=lambda s: (medians[s], -s))  # a tie goes to fewer steps: less draft work
        kept = tuple(s for s, v in medians.items() if v >= medians[best] * (1.0 - within))
        runs = tuple(sorted(m.run for ms in by_steps.values() for m in ms))
        slots.append(SlotChoice(level, kept, best, medians, runs))
    return tuple(slots)


def render(slots: Sequence[SlotChoice], *, source: str = "") -> str:
    """The --speculative-adaptive-config JSON of `slots` (checked with config.adaptive's copy of 0.5.23's loader)."""
    data: dict[str, Any] = {str(s.batch_size): {"candidate_steps": list(s.candidate_steps)} for s in slots}
    data[TRACE_KEY] = {
        "source": source,
        "rule": f"per concurrency measured: the best median output tok/s's steps and every steps within "
        f"{WITHIN:.0%} of it (0 = no drafting)",
        "slots": {
            str(s.batch_size): {
                "best_steps": s.best,
                "median_output_tok_s": {str(k): round(v, 3) for k, v in s.medians.items()},
                "runs": list(s.runs),
            }
            for s in slots
        },
    }
    adaptive.parse(data)  # never write a file 0.5.23's loader would refuse
    return json.dumps(data, indent=2) + "\n"


def held_concurrency(records: Iterable[BenchRecord]) -> int:
    """The most measured requests of the first repeat that were in flight at once (0 when none completed)."""
    spans = [
        (r.start_s, r.start_s + r.latency_s)
        for r in records
        if r.ok and not r.warmup and r.repeat == 0 and r.latency_s is not None
    ]
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    most = running = 0
    for _, step in events:  # an end sorts before a start at the same instant: back-to-back is not overlap
        running += step
        most = max(most, running)
    return most


def _bench_records(path: Path) -> list[BenchRecord]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            records.append(BenchRecord.model_validate_json(line))
        except ValidationError:
            continue  # a torn last line of an interrupted trial
    return records


def measurements_from_workdir(workdir: Path) -> list[LoadMeasurement]:
    """Every completed run in `workdir` whose launch adaptive could run (chain_steps), at its load: the search's
    trials (trials/*) and the confirmation's rounds at each promotion.concurrency level (confirm/*)."""
    found = []
    for outcome_file in sorted([*workdir.glob("trials/*/outcome.json"), *workdir.glob("confirm/*/outcome.json")]):
        try:
            outcome = TrialOutcome.model_validate_json(outcome_file.read_text(encoding="utf-8"))
        except (OSError, ValidationError):
            continue
        steps = chain_steps(launched_params(outcome))
        if outcome.status is not TrialStatus.COMPLETE or outcome.metrics is None or steps is None:
            continue
        level = held_concurrency(_bench_records(outcome_file.parent / "bench.jsonl"))
        run = outcome_file.parent.relative_to(workdir).as_posix()
        if level > 0:
            found.append(LoadMeasurement(level, steps, outcome.metrics.output_tok_s, run))
    return found


def export_from_workdir(workdir: Path) -> tuple[str, tuple[SlotChoice, ...]]:
    """The adaptive config JSON tuned from `workdir`'s trials, and its slots (ValueError: nothing to tune from)."""
    slots = tune(measurements_from_workdir(workdir))
    return render(slots, source=str(workdir)), slots


def carried(config: ServingConfig, text: str, path: str) -> ServingConfig:
    """`config` running adaptive speculation from the adaptive config `text` (its JSON), which the server reads at
    `path`: --speculative-adaptive (unless set) and --speculative-adaptive-config PATH follow its flags.
    ValueError (what and how to fix it) where SGLang 0.5.23 would not run that: a config its loader refuses, a
    champion adaptive cannot run (only an EAGLE/EAGLE3 chain, top-k 1: `adaptive_unsupported_reason`), its
    steps outside the config's candidate_steps (`_init_adaptive_speculative_params`), or a path that is relative
    (the server would resolve it against its own working directory) or that no process can be given."""
    try:
        slots = adaptive.parse(json.loads(text))
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"it is not an adaptive config SGLang 0.5.23 reads ({exc})") from None
    params = config.params
    algo = speculation.get(params.get("speculative_algorithm"))
    steps, topk = params.get("speculative_num_steps"), params.get("speculative_eagle_topk")
    if algo is None or not algo.adaptive or topk not in (None, 1) or steps is None:
        what = "no speculation" if algo is None else f"{algo.name} at top-k {topk}, steps {steps}"
        raise ValueError(
            f"the champion runs {what}; SGLang 0.5.23 runs adaptive speculation only for an EAGLE/EAGLE3 chain "
            "(top-k 1) with its steps set, so the config would be ignored: export the env file without it"
        )
    if int(steps) not in slots.candidate_steps:
        raise ValueError(
            f"the champion's --speculative-num-steps {steps} is not among the config's candidate_steps "
            f"{list(slots.candidate_steps)}, which SGLang 0.5.23 refuses at start-up; export the config from the "
            "same sweep (sweep export --format adaptive-config), or add the steps to a slot"
        )
    if problem := _path_problem(path):
        raise ValueError(
            f"the path the server reads it from, {yamlfile.shorten(repr(path), 80)}, {problem}: give an absolute "
            "path on the serving host (in a container, where you mount it: e.g. /config/champion.adaptive.json)"
        )
    args = list(config.sglang_args)
    if any(a == CONFIG_FLAG or a.startswith(CONFIG_FLAG + "=") for a in args):
        raise ValueError(f"the champion's flags already hold {CONFIG_FLAG}; export it without --with-adaptive-config")
    if ADAPTIVE_FLAG not in args:
        args.append(ADAPTIVE_FLAG)
    args += [CONFIG_FLAG, path]
    params = {**params, "speculative_adaptive": True, "speculative_adaptive_config": path}
    return config.model_copy(update={"sglang_args": tuple(args), "params": params})


def _path_problem(path: str) -> str | None:
    """Why the server could not be pointed at `path` by a flag, or None."""
    if not os.path.isabs(path):
        return "is relative (the server would resolve it against its own working directory)"
    if any(c in path for c in "\n\r"):
        return "holds a line break, which an env file cannot carry"
    return yamlfile.arg_problem(path)
