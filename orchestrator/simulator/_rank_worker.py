"""One simulated tensor-parallel rank (SGLang's scheduler process for one GPU), stdlib only.

Started by ranks.py as `python -I -S _rank_worker.py orchestrator.simulator::scheduler_TP<RANK> RANK WORLD PARENT_PID
NCCL_VERSION [TUNING...]` (the first argument names it in `ps`, like SGLang's process titles)
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
found / No valid configurations found), and each all-reduce TUNING line follows the rules, first match wins
(Applied config / Config does not match / No matching config found before it), one channel where a rule says
-1 or none matches. The simulated call has numPipeOps 1 and regBuff 0, and every rule's algorithm/protocol
counts as available (NCCL marks some IGNORE; the plugin then tries the next rule). The timing model does not
follow the rule file: only the log lines do.
"""

import os
import re
import sys
import time

# NCCL_PARAM integers are echoed as "%lld." ; string variables as "%s".
_INT_PARAMS = {
    "NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS", "NCCL_BUFFSIZE", "NCCL_NTHREADS", "NCCL_P2P_DISABLE",
    "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE", "NCCL_GRAPH_REGISTER",
    "NCCL_LL_BUFFSIZE", "NCCL_LL128_BUFFSIZE", "NCCL_MAX_CTAS", "NCCL_MIN_CTAS", "NCCL_CHECKS_DISABLE",
}
# Not echoed with the others: NCCL_TUNER_PLUGIN is echoed by the tuner loader (tuner_load), the config file
# only the plugin reads.
_NOT_ECHOED = {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "NCCL_TUNER_PLUGIN", "NCCL_TUNER_CONFIG_FILE"}

_TUNER_DEFAULT = "libnccl-tuner.so"
_INIT_TUNING = ("INIT", "TUNING")
# ext-tuner/example's names (plugin.c); a name it does not know parses as the first value here
_COLLECTIVES = ("allreduce", "broadcast", "reduce", "allgather", "reducescatter")
_ALGORITHMS = ("ring", "tree", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
_PROTOCOLS = ("simple", "ll", "ll128")
_PIPE_OPS, _REG_BUFF = 1, 0  # what the simulated all-reduce call hands the plugin
_C_INT = re.compile(r"\s*([+-]?\d+)")


def _atoi(text):
    m = _C_INT.match(text)
    return int(m.group(1)) if m else 0


def _strtoull(text):
    m = _C_INT.match(text)
    value = int(m.group(1)) if m else 0
    return min(value, 2 ** 64 - 1) if value >= 0 else value % 2 ** 64


def _dlopen(name, env):
    """The file dlopen would open for `name`, or None (see the module docstring)."""
    if "/" in name:
        return name if os.path.isfile(name) else None
    for folder in env.get("LD_LIBRARY_PATH", "").split(":"):
        if folder and os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name)
    return None


def tuner_load(env):
    """NCCL 2.28.9's tuner plugin loader: its lines as (subsystems, message), and the library it loaded (the
    example plugin) or None."""
    said = []
    requested = env.get("NCCL_TUNER_PLUGIN")
    if requested is not None:
        said.append((("ENV", "TUNING"), "NCCL_TUNER_PLUGIN set by environment to " + requested))
        if requested.lower() == "none":
            return said, None
    names = [requested or _TUNER_DEFAULT]
    if requested and "/" not in requested and not (requested.startswith("lib") and requested.endswith(".so")):
        names.append("libnccl-tuner-%s.so" % requested)
    path = next((p for p in (_dlopen(n, env) for n in names) if p), None)
    if path is None:
        said.append((_INIT_TUNING, "TUNER/Plugin: Could not find: " + " ".join(names)))
        return said, None
    if "tuner" not in os.path.basename(path):
        said.append((_INIT_TUNING, "External tuner plugin %s is unsupported" % path))
        return said, None
    said.append((_INIT_TUNING, "TUNER/Plugin: Using Example (v5)"))
    said.append((_INIT_TUNING, "Successfully loaded external tuner plugin " + path))
    return said, path


