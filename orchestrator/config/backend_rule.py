"""The all_reduce_backend's rule before launch: a backend the host or model cannot take (config/allreduce.py
`backend_refusal`, SGLang 0.5.23's own conditions and warning text), known when the host is (a CommContext)."""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.config.allreduce import CommContext
from orchestrator.config.speculation_rules import Infeasible, Rule
from orchestrator.records import ParamValue


def refusal(params: Mapping[str, ParamValue], comm: CommContext | None) -> Infeasible | None:
    """Why SGLang 0.5.23 would not run the point's all_reduce_backend on `comm`'s host, or None (also
    when the host is not known)."""
    if comm is None or (why := comm.refusal(params)) is None:
        return None
    return Infeasible(
        Rule.backend_unavailable,
        f"all_reduce_backend {params.get('all_reduce_backend')} on {comm.host.describe()}: {why.reason}",
    )
