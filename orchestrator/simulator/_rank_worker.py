"""One simulated tensor-parallel rank (SGLang's scheduler process for one GPU), stdlib only.

Started by ranks.py as `python -I -S _rank_worker.py orchestrator.simulator::scheduler_TP<RANK> RANK WORLD PARENT_PID
NCCL_VERSION [--ready-fd=FD] [TUNING...]` (the first argument names it in `ps`, like SGLang's process titles;
FD gets one byte once the lines are written, so the server goes on only after every rank's NCCL init)
with the environment the server hands its ranks, so the environment NCCL would read can be seen in
/proc/<pid>/environ. When NCCL_DEBUG is INFO (or TRACE) it prints what NCCL prints at communicator
set-up, in NCCL's format (`host:pid:tid [rank] NCCL INFO ...`), from ITS OWN environment: the version, one
"... set by environment to ..." line per NCCL_* variable present (integers end with a period, as NCCL's
NCCL_PARAM does), the tuner plugin's lines, and the tuning decisions passed in TUNING ("<bytes> <ALGO>
<PROTO> <channels>") when the TUNING subsystem is on. Then it sleeps until its parent is gone or it is
signalled (a PARENT_PID that is not its parent, 0 say, makes it print and exit).

The tuner plugin lines are NCCL 2.28.9's, as a real H200 printed them (docs/measurements/h200-tuner-plugin/),
between the `comm ... nRanks` line and `Init COMPLETE`:

    NCCL_TUNER_PLUGIN=<lib>, a file     NCCL_TUNER_PLUGIN set by environment to <lib>             (ENV|TUNING)
      whose name has "tuner" in it      TUNER/Plugin: Using Example (v5)                         (INIT|TUNING)
                                        Successfully loaded external tuner plugin <lib>           (INIT|TUNING)
                                        then ext-tuner/example's own lines (TUNING)
    NCCL_TUNER_PLUGIN=<lib>, no file    NCCL_TUNER_PLUGIN set by environment to <lib>
                                        TUNER/Plugin: Could not find: <lib>
    NCCL_TUNER_PLUGIN unset             TUNER/Plugin: Could not find: libnccl-tuner.so            (the default)
    NCCL_TUNER_PLUGIN=<lib>, a file     NCCL_TUNER_PLUGIN set by environment to <lib>
      whose name has no "tuner"         External tuner plugin <lib> is unsupported                (INIT|TUNING)
    NCCL_TUNER_PLUGIN=none (any case)   NCCL_TUNER_PLUGIN set by environment to none

The last-but-one row is the simulator's rule for "a library without an ncclTunerPlugin_v* symbol" (the real
run's was a no-symbol build); NCCL would dlopen the file, the simulator only looks at its name. A name
without '/' is looked for in LD_LIBRARY_PATH only (dlopen also reads the loader's cache and system folders),
and, unless it is `lib*.so`, as `libnccl-tuner-<name>.so` too (NCCL 2.28's plugin opener); "Could not find"
lists every name tried. A file that is a tuner is NCCL's ext-tuner/example (name "Example", interface v5):
it reads NCCL_TUNER_CONFIG_FILE (default nccl_tuner.conf) as that plugin's plugin.c does and logs what it
logs (Initializing / Allocated memory / Loaded config / Loaded N tuning configurations / Config file ... not
found / No valid configurations found), and each all-reduce TUNING line follows the rules (Applied config /
Config does not match / marked as IGNORE / No matching config found before it). All of that is
tuner_plugin.py, which the server's timing model uses too: the TUNING items the server passes are already
the model's tuned choices, and applying the rules again here gives the same ones.
"""

import os
import sys
import time

# -I leaves the script's folder off sys.path; the plugin module is stdlib-only and shared with the model.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tuner_plugin  # noqa: E402

# NCCL_PARAM integers are echoed as "%lld." ; string variables as "%s".
_INT_PARAMS = {
    "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_NCHANNELS",
    "NCCL_BUFFSIZE",
    "NCCL_NTHREADS",
    "NCCL_P2P_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_IB_DISABLE",
    "NCCL_CUMEM_ENABLE",
    "NCCL_NVLS_ENABLE",
    "NCCL_GRAPH_REGISTER",
    "NCCL_LL_BUFFSIZE",
    "NCCL_LL128_BUFFSIZE",
    "NCCL_MAX_CTAS",
    "NCCL_MIN_CTAS",
    "NCCL_CHECKS_DISABLE",
}
# Not echoed with the others: NCCL_TUNER_PLUGIN is echoed by the tuner loader (tuner_plugin.load), the config
# file only the plugin reads.
_NOT_ECHOED = {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "NCCL_TUNER_PLUGIN", "NCCL_TUNER_CONFIG_FILE"}


