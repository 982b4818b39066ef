"""Failures as information (issue 34): a failed trial marks a region, not a point.

Each failure the sampler learns from, and each point the correctness screen refused, becomes a Region:
its core (the points that would fail the same way, never proposed again: they are settled without a
launch, as infeasible) and its edge (the nearest points that may not, proposed next by the refinement):

- oom: the speculation shape at its top-k with as many draft tokens or more, under any NCCL setting and
  anything else (memory grows with the draft tree; the NCCL setting does not change it); the edge is
  one draft token fewer (one draft step fewer at top-k 1).
- nccl_hang: the same NCCL setting with speculation on or off as it was; the edge is the next NCCL
  protocol (the fastest kept setting forcing another NCCL_PROTO) and the same NCCL setting without
  speculation. Two hangs also mark the NCCL values they share (one set at least), speculating or not,
  unless a measured point runs them.
- outputs changed (the screen refused it): every point forcing the same NCCL_PROTO, speculating or not
  as it was (a protocol that changes greedy outputs on this host does so at every setting); where no
  protocol was forced, the same NCCL setting. The edge is the next NCCL protocol.

Other failures (a crash, a start-up timeout) stay points: the exact repeat is settled as before.
Pure: the proposal policy and the stage-two sampler hand it the study's trials.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.config import eagle
from orchestrator.config.experiment import SearchSpace
from orchestrator.records import ParamValue
from orchestrator.search import space as sp

OOM, HANG, REFUSED = "oom", "nccl_hang", "outputs_changed"
SHAPED = frozenset({OOM, HANG, REFUSED})
"""The failure kinds (and the screen's refusal) whose region is more than the failed point."""
PROTO = "NCCL_PROTO"


def _nccl(params: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
    return {k: v for k, v in params.items() if k.startswith("NCCL_")}


def _speculating(params: Mapping[str, ParamValue]) -> bool:
    return bool(params.get("speculative_algorithm"))


def _shape(params: Mapping[str, ParamValue]) -> tuple[int, int]:
    """(top-k, draft tokens) a speculating server runs, SGLang's forced values filled in."""
    eff = eagle.effective(dict(params))
    return int(eff.get("speculative_eagle_topk") or 1), int(eff.get("speculative_num_draft_tokens") or 0)


@dataclass(frozen=True)
class Region:
    """The region trial `number`'s failure of `kind` (or the screen's refusal) marks around its `point`;
    with `shared`, the region two hangs have in common instead: every point with those NCCL values."""

    kind: str
    point: dict[str, ParamValue]
    number: int
    shared: tuple[tuple[str, ParamValue], ...] = ()

    def holds(self, params: Mapping[str, ParamValue]) -> bool:
        """Whether `params` lies in the core: it would fail the same way (module doc)."""
        if self.shared:
            return all(params.get(k) == v for k, v in self.shared)
        if self.kind == OOM:
            if not (_speculating(params) and _speculating(self.point)):
                return False
            (topk, draft), (at_k, at_draft) = _shape(params), _shape(self.point)
            return topk == at_k and draft >= at_draft
        if _speculating(params) != _speculating(self.point):
            return False
        forced = self.point.get(PROTO)
        if self.kind == REFUSED and forced is not None:
            return params.get(PROTO) == forced
        if self.kind in (HANG, REFUSED):
            return _nccl(params) == _nccl(self.point)
        return sp.key(params) == sp.key(self.point)

    def edge(self, space: SearchSpace, settings: Mapping[str, Mapping[str, ParamValue]]) -> list[dict[str, ParamValue]]:
        """The nearest points outside the core, nearest first (module doc); feasible, maybe tried already."""
        out: list[dict[str, ParamValue]] = []
        if self.shared:
            return out
        if self.kind == OOM:
            out += _fewer_drafts(space, self.point)
        else:
            out += _next_protocol(self.point, settings)
            if self.kind == HANG and _speculating(self.point):
                out.append(_settled(space, {**self.point, "speculative_algorithm": None}))
        return [p for p in out if sp.infeasible_reason(p) is None and not self.holds(p)]


def _settled(space: SearchSpace, point: dict[str, ParamValue]) -> dict[str, ParamValue]:
    """Knobs whose `when` no longer holds unset."""
    for name in sp.ordered(space):
        if not sp.is_active(space.params[name], point):
            point[name] = None
    return sp.complete(space, point)


def _fewer_drafts(space: SearchSpace, point: Mapping[str, ParamValue]) -> list[dict[str, ParamValue]]:
    """`point` with one draft token fewer, or one draft step fewer where top-k 1 fixes the draft tokens."""
    for name in ("speculative_num_draft_tokens", "speculative_num_steps"):
        param = space.params.get(name)
        current = point.get(name)
        if param is None or current is None:
            continue
        values = list(param.values())
        if current in values and values.index(current) > 0:
            return [_settled(space, {**point, name: values[values.index(current) - 1]})]
    return []


def _next_protocol(
    point: Mapping[str, ParamValue], settings: Mapping[str, Mapping[str, ParamValue]]
) -> list[dict[str, ParamValue]]:
    """`point` under the fastest kept NCCL setting (settings are fastest first) whose NCCL_PROTO differs."""
    for values in settings.values():
        if values.get(PROTO) != point.get(PROTO):
            return [{**point, **values}]
    return []


def regions_of(trials: Iterable[Any]) -> list[Region]:
    """The regions the study's trials mark: each a TrialView-like value (number, state, params, attrs)
    that failed with a SHAPED kind (a real failure, not a proposal settled without a launch), or was
    measured with its outputs changed (attrs `outputs_changed`)."""
    out: list[Region] = []
    measured: list[dict[str, ParamValue]] = []
    for t in trials:
        attrs = t.attrs
        if attrs.get("skipped"):
            continue
        if t.state == "FAIL" and attrs.get("failure_kind") in (OOM, HANG):
            out.append(Region(str(attrs["failure_kind"]), dict(t.params), t.number))
        elif t.state == "COMPLETE" and attrs.get(REFUSED):
            out.append(Region(REFUSED, dict(t.params), t.number))
        elif t.state == "COMPLETE":
            measured.append(dict(t.params))
    return out + _shared_hangs([r for r in out if r.kind == HANG], measured)


def _shared_hangs(hangs: Sequence[Region], measured: Sequence[Mapping[str, ParamValue]]) -> list[Region]:
    """For each two hangs, the NCCL values they share (at least one set), as a region of its own where no
    measured point lies in it: hangs under ALGO=Ring+CTAS=4 and under CTAS=4 alone point at CTAS=4."""
    out: list[Region] = []
    for i, a in enumerate(hangs):
        for b in hangs[i + 1 :]:
            shared = tuple(sorted((k, v) for k, v in _nccl(a.point).items() if b.point.get(k) == v))
            region = Region(HANG, a.point, max(a.number, b.number), shared)
            if any(v is not None for _, v in shared) and not any(region.holds(m) for m in measured):
                out.append(region)
    return out


def holding(regions: Sequence[Region], params: Mapping[str, ParamValue]) -> Region | None:
    """The first region whose core holds `params`, or None."""
    return next((r for r in regions if r.holds(params)), None)


def describe(region: Region) -> str:
    """Why a point of `region`'s core is not launched, for the console and sweep.log."""
    what = {OOM: "ran out of memory", HANG: "hung", REFUSED: "changed the outputs"}.get(region.kind, "failed")
    return f"in the region where trial {region.number} {what} ({region.kind})"
