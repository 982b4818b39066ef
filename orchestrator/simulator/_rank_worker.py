"""One simulated tensor-parallel rank (SGLang's scheduler process for one GPU), stdlib only.

Started by ranks.py as `python -I -S _rank_worker.py orchestrator.simulator::scheduler_TP<RANK> RANK WORLD PARENT_PID
NCCL_VERSION [TUNING...]` (the first argument names it in `ps`, like SGLang's process titles)
with the environment the server hands its ranks, so the environment NCCL would read can be seen in
/proc/<pid>/environ. When NCCL_DEBUG is INFO (or TRACE) it prints what NCCL prints at communicator
set-up, in NCCL's format, from ITS OWN environment: the version, one "... set by environment to ..."
line per NCCL_* variable present (integers end with a period, as NCCL's NCCL_PARAM does), and the
tuning decisions passed in TUNING ("<bytes> <ALGO> <PROTO> <channels>") when the TUNING subsystem
is on. Then it sleeps until its parent is gone or it is signalled.

NCCL_TUNER_PLUGIN is handled as NCCL 2.28 does with ext-tuner/example: when the path is a file the
plugin "loads" (`TUNER/Plugin: Plugin name set by env to PATH`, `TUNER/Plugin: Using Example (v5)`,
the example plugin's own lines about NCCL_TUNER_CONFIG_FILE) and the all-reduce TUNING lines follow the
rule file, first match wins, one channel where a rule says -1 or none matches (as that plugin does);
otherwise NCCL says it could not find it and uses its internal tuner. The timing model does not follow
the rule file: only the log lines do.
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
# NCCL 2.28 does not echo these; the tuner plugin's two are read by the plugin loader and the plugin.
_NOT_ECHOED = {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "NCCL_TUNER_PLUGIN", "NCCL_TUNER_CONFIG_FILE"}


def tuner_rules(path):
    """The example plugin's CSV rules as (collective, lo, hi, ALGO, PROTO, channels, nNodes, nRanks); lines it
    would not take (fewer than 8 fields) are skipped, as it skips them."""
    rules = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = [x.strip() for x in line.strip().split(",")]
            if line.startswith("#") or len(fields) < 8:
                continue
            try:
                rules.append((fields[0], int(fields[1]), int(fields[2]), fields[3].upper(), fields[4].upper(),
                              int(fields[5]), int(fields[6]), int(fields[7])))
            except ValueError:
                continue
    return rules


def tuned(item, rules, world):
    """A TUNING item ("<bytes> <ALGO> <PROTO> <channels>") as the example plugin's rules change it."""
    nbytes, algo, proto, _ = item.split()
    for coll, lo, hi, r_algo, r_proto, channels, nodes, ranks in rules:
        if coll == "allreduce" and lo <= int(nbytes) <= hi and nodes in (-1, 1) and ranks in (-1, world):
            return "%s %s %s %d" % (nbytes, r_algo, r_proto, channels if channels > 0 else 1)
    return "%s %s %s 1" % (nbytes, algo, proto)


def tuner_lines(prefix, world, env, subsys):
    """NCCL's TUNER/Plugin lines (INIT|TUNING) and the example plugin's (TUNING), and the rules when it loads."""
    plugin = env.get("NCCL_TUNER_PLUGIN", "")
    if not plugin or plugin.lower() == "none":
        return [], None
    shown = "ALL" in subsys or "INIT" in subsys or "TUNING" in subsys
    if not os.path.isfile(plugin):
        names = plugin if "/" in plugin else "%s libnccl-tuner-%s.so" % (plugin, plugin)
        return ([prefix + "TUNER/Plugin: Could not find: %s. Using internal tuner plugin." % names] if shown else []), None
    lines = [prefix + "TUNER/Plugin: Plugin name set by env to " + plugin, prefix + "TUNER/Plugin: Using Example (v5)"]
    config = env.get("NCCL_TUNER_CONFIG_FILE") or "nccl_tuner.conf"
    rules = tuner_rules(config) if os.path.isfile(config) else []
    plugin_says = [prefix + "TUNER/ExamplePlugin: Initializing tuner for 1 nodes, %d ranks, 0 NVL domains" % world]
    if not os.path.isfile(config):
        plugin_says.append(prefix + "TUNER/ExamplePlugin: Config file %s not found, using defaults" % config)
    else:
        plugin_says.append(prefix + "TUNER/ExamplePlugin: Loaded %d tuning configurations from %s" % (len(rules), config))
    if "ALL" in subsys or "TUNING" in subsys:
        lines += plugin_says
    return (lines if shown else []), rules


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
    plugin_lines, rules = tuner_lines(prefix, world, env, subsys)
    lines += plugin_lines
    if rules is not None:
        tuning = [tuned(item, rules, world) for item in tuning]
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
