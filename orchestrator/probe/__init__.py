"""The probe stage: the host's real tensor-parallel all-reduce per NCCL setting, without a model.

`sweep probe EXP` measures, for NCCL settings taken from the experiment's space, the latency of
all-reduces of the sizes decode, verify and prefill move, inside CUDA graphs (as decode runs) and
eager, and ranks the settings by latency at the verify sizes. A sweep can then run full trials only
over the settings within `keep_within` of the best (the NCCL defaults always kept).

Pieces:
    sizes.py      message sizes from the model profile and the experiment (decode, verify-n, prefill, large)
    settings.py   the NCCL dimensions of the space; `SettingSearch` (enumerate a small space, search a large one)
    (NCCL's NCCL_DEBUG=INFO lines are parsed by orchestrator/nccllog.py, shared with the trial's check)
    result.py     ProbeRow / SettingRecord / ProbeResult, probe.json (atomic), `rank_settings`
    simulated.py  `engine: simulator`: the hardware profile's NCCL model with seeded noise
    backends.py   the other all-reduce backends the host offers, at the same sizes (simulated; skipped on GPUs)
    gpu.py        a GPU host: rank workers (_worker.py) forking one fresh process group per setting
    tuner.py      `--format nccl-tuner`: per-size rules for NCCL's example tuner plugin, and their parser
    run.py        the loop: ask, measure, score, tell, write probe.json
    comm.py       the host's communication path before a launch (SGLang 0.5.23's resolution on a profile)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.config.allreduce import CommContext
from orchestrator.config.experiment import SweepSpec
from orchestrator.nccllog import NcclChoice, parse_nccl_log
from orchestrator.probe import backends
from orchestrator.probe.comm import ProfileError, comm_context
from orchestrator.probe.gpu import GpuHost, ProbeUnavailable, unavailable_reason
from orchestrator.probe.result import (
    PROBE_FILE,
    BackendRecord,
    ProbeResult,
    ProbeRow,
    RankedSetting,
    SettingRecord,
    rank_settings,
    rank_with_backends,
    read_probe,
    write_probe,
)
from orchestrator.probe.run import ProbeProgress, base_env, default_speculation, probe_on, probe_sizes
from orchestrator.probe.settings import DEFAULT_BUDGET, DEFAULTS_LABEL, NcclSetting, SettingSearch, nccl_dimensions
from orchestrator.probe.simulated import SimulatedHost
from orchestrator.probe.sizes import ProbeSize
from orchestrator.probe.tuner import TunerRule, parse_tuner_config, render_tuner_config, tuner_rules

__all__ = [
    "DEFAULTS_LABEL",
    "DEFAULT_BUDGET",
    "PROBE_FILE",
    "BackendRecord",
    "GpuHost",
    "NcclChoice",
    "NcclSetting",
    "ProbeProgress",
    "ProbeResult",
    "ProbeRow",
    "ProbeSize",
    "ProbeUnavailable",
    "RankedSetting",
    "SettingRecord",
    "SettingSearch",
    "SimulatedHost",
    "TunerRule",
    "default_speculation",
    "nccl_dimensions",
    "parse_nccl_log",
    "parse_tuner_config",
    "rank_settings",
    "rank_with_backends",
    "read_probe",
    "render_tuner_config",
    "run_probe",
    "tuner_rules",
    "write_probe",
]


def _host_context(spec: SweepSpec) -> CommContext | None:
    """The host the experiment describes (its simulator profile: the simulated host, or on engine sglang the
    profile it names for planning), or None."""
    named = spec.engine == "simulator" or "hardware_profile" in spec.simulator.model_fields_set
    try:
        return comm_context(spec, spec.simulator.hardware_profile if named else None, None)
    except ProfileError:
        return None


def with_backends(result: ProbeResult, spec: SweepSpec, workdir: Path) -> ProbeResult:
    """`result` with the other backends the host offers, measured at the same sizes (simulator) or skipped
    with the reason (a GPU host: backends.py), written to probe.json (issue 19)."""
    offered = backends.offered(_host_context(spec))
    if not offered:
        return result
    if spec.engine == "simulator":
        records, rows = backends.simulated(spec, offered, result.sizes, result.base_env)
    else:
        records, rows = backends.gpu_skips(offered), ()
    result = result.model_copy(update={"backends": records, "backend_rows": rows})
    write_probe(result, workdir / PROBE_FILE)
    return result


def run_probe(
    spec: SweepSpec,
    workdir: Path,
    *,
    budget: int | None = None,
    progress: Callable[[ProbeProgress], None] | None = None,
) -> ProbeResult:
    """Probe `spec`'s NCCL settings on its engine and write `workdir/probe.json`.

    On `engine: simulator` the hardware profile's model answers; on `engine: sglang` this host's
    GPUs do. Where the GPU path cannot run (no torch, fewer GPUs than tp, a rank worker gone) the
    result says why in `skipped`, keeping what was measured before; it is written all the same.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    sizes = probe_sizes(spec)
    if spec.engine == "simulator":
        result = probe_on(SimulatedHost(spec, sizes), spec, sizes, workdir, budget=budget, progress=progress)
        return with_backends(result, spec, workdir)
    reason = unavailable_reason()
    started = time.time()
    if reason is None:
        try:
            with GpuHost(sizes, workdir / "probe", tp=spec.server.tp, unset=tuple(nccl_dimensions(spec))) as host:
                result = probe_on(host, spec, sizes, workdir, budget=budget, progress=progress)
            return with_backends(result, spec, workdir)
        except ProbeUnavailable as exc:
            reason = str(exc)
    path = workdir / PROBE_FILE
    if path.exists() and path.stat().st_mtime >= started:  # this run measured some settings before it stopped
        partial = read_probe(path).model_copy(update={"skipped": reason})
        write_probe(partial, path)
        return partial
    skipped = ProbeResult(
        experiment=spec.name,
        engine=spec.engine,
        host="this host",
        tp=spec.server.tp,
        nccl_version=None,
        base_env=base_env(spec),
        sizes=sizes,
        settings=(),
        rows=(),
        space_settings=0,
        searched=False,
        seconds=0.0,
        skipped=reason,
    )
    write_probe(skipped, workdir / PROBE_FILE)
    return skipped
