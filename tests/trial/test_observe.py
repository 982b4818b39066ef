"""What really ran: environments of real processes, NCCL's log, the all-reduce path, the fingerprint.

The nvidia-smi and NCCL texts below were captured on the lent H200 host (driver 580.159.04,
NCCL 2.28.9 from torch 2.11.0+cu130) with the exact commands fingerprint() runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config import experiment as spec_mod
from orchestrator.search import space as sp
from orchestrator.trial import plan as planner
from orchestrator.trial import procs
from orchestrator.trial.allreduce import allreduce_path, plan_warnings
from orchestrator.trial.observe import (
    RANK_WORKER_RULE,
    ProcessSnapshot,
    check_env_applied,
    evaluate_env,
    fingerprint,
    fingerprint_diff,
    fingerprint_hash,
    niceness_warning,
    observe_env,
    parse_nccl_log,
)

REQUESTED = {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "4"}

# Captured on the H200 host.
QUERY_FULL = (
    "0, NVIDIA H200, GPU-690e8d4c-05c8-5700-2d7f-c0afe34935a7, 00000000:00:06.0, 580.159.04, 143771, "
    "345, 3201, 1980, 3201, 77.57, 700.00, 33, 5, 5, 16, 16, 0x0000000000000001\n"
)
QUERY = (
    "0, NVIDIA H200, GPU-690e8d4c-05c8-5700-2d7f-c0afe34935a7, 00000000:00:06.0, 580.159.04, 143771, "
    "345, 3201, 1980, 3201, 77.51, 700.00, 34, 5, 5, 16, 16\n"
)
PLAIN = """Sun Nov 29 14:03:26 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |
+-----------------------------------------+------------------------+----------------------+
"""
TOPO = (
    "\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \t0-15\t0\t\tN/A\n"
    "\n"
    "Legend:\n"
    "\n"
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n"
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node\n"
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n"
    "  PIX  = Connection traversing at most a single PCIe bridge\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n"
)

# Two NVLinked GPUs (as on the H200x2 host) and a PCIe box, in the same format.
TOPO_NV = (
    "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \tNV18\t0-47\t0\t\tN/A\n"
    "GPU1\tNV18\t X \t0-47\t0\t\tN/A\n\nLegend:\n\n  X    = Self\n  PIX  = Connection traversing PCIe\n"
)
TOPO_PCIE = (
    "\tGPU0\tGPU1\tGPU2\tGPU3\nGPU0\t X \tPIX\tPHB\tSYS\nGPU1\tPIX\t X \tPHB\tSYS\n"
    "GPU2\tPHB\tPHB\t X \tSYS\nGPU3\tSYS\tSYS\tSYS\t X \n\nLegend:\n  NV#  = NVLinks\n"
)


# --- real processes ---------------------------------------------------------------------------

# A stand-in for a server: it starts one Python worker per rank that inherits its environment
# (as SGLang's schedulers do), except that it can drop or change one variable for rank 1.
SERVER = r"""
import os, subprocess, sys, time
workers = []
for rank in range(2):
    env = dict(os.environ)
    if rank == 1 and os.environ.get("TEST_DROP"):
        env.pop(os.environ["TEST_DROP"])
    if rank == 1 and os.environ.get("TEST_CHANGE"):
        name, value = os.environ["TEST_CHANGE"].split("=")
        env[name] = value
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    if os.environ.get("TEST_NAMED"):
        argv += ["--tp-rank", str(rank)]
    workers.append(subprocess.Popen(argv, env=env))
# Report ready only once every worker has exec'ed (its /proc cmdline is its own).
deadline = time.time() + 20
while time.time() < deadline:
    try:
        if all(b"time.sleep(60)" in open(f"/proc/{w.pid}/cmdline", "rb").read() for w in workers):
            break
    except OSError:
        pass
    time.sleep(0.01)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def server():
    started = []

    def start(**extra):
        env = {**os.environ, **REQUESTED, **extra}
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVER], env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        started.append(proc)
        assert proc.stdout.readline().strip() == "ready"
        return proc.pid

    yield start
    for proc in started:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the session we created: server and its workers
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
        proc.stdout.close()


