"""What a real SGLang 0.5.23 server on CPU showed (tests/sglang_real) and GPU servers share, learnt by the
simulator: access lines in SGLang's log format, /health 503 until the warm-up request has finished, and
/server_info's resolved device and status."""

from __future__ import annotations

import re
import time

import httpx

# A real server's lines (tests/sglang_real, server.log of a CPU trial):
#   [2026-12-01 22:26:26] INFO:     127.0.0.1:55998 - "GET /health HTTP/1.1" 503 Service Unavailable
#   [2026-12-01 22:26:27] INFO:     127.0.0.1:56010 - "POST /generate HTTP/1.1" 200 OK
ACCESS = re.compile(
    r'^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] INFO:     127\.0\.0\.1:\d+ - "(GET|POST) (\S+) HTTP/1\.1" '
    r"(\d{3}) [A-Za-z ]+$",
    re.M,
)


def test_access_lines_and_server_info_as_a_real_server_writes_them(sim_factory):
    sim = sim_factory("--tp-size", "2")
    sim.wait_ready()
    info = httpx.get(sim.url + "/server_info", timeout=10).json()
    assert (info["version"], info["device"], info["status"]) == ("0.5.23", "cuda", "ready")
    httpx.post(sim.url + "/generate", json={"text": "a b", "sampling_params": {"max_new_tokens": 2}}, timeout=10)
    lines = {(m.group(1), m.group(2), m.group(3)) for m in ACCESS.finditer(sim.log())}
    assert ("GET", "/health", "200") in lines and ("POST", "/generate", "200") in lines, sim.log()[-2000:]


def test_health_is_503_with_its_access_line_until_warm_up_ends(sim_factory):
    sim = sim_factory("--tp-size", "2", faults=("never_ready",))
    deadline = time.monotonic() + 15
    code = None
    while code != 503 and time.monotonic() < deadline:
        try:
            code = httpx.get(sim.url + "/health", timeout=5).status_code
        except httpx.TransportError:
            time.sleep(0.05)
    assert code == 503
    assert httpx.get(sim.url + "/server_info", timeout=10).json()["status"] == "starting"
    time.sleep(0.3)
    assert ("GET", "/health", "503") in {(m.group(1), m.group(2), m.group(3)) for m in ACCESS.finditer(sim.log())}
