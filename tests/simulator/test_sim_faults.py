"""Every injected fault, end to end on a real process: what the outside sees, and nothing left behind."""

from __future__ import annotations

import signal
import socket
import time

import httpx
import pytest
from sim_helpers import descendants, environ_of, wait_gone

SPEC = (
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "2",
    "--speculative-num-draft-tokens",
    "6",
)


def health(url: str) -> int | None:
    try:
        return httpx.get(url + "/health", timeout=5).status_code
    except httpx.TransportError:
        return None


def test_never_ready_answers_503_forever(sim_factory):
    sim = sim_factory("--tp-size", "2", faults=("never_ready",))
    deadline = time.monotonic() + 15
    while health(sim.url) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    codes = set()
    for _ in range(8):
        codes.add(health(sim.url))
        time.sleep(0.1)
    assert codes == {503}
    assert httpx.get(sim.url + "/ready").status_code == 503
    assert "fired up" not in sim.log()
    assert len(sim.workers(2)) == 2


def test_slow_start_binds_late(sim_factory):
    sim = sim_factory("--tp-size", "2", env={"SWEEP_SIM_FAULTS": "slow_start=1.5"})
    time.sleep(0.8)
    assert health(sim.url) is None  # still "loading": nothing listens yet
    assert sim.wait_ready() >= 1.5


# A failing scheduler SIGQUITs SGLang's launcher, which SIGKILLs its whole process tree, itself last
# (sglang/srt/entrypoints/engine.py::launch_phase_sigquit_handler -> srt/utils/common.py::kill_process_tree):
# the server's exit status is -9 whatever the cause; the simulator ends the same way.
KILLED = -signal.SIGKILL


def test_crash_after_tokens_cuts_the_stream_and_kills_the_tree(sim_factory):
    sim = sim_factory("--tp-size", "4", *SPEC, faults=("crash_after_tokens=30",))
    sim.wait_ready()
    workers = sim.workers(4)
    received = 0
    with pytest.raises(httpx.HTTPError):
        with httpx.stream(
            "POST",
            sim.url + "/generate",
            timeout=30,
            json={"text": "a b c", "sampling_params": {"max_new_tokens": 200}, "stream": True},
        ) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    received += 1
    assert sim.wait_exit() == KILLED
    assert 0 < received < 200
    log = sim.log()
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in log
    assert "Received sigquit from a child process" in log
    assert wait_gone(workers) == []


def test_nccl_hang_keeps_the_process_alive_without_tokens(sim_factory):
    sim = sim_factory(
        "--tp-size",
        "2",
        "--watchdog-timeout",
        "1.5",
        env={"NCCL_PROTO": "Simple", "NCCL_ALGO": "Tree", "SGLANG_HEALTH_CHECK_TIMEOUT": "1"},
        faults=("nccl_hang_when=NCCL_PROTO:Simple,NCCL_ALGO:Tree",),
    )
    sim.wait_ready()
    with pytest.raises(httpx.ReadTimeout):
        with httpx.stream(
            "POST",
            sim.url + "/generate",
            timeout=httpx.Timeout(10, read=2.0),
            json={"text": "a b c", "sampling_params": {"max_new_tokens": 20}, "stream": True},
        ) as resp:
            for _ in resp.iter_lines():
                pass
    assert sim.proc.poll() is None
    assert health(sim.url) == 503  # the health generation is stuck behind the collective too
    deadline = time.monotonic() + 5
    while "watchdog timeout" not in sim.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "Scheduler watchdog timeout" in sim.log()
    assert sim.proc.poll() is None


def test_no_hang_when_the_environment_does_not_match(sim_factory):
    sim = sim_factory("--tp-size", "2", env={"NCCL_PROTO": "LL"}, faults=("nccl_hang_when=NCCL_PROTO:Simple",))
    sim.wait_ready()
    out = httpx.post(sim.url + "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 5}}, timeout=10)
    assert out.json()["meta_info"]["completion_tokens"] == 5


def test_oom_above_draft_token_limit(sim_factory):
    sim = sim_factory("--tp-size", "2", *SPEC, faults=("oom_above_draft_tokens=8",))  # 6 draft tokens x top-k 2
    assert sim.wait_exit() == KILLED
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in sim.log()


@pytest.mark.parametrize("graph_flags,at_capture", [((), True), (("--cuda-graph-backend-decode", "disabled"), False)])
def test_draft_tree_too_small_for_draft_tokens_crashes(sim_factory, graph_flags, at_capture):
    """At CUDA-graph capture, or without graphs at the first verify (the warmup request)."""
    sim = sim_factory(
        "--tp-size",
        "2",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-num-steps",
        "2",
        "--speculative-eagle-topk",
        "2",
        "--speculative-num-draft-tokens",
        "8",
        *graph_flags,
    )
    assert sim.wait_exit() == KILLED
    log = sim.log()
    assert "RuntimeError: selected index k out of range" in log
    assert ("Capture cuda graph begin" in log) == at_capture
    assert "fired up" not in log


def test_env_drop_keeps_nccl_variables_from_the_workers(sim_factory):
    env = {"NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "SYS", "NCCL_DEBUG": "INFO"}
    sim = sim_factory("--tp-size", "8", env=env, faults=("env_drop",))
    sim.wait_ready()
    workers = sim.workers(8)
    assert len(workers) == 8
    assert environ_of(sim.proc.pid)["NCCL_PROTO"] == "LL"
    for pid in workers:
        assert not [k for k in environ_of(pid) if k.startswith("NCCL_")]
    assert "NCCL INFO" not in sim.log()  # NCCL_DEBUG did not reach NCCL either


def test_port_in_use_fails_like_uvicorn(sim_factory):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sim = sim_factory("--tp-size", "2", port=port)
        assert sim.wait_exit() == 1
    assert (
        f"[Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): address already in use"
        in sim.log()
    )
    assert descendants(sim.proc.pid) == []


@pytest.mark.parametrize(
    "args,env,text",
    [
        (("--tp-size", "4"), {}, "invalid device ordinal"),
        (("--tp-size", "2"), {"NCCL_ALGO": "NVLS"}, "no algorithm/protocol available"),
    ],
)
def test_start_up_errors_kill_the_tree(sim_factory, args, env, text):
    sim = sim_factory(*args, "--hardware-profile", "h200-nvlink", env=env)
    assert sim.wait_exit() == KILLED
    assert text in sim.log()
    assert descendants(sim.proc.pid) == []
