"""The probe's other all-reduce backends (issue 19): beside the NCCL settings, each backend the host offers
(SGLang 0.5.23's resolution, config/allreduce.py over the host the experiment describes) is measured at
the same message sizes, so stage one ranks backends and NCCL settings together.

- `engine: simulator`: the hardware profile's model of that backend (simulator/model.py
  `carried_all_reduce`, the path 0.5.23 takes with all_reduce_backend=<backend>), with the NCCL probe's
  seeded noise; past a backend's workspace a size goes to NCCL, and the row says so (`ProbeRow.backend`).
- a GPU host: only through SGLang's and FlashInfer's own communicators in the probe's environment
  (sglang.srt.distributed.device_communicators...). Measuring them there is NOT implemented yet and has
  never run on a GPU: each backend is skipped with the reason (the communicator does not import, or it does
  and the measurement is not written), so probe.json says what was not compared.
"""

from __future__ import annotations

import importlib.util
import random
import statistics
import sys
import time
from collections.abc import Mapping, Sequence

from orchestrator.config import speculation as speculation_registry
from orchestrator.config.allreduce import Backend, CommContext
from orchestrator.config.experiment import SweepSpec
from orchestrator.probe.result import BackendRecord, Mode, ProbeRow, backend_label
from orchestrator.probe.simulated import EAGER_NOISE_FACTOR
from orchestrator.probe.sizes import ProbeSize
from orchestrator.simulator import NcclSettings, load_hardware, load_model
from orchestrator.simulator.model import carried_all_reduce
from orchestrator.simulator.model import resolve as resolve_model

__all__ = ["COMMUNICATORS", "gpu_skips", "offered", "simulated"]

COMMUNICATORS: Mapping[str, tuple[str, ...]] = {
    Backend.custom.value: ("sglang.srt.distributed.device_communicators.custom_all_reduce",),
    Backend.flashinfer_fusion.value: ("flashinfer.comm",),
    Backend.pcie_ipc.value: ("sglang.srt.distributed.device_communicators.pcie_ipc_ar", "flashinfer.comm"),
    Backend.torch_symm_mem.value: ("sglang.srt.distributed.device_communicators.torch_symm_mem",),
    Backend.mscclpp.value: ("sglang.srt.distributed.device_communicators.pymscclpp",),
}
"""Backend -> the modules of SGLang 0.5.23 / FlashInfer its communicator lives in."""


def offered(ctx: CommContext | None) -> tuple[str, ...]:
    """The backends other than NCCL this host takes for decode-sized messages (none when the host is not
    described): asked for with all_reduce_backend, 0.5.23 neither refuses them before launch nor leaves a
    one-token message to NCCL."""
    if ctx is None:
        return ()
    out = []
    for backend in Backend:
        if backend is Backend.nccl or ctx.refusal({"all_reduce_backend": backend.value}) is not None:
            continue
        if ctx.path({"all_reduce_backend": backend.value}).carrier(1) is backend:
            out.append(backend.value)
    return tuple(out)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing or broken
        return False


def gpu_skips(backends: Sequence[str]) -> tuple[BackendRecord, ...]:
    """A GPU host: every backend skipped, with why (see the module docstring)."""
    out = []
    for backend in backends:
        missing = [m for m in COMMUNICATORS.get(backend, ()) if not _importable(m)]
        why = (
            f"{', '.join(missing)} does not import in the probe's environment ({sys.executable}); install "
            f"sglang 0.5.23 there (pip install -e '.[sglang,probe]') to compare it"
            if missing
            else "its communicator imports, but measuring it through SGLang's communicator is not implemented yet "
            "(never run on a GPU)"
        )
        out.append(BackendRecord(backend=backend, status="skipped", reason=why))
    return tuple(out)


def _backend_rows(
    spec: SweepSpec,
    backend: str,
    sizes: Sequence[ProbeSize],
    base_env: Mapping[str, str],
    modes: Sequence[Mode],
    repeats: int,
) -> list[ProbeRow] | str:
    hw, md = load_hardware(spec.simulator.hardware_profile), load_model(spec.simulator.model_profile)
    steps, topk, draft = md.default_spec  # the workspace PCIe-IPC sizes follows the verify width
    default = speculation_registry.model_default(md.drafters)
    speculation = (
        {
            "speculative_algorithm": default.name,
            "speculative_num_steps": steps,
            "speculative_eagle_topk": topk,
            "speculative_num_draft_tokens": draft,
        }
        if default is not None
        else {}
    )
    cfg = resolve_model({"all_reduce_backend": backend, **speculation, **base_env}, hw, md, tp=spec.server.tp)
    if isinstance(cfg, str):
        return cfg
    token_bytes = md.hidden_size * md.dtype_bytes
    nccl = NcclSettings.from_env(base_env)
    rows = []
    for size in sizes:
        for mode in modes:
            ar = carried_all_reduce(
                hw, nccl, cfg.comm, cfg.tp, max(1, size.nbytes // token_bytes), token_bytes, mode == "graph"
            )
            noise = spec.simulator.noise * (1.0 if mode == "graph" else EAGER_NOISE_FACTOR)
            rng = random.Random(f"{spec.sampler.seed}:{backend_label(backend)}:{size.label}:{mode}")
            samples = [ar.us * max(0.1, rng.gauss(1.0, noise)) for _ in range(repeats)]
            rows.append(
                ProbeRow(
                    setting=backend_label(backend),
                    env=dict(base_env),
                    size=size.label,
                    nbytes=size.nbytes,
                    mode=mode,
                    median_us=round(statistics.median(samples), 3),
                    repeats=repeats,
                    backend=ar.path,
                )
            )
    return rows


def simulated(
    spec: SweepSpec,
    backends: Sequence[str],
    sizes: Sequence[ProbeSize],
    base_env: Mapping[str, str],
    *,
    modes: Sequence[Mode] = ("graph", "eager"),
    repeats: int = 5,
) -> tuple[tuple[BackendRecord, ...], tuple[ProbeRow, ...]]:
    """`engine: simulator`: each backend measured at `sizes` on the hardware profile's model."""
    records, rows = [], []
    for backend in backends:
        started = time.perf_counter()
        measured = _backend_rows(spec, backend, sizes, base_env, modes, repeats)
        seconds = round(time.perf_counter() - started, 6)
        if isinstance(measured, str):
            records.append(BackendRecord(backend=backend, status="error", reason=measured, seconds=seconds))
            continue
        records.append(BackendRecord(backend=backend, status="ok", seconds=seconds))
        rows += measured
    return tuple(records), tuple(rows)
