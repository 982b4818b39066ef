"""The server's rank workers: one process per TP rank, like SGLang's scheduler processes.

They matter for what can be observed, not for timing: each inherits the server's environment (so
/proc/<pid>/environ of the server's descendants shows the NCCL_* variables that reached "NCCL"),
prints NCCL's own start-up lines when NCCL_DEBUG=INFO, and dies with the server. The worker is a
stdlib-only script started with `python -I -S` so eight of them stay small and start fast.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

_WORKER = Path(__file__).with_name("_rank_worker.py")


def worker_env(server_env: Mapping[str, str], *, drop_nccl: bool) -> dict[str, str]:
    """The environment a rank starts with; `drop_nccl` is the env_drop fault."""
    env = dict(server_env)
    if drop_nccl:
        env = {k: v for k, v in env.items() if not k.startswith("NCCL_")}
    return env


def start(
    tp_size: int, env: Mapping[str, str], *, nccl_version: str, tuning: Sequence[str], ready_timeout_s: float = 120.0
) -> list[subprocess.Popen]:
    """Start `tp_size` rank workers (their stdout/stderr are the server's) and return once each has printed
    its NCCL lines, as SGLang's "Init torch distributed ends" follows every rank's NCCL init: a reader of
    the log that sees the server ready finds every rank's lines. `ready_timeout_s` only guards a hang."""
    ready, told = os.pipe()
    procs = []
    try:
        for rank in range(tp_size):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-I",
                        "-S",
                        str(_WORKER),
                        f"orchestrator.simulator::scheduler_TP{rank}",
                        str(rank),
                        str(tp_size),
                        str(os.getpid()),
                        nccl_version,
                        f"--ready-fd={told}",
                        *tuning,
                    ],
                    env=dict(env),
                    stdin=subprocess.DEVNULL,
                    close_fds=True,
                    pass_fds=(told,),
                )
            )
        os.close(told)
        told = -1
        _wait_told(ready, procs, ready_timeout_s)
    finally:
        if told >= 0:
            os.close(told)
        os.close(ready)
    return procs


def _wait_told(ready: int, procs: Sequence[subprocess.Popen], timeout_s: float) -> None:
    """Read one byte per worker from `ready`; a worker that died (or the timeout) ends the wait early."""
    deadline = time.monotonic() + timeout_s
    count = 0
    while count < len(procs):
        left = deadline - time.monotonic()
        if left <= 0:
            return
        readable, _, _ = select.select([ready], [], [], min(left, 0.5))
        if readable:
            got = os.read(ready, len(procs) - count)
            if not got:  # every writer is gone: the workers that could tell have told, or died
                return
            count += len(got)
        elif any(p.poll() is not None for p in procs):
            return


def stop(procs: Sequence[subprocess.Popen], timeout_s: float = 2.0) -> None:
    """Terminate every worker, then kill those still alive after `timeout_s`, and reap them all."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
