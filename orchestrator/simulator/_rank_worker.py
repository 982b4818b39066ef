"""One simulated tensor-parallel rank (SGLang's scheduler process for one GPU), stdlib only.

Started by ranks.py as `python -I -S _rank_worker.py orchestrator.simulator::scheduler_TP<RANK> RANK WORLD PARENT_PID
NCCL_VERSION [TUNING...]` (the first argument names it in `ps`, like SGLang's process titles)
with the environment the server hands its ranks, so the environment NCCL would read can be seen in
/proc/<pid>/environ. When NCCL_DEBUG is INFO (or TRACE) it prints what NCCL prints at communicator
set-up, in NCCL's format, from ITS OWN environment: the version, one "... set by environment to ..."
line per NCCL_* variable present (integers end with a period, as NCCL's NCCL_PARAM does), and the
tuning decisions passed in TUNING ("<bytes> <ALGO> <PROTO> <channels>") when the TUNING subsystem
is on. Then it sleeps until its parent is gone or it is signalled.
"""

import os
import sys
import time

# NCCL_PARAM integers are echoed as "%lld." ; string variables as "%s".
_INT_PARAMS = {
    "NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS", "NCCL_BUFFSIZE", "NCCL_NTHREADS", "NCCL_P2P_DISABLE",
    "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE", "NCCL_GRAPH_REGISTER",
    "NCCL_LL_BUFFSIZE", "NCCL_LL128_BUFFSIZE", "NCCL_MAX_CTAS", "NCCL_MIN_CTAS", "NCCL_CHECKS_DISABLE",
}
_NOT_ECHOED = {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"}


def nccl_lines(rank, world, version, tuning, env):
    level = env.get("NCCL_DEBUG", "").upper()
    if level not in ("INFO", "TRACE"):
        return []
    subsys = {s.strip().upper() for s in env.get("NCCL_DEBUG_SUBSYS", "INIT,BOOTSTRAP,ENV").split(",")}
    everything = "ALL" in subsys
    pid = os.getpid()
    prefix = "%s:%d:%d [%d] NCCL INFO " % (os.uname().nodename, pid, pid, rank)
    lines = []
    if everything or "INIT" in subsys:
        lines.append(prefix + "NCCL version " + version)
    if everything or "ENV" in subsys:
        for name in sorted(env):
            if not name.startswith("NCCL_") or name in _NOT_ECHOED:
                continue
            value = env[name]
            if name in _INT_PARAMS and value.strip().lstrip("-").isdigit():
                lines.append("%s%s set by environment to %d." % (prefix, name, int(value)))
            else:
                lines.append("%s%s set by environment to %s" % (prefix, name, value))
    if everything or "INIT" in subsys:
        lines.append(prefix + "comm %#x rank %d nRanks %d nNodes 1 localRanks %d localRank %d MNNVL 0"
                     % (0x55d0c0de0000 + rank * 0x1000, rank, world, world, rank))
        lines.append(prefix + "ncclCommInitRank comm %#x rank %d nranks %d cudaDev %d - Init COMPLETE"
                     % (0x55d0c0de0000 + rank * 0x1000, rank, world, rank))
    if everything or "TUNING" in subsys:
        for item in tuning:
            nbytes, algo, proto, channels = item.split()
            lines.append("%sAllReduce: %s Bytes -> Algo %s proto %s channel{Lo..Hi}={0..%d}"
                         % (prefix, nbytes, algo, proto, int(channels) - 1))
    return lines


if __name__ == "__main__":
    rank, world, parent = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    out = nccl_lines(rank, world, sys.argv[5], sys.argv[6:], os.environ)
    if out:
        os.write(1, ("\n".join(out) + "\n").encode())
    while os.getppid() == parent:
        time.sleep(0.2)