def tuned(item, rules, world, env):
    """A TUNING item ("<bytes> <ALGO> <PROTO> <channels>") as the example plugin changes it for an all-reduce
    (tuner_plugin.get_coll_info, under this rank's NCCL_ALGO / NCCL_PROTO), and that call's lines (TUNING)."""
    nbytes, algo, proto, channels = item.split()
    algorithms, protocols = tuner_plugin.available(env)
    choice, said = tuner_plugin.get_coll_info(
        rules, int(nbytes), world, algorithms, protocols, (algo.lower(), proto.lower())
    )
    return "%s %s %s %d" % (
        nbytes,
        choice.algorithm.upper(),
        choice.protocol.upper(),
        choice.channels or int(channels),
    ), said


def nccl_lines(rank, world, version, tuning, env):
    level = env.get("NCCL_DEBUG", "").upper()
    if level not in ("INFO", "TRACE"):
        return []
    subsys = {s.strip().upper() for s in env.get("NCCL_DEBUG_SUBSYS", "INIT,BOOTSTRAP,ENV").split(",")}

    def shown(*names):
        return "ALL" in subsys or any(n in subsys for n in names)

    pid = os.getpid()
    prefix = "%s:%d:%d [%d] NCCL INFO " % (os.uname().nodename, pid, pid, rank)
    lines = []
    if shown("INIT"):
        lines.append(prefix + "NCCL version " + version)
    if shown("ENV"):
        lines += env_lines(prefix, env)
    comm = 0x55D0C0DE0000 + rank * 0x1000
    if shown("INIT"):
        lines.append(
            prefix
            + "comm %#x rank %d nRanks %d nNodes 1 localRanks %d localRank %d MNNVL 0"
            % (comm, rank, world, world, rank)
        )
    said, plugin = tuner_plugin.load(env)
    lines += [prefix + message for names, message in said if shown(*names)]
    rules = None
    if plugin is not None:
        said, rules = tuner_plugin.read_config(world, env)
        lines += [prefix + message for message in said if shown("TUNING")]
    if shown("INIT"):
        lines.append(
            prefix
            + "ncclCommInitRank comm %#x rank %d nranks %d cudaDev %d - Init COMPLETE" % (comm, rank, world, rank)
        )
    if shown("TUNING"):
        lines += tuning_lines(prefix, tuning, rules, world, env)
    return lines


def env_lines(prefix, env):
    """NCCL's "<NAME> set by environment to <value>" for each NCCL_* variable it echoes (integers with a dot)."""
    lines = []
    for name in sorted(env):
        if not name.startswith("NCCL_") or name in _NOT_ECHOED:
            continue
        value = env[name]
        if name in _INT_PARAMS and value.strip().lstrip("-").isdigit():
            lines.append("%s%s set by environment to %d." % (prefix, name, int(value)))
        else:
            lines.append("%s%s set by environment to %s" % (prefix, name, value))
    return lines


def tuning_lines(prefix, tuning, rules, world, env):
    """NCCL's TUNING line per all-reduce size, after a loaded tuner plugin's own lines when it chose."""
    lines = []
    for item in tuning:
        if rules is not None:
            item, said = tuned(item, rules, world, env)
            lines += [prefix + message for message in said]
        nbytes, algo, proto, channels = item.split()
        lines.append(
            "%sAllReduce: %s Bytes -> Algo %s proto %s channel{Lo..Hi}={0..%d}"
            % (prefix, nbytes, algo, proto, int(channels) - 1)
        )
    return lines


if __name__ == "__main__":
    rank, world, parent = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    items = sys.argv[6:]
    told = int(items.pop(0).split("=", 1)[1]) if items and items[0].startswith("--ready-fd=") else None
    out = nccl_lines(rank, world, sys.argv[5], items, os.environ)
    if out:
        os.write(1, ("\n".join(out) + "\n").encode())
    if told is not None:  # the server waits for every rank's lines before it goes on (ranks.start)
        os.write(told, b".")
        os.close(told)
    while os.getppid() == parent:
        time.sleep(0.2)
