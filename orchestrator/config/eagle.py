"""SGLang's EAGLE rules (reference INTERFACE.md 1.2), checked before any launch so an infeasible
point costs no server start:

  1. all three of steps, top-k and draft tokens are given, or none (SGLang asserts on a partial
     set; with none it picks its own per-model defaults), and none without an algorithm;
  2. top-k 1 forces draft tokens = steps + 1 (SGLang silently overrides any other value, so a
     sweep that varied draft tokens at top-k 1 would measure the same server under two names);
  3. draft tokens - 1 <= top-k + (steps - 1) * top-k^2 (torch.topk over the candidate tree
     fails at CUDA-graph capture otherwise);
  4. `speculative_adaptive` (SGLang 0.5.23 `--speculative-adaptive`: steps adapted at run time from
     an EMA of the acceptance length) runs a chain: top-k 1, draft tokens = steps + 1, and steps, the
     initial count, given and one of the adaptive config's candidate_steps (default 1, 3, 7);
     SGLang refuses any other steps at resolution, and skips its automatic choice when adaptive;
  5. an `all_reduce_backend` the host or model cannot take (config/allreduce.py `backend_refusal`, SGLang
     0.5.23's own conditions and warning text), when the host is known (a CommContext).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.config.allreduce import CommContext
from orchestrator.config.knobs import ADAPTIVE_CANDIDATE_STEPS
from orchestrator.records import ParamValue

EAGLE_KNOBS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
RULE_KNOBS = ("speculative_algorithm", *EAGLE_KNOBS, "speculative_adaptive", "all_reduce_backend")
"""The knobs feasibility depends on; every other knob is free."""


class Rule(str, enum.Enum):
    """Which rule a point breaks; the value is the rule in words (what `sweep plan` counts by)."""

    without_algorithm = "EAGLE knobs set without speculative_algorithm"
    all_or_none = "EAGLE needs steps, top-k and draft tokens all together or none"
    topk_one = "top-k 1 forces draft tokens = steps + 1"
    tree_capacity = "draft tokens - 1 <= topk + (steps - 1) * topk^2"
    adaptive_chain = "speculative_adaptive runs a chain: top-k 1"
    adaptive_steps = "speculative_adaptive needs steps in candidate_steps (1, 3, 7)"
    backend_unavailable = "all_reduce_backend this host or model cannot take (SGLang 0.5.23)"


@dataclass(frozen=True)
class Infeasible:
    """Why SGLang would not run a point as asked: the rule and the sentence with the point's numbers."""

    rule: Rule
    detail: str

    def __str__(self) -> str:
        return self.detail


def effective(params: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
    """The point as SGLang will run it: at top-k 1 draft tokens is not a free knob (SGLang forces
    steps + 1), so a space may leave it out there (`when: {speculative_eagle_topk: [2, 4]}`) and the
    value is filled in here, for the launch plan and the model alike."""
    out = dict(params)
    steps = out.get("speculative_num_steps")
    if (out.get("speculative_algorithm") is not None and out.get("speculative_eagle_topk") == 1
            and steps is not None and out.get("speculative_num_draft_tokens") is None):
        out["speculative_num_draft_tokens"] = int(steps) + 1
    return out


def infeasible(params: Mapping[str, ParamValue], comm: CommContext | None = None) -> Infeasible | None:
    """The rule a point breaks, or None when SGLang would run it as asked. With `comm` (the host and
    model known) an all_reduce_backend SGLang would not run there breaks rule 5."""
    if comm is not None and (refusal := comm.refusal(params)) is not None:
        return Infeasible(Rule.backend_unavailable, f"all_reduce_backend {params.get('all_reduce_backend')} on "
                                                    f"{comm.host.describe()}: {refusal.reason}")
    params = effective(params)
    eagle = {k: params.get(k) for k in EAGLE_KNOBS}
    given = [k for k, v in eagle.items() if v is not None]
    adaptive = bool(params.get("speculative_adaptive"))
    if params.get("speculative_algorithm") is None:
        if given or adaptive:
            named = ", ".join(given + ["speculative_adaptive"] * adaptive)
            return Infeasible(Rule.without_algorithm, f"{named} set without speculative_algorithm")
        return None
    if adaptive and (problem := _adaptive(eagle)):
        return problem
    if not given:
        return None  # SGLang chooses steps, top-k and draft tokens for the model itself
    if len(given) != 3:
        missing = [k for k in EAGLE_KNOBS if eagle[k] is None]
        return Infeasible(Rule.all_or_none, f"EAGLE needs steps, top-k and draft tokens all together or none "
                                            f"(SGLang asserts); missing {', '.join(missing)}")
    steps, topk, ndt = (int(v) for v in eagle.values() if v is not None)
    if topk == 1 and ndt != steps + 1:
        return Infeasible(Rule.topk_one, f"top-k 1 forces draft tokens = steps + 1 = {steps + 1}, but got {ndt} "
                                         f"(SGLang would silently run {steps + 1})")
    capacity = topk + (steps - 1) * topk * topk
    if ndt - 1 > capacity:
        return Infeasible(Rule.tree_capacity, f"draft tokens - 1 <= topk + (steps - 1) * topk^2 must hold, but got "
                                              f"{ndt} - 1 > {topk} + {steps - 1}*{topk}^2 = {capacity}")
    return None


def _adaptive(eagle: Mapping[str, ParamValue]) -> Infeasible | None:
    """Why SGLang refuses --speculative-adaptive with these EAGLE settings, or None."""
    steps, topk = eagle["speculative_num_steps"], eagle["speculative_eagle_topk"]
    candidates = ", ".join(map(str, ADAPTIVE_CANDIDATE_STEPS))
    if topk is not None and int(topk) != 1:
        return Infeasible(Rule.adaptive_chain, f"speculative_adaptive runs a chain (top-k 1, draft tokens = steps + 1), "
                                               f"but got speculative_eagle_topk {topk}")
    if steps is None or int(steps) not in ADAPTIVE_CANDIDATE_STEPS:
        got = "none (SGLang skips its automatic choice when adaptive)" if steps is None else str(steps)
        return Infeasible(Rule.adaptive_steps, f"speculative_adaptive starts at speculative_num_steps, which must be "
                                               f"one of candidate_steps ({candidates}), but got {got}")
    return None