def example_init(world, env):
    """ext-tuner/example's pluginInit for one node of `world` ranks: its lines (TUNING) and the rules it keeps,
    each (collective, min_bytes, max_bytes, algorithm, protocol, channels, nNodes, nRanks, numPipeOps, regBuff)."""
    said = ["TUNER/ExamplePlugin: Initializing tuner for 1 nodes, %d ranks, 1 NVL domains" % world]
    config = env["NCCL_TUNER_CONFIG_FILE"] if "NCCL_TUNER_CONFIG_FILE" in env else "nccl_tuner.conf"
    try:
        with open(config, "rb") as f:
            text = f.read().decode("latin-1")
    except IsADirectoryError:
        text = ""  # fopen opens a folder; reading it gives no line
    except OSError:
        return said + ["TUNER/ExamplePlugin: Config file %s not found, using defaults" % config], []
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [line for line in lines if line and not line.startswith("#")]
    if not lines:
        return said + ["TUNER/ExamplePlugin: No valid configurations found in %s" % config], []
    said.append("TUNER/ExamplePlugin: Allocated memory for %d configurations" % len(lines))
    rules = []
    for line in lines:
        fields = [t.strip(" \t") for t in line.split(",") if t][:10]  # strtok: empty fields vanish
        if len(fields) < 8:
            continue
        coll, algo, proto = fields[0], fields[3], fields[4]
        rule = (coll if coll in _COLLECTIVES else "allreduce", _strtoull(fields[1]), _strtoull(fields[2]),
                algo if algo in _ALGORITHMS else "ring", proto if proto in _PROTOCOLS else "simple",
                _atoi(fields[5]), _atoi(fields[6]), _atoi(fields[7]),
                _atoi(fields[8]) if len(fields) > 8 else -1, _atoi(fields[9]) if len(fields) > 9 else -1)
        rules.append(rule)
        said.append("TUNER/ExamplePlugin: Loaded config: %s [%d-%d] %s/%s channels=%d nodes=%d ranks=%d "
                    "pipeOps=%s regBuff=%s" % (coll, rule[1], rule[2], algo, proto, rule[5], rule[6], rule[7],
                                               "any" if rule[8] == -1 else rule[8], "any" if rule[9] == -1 else rule[9]))
    said.append("TUNER/ExamplePlugin: Loaded %d tuning configurations from %s" % (len(rules), config))
    return said, rules


def tuned(item, rules, world):
    """A TUNING item ("<bytes> <ALGO> <PROTO> <channels>") as the example plugin's getCollInfo changes it for an
    all-reduce, and that call's lines (TUNING)."""
    nbytes, algo, proto, _ = item.split()
    size = int(nbytes)
    said = []
    for coll, lo, hi, r_algo, r_proto, channels, nodes, ranks, pipe_ops, reg_buff in rules:
        matches = (coll == "allreduce", lo <= size <= hi, nodes in (-1, 1), ranks in (-1, world),
                   pipe_ops in (-1, _PIPE_OPS), reg_buff in (-1, _REG_BUFF))
        if all(matches):
            said.append("TUNER/ExamplePlugin: Applied config for collType=allreduce, bytes=%d, pipeOps=%d, regBuff=%d: "
                        "algo=%s, proto=%s, channels=%s (nodes=%d, ranks=%d)"
                        % (size, _PIPE_OPS, _REG_BUFF, r_algo, r_proto, "default" if channels == -1 else channels,
                           nodes, ranks))
            return "%s %s %s %d" % (nbytes, r_algo.upper(), r_proto.upper(), channels if channels > 0 else 1), said
        said.append("TUNER/ExamplePlugin: Config does not match - collType match=%d, size match=%d, nodes match=%d, "
                    "ranks match=%d, pipeOps match=%d, regBuff match=%d" % matches)
    said.append("TUNER/ExamplePlugin: No matching config found")
    return "%s %s %s 1" % (nbytes, algo, proto), said


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
        for name in sorted(env):
            if not name.startswith("NCCL_") or name in _NOT_ECHOED:
                continue
            value = env[name]
            if name in _INT_PARAMS and value.strip().lstrip("-").isdigit():
                lines.append("%s%s set by environment to %d." % (prefix, name, int(value)))
            else:
                lines.append("%s%s set by environment to %s" % (prefix, name, value))
    comm = 0x55d0c0de0000 + rank * 0x1000
    if shown("INIT"):
        lines.append(prefix + "comm %#x rank %d nRanks %d nNodes 1 localRanks %d localRank %d MNNVL 0"
                     % (comm, rank, world, world, rank))
    said, plugin = tuner_load(env)
    lines += [prefix + message for names, message in said if shown(*names)]
    rules = None
    if plugin is not None:
        said, rules = example_init(world, env)
        lines += [prefix + message for message in said if shown("TUNING")]
    if shown("INIT"):
        lines.append(prefix + "ncclCommInitRank comm %#x rank %d nranks %d cudaDev %d - Init COMPLETE"
                     % (comm, rank, world, rank))
    if shown("TUNING"):
        for item in tuning:
            if rules is not None:
                item, said = tuned(item, rules, world)
                lines += [prefix + message for message in said]
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
