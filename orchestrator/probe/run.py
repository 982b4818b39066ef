"""The probe stage's loop: ask the setting search, measure on the host, score, tell, write probe.json."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from orchestrator.config import speculation as speculation_registry
from orchestrator.config.experiment import SweepSpec
from orchestrator.probe.result import PROBE_FILE, ProbeResult, ProbeRow, SettingRecord, setting_score, write_probe
from orchestrator.probe.settings import DEFAULT_BUDGET, NcclSetting, SettingSearch, nccl_dimensions, space_size
from orchestrator.probe.sizes import ProbeSize, sizes_for
from orchestrator.simulator import load_model

_WRITE_EVERY_S = 1.0
"""probe.json is rewritten at most this often while probing (a GPU setting takes seconds, a simulated one
microseconds), and once at the end."""
_DEBUG_ENV = frozenset({"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"})


class Host(Protocol):
    """Where settings are measured: the simulator's model or this machine's GPUs."""

    @property
    def host(self) -> str: ...

    @property
    def nccl_version(self) -> str | None: ...

    def measure(
        self, setting: NcclSetting, base_env: Mapping[str, str]
    ) -> tuple[SettingRecord, tuple[ProbeRow, ...]]: ...


@dataclass(frozen=True)
class ProbeProgress:
    """Sent to `progress` after every setting."""

    done: int
    budget: int
    record: SettingRecord
    score_us: float | None
    best: str | None
    """The best setting's label so far."""


def probe_sizes(spec: SweepSpec) -> tuple[ProbeSize, ...]:
    """The message sizes for `spec`, from its model profile (hidden size, activation bytes)."""
    model = load_model(spec.simulator.model_profile)
    return sizes_for(spec, model.hidden_size, model.dtype_bytes, model.default_spec[2])


def default_speculation(spec: SweepSpec) -> tuple[int, int, int]:
    """(steps, top-k, draft tokens) of the default speculation the experiment's model profile ships with."""
    steps, topk, draft = load_model(spec.simulator.model_profile).default_spec
    return steps, topk, draft


def default_algorithm(spec: SweepSpec) -> str | None:
    """The speculative algorithm SGLang runs by default for the experiment's model (the registry's
    `model_default` over the drafters its profile models), or None when it has none."""
    algo = speculation_registry.model_default(load_model(spec.simulator.model_profile).drafters)
    return None if algo is None else algo.name


def base_env(spec: SweepSpec) -> dict[str, str]:
    """The experiment's fixed NCCL variables (NCCL_NVLS_ENABLE=0 and the like), under every setting;
    the logging ones are the probe's own business."""
    return {k: str(v) for k, v in spec.server.env.items() if k.startswith("NCCL_") and k not in _DEBUG_ENV}


def probe_on(
    host: Host,
    spec: SweepSpec,
    sizes: Sequence[ProbeSize],
    workdir: Path,
    *,
    budget: int | None = None,
    progress: Callable[[ProbeProgress], None] | None = None,
) -> ProbeResult:
    """Search the NCCL part of `spec`'s space on `host`; probe.json in `workdir` is rewritten as settings
    finish, so an interrupted probe keeps what it measured."""
    started = time.monotonic()
    dims = nccl_dimensions(spec)
    search = SettingSearch(dims, budget=budget or DEFAULT_BUDGET, seed=spec.sampler.seed)
    fixed = base_env(spec)
    records: list[SettingRecord] = []
    rows: list[ProbeRow] = []
    result = None
    written = time.monotonic()
    while (setting := search.ask()) is not None:
        record, measured = host.measure(setting, fixed)
        score = setting_score(measured, sizes) if record.status == "ok" else None
        search.tell(setting, score)
        records.append(record)
        rows.extend(measured)
        result = ProbeResult(
            experiment=spec.name,
            engine=spec.engine,
            host=host.host,
            tp=spec.server.tp,
            machine=socket.gethostname() if spec.engine == "sglang" else "",
            nccl_version=host.nccl_version,
            base_env=fixed,
            sizes=tuple(sizes),
            settings=tuple(records),
            rows=tuple(rows),
            space_settings=space_size(dims),
            searched=not search.enumerates,
            seconds=round(time.monotonic() - started, 3),
        )
        if time.monotonic() - written >= _WRITE_EVERY_S:
            write_probe(result, workdir / PROBE_FILE)
            written = time.monotonic()
        if progress is not None:
            best = search.best()
            progress(ProbeProgress(len(records), search.budget, record, score, best.label if best else None))
    assert result is not None  # the search always asks for the NCCL defaults first
    write_probe(result, workdir / PROBE_FILE)
    return result