def test_real_workers_that_got_everything(server):
    pid = server(TEST_NAMED="1")
    assert len(procs.descendants(pid)) == 2
    assert procs.environ(pid)["NCCL_PROTO"] == "LL"
    obs = observe_env(pid, REQUESTED, expected_ranks=2)
    assert obs.ok, obs.problems
    assert sorted(obs.workers.values()) == [0, 1]
    assert obs.rule == RANK_WORKER_RULE
    ok, reason = check_env_applied(REQUESTED, obs)
    assert ok and reason.startswith("all 2 requested variable(s) reached all 2 rank worker(s)")


def test_a_server_tree_at_a_raised_nice_value_is_read_and_named(server):
    """Ray starts its workers 15 above its raylet and the servers they launch inherit it: the observation
    reads each process's nice value, and the warning names one above the sweep's own with the fix
    (RAY_worker_niceness=0). At the sweep's own niceness, whatever it is, nothing is said."""
    ours = os.nice(0)
    pid = server(TEST_NAMED="1")
    quiet = observe_env(pid, REQUESTED, expected_ranks=2)
    assert {p.nice for p in quiet.processes} == {ours}
    assert niceness_warning(quiet, ours) is None
    if ours >= 19:
        pytest.skip("already at the highest nice value: a worker cannot run above the sweep's")
    raised = min(ours + 15, 19)
    for worker in procs.descendants(pid):
        os.setpriority(os.PRIO_PROCESS, worker, raised)  # raising a nice value needs no privilege
    niced = observe_env(pid, REQUESTED, expected_ranks=2)
    assert sorted(p.nice for p in niced.processes if p.pid != pid) == [raised, raised]
    line = niceness_warning(niced, ours)
    assert line is not None and f"niceness {raised}, above the sweep's own ({ours})" in line
    assert "RAY_worker_niceness=0" in line
    assert niceness_warning(niced, raised) is None  # a sweep started at that niceness chose it


def test_real_worker_that_lost_a_variable(server):
    pid = server(TEST_NAMED="1", TEST_DROP="NCCL_PROTO")
    obs = observe_env(pid, REQUESTED, expected_ranks=2)
    assert not obs.ok
    ok, reason = check_env_applied(REQUESTED, obs)
    assert not ok
    rank1 = next(pid for pid, rank in obs.workers.items() if rank == 1)
    assert f"NCCL_PROTO did not reach rank 1 (pid {rank1})" in reason
    assert "NCCL_MAX_NCHANNELS" not in reason


def test_real_worker_with_another_value_and_unnamed_ranks(server):
    # Workers name no rank: every Python descendant counts, in pid order.
    pid = server(TEST_CHANGE="NCCL_MAX_NCHANNELS=16")
    obs = observe_env(pid, REQUESTED, expected_ranks=2)
    ok, reason = check_env_applied(REQUESTED, obs)
    assert not ok
    assert "NCCL_MAX_NCHANNELS reached rank 1" in reason and "'16', requested '4'" in reason


def test_too_few_real_workers(server):
    pid = server(TEST_NAMED="1")
    obs = observe_env(pid, REQUESTED, expected_ranks=8)
    assert not obs.ok
    assert "found 2 rank worker(s)" in obs.problems[0] and "expected 8" in obs.problems[0]


# --- the rank rule, on snapshots --------------------------------------------------------------


def snap(pid, cmdline, env, exe="/usr/bin/python3"):
    return ProcessSnapshot(pid=pid, ppid=1, cmdline=tuple(cmdline), exe=exe, environ=env)


GOOD = {**REQUESTED, "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123456789"}


def test_sglang_process_titles_name_the_ranks():
    snaps = [
        snap(100, ["python", "-m", "sglang.launch_server", "--tp-size", "2"], GOOD),
        snap(101, ["sglang::scheduler_TP1"], GOOD),
        snap(102, ["sglang::scheduler_TP0"], GOOD),
        snap(103, ["sglang::detokenizer"], {}),  # not a rank: its env is not required
        snap(104, ["python", "-c", "from multiprocessing.resource_tracker import main;main(5)"], {}),
    ]
    obs = evaluate_env(100, snaps, REQUESTED, expected_ranks=2)
    assert obs.ok and obs.workers == {102: 0, 101: 1}
    # The observation is safe to write anywhere: no secret values in it.
    assert "hf_abc" not in obs.model_dump_json()


