"""Start-up time and memory of one simulator server with its rank workers (issue 4: < 2 s, < 150 MB).

Starts `python -m orchestrator.simulator` (TP 8, EAGLE-3, metrics on) a few times, measures the
seconds from process start until GET /health answers 200, then the resident memory (VmRSS, and PSS
where the kernel offers it) of the server plus every descendant after one streamed request, and
stops it with SIGTERM. RSS counts shared pages once per process, so it overstates the real total;
PSS splits them fairly.

    .venv/bin/python bench/simulator_footprint.py [--runs 3] [--tp 8] [-o FILE]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _result  # bench/_result.py: the result file and what made it
import httpx
import psutil

from orchestrator.trial import procs

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mib(pid: int, which: str) -> float:
    """Resident (rss) or proportional (pss) memory of one process in MiB; 0 once it is gone."""
    try:
        info = psutil.Process(pid).memory_full_info()
    except psutil.Error:
        return 0.0
    return float(getattr(info, which)) / (1 << 20)


def one_run(tp: int) -> dict[str, float]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        sys.executable,
        "-m",
        "orchestrator.simulator",
        "--model-path",
        "kimi-k2.5",
        "--tp-size",
        str(tp),
        "--port",
        str(port),
        "--enable-metrics",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"simulator exited with {proc.returncode}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.01)
        ready_s = time.monotonic() - t0
        httpx.post(
            url + "/generate",
            json={"text": "hello", "sampling_params": {"max_new_tokens": 64}, "stream": True},
            timeout=30,
        )
        pids = [proc.pid, *procs.descendants(proc.pid)]
        rss = sum(_mib(p, "rss") for p in pids)
        pss = sum(_mib(p, "pss") for p in pids)
        server_rss = _mib(proc.pid, "rss")
        return {"ready_s": ready_s, "processes": len(pids), "rss_mb": rss, "pss_mb": pss, "server_rss_mb": server_rss}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tp", type=int, default=8)
    _result.add_output(ap)
    args = ap.parse_args()
    run = _result.start()
    runs = [one_run(args.tp) for _ in range(args.runs)]
    for i, r in enumerate(runs):
        print(
            f"run {i + 1}: ready in {r['ready_s']:.2f} s, {r['processes']:.0f} processes, "
            f"RSS {r['rss_mb']:.1f} MB (server {r['server_rss_mb']:.1f} MB), PSS {r['pss_mb']:.1f} MB"
        )
    print(
        f"median: ready {statistics.median(r['ready_s'] for r in runs):.2f} s, "
        f"RSS {statistics.median(r['rss_mb'] for r in runs):.1f} MB, "
        f"PSS {statistics.median(r['pss_mb'] for r in runs):.1f} MB "
        f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)"
    )
    median = {k: statistics.median(r[k] for r in runs) for k in ("ready_s", "rss_mb", "pss_mb", "server_rss_mb")}
    _result.write(args.out, {"tp": args.tp, "runs": runs, "median": median}, run, indent=2)


if __name__ == "__main__":
    main()
