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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config import commplan
from orchestrator.config.allreduce import CommContext, Host, ModelFacts
from orchestrator.config.experiment import SweepSpec
from orchestrator.config.space import Scalar
from orchestrator.simulator import ProfileError, load_hardware, load_model

__all__ = ["Collapsed", "Inert", "ProfileError", "collapsed", "comm_context", "host_from_profile", "model_facts"]


def host_from_profile(name_or_path: str) -> Host:
    """The host a hardware profile describes, as the all-reduce resolution needs it (ProfileError when unknown)."""
    hw = load_hardware(name_or_path)
    return Host(
        name=hw.name,
        gpu_name=hw.gpu_name,
        compute_capability=hw.compute_capability if hw.compute_capability != (0, 0) else None,
        interconnect="nvlink" if hw.interconnect == "nvlink" else "pcie" if hw.interconnect == "pcie" else None,
        gpus=hw.gpus,
        nodes=hw.nodes,
        nvlink_multicast=hw.nvlink_multicast,
        flashinfer_pcie_ipc=hw.pcie_ipc is not None,
        default_cuda_graph_max_bs=hw.default_cuda_graph_max_bs,
    )


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
            f"the simulator's model profile {s.simulator.model_profile} ({config} not readable here)"
        )


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
    """Knobs (the NCCL ones, or the backend knob) that touch nothing the objective measures on this host, and
    where they still do."""

    knobs: tuple[str, ...]
    when: Mapping[str, tuple[Scalar, ...]]
    """Empty: nowhere (drop them); else the backend knob's values under which NCCL carries the objective."""
    line: str


@dataclass(frozen=True)
class Collapsed:
    """The dimensions the communication path makes inert on one host, from one plan; iterating yields those
    present (search.space.collapse_all applies them), falsy when none is."""

    nccl: Inert | None = None
    """The NCCL knobs: dropped where NCCL carries no message class the objective depends on, kept only
    under the backend values that put NCCL there; None when every knob matters."""
    backend: Inert | None = None
    """The backend knob, dropped where each of its values leaves the objective's messages on the same
    carriers (commplan.inert_backend); None when a value moves one, or another knob's `when` names it."""

    def __iter__(self) -> Iterator[Inert]:
        return (i for i in (self.nccl, self.backend) if i is not None)

    def __bool__(self) -> bool:
        return self.nccl is not None or self.backend is not None


def collapsed(s: SweepSpec, ctx: CommContext | None = None, cp: commplan.CommPlan | None = None) -> Collapsed:
    """Every dimension the communication path makes inert, from one plan (`ctx`: the host `sweep plan --host`
    names; else the simulator's profile); none when the host is not described (a real host's sweep searches
    the space as written: its topology is known only once a trial ran)."""
    ctx = ctx or comm_context(s, None, None)
    if ctx is None:
        return Collapsed()
    cp = cp or commplan.plan(s, ctx)
    return Collapsed(_nccl(ctx, cp), _backend(s, ctx, cp))


def _nccl(ctx: CommContext, cp: commplan.CommPlan) -> Inert | None:
    when = commplan.collapse_values(cp)
    if when is None:
        return None
    knobs = ", ".join(cp.nccl_knobs)
    if not when:
        line = (
            f"communication path: NCCL carries none of {', '.join(cp.depends_on)} on {ctx.host.name}, so "
            f"{knobs} are not searched"
        )
    else:
        ((knob, values),) = when.items()
        line = (
            f"communication path: NCCL carries {', '.join(cp.depends_on)} on {ctx.host.name} only with "
            f"{knob} in {list(values)}, so {knobs} are searched only there"
        )
    return Inert(tuple(cp.nccl_knobs), when, line)


def _backend(s: SweepSpec, ctx: CommContext, cp: commplan.CommPlan) -> Inert | None:
    knob = commplan.inert_backend(cp)
    if knob is None or any(knob in p.when for p in s.space.params.values()):
        return None
    values = ", ".join("engine default" if v is None else str(v) for v in s.space.params[knob].values())
    carriers = "; ".join(c.describe(ctx.model.token_bytes) for c in cp.arms[0].classes if c.message in cp.depends_on)
    classes = ", ".join(cp.depends_on) or "nothing the objective depends on"
    line = (
        f"communication path: {knob} ({values}) puts {classes} on the same carriers on {ctx.host.name} "
        f"({carriers or 'none'}), so {knob} is not searched (the engine default is launched)"
    )
    return Inert((knob,), {}, line)