def test_a_tp1_sglang_server_has_one_rank_and_its_detokenizer_is_not_one():
    """SGLang 0.5.23 titles its one TP=1 scheduler plain `sglang::scheduler` (no _TP part:
    sglang/srt/managers/scheduler.py::run_scheduler_process) and its detokenizer `sglang::detokenizer`
    (detokenizer_manager.py::run_detokenizer_process); the process tree of a real CPU server at TP=1."""
    snaps = [
        snap(100, ["/v/bin/python", "-m", "sglang.launch_server", "--device", "cpu"], GOOD),
        snap(101, ["/v/bin/python", "-c", "from multiprocessing.resource_tracker import main;main(9)"], {}),
        snap(102, ["sglang::scheduler"], GOOD),
        snap(103, ["sglang::detokenizer"], {}),
    ]
    obs = evaluate_env(100, snaps, REQUESTED, expected_ranks=1)
    assert obs.ok and obs.workers == {102: 0}, obs.problems


def test_the_fallback_never_counts_sglangs_other_processes():
    snaps = [
        snap(100, ["python", "-m", "sglang.launch_server"], GOOD),
        snap(101, ["python", "worker.py"], GOOD),
        snap(102, ["sglang::detokenizer"], {}),
        snap(103, ["sglang::tokenizer_worker:103"], {}),
    ]
    obs = evaluate_env(100, snaps, REQUESTED, expected_ranks=1)
    assert obs.ok and obs.workers == {101: 0}, obs.problems


def test_data_parallel_groups_are_all_checked():
    snaps = [
        snap(100, ["python", "-m", "sglang.launch_server"], GOOD),
        snap(101, ["sglang::scheduler_DP0_TP0"], GOOD),
        snap(102, ["sglang::scheduler_DP0_TP1"], GOOD),
        snap(103, ["sglang::scheduler_DP1_TP0"], GOOD),
        snap(104, ["sglang::scheduler_DP1_TP1"], {"NCCL_MAX_NCHANNELS": "4"}),
    ]
    obs = evaluate_env(100, snaps, REQUESTED, expected_ranks=4)
    assert len(obs.workers) == 4
    assert obs.problems == ("NCCL_PROTO did not reach rank 1 (pid 104)",)


def test_fallback_skips_multiprocessing_helpers_and_non_python():
    snaps = [
        snap(100, ["python", "server.py"], GOOD),
        snap(101, ["python", "-c", "from multiprocessing.resource_tracker import main;main(5)"], {}),
        snap(102, ["python", "-c", "worker"], GOOD),
        snap(103, ["/bin/sh", "-c", "true"], {}, exe="/bin/sh"),
        snap(104, ["python3.11", "-c", "worker"], {"NCCL_PROTO": "LL"}),
    ]
    obs = evaluate_env(100, snaps, REQUESTED, expected_ranks=2)
    assert obs.workers == {102: 0, 104: 1}
    assert obs.problems == ("NCCL_MAX_NCHANNELS did not reach rank 1 (pid 104)",)


def test_unreadable_worker_environment_is_not_proof():
    snaps = [snap(100, ["python"], GOOD), snap(101, ["sglang::scheduler_TP0"], None)]
    obs = evaluate_env(100, snaps, REQUESTED, expected_ranks=1)
    assert not obs.ok
    assert "could not read the environment of rank 0 (pid 101)" in obs.problems


# --- NCCL log -----------------------------------------------------------------------------------

# Captured on the H200 host (one rank), then a second rank as NCCL writes it, and per-call tuning
# lines in the format of reference/measurements/h200x2-nvlink-allreduce.json.
NCCL_LOG = """\
vm:471:471 [0] NCCL INFO ENV/Plugin: Could not find: libnccl-env.so
vm:471:471 [0] NCCL INFO cudaDriverVersion 13000
vm:471:471 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
vm:471:471 [0] NCCL INFO ncclCommInitRankConfig comm 0x19ac45f0 rank 0 nranks 1 cudaDev 0 nvmlDev 0 busId 60 commId 0xe1d1d5eced0ac3e5 - Init START
vm:471:471 [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.
vm:471:471 [0] NCCL INFO comm 0x19ac45f0 rank 0 nRanks 1 nNodes 1 localRanks 1 localRank 0 MNNVL 0
vm:471:471 [0] NCCL INFO NCCL_MAX_NCHANNELS set by environment to 4.
vm:471:471 [0] NCCL INFO Channel 00/04 : 0
vm:471:497 [0] NCCL INFO [Proxy Service] Device 0 CPU core 2
vm:471:471 [0] NCCL INFO NCCL_PROTO set by environment to LL
vm:472:472 [1] NCCL INFO NCCL version 2.28.9+cuda13.0
vm:472:472 [1] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.
vm:472:472 [1] NCCL INFO NCCL_MAX_NCHANNELS set by environment to 4.
vm:472:472 [1] NCCL INFO NCCL_PROTO set by environment to LL
[2026-11-29 13:14:07 TP0] Load weight end. type=DeepseekV3ForCausalLM
vm:471:471 [0] NCCL INFO AllReduce: 14336 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}
vm:471:471 [0] NCCL INFO AllReduce: 57344 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}
vm:472:472 [1] NCCL INFO AllReduce: 14336 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}
vm:472:472 [1] NCCL INFO AllGather: 1048576 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..3}
"""


