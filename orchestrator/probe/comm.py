"""The host's communication path as the sweep knows it before a launch: SGLang 0.5.23's resolution
(config/allreduce.py, config/commplan.py) over the host a hardware profile describes and the model's
facts, and the search space with the NCCL knobs collapsed where NCCL carries nothing the objective
depends on (issue 20: "a dimension that the communication path makes inert is collapsed").

`sweep plan` prints the same plan (cli/check.py); where the host is described before the first launch (the
simulator's hardware profile) the driver searches the collapsed space, so an H200 host whose decode and verify
all-reduces go through FlashInfer's fusion spends no trial on NCCL knobs outside all_reduce_backend nccl, and
a PCIe host none on the backend knob; a real engine's sweep searches the space as written (its host's topology
is known only once a trial ran). Read from SGLang's source, not measured on a GPU.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config import commplan
from orchestrator.config.allreduce import CommContext, Host, ModelFacts
from orchestrator.config.experiment import SweepSpec
from orchestrator.config.space import Scalar
from orchestrator.simulator import ProfileError, load_hardware, load_model

__all__ = ["Inert", "ProfileError", "comm_context", "host_from_profile", "collapsed", "inert_backend", "inert_nccl", "model_facts"]


def host_from_profile(name_or_path: str) -> Host:
    """The host a hardware profile describes, as the all-reduce resolution needs it (ProfileError when unknown)."""
    hw = load_hardware(name_or_path)
    return Host(name=hw.name, gpu_name=hw.gpu_name, compute_capability=hw.compute_capability
                if hw.compute_capability != (0, 0) else None,
                interconnect="nvlink" if hw.interconnect == "nvlink" else "pcie" if hw.interconnect == "pcie" else None,
                gpus=hw.gpus, nodes=hw.nodes, nvlink_multicast=hw.nvlink_multicast,
                flashinfer_pcie_ipc=hw.pcie_ipc is not None, default_cuda_graph_max_bs=hw.default_cuda_graph_max_bs)


def model_facts(s: SweepSpec, arch: str | None) -> tuple[ModelFacts, str]:
    """(the model's architecture and width, where they came from): the model directory's config.json when it
    is readable here, else the simulator's model profile (`arch` overrides the architecture)."""
    config = Path(s.server.model) / "config.json"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
        text = data.get("text_config") or data
        facts = ModelFacts(arch or data["architectures"][0], int(text["hidden_size"]))
        return facts, str(config)
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        md = load_model(s.simulator.model_profile)
        return ModelFacts(arch or md.architectures[0], md.hidden_size, md.dtype_bytes), (
            f"the simulator's model profile {s.simulator.model_profile} ({config} not readable here)")


def comm_context(s: SweepSpec, host: str | None, arch: str | None) -> CommContext | None:
    """What the all-reduce resolution needs: the host (`host`, else the simulator's profile), the model,
    tp and the experiment's fixed flags and environment; None when no host is described. A profile that
    does not load raises ProfileError."""
    name = host or (s.simulator.hardware_profile if s.engine == "simulator" else None)
    if name is None:
        return None
    facts, _ = model_facts(s, arch)
    return CommContext(facts, host_from_profile(name), s.server.tp, dict(s.server.flags), dict(s.server.env))


@dataclass(frozen=True)
class Inert:
    """NCCL knobs that touch nothing the objective measures on this host, and where they still do."""

    knobs: tuple[str, ...]
    when: Mapping[str, tuple[Scalar, ...]]
    """Empty: nowhere (drop them); else the backend knob's values under which NCCL carries the objective."""
    line: str


def inert_nccl(s: SweepSpec) -> Inert | None:
    """The NCCL knobs to collapse: dropped where NCCL carries no message class the objective depends on,
    kept only under the backend values that put NCCL there (search.space.collapse_inert applies it); None
    when every knob matters or the host is not described (a real host's sweep searches the space as
    written: its topology is known only once a trial ran)."""
    ctx = comm_context(s, None, None)
    return None if ctx is None else _nccl(ctx, commplan.plan(s, ctx))


def inert_backend(s: SweepSpec, ctx: CommContext | None = None) -> Inert | None:
    """The backend knob to drop where each of its values leaves the objective's messages on the same carriers
    (commplan.inert_backend); kept when another knob's `when` names it (the space's own structure), or when
    the host is not described (`ctx`: the host `sweep plan --host` names; else the simulator's profile)."""
    ctx = ctx or comm_context(s, None, None)
    return None if ctx is None else _backend(s, ctx, commplan.plan(s, ctx))


def collapsed(s: SweepSpec, ctx: CommContext | None = None, cp: commplan.CommPlan | None = None) -> list[Inert]:
    """Every dimension the communication path makes inert (the NCCL knobs', then the backend knob's), from
    one plan; empty when the host is not described."""
    ctx = ctx or comm_context(s, None, None)
    if ctx is None:
        return []
    cp = cp or commplan.plan(s, ctx)
    return [i for i in (_nccl(ctx, cp), _backend(s, ctx, cp)) if i is not None]


def _nccl(ctx: CommContext, cp: commplan.CommPlan) -> Inert | None:
    when = commplan.collapse_values(cp)
    if when is None:
        return None
    knobs = ", ".join(cp.nccl_knobs)
    if not when:
        line = (f"communication path: NCCL carries none of {', '.join(cp.depends_on)} on {ctx.host.name}, so "
                f"{knobs} are not searched")
    else:
        (knob, values), = when.items()
        line = (f"communication path: NCCL carries {', '.join(cp.depends_on)} on {ctx.host.name} only with "
                f"{knob} in {list(values)}, so {knobs} are searched only there")
    return Inert(tuple(cp.nccl_knobs), when, line)


def _backend(s: SweepSpec, ctx: CommContext, cp: commplan.CommPlan) -> Inert | None:
    knob = commplan.inert_backend(cp)
    if knob is None or any(knob in p.when for p in s.space.params.values()):
        return None
    values = ", ".join("engine default" if v is None else str(v) for v in s.space.params[knob].values())
    carriers = "; ".join(c.describe(ctx.model.token_bytes) for c in cp.arms[0].classes if c.message in cp.depends_on)
    classes = ", ".join(cp.depends_on) or "nothing the objective depends on"
    line = (f"communication path: {knob} ({values}) puts {classes} on the same carriers on {ctx.host.name} "
            f"({carriers or 'none'}), so {knob} is not searched (the engine default is launched)")
    return Inert((knob,), {}, line)
