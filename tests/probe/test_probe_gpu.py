"""The GPU path's plumbing, on CPU: real rank workers (torch imported once each) forking one gloo
process group per setting, the environment checked on every rank, a hung setting killed at its
deadline. On a host with CUDA the same code runs the real measurement (the last test)."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest
from probe_helpers import write_spec

from orchestrator.probe import GpuHost, NcclSetting, ProbeUnavailable, read_probe, run_probe
from orchestrator.probe.sizes import message_sizes

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="torch is not installed (the probe extra: pip install 'sglang-sweep[probe]')",
)

SIZES = message_sizes(7168, 2, draft_tokens=[4], large=())


def _cuda_devices() -> int:
    import torch  # heavy: only for the skip condition of the real-GPU test

    return torch.cuda.device_count()


@pytest.fixture
def cpu_host(tmp_path):
    # The deadline is generous: a setting that works must not be taken for a hang on a loaded machine.
    with GpuHost(
        SIZES,
        tmp_path / "probe",
        tp=2,
        backend="gloo",
        unset=("NCCL_PROTO", "NCCL_ALGO"),
        repeats=3,
        iters=3,
        deadline_s=600.0,
        env={"PATH": "/usr/bin:/bin", "NCCL_ALGO": "Tree"},
    ) as host:
        yield host


def test_every_rank_gets_the_setting_and_nothing_else(cpu_host):
    record, rows = cpu_host.measure(NcclSetting.of({"NCCL_PROTO": "LL"}), {"NCCL_NVLS_ENABLE": "0"})
    assert record.status == "ok", record.reason
    assert record.env_checked == "4 variable(s) in os.environ of all 2 ranks"
    assert [(r.size, r.mode, r.status) for r in rows] == [("decode", "eager", "ok"), ("verify-4", "eager", "ok")]
    assert all(r.median_us > 0 and r.repeats == 3 for r in rows)
    for rank in (0, 1):  # each child reported its os.environ; NCCL_ALGO from the worker's own env was unset
        seen = (cpu_host.folder / f"setting-1.rank-{rank}.json").read_text()
        assert '"NCCL_PROTO": "LL"' in seen and '"NCCL_ALGO": null' in seen and '"NCCL_DEBUG": "INFO"' in seen


HANG_S = 3600.0
"""How long the hung setting would sleep: far beyond its deadline, so only the kill can end it."""


class PastTheDeadline:
    """The host's clock (GpuHost.clock): real time until every child of the setting is running (each has
    opened its log, just before the test hook's sleep), then `jump` seconds on. The deadline passes when
    the test says so, however slowly this machine starts the children."""

    def __init__(self, logs: list[Path], jump: float):
        self.logs, self.jump, self.jumped = logs, jump, False

    def __call__(self) -> float:
        self.jumped = self.jumped or all(p.exists() for p in self.logs)
        return time.monotonic() + (self.jump if self.jumped else 0.0)


def test_a_hung_setting_is_killed_at_its_deadline_and_the_next_one_runs(cpu_host):
    workers = [rank.proc.pid for rank in cpu_host.ranks]
    clock = PastTheDeadline([cpu_host.folder / f"setting-1.rank-{r}.log" for r in (0, 1)], cpu_host.deadline_s)
    cpu_host.clock = clock
    record, rows = cpu_host.measure(
        NcclSetting.of({"NCCL_PROTO": "Simple"}), {"SWEEP_PROBE_TEST_SLEEP_S": f"{HANG_S:g}"}
    )
    # Killed once the host's clock passed the deadline, with both children running (asleep in the hook).
    assert clock.jumped and record.status == "hang" and record.seconds >= cpu_host.deadline_s
    assert record.reason == "not every rank finished within the 600 s deadline; killed"
    assert {(r.status, r.median_us) for r in rows} == {("hang", None)}
    assert not any((cpu_host.folder / f"setting-1.rank-{r}.json").exists() for r in (0, 1))  # it never got to write
    record, _ = cpu_host.measure(NcclSetting.of({}), {})
    assert record.status == "ok", record.reason
    # A fresh process group per setting from the same rank workers: torch is not imported again.
    assert [rank.proc.pid for rank in cpu_host.ranks] == workers
    assert all(rank.proc.poll() is None for rank in cpu_host.ranks)


def test_the_nccl_backend_needs_as_many_gpus_as_tp(tmp_path):
    if _cuda_devices() >= 2:
        pytest.skip("this host has 2 CUDA devices")
    with pytest.raises(ProbeUnavailable, match=r"tp 2 needs 2 CUDA devices, but this host has \d"):
        with GpuHost(SIZES, tmp_path, tp=2):
            pass


def test_sweep_probe_on_an_sglang_experiment_without_gpus_is_skipped_with_the_reason(tmp_path):
    if _cuda_devices() >= 2:
        pytest.skip("this host has 2 CUDA devices")
    spec = write_spec(tmp_path, engine="sglang", server={"tp": 2})
    result = run_probe(spec, tmp_path / "wd")
    assert result.settings == () and "tp 2 needs 2 CUDA devices" in result.skipped
    assert read_probe(tmp_path / "wd" / "probe.json") == result


@pytest.mark.skipif(importlib.util.find_spec("torch") is None or _cuda_devices() < 2, reason="needs 2 CUDA devices")
def test_real_all_reduce_inside_cuda_graphs_and_eager(tmp_path):
    with GpuHost(SIZES, tmp_path, tp=2, repeats=3, env={**os.environ, "NCCL_NVLS_ENABLE": "0"}) as host:
        record, rows = host.measure(NcclSetting.of({"NCCL_PROTO": "LL"}), {"NCCL_NVLS_ENABLE": "0"})
    assert record.status == "ok", record.reason
    assert {r.mode for r in rows} == {"graph", "eager"} and all(r.nccl_choice for r in rows)
    assert host.nccl_version


def test_a_rank_worker_that_dies_stops_the_probe_with_the_reason(cpu_host):
    cpu_host.ranks[1].proc.kill()
    cpu_host.ranks[1].proc.wait()
    with pytest.raises(ProbeUnavailable, match=r"rank worker\(s\) 1 exited; see .*worker-\*\.log"):
        cpu_host.measure(NcclSetting.of({}), {})