def ok_observation():
    return evaluate_env(
        1,
        [
            snap(1, ["python"], REQUESTED),
            snap(2, ["sglang::scheduler_TP0"], REQUESTED),
            snap(3, ["sglang::scheduler_TP1"], REQUESTED),
        ],
        REQUESTED,
        2,
    )


NCCL_CHECK_CASES = [
    ("both devices confirm", NCCL_LOG, {}, True, "NCCL confirmed NCCL_PROTO, NCCL_MAX_NCHANNELS on 2 device(s)"),
    (
        "one device never took it",
        NCCL_LOG.replace("vm:472:472 [1] NCCL INFO NCCL_PROTO set by environment to LL\n", ""),
        {},
        False,
        "NCCL did not report NCCL_PROTO on device(s) 1 (reported on 0)",
    ),
    (
        "another value",
        NCCL_LOG.replace(
            "[1] NCCL INFO NCCL_MAX_NCHANNELS set by environment to 4.",
            "[1] NCCL INFO NCCL_MAX_NCHANNELS set by environment to 2.",
        ),
        {},
        False,
        "NCCL on device 1 took NCCL_MAX_NCHANNELS='2', requested '4'",
    ),
    (
        "a variable NCCL never echoes is not held against the trial",
        NCCL_LOG,
        {"NCCL_DEBUG": "INFO", "NCCL_ALGO": "Ring"},
        True,
        "all 4 requested variable(s)",
    ),
    ("no NCCL log", "", {}, True, "reached all 2 rank worker(s)"),
]


@pytest.mark.parametrize(
    ("log", "more", "ok", "text"), [c[1:] for c in NCCL_CHECK_CASES], ids=[c[0] for c in NCCL_CHECK_CASES]
)
def test_check_env_applied_with_nccl_log(log, more, ok, text):
    requested = {**REQUESTED, **more}
    obs = evaluate_env(
        1,
        [
            snap(1, ["python"], requested),
            snap(2, ["sglang::scheduler_TP0"], requested),
            snap(3, ["sglang::scheduler_TP1"], requested),
        ],
        requested,
        2,
    )
    got_ok, reason = check_env_applied(requested, obs, parse_nccl_log(log))
    assert got_ok is ok
    assert text in reason


# --- all-reduce path ------------------------------------------------------------------------------

AR_CASES = [
    (
        "SGLang says NCCL",
        {"tp_size": 8},
        "[2026-11-29 13:14:07 TP0] [AR] All-reduce call path: NCCL (custom AR disabled)",
        "nvlink",
        "nccl",
    ),
    (
        "SGLang says custom",
        {"--tp-size": "2"},
        "[2026-11-29 13:14:07 TP0] [AR] Using CustomAllReduceV2 (JIT-compiled)",
        None,
        "custom",
    ),
    (
        "custom disabled on PCIe",
        {"tp_size": 2},
        "WARNING Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs.",
        "nvlink",
        "nccl",
    ),
    (
        "custom setup failed",
        {"tp_size": 8},
        "Setup Custom allreduce failed with CUDA error. To silence this warning, specify --disable-custom-all-reduce explicitly.",
        "nvlink",
        "nccl",
    ),
    ("flag disables custom", {"--disable-custom-all-reduce": True, "--tp-size": 8}, "", "H200 SXM NVLink", "nccl"),
    (
        "deterministic inference disables custom",
        {"enable_deterministic_inference": True, "tp_size": 8},
        "",
        "nvlink",
        "nccl",
    ),
    ("NVLink TP8 defaults to custom", {"tp_size": 8}, "", "8x H200 SXM (NVSwitch)", "custom"),
    ("PCIe with 8 GPUs has no custom kernel", {"tp_size": 8}, "", "8x RTX PRO 6000 PCIe Gen5", "nccl"),
    ("PCIe with 2 GPUs is not known", {"tp_size": 2}, "", "pcie", "unknown"),
    ("unsupported world size", {"tp_size": 3}, "", "nvlink", "nccl"),
    ("TP 1 has no all-reduce", {"tp_size": 1}, "", "nvlink", "none"),
    ("hardware unknown", {"tp_size": 8}, "", None, "unknown"),
    ("NVLink read from the topology matrix", {"tp_size": 2}, "", TOPO_NV, "custom"),
    ("PCIe read from the topology matrix", {"tp_size": 4}, "", TOPO_PCIE, "nccl"),
    ("one-GPU matrix says nothing", {"tp_size": 2}, "", TOPO, "unknown"),
]


