"""The probe on `engine: simulator`: the hardware profile's NCCL model instead of GPUs.

Each (setting, size, mode) is the model's all-reduce latency times seeded multiplicative noise
(the experiment's simulator noise inside CUDA graphs, three times that eager, as measured on the
H200 host: small eager all-reduces vary 30-60% between runs, graph ones little), median over the
repeats; NCCL's choice is the model's. The experiment's simulator faults apply as on a server: a
setting matching `nccl_hang` / `nccl_hang_when` hangs (status hang, as the GPU path's deadline
records it). About 10 ms per setting, with the same output as a GPU host.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Mapping, Sequence

from orchestrator.config.experiment import FaultSpec, SweepSpec
from orchestrator.nccllog import NcclChoice
from orchestrator.probe.result import Mode, ProbeRow, SettingRecord, Status
from orchestrator.probe.settings import NcclSetting
from orchestrator.probe.sizes import ProbeSize
from orchestrator.simulator import Faults, HardwareProfile, NcclSettings, load_hardware, nccl_all_reduce, parse_faults

EAGER_NOISE_FACTOR = 3.0


def _hang_faults(spec: SweepSpec, env: Mapping[str, str]) -> Faults:
    """The experiment's faults that apply to a probe of `env` (a `when` on other knobs never matches:
    the probe runs no model)."""
    texts = []
    for fault in spec.simulator.faults:
        if isinstance(fault, FaultSpec):
            wanted = {k: [str(x) for x in v] if isinstance(v, list) else [str(v)] for k, v in fault.when.items()}
            if not all(env.get(k) in values for k, values in wanted.items()):
                continue
            fault = fault.fault
        if fault.startswith("nccl_hang"):
            texts.append(fault)
    return parse_faults(texts)


class SimulatedHost:
    """Measures settings against the hardware profile named by the experiment."""

    def __init__(
        self,
        spec: SweepSpec,
        sizes: Sequence[ProbeSize],
        *,
        repeats: int = 5,
        modes: Sequence[Mode] = ("graph", "eager"),
    ):
        self.spec, self.sizes, self.repeats, self.modes = spec, tuple(sizes), repeats, tuple(modes)
        self.hardware: HardwareProfile = load_hardware(spec.simulator.hardware_profile)

    @property
    def host(self) -> str:
        return self.hardware.name

    @property
    def nccl_version(self) -> str:
        return self.hardware.nccl.version

    def measure(self, setting: NcclSetting, base_env: Mapping[str, str]) -> tuple[SettingRecord, tuple[ProbeRow, ...]]:
        """One setting: every size in every mode, or one failure for all of them."""
        started = time.perf_counter()
        env = {**base_env, **setting.as_env()}
        tp = self.spec.server.tp
        nccl = NcclSettings.from_env(env)
        status: Status = "ok"
        reason = ""
        if _hang_faults(self.spec, env).hangs(env):
            status, reason = "hang", "no result within the deadline (simulated NCCL hang for this setting)"
        elif nccl.unsupported_algorithm is not None:
            status, reason = (
                "error",
                (
                    f"NCCL error: no algorithm/protocol available for AllReduce "
                    f"(NCCL_ALGO={nccl.unsupported_algorithm} on {self.hardware.name})"
                ),
            )
        elif tp > self.hardware.gpus:
            status, reason = "error", f"tp {tp} needs more GPUs than {self.hardware.name} has ({self.hardware.gpus})"
        rows = []
        for size in self.sizes:
            for mode in self.modes:
                if status != "ok":
                    rows.append(
                        ProbeRow(
                            setting=setting.label,
                            env=setting.as_env(),
                            size=size.label,
                            nbytes=size.nbytes,
                            mode=mode,
                            median_us=None,
                            repeats=0,
                            status=status,
                            reason=reason,
                        )
                    )
                    continue
                ar = nccl_all_reduce(self.hardware, nccl, tp, size.nbytes, mode == "graph")
                noise = self.spec.simulator.noise * (1.0 if mode == "graph" else EAGER_NOISE_FACTOR)
                rng = random.Random(f"{self.spec.sampler.seed}:{setting.label}:{size.label}:{mode}")
                samples = [ar.us * max(0.1, rng.gauss(1.0, noise)) for _ in range(self.repeats)]
                choice = (
                    NcclChoice(algorithm=ar.algorithm.upper(), protocol=ar.protocol.upper(), channels=ar.channels)
                    if ar.path == "nccl"
                    else None
                )
                rows.append(
                    ProbeRow(
                        setting=setting.label,
                        env=setting.as_env(),
                        size=size.label,
                        nbytes=size.nbytes,
                        mode=mode,
                        median_us=round(statistics.median(samples), 3),
                        repeats=self.repeats,
                        nccl_choice=choice,
                    )
                )
        record = SettingRecord(
            setting=setting.label,
            env=setting.as_env(),
            status=status,
            reason=reason,
            seconds=round(time.perf_counter() - started, 6),
            env_checked="simulated: the NCCL model reads the setting's environment itself",
        )
        return record, tuple(rows)
