"""One single-rank torch.distributed NCCL process group, one all_reduce, then destroy (for run_on_device.sh).

Usage: python3 pg_once.py PORT. NCCL's own lines go to stderr (NCCL_DEBUG=INFO from the caller).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist


def main() -> None:
    port = sys.argv[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    x = torch.ones(1 << 20, dtype=torch.float32, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    print(f"ALLREDUCE_OK sum={x.sum().item():.0f} bytes={x.numel() * x.element_size()}", flush=True)
    with open("/proc/self/maps") as maps:
        libs = sorted({line.split()[-1] for line in maps if "libnccl" in line})
    print("LIBNCCL_MAPPED", libs, flush=True)
    dist.destroy_process_group()
    print("DESTROYED", flush=True)


if __name__ == "__main__":
    main()