@pytest.mark.parametrize(("flags", "log", "hardware", "path"), [c[1:] for c in AR_CASES], ids=[c[0] for c in AR_CASES])
def test_allreduce_path(flags, log, hardware, path):
    assert allreduce_path(flags, log, hardware) == path


def test_the_plans_flags_decide_the_allreduce_path():
    s = spec_mod.load(Path(__file__).resolve().parents[2] / "experiments" / "kimi-k2.5-tp8.yaml")
    base = sp.baseline_params(s.space)
    nccl = planner.make(s, {**base, "all_reduce_path": "nccl"}, port=30000)
    assert nccl.flags["--disable-custom-all-reduce"] is True and nccl.flags["--tp-size"] == "8"
    assert allreduce_path(nccl.flags, "", "nvlink") == "nccl"
    assert allreduce_path(planner.make(s, base, port=30000).flags, "", "nvlink") == "custom"


WARN_CASES = [
    (
        "NCCL swept under custom all-reduce",
        {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"},
        {"tp_size": 8},
        "nvlink",
        ["NCCL_ALGO, NCCL_PROTO are swept, but on this NVLink host SGLang's custom all-reduce carries"],
    ),
    (
        "NCCL on the verify path: nothing to say",
        {"NCCL_PROTO": "LL"},
        {"tp_size": 8, "disable_custom_all_reduce": True},
        "nvlink",
        [],
    ),
    ("PCIe TP8: NCCL carries it", {"NCCL_PROTO": "LL"}, {"tp_size": 8}, "pcie", []),
    ("debug variables are not tuning", {"NCCL_DEBUG": "INFO"}, {"tp_size": 8}, "nvlink", []),
    (
        "symm-mem overwrites CUMEM",
        {"NCCL_CUMEM_ENABLE": "0"},
        {"tp_size": 8, "enable_symm_mem": True, "disable_custom_all_reduce": True},
        "nvlink",
        [
            "--enable-symm-mem forces NCCL_CUMEM_ENABLE=1 and NCCL_NVLS_ENABLE=1 in the server, overwriting the plan's NCCL_CUMEM_ENABLE=0"
        ],
    ),
    (
        "deterministic inference overwrites ALGO and channels",
        {"NCCL_ALGO": "Ring", "NCCL_MAX_NCHANNELS": "16"},
        {"tp_size": 8, "enable_deterministic_inference": True},
        "nvlink",
        ["--enable-deterministic-inference overwrites NCCL_ALGO, NCCL_MAX_NCHANNELS"],
    ),
    (
        "SGLang's own defaults",
        {"NCCL_GRAPH_REGISTER": "1", "NCCL_NVLS_ENABLE": "0", "NCCL_CUMEM_ENABLE": "1"},
        {"tp_size": 8, "disable_custom_all_reduce": True},
        "nvlink",
        [
            "NCCL_CUMEM_ENABLE: SGLang sets it to 0",
            "NCCL_NVLS_ENABLE: SGLang sets it to 0",
            "NCCL_GRAPH_REGISTER: SGLang sets it to 0",
        ],
    ),
    (
        "a tuner plugin alone",
        {"NCCL_TUNER_PLUGIN": "/opt/libnccl-tuner-example.so", "NCCL_TUNER_CONFIG_FILE": "/srv/rules.csv"},
        {"tp_size": 8},
        "pcie",
        [],
    ),
    (
        "NCCL_PROTO masks the tuner plugin",
        {"NCCL_TUNER_PLUGIN": "/opt/libnccl-tuner-example.so", "NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"},
        {"tp_size": 8},
        "pcie",
        [
            "NCCL_TUNER_PLUGIN loads a tuner plugin, but NCCL_ALGO=Ring, NCCL_PROTO=LL are set too: NCCL_ALGO / NCCL_PROTO "
            "mask the plugin"
        ],
    ),
]


@pytest.mark.parametrize(
    ("env", "flags", "hardware", "expected"), [c[1:] for c in WARN_CASES], ids=[c[0] for c in WARN_CASES]
)
def test_plan_warnings(env, flags, hardware, expected):
    warnings = plan_warnings(env, flags, hardware)
    assert len(warnings) == len(expected), warnings
    for warning, start in zip(warnings, expected):
        assert warning.startswith(start), warning


# --- fingerprint ----------------------------------------------------------------------------------


class FakeSmi:
    """Stands in for subprocess.run at the nvidia-smi boundary, answering with captured output."""

    def __init__(self, *, event_reasons=True, fail=None):
        self.event_reasons, self.fail, self.calls = event_reasons, fail, []

    def __call__(self, argv, **kwargs):
        assert isinstance(argv, list) and kwargs.get("timeout")  # argv lists and a timeout, always
        self.calls.append(argv)
        if self.fail:
            raise self.fail
        if argv[1:2] == ["topo"]:
            return subprocess.CompletedProcess(argv, 0, TOPO, "")
        if len(argv) == 1:
            return subprocess.CompletedProcess(argv, 0, PLAIN, "")
        if "clocks_event_reasons.active" in argv[1]:
            if not self.event_reasons:
                return subprocess.CompletedProcess(
                    argv, 2, 'Field "clocks_event_reasons.active" is not a valid field to query.\n', ""
                )
            return subprocess.CompletedProcess(argv, 0, QUERY_FULL, "")
        return subprocess.CompletedProcess(argv, 0, QUERY, "")


def test_fingerprint_of_the_h200_host():
    fp = fingerprint(run=FakeSmi(), nccl_log=NCCL_LOG)
    assert (fp["gpu_count"], fp["gpu_names"], fp["driver"], fp["cuda"], fp["nccl"]) == (
        1,
        ["NVIDIA H200"],
        "580.159.04",
        "13.0",
        "2.28.9+cuda13.0",
    )
    gpu = fp["gpus"][0]
    assert (gpu["sm_clock_mhz"], gpu["mem_clock_mhz"], gpu["power_w"], gpu["temperature_c"]) == (345, 3201, 77.57, 33)
    assert (gpu["pcie_gen"], gpu["pcie_gen_max"], gpu["pcie_width"], gpu["pcie_width_max"]) == (5, 5, 16, 16)
    assert gpu["clock_event_reasons"] == "0x0000000000000001"
    assert fp["topology"].startswith("GPU0\tCPU Affinity") and "\x1b" not in fp["topology"]
    assert fp["host"] and fp["python"] and "cpu_model" in fp and "torch" in fp and "sglang" in fp


def test_fingerprint_on_an_older_driver_drops_the_unknown_field():
    fp = fingerprint(run=FakeSmi(event_reasons=False))
    assert fp["gpu_count"] == 1 and fp["gpus"][0]["power_w"] == 77.51
    assert "clock_event_reasons" not in fp["gpus"][0]


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (FileNotFoundError("nvidia-smi"), "absent"),
        (subprocess.TimeoutExpired(["nvidia-smi"], 15), "failed: timed out after 15 s"),
        (PermissionError("denied"), "failed: PermissionError: denied"),
    ],
)
def test_fingerprint_without_nvidia_smi_never_raises(error, status):
    fp = fingerprint(run=FakeSmi(fail=error))
    assert fp["gpu_count"] == 0 and fp["nvidia_smi"] == status
    assert fp["host"] and fp["python"]


