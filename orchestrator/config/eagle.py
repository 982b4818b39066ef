"""The rules before launch, in one call for the callers that settle points (search, sweep, results):

  - the speculative algorithm's (config/speculation.py, one class per algorithm, its rules from SGLang 0.5.23's
    `arg_groups/speculative_hook.py` in config/speculation_rules.py). For the EAGLE family (EAGLE, EAGLE3,
    STANDALONE): steps, top-k and draft tokens all or none; top-k 1 forces draft tokens = steps + 1; draft
    tokens - 1 <= top-k + (steps - 1) * top-k^2; `speculative_adaptive` (EAGLE/EAGLE3 only) runs a chain whose
    steps are in the adaptive config's union; `speculative_adaptive_config` only with `speculative_adaptive`.
    DFLASH: steps and top-k 1, block size = draft tokens. NGRAM: top-k comes from its BFS breadth. A knob of
    another algorithm is refused (SGLang never reads it);
  - the all_reduce_backend's (config/backend_rule.py), when the host is known (a CommContext).

The module keeps its name for its callers; the rules themselves live in the modules above.
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.config import backend_rule, speculation
from orchestrator.config.allreduce import CommContext
from orchestrator.config.speculation_rules import ALGORITHM_KNOBS, EAGLE_KNOBS, Infeasible, Rule
from orchestrator.records import ParamValue

__all__ = ["EAGLE_KNOBS", "RULE_KNOBS", "Infeasible", "Rule", "effective", "infeasible"]

RULE_KNOBS = (
    "speculative_algorithm",
    *EAGLE_KNOBS,
    "speculative_adaptive",
    "speculative_adaptive_config",
    *ALGORITHM_KNOBS,
    "all_reduce_backend",
)
"""The knobs feasibility depends on; every other knob is free."""


def effective(params: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
    """The point as SGLang will run it: at top-k 1 draft tokens is not a free knob for the EAGLE family (SGLang
    forces steps + 1), so a space may leave it out there (`when: {speculative_eagle_topk: [2, 4]}`) and the
    value is filled in here, for the launch plan and the model alike."""
    return speculation.effective(params)


def infeasible(params: Mapping[str, ParamValue], comm: CommContext | None = None) -> Infeasible | None:
    """The rule a point breaks, or None when SGLang would run it as asked. With `comm` (the host and
    model known) an all_reduce_backend SGLang would not run there breaks Rule.backend_unavailable."""
    return backend_rule.refusal(params, comm) or speculation.refusal(params)
