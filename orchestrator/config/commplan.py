"""What `sweep plan` says about the communication path: per message class which backend carries it (SGLang
0.5.23's resolution, config/allreduce.py) for each all-reduce backend the space can choose, and which
NCCL knobs are inert because NCCL carries no message class the objective depends on. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from orchestrator.config.allreduce import (
    BACKEND_CHOICES,
    DEFAULT_CHUNKED_PREFILL,
    FUSE_ALLREDUCE_MAX_BATCH_SIZE,
    OBJECTIVE_CLASSES,
    Backend,
    Carried,
    CommContext,
    carried,
    nccl_matters,
)
from orchestrator.config.allreduce import normalize_flags as _flags
from orchestrator.config.experiment import SweepSpec
from orchestrator.config.space import Scalar, SearchSpace
from orchestrator.records import ParamValue

SPECULATIVE_MAX_RUNNING = 48
"""SGLang 0.5.23 resets --max-running-requests to 48 with speculative decoding when it is not given."""
BACKEND_KNOBS = ("all_reduce_backend", "all_reduce_path")


@dataclass(frozen=True)
class Arm:
    """One value of the space's backend knob and what carries each message class with it."""

    knob: str | None
    value: Scalar
    classes: tuple[Carried, ...]
    nccl_matters: bool
    """NCCL carries some message of a class the objective depends on."""


@dataclass(frozen=True)
class CommPlan:
    depends_on: tuple[str, ...]
    """The message classes the objective and its constraints depend on."""
    arms: tuple[Arm, ...]
    nccl_knobs: tuple[str, ...]
    """The NCCL_* tuning knobs of the space."""
    others: tuple[Arm, ...] = ()
    """all_reduce_backend values the space does not offer that this host takes and that change a carrier."""

    @property
    def inert(self) -> bool:
        """NCCL carries no objective class whatever the backend knob says: the NCCL knobs change nothing."""
        return not any(arm.nccl_matters for arm in self.arms)

    def active_when(self) -> tuple[str, tuple[Scalar, ...]] | None:
        """(backend knob, its values where NCCL matters) when only some values put NCCL on the path."""
        knob = self.arms[0].knob if self.arms else None
        on = tuple(arm.value for arm in self.arms if arm.nccl_matters)
        if knob is None or not on or len(on) == len(self.arms):
            return None
        return knob, on


def _values(space: SearchSpace, name: str) -> list[ParamValue]:
    param = space.params.get(name)
    return list(param.values()) if param is not None else []


def draft_tokens(space: SearchSpace) -> tuple[int, int] | None:
    """(fewest, most) draft tokens per request a speculating point of the space verifies, None without one."""
    if not any(v is not None for v in _values(space, "speculative_algorithm")):
        return None
    algorithms = set(_values(space, "speculative_algorithm"))
    counts = [int(v) for v in _values(space, "speculative_num_draft_tokens") if v is not None]
    counts += [int(s) + 1 for s in _values(space, "speculative_num_steps") if s is not None]
    if "DFLASH" in algorithms:  # the block is the verify window (0.5.23 _handle_dflash; 16 when none is named)
        counts += [int(b) for b in _values(space, "speculative_dflash_block_size") if b is not None] or [16]
    if "NGRAM" in algorithms:  # 0.5.23 _handle_ngram: 12 draft tokens unless given
        counts.append(12)
    return (min(counts), max(counts)) if counts else (4, 4)  # none given: SGLang's default 3 steps, 4 tokens


def loads(spec: SweepSpec) -> tuple[int, int]:
    """(fewest, most) concurrent streams the sweep judges at (objective, promotion levels)."""
    levels = [spec.objective.concurrency or spec.benchmark.concurrency, *spec.promotion.concurrency]
    return min(levels), max(levels)


