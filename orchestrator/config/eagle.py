"""SGLang's EAGLE rules (reference INTERFACE.md 1.2), checked before any launch so an infeasible
point costs no server start:

  1. all three of steps, top-k and draft tokens are given, or none (SGLang asserts on a partial
     set; with none it picks its own per-model defaults), and none without an algorithm;
  2. top-k 1 forces draft tokens = steps + 1 (SGLang silently overrides any other value, so a
     sweep that varied draft tokens at top-k 1 would measure the same server under two names);
  3. draft tokens - 1 <= top-k + (steps - 1) * top-k^2 (torch.topk over the candidate tree
     fails at CUDA-graph capture otherwise);
  4. `speculative_adaptive` (SGLang 0.5.23 `--speculative-adaptive`: steps adapted at run time, one EMA
     of the acceptance length per batch-size slot) runs a chain: top-k 1 (or unset: 0.5.23 sets 1), draft
     tokens = steps + 1, and steps, the initial count, one of the union of the adaptive config's slots
     (`speculative_adaptive_config`, else 0.5.23's default: 0, 1, 3, 5, 7) or unset (0.5.23 starts at the
     union's middle, 3 by default): `arg_groups/speculative_hook.py` `_init_adaptive_speculative_params`
     raises ValueError for any other steps; `adaptive_spec_params.py` `adaptive_unsupported_reason` turns
     adaptive off for top-k != 1 (a warning, then static steps: the point would not run as asked).
     `speculative_adaptive_config` without `speculative_adaptive` is never read by SGLang;
  5. an `all_reduce_backend` the host or model cannot take (config/allreduce.py `backend_refusal`, SGLang
     0.5.23's own conditions and warning text), when the host is known (a CommContext).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.config import adaptive as adaptive_config
from orchestrator.config.allreduce import CommContext
from orchestrator.records import ParamValue

EAGLE_KNOBS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
RULE_KNOBS = (
    "speculative_algorithm",
    *EAGLE_KNOBS,
    "speculative_adaptive",
    "speculative_adaptive_config",
    "all_reduce_backend",
)
"""The knobs feasibility depends on; every other knob is free."""


class Rule(str, enum.Enum):
    """Which rule a point breaks; the value is the rule in words (what `sweep plan` counts by)."""

    without_algorithm = "EAGLE knobs set without speculative_algorithm"
    all_or_none = "EAGLE needs steps, top-k and draft tokens all together or none"
    topk_one = "top-k 1 forces draft tokens = steps + 1"
    tree_capacity = "draft tokens - 1 <= topk + (steps - 1) * topk^2"
    adaptive_chain = "speculative_adaptive runs a chain: top-k 1"
    adaptive_steps = "speculative_adaptive needs steps in the adaptive slots' union (0, 1, 3, 5, 7 by default)"
    zero_steps = "speculative_num_steps 0 only with speculative_adaptive"
    adaptive_config_alone = "speculative_adaptive_config without speculative_adaptive (SGLang never reads it)"
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
    if (
        out.get("speculative_algorithm") is not None
        and out.get("speculative_eagle_topk") == 1
        and steps is not None
        and out.get("speculative_num_draft_tokens") is None
    ):
        out["speculative_num_draft_tokens"] = int(steps) + 1
    return out


def infeasible(params: Mapping[str, ParamValue], comm: CommContext | None = None) -> Infeasible | None:
    """The rule a point breaks, or None when SGLang would run it as asked. With `comm` (the host and
    model known) an all_reduce_backend SGLang would not run there breaks rule 5."""
    if comm is not None and (refusal := comm.refusal(params)) is not None:
        return Infeasible(
            Rule.backend_unavailable,
            f"all_reduce_backend {params.get('all_reduce_backend')} on {comm.host.describe()}: {refusal.reason}",
        )
    params = effective(params)
    eagle = {k: params.get(k) for k in EAGLE_KNOBS}
    given = [k for k, v in eagle.items() if v is not None]
    adaptive = bool(params.get("speculative_adaptive"))
    if params.get("speculative_algorithm") is None:
        config = ["speculative_adaptive_config"] * (params.get("speculative_adaptive_config") is not None)
        if given or adaptive or config:
            named = ", ".join(given + ["speculative_adaptive"] * adaptive + config)
            return Infeasible(Rule.without_algorithm, f"{named} set without speculative_algorithm")
        return None
    if params.get("speculative_adaptive_config") is not None and not adaptive:
        return Infeasible(
            Rule.adaptive_config_alone,
            "speculative_adaptive_config set without speculative_adaptive: "
            "SGLang 0.5.23 reads the file only with --speculative-adaptive",
        )
    if adaptive:
        return _adaptive(eagle, params.get("speculative_adaptive_config"))
    if not given:
        return None  # SGLang chooses steps, top-k and draft tokens for the model itself
    if len(given) != 3:
        missing = [k for k in EAGLE_KNOBS if eagle[k] is None]
        return Infeasible(
            Rule.all_or_none,
            f"EAGLE needs steps, top-k and draft tokens all together or none "
            f"(SGLang asserts); missing {', '.join(missing)}",
        )
    steps, topk, ndt = (int(v) for v in eagle.values() if v is not None)
    if steps == 0:  # the tool's rule: a fixed chain of no draft steps is not speculation
        return Infeasible(
            Rule.zero_steps,
            "speculative_num_steps 0 drafts nothing: it exists only as a slot's "
            "step of speculative_adaptive (SGLang 0.5.23 DEFAULT_ADAPTIVE_CONFIG); "
            "for no drafting leave speculative_algorithm unset",
        )
    if topk == 1 and ndt != steps + 1:
        return Infeasible(
            Rule.topk_one,
            f"top-k 1 forces draft tokens = steps + 1 = {steps + 1}, but got {ndt} "
            f"(SGLang would silently run {steps + 1})",
        )
    capacity = topk + (steps - 1) * topk * topk
    if ndt - 1 > capacity:
        return Infeasible(
            Rule.tree_capacity,
            f"draft tokens - 1 <= topk + (steps - 1) * topk^2 must hold, but got "
            f"{ndt} - 1 > {topk} + {steps - 1}*{topk}^2 = {capacity}",
        )
    return None


def _adaptive(eagle: Mapping[str, ParamValue], config: ParamValue) -> Infeasible | None:
    """Why SGLang 0.5.23 refuses --speculative-adaptive with these EAGLE settings and adaptive config (a
    path, None: the default slots), or None."""
    steps, topk, ndt = (eagle[k] for k in EAGLE_KNOBS)
    try:
        union = adaptive_config.load(None if config is None else str(config)).candidate_steps
    except ValueError as exc:
        return Infeasible(Rule.adaptive_steps, f"speculative_adaptive_config: {exc}")
    candidates = ", ".join(map(str, union))
    if topk is not None and int(topk) != 1:
        return Infeasible(
            Rule.adaptive_chain,
            f"speculative_adaptive runs a chain (top-k 1, draft tokens = steps + 1), "
            f"but got speculative_eagle_topk {topk}",
        )
    if steps is not None and int(steps) not in union:
        return Infeasible(
            Rule.adaptive_steps,
            f"--speculative-num-steps={steps} is not in the adaptive config "
            f"candidate_steps [{candidates}] (SGLang 0.5.23 raises ValueError)",
        )
    if steps is not None and ndt is not None and int(ndt) != int(steps) + 1:
        return Infeasible(
            Rule.topk_one,
            f"top-k 1 forces draft tokens = steps + 1 = {int(steps) + 1}, but got {ndt} "
            f"(SGLang would silently run {int(steps) + 1})",
        )
    return None
