"""One rank of the GPU probe: imports torch once, then forks a fresh child per NCCL setting.

Started by gpu.py as `python .../probe/_worker.py RANK WORLD BACKEND` (a script: stdlib and torch only). NCCL reads its
environment when a communicator is created and caches most variables for the life of the process
(NCCL_PARAM), so a long-lived process cannot try a second setting; a fresh `torchrun` per setting
pays ~5.5 s of torch import each time. This process imports torch (without touching CUDA, so forking
stays safe) and forks a child per setting, which sets the environment, creates the process group,
measures and exits.

Protocol, one JSON object per line. stdin: {"run": {...}} (see `_child`) or {"quit": true}.
stdout: {"ready": ..., "cuda_devices": N} once, then per run {"started": pid} and {"exited": code}
(negative: killed by that signal). A child writes its result file itself (temp + rename) and leaves
with os._exit before any tear-down: NCCL can hang in tear-down after CUDA-graph capture.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback
from typing import Any


def _say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _per_call_us(torch: Any, run: Any, iters: int, repeats: int, cuda: bool) -> list[float]:
    """`repeats` timings of `iters` back-to-back calls of `run`, in microseconds per call."""
    out = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1e3 / iters)
        else:
            t0 = time.perf_counter()
            run()
            out.append((time.perf_counter() - t0) * 1e6 / iters)
    return out


def _measure(torch: Any, dist: Any, job: dict[str, Any], device: Any, cuda: bool) -> list[dict[str, Any]]:
    iters, repeats = int(job["iters"]), int(job["repeats"])
    rows = []
    for size in job["sizes"]:
        x = torch.ones(max(1, size["nbytes"] // 2), dtype=torch.bfloat16 if cuda else torch.float32, device=device)
        for mode in job["modes"]:
            if mode == "graph" and not cuda:
                continue  # CUDA graphs need a GPU; on CPU (the plumbing tests) only eager is timed
            if mode == "graph":
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):  # warm-up outside the graph, as torch.cuda.graph's docs ask
                    for _ in range(3):
                        dist.all_reduce(x)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for _ in range(iters):
                        dist.all_reduce(x)
                graph.replay()
                samples = _per_call_us(torch, graph.replay, iters, repeats, cuda)
            else:

                def eager(x: Any = x) -> None:
                    for _ in range(iters):
                        dist.all_reduce(x)

                eager()
                samples = _per_call_us(torch, eager, iters, repeats, cuda)
            rows.append(
                {
                    "size": size["label"],
                    "nbytes": size["nbytes"],
                    "mode": mode,
                    "median_us": round(statistics.median(samples), 3),
                    "repeats": repeats,
                }
            )
    return rows


def _child(torch: Any, dist: Any, rank: int, world: int, backend: str, job: dict[str, Any]) -> None:
    """Runs in the forked child: never returns."""
    code = 0
    result: dict[str, Any] = {"rank": rank}
    try:
        os.setpgrp()  # the driver kills a hung setting by process group
        log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        for name in job["unset"]:
            os.environ.pop(name, None)
        os.environ.update(job["env"])
        time.sleep(float(os.environ.get("SWEEP_PROBE_TEST_SLEEP_S", "0")))  # test hook: a setting that hangs
        result["env"] = {name: os.environ.get(name) for name in [*job["env"], *job["unset"]]}
        cuda = backend == "nccl"
        device = torch.device("cuda", rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{job['port']}", rank=rank, world_size=world)
        result["rows"] = _measure(torch, dist, job, device, cuda)
    except BaseException:
        result["error"] = traceback.format_exc(limit=6)
        code = 1
    try:
        tmp = job["result"] + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(result, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, job["result"])
    finally:
        sys.stdout.flush()
        os._exit(code)


def main(argv: list[str]) -> int:
    rank, world, backend = int(argv[0]), int(argv[1]), argv[2]
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # count GPUs without initialising CUDA: forks stay safe
    # torch (heavy) is imported here, once per rank, so nothing else in the package ever pulls it in.
    import torch
    import torch.distributed as dist  # heavy: torch, deferred as above

    _say({"ready": True, "torch": torch.__version__, "cuda_devices": torch.cuda.device_count()})
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("quit"):
            return 0
        job = message["run"]
        pid = os.fork()
        if pid == 0:
            _child(torch, dist, rank, world, backend, job)
        _say({"started": pid})
        _, status = os.waitpid(pid, 0)
        _say({"exited": os.waitstatus_to_exitcode(status)})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