def plan(spec: SweepSpec, ctx: CommContext) -> CommPlan:
    """The communication path of the sweep on `ctx`'s host, per value of its backend knob."""
    metrics = [spec.objective.metric, *spec.objective.constraints]
    depends = tuple(dict.fromkeys(c for m in metrics for c in OBJECTIVE_CLASSES.get(m, ())))
    knob = next((k for k in BACKEND_KNOBS if k in spec.space.params), None)
    values: list[Scalar] = list(spec.space.params[knob].values()) if knob else [None]
    low, high = loads(spec)
    ndt = draft_tokens(spec.space)
    spec_on = ndt is not None
    running = min(high, SPECULATIVE_MAX_RUNNING) if spec_on else high
    chunk = int(_flags(spec.server.flags).get("chunked_prefill_size") or DEFAULT_CHUNKED_PREFILL)
    prompt = min(spec.benchmark.input_len, chunk)

    def arm(knob: str | None, value: Scalar) -> Arm:
        params = {knob: value} if knob else {}
        path = ctx.path(params, draft_tokens=ndt[1] if ndt else 1)
        classes = [carried(path, "decode", low, running)]
        if ndt:
            classes.append(carried(path, "verify", ndt[0] * low, ndt[1] * running))
        classes.append(carried(path, "prefill", prompt, max(prompt, chunk)))
        return Arm(knob, value, tuple(classes), nccl_matters(classes, depends))

    arms = [arm(knob, value) for value in values]
    offered = set(values) if knob == "all_reduce_backend" else set()
    others = _others(arms, [b for b in BACKEND_CHOICES if b not in offered], ctx, arm)
    nccl = tuple(n for n in spec.space.params if n.startswith("NCCL_") and n not in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS"))
    return CommPlan(depends, tuple(arms), nccl, tuple(others))


def _others(
    arms: list[Arm], backends: list[str], ctx: CommContext, arm: Callable[[str | None, Scalar], Arm]
) -> list[Arm]:
    """The backends not offered that this host takes and that change some carrier, once per distinct path."""
    seen = {a.classes for a in arms}
    others = []
    for backend in backends:
        if ctx.refusal({"all_reduce_backend": backend}) is not None:
            continue
        other = arm("all_reduce_backend", backend)
        if other.classes not in seen:
            seen.add(other.classes)
            others.append(other)
    return others


def lines(cp: CommPlan, ctx: CommContext) -> list[str]:
    """`sweep plan`'s paragraph: the host, per backend value the carriers, then the inert knobs."""
    out = [
        f"all-reduce path (SGLang 0.5.23's resolution, read from its code) on {ctx.host.describe()}, "
        f"{ctx.model.arch}, tp {ctx.tp}:"
    ]
    for arm in cp.arms:
        label = "engine default" if arm.value is None else f"{arm.knob} {arm.value}"
        out.append(f"  {label}:")
        out += [f"    {c.describe(ctx.model.token_bytes)}" for c in arm.classes]
        out.append(f"    -> {_verdict(arm, cp)}")
    if cp.others:
        out.append("  other backends this host takes, not in the space (all_reduce_backend):")
        for arm in cp.others:
            parts = "; ".join(c.describe(ctx.model.token_bytes) for c in arm.classes if c.message != "prefill")
            out.append(f"    {arm.value}: {parts}")
    if cp.nccl_knobs:
        if cp.inert:
            out.append(
                f"  inert for {' and '.join(cp.depends_on) or 'the objective'}: {', '.join(cp.nccl_knobs)} "
                f"(NCCL carries none of those messages with any backend this space can choose; "
                f"the search space collapses them)"
            )
        elif (when := cp.active_when()) is not None:
            out.append(
                f"  {', '.join(cp.nccl_knobs)} matter only at {when[0]} "
                f"{', '.join(str(v) for v in when[1])}: searched only there"
            )
    return out


def _verdict(arm: Arm, cp: CommPlan) -> str:
    objective = [c for c in arm.classes if c.message in cp.depends_on]
    carriers = {b for c in objective for b, _, _ in c.backends}
    names = " and ".join(c.message for c in objective) or "no objective class"
    if Backend.nccl not in carriers:
        return _without_nccl(arm, carriers, names)
    if carriers == {Backend.nccl}:
        return f"NCCL carries {names}: the NCCL_* knobs matter"
    return f"NCCL carries part of {names}: the NCCL_* knobs matter there"


def _without_nccl(arm: Arm, carriers: set[Backend], names: str) -> str:
    """The verdict when NCCL carries no objective class: who does, and whether NCCL_* touch prefill."""
    prefill = next((c for c in arm.classes if c.message == "prefill"), None)
    nccl_prefill = prefill is not None and any(b is Backend.nccl for b, _, _ in prefill.backends)
    tail = "NCCL_* affect prefill only" if nccl_prefill else "NCCL_* affect none of these messages"
    who = ", ".join(sorted(b.value for b in carriers))
    bound = f" up to {FUSE_ALLREDUCE_MAX_BATCH_SIZE} tokens" if carriers == {Backend.flashinfer_fusion} else ""
    return f"{who} carries {names}{bound}: {tail}"


def inert_backend(cp: CommPlan) -> str | None:
    """The backend knob when each of its values leaves every message class the objective depends on with
    the same carriers over the same sizes (a PCIe host at TP 8: auto and nccl both put decode and verify
    on NCCL, as 0.5.23 enables neither custom all-reduce nor the fusion there): the knob changes nothing
    the objective measures. None when some value moves a class, or the space has no such knob."""
    knob = cp.arms[0].knob if cp.arms else None
    if knob is None or len(cp.arms) < 2:
        return None
    first, *rest = ([c for c in arm.classes if c.message in cp.depends_on] for arm in cp.arms)
    return knob if all(classes == first for classes in rest) else None


def collapse_values(cp: CommPlan) -> Mapping[str, tuple[Scalar, ...]] | None:
    """The `when` condition that keeps the NCCL knobs only where NCCL carries an objective class
    (None: nothing to collapse; an empty mapping: drop them everywhere)."""
    if not cp.nccl_knobs:
        return None
    if cp.inert:
        return {}
    when = cp.active_when()
    return None if when is None else {when[0]: when[1]}
