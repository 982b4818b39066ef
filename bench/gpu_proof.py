"""Proof-of-what-ran on a real GPU host: the trial's observation code against real NVIDIA and NCCL output.

Run on a machine with a GPU and torch (no Ray, MLflow or SGLang needed):

    NCCL_NVLS_ENABLE=0 python3 bench/gpu_proof.py --out DIR

It does what a trial does after the server is ready, with a stand-in server whose rank workers are
real torch.distributed NCCL processes (one per visible GPU, as SGLang's schedulers are):
  1. observe.fingerprint(): nvidia-smi (GPUs, driver, CUDA, clocks, power, temperature, PCIe link,
     topology), torch/NCCL versions; written to fingerprint.json.
  2. A "server" process starts the rank workers with NCCL_DEBUG=INFO and the requested NCCL variables;
     each rank runs all-reduces of verify-sized messages (tokens x 7168 x bf16) and stays alive.
  3. observe.observe_env() reads /proc/<pid>/environ of the server's descendants; parse_nccl_log()
     reads NCCL's own lines; check_env_applied() gives the verdict a trial would record.
  4. The same with one variable dropped from rank 0's environment: the verdict must be env_not_applied.
Results: proof.json (verdicts, parsed NCCL info, all-reduce timings) and the raw logs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import _result  # noqa: E402  (bench/_result.py: the result file and what made it)

from orchestrator.trial import observe  # noqa: E402

REQUESTED = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_MAX_NCHANNELS": "4",
    "NCCL_BUFFSIZE": "4194304",
    "NCCL_NTHREADS": "256",
}

RANK = r"""
import os, sys, time, torch, torch.distributed as dist
rank, world, port, hold = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
res = {}
for tokens in (1, 4, 8, 32):
    x = torch.ones(tokens, 7168, dtype=torch.bfloat16, device="cuda")
    for _ in range(20):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(100):
        dist.all_reduce(x)
    end.record(); torch.cuda.synchronize()
    res[tokens * 7168 * 2] = start.elapsed_time(end) * 1000 / 100
print("ALLREDUCE_US", rank, res, flush=True)
open(os.environ["READY_FILE"] + f".{rank}", "w").write("ok")
time.sleep(hold)
dist.destroy_process_group()
"""

SERVER = r"""
import os, subprocess, sys, time
world, port, drop = int(sys.argv[1]), sys.argv[2], sys.argv[3]
procs = []
for r in range(world):
    env = dict(os.environ)
    if drop and r == 0:
        env.pop(drop, None)   # the fault a trial must catch: a variable that did not reach a rank
    procs.append(subprocess.Popen([sys.executable, "-c", os.environ["RANK_CODE"], str(r), str(world), port, "30"],
                                  env=env))
for p in procs:
    p.wait()
"""


def one_run(out: Path, name: str, world: int, port: int, drop: str = "") -> dict:
    log_path = out / f"{name}.log"
    ready = out / f"{name}.ready"
    env = {
        **os.environ,
        **REQUESTED,
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,ENV,TUNING",
        "NCCL_NVLS_ENABLE": "0",
        "RANK_CODE": RANK,
        "READY_FILE": str(ready),
    }
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(world), str(port), drop],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.time() + 240
    while time.time() < deadline and not all(Path(f"{ready}.{r}").exists() for r in range(world)):
        if server.poll() is not None:
            break
        time.sleep(0.5)
    observation = observe.observe_env(server.pid, REQUESTED, world)
    text = log_path.read_text(errors="replace")
    nccl = observe.parse_nccl_log(text)
    ok, reason = observe.check_env_applied(REQUESTED, observation, nccl)
    timings = [line for line in text.splitlines() if line.startswith("ALLREDUCE_US")]
    os.killpg(server.pid, 15)
    server.wait(timeout=60)
    return {
        "name": name,
        "dropped": drop or None,
        "world": world,
        "env_applied": ok,
        "reason": reason,
        "observation": observation.model_dump(mode="json"),
        "nccl": {r: i.model_dump(mode="json") for r, i in nccl.items()},
        "allreduce_us": timings,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    run = _result.start()
    args.out.mkdir(parents=True, exist_ok=True)
    fp = observe.fingerprint(nccl_log=None)
    (args.out / "fingerprint.json").write_text(json.dumps(fp, indent=2, default=str))
    import torch

    world = torch.cuda.device_count()
    runs = [one_run(args.out, "applied", world, 29517), one_run(args.out, "dropped", world, 29518, "NCCL_PROTO")]
    fp = observe.fingerprint(nccl_log=(args.out / "applied.log").read_text(errors="replace"))
    proof = {
        "gpus": world,
        "fingerprint_hash": observe.fingerprint_hash(fp),
        "nccl_version": fp.get("nccl"),
        "requested": REQUESTED,
        "runs": runs,
    }
    _result.write(args.out / "proof.json", proof, run, indent=2)
    for r in runs:
        print(
            f"{r['name']}: env_applied={r['env_applied']} reason={r['reason']!r} "
            f"nccl ranks={list(r['nccl'])} {r['allreduce_us']}"
        )
    print("fingerprint:", {k: fp.get(k) for k in ("gpu_count", "gpu_names", "driver", "cuda", "nccl", "torch")})


if __name__ == "__main__":
    main()