def test_fingerprint_of_the_simulator_is_marked():
    fp = fingerprint(
        run=FakeSmi(fail=FileNotFoundError()), simulated={"gpu_count": 8, "gpu_names": ["RTX PRO 6000 (simulated)"] * 8}
    )
    assert fp["simulated"] is True and fp["gpu_count"] == 8


def test_hash_ignores_clocks_and_temperature_but_not_the_driver():
    a = fingerprint(run=FakeSmi(), nccl_log=NCCL_LOG)
    warm = {
        **a,
        "gpus": [{**a["gpus"][0], "sm_clock_mhz": 1980, "temperature_c": 71, "power_w": 650.0}],
        "topology": a["topology"].replace("\t", "  "),
    }
    assert fingerprint_hash(warm) == fingerprint_hash(a)
    assert fingerprint_diff(a, warm) == []

    upgraded = {**a, "driver": "580.160.01", "nccl": "2.29.1+cuda13.0"}
    assert fingerprint_hash(upgraded) != fingerprint_hash(a)
    assert fingerprint_diff(a, upgraded) == [
        "driver: '580.159.04' -> '580.160.01'",
        "nccl: '2.28.9+cuda13.0' -> '2.29.1+cuda13.0'",
    ]


def _venv_with(tmp_path: Path, **versions: str) -> str:
    """A real, separate interpreter (a venv without pip) whose site-packages holds these distributions'
    metadata: what a server venv looks like to importlib.metadata."""
    venv = tmp_path / "server-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python*/site-packages"))
    for name, version in versions.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return str(venv / "bin" / "python")


def test_fingerprint_reads_the_versions_the_servers_interpreter_imports(tmp_path: Path):
    """server.python names another venv (torch 2.14.1 and sglang 0.5.23 there, torch 2.13.0+cpu and no
    sglang here): the fingerprint records the server's, not the sweep's own."""
    python = _venv_with(tmp_path, torch="2.14.1", sglang="0.5.23")
    smi = FakeSmi(fail=FileNotFoundError())

    def run(argv, **kwargs):
        return smi(argv, **kwargs) if argv[0] == "nvidia-smi" else subprocess.run(argv, **kwargs)

    fp = fingerprint(run=run, python=python)
    assert (fp["torch"], fp["sglang"], fp["sgl_kernel"], fp["server_python"]) == ("2.14.1", "0.5.23", None, python)
    assert "versions_error" not in fp


def test_fingerprint_says_why_when_the_servers_interpreter_cannot_be_asked(tmp_path: Path):
    missing = str(tmp_path / "no-such-python")
    fp = fingerprint(run=FakeSmi(fail=FileNotFoundError()), python=missing)
    assert (fp["torch"], fp["sglang"], fp["versions_error"]) == (None, None, "absent")


def test_a_rank_whose_environ_its_process_title_overwrote_is_read_from_what_spawned_it():
    """setproctitle reuses the memory of the initial environment for the title: a real SGLang 0.5.23 CPU
    server at TP=2 showed /proc/<pid>/environ of `sglang::scheduler_TP0/TP1` and `sglang::detokenizer` with
    no variable at all, while the launcher's resource_tracker (spawned alike, never retitled) kept its
    environment. The ranks' environment is read from that sibling, and the observation says so."""
    spawned = {**REQUESTED, "PATH": "/usr/bin", "NCCL_CUMEM_ENABLE": "0"}
    snaps = [
        ProcessSnapshot(
            100, 1, ("/v/bin/python", "-m", "sglang.launch_server"), "/v/bin/python", {**REQUESTED, "PATH": "/usr/bin"}
        ),
        ProcessSnapshot(
            101,
            100,
            ("/v/bin/python", "-B", "-c", "from multiprocessing.resource_tracker import main;main(6)"),
            "/v/bin/python",
            spawned,
        ),
        ProcessSnapshot(102, 100, ("sglang::scheduler_TP0",), "/v/bin/python", {}),
        ProcessSnapshot(103, 100, ("sglang::scheduler_TP1",), "/v/bin/python", {"": "\x00 padding"}),
    ]
    obs = evaluate_env(100, snaps, REQUESTED, expected_ranks=2)
    assert obs.ok and obs.workers == {102: 0, 103: 1}, obs.problems
    ranks = [p for p in obs.processes if p.rank is not None]
    assert {p.environ_source for p in ranks} == {"sibling 101 (spawned by the same parent, not retitled)"}
    assert all(p.nccl_env.get("NCCL_CUMEM_ENABLE") == "0" for p in ranks)  # what SGLang set before spawning


def test_a_rank_that_lost_a_variable_is_still_caught_through_its_own_environ():
    snaps = [
        ProcessSnapshot(
            100, 1, ("python", "-m", "sglang.launch_server"), "/usr/bin/python3", {**REQUESTED, "PATH": "/b"}
        ),
        ProcessSnapshot(102, 100, ("sglang::scheduler_TP0",), "/usr/bin/python3", {"PATH": "/b"}),
    ]
    obs = evaluate_env(100, snaps, REQUESTED, expected_ranks=1)
    assert not obs.ok and obs.processes[1].environ_source == "own"
