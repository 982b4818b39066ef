"""The simulated NCCL's tuner plugin: NCCL 2.28.9's loader and ext-tuner/example, stdlib only.

The one place that reads NCCL_TUNER_PLUGIN / NCCL_TUNER_CONFIG_FILE: the rank workers print its lines
(`_rank_worker.py` imports this file by path, as it runs with `python -I -S`), and `cli.params_from_args`
hands its rules to the model (`model.nccl_all_reduce`), so what the ranks log and what the server's timing
uses are the same decision. Nothing here imports the rest of the package.

    load(env)               the loader: its lines, and the library it opened (the example plugin) or None
    read_config(world, env) ext-tuner/example's pluginInit: its lines and its rules
    rules_for(env)          the rules NCCL runs with: None when no plugin loaded, () for a missing/empty file
    get_coll_info(...)      ext-tuner/example's pluginGetCollInfo for one all-reduce: the choice and its lines

The example plugin's semantics (plugin.c): the first rule matching collective, size, nNodes, nRanks,
numPipeOps and regBuff whose algorithm/protocol NCCL has not marked IGNORE wins; it sets that pair's cost to
0 and the channel count to the rule's (-1 keeps the plugin's default of 1; 0 leaves NCCL's own count, as
`nMaxChannels == 0` does in NCCL's enqueue.cc). A matching rule whose pair is IGNORE is logged and the next
rule is tried. No rule: NCCL's own algorithm/protocol, one channel. The simulated NCCL marks IGNORE every pair
NCCL_ALGO / NCCL_PROTO exclude and every algorithm it does not run (only ring and tree), so those variables
still mask the plugin.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import NamedTuple

DEFAULT_LIBRARY = "libnccl-tuner.so"
DEFAULT_CONFIG = "nccl_tuner.conf"
_INIT_TUNING: tuple[str, ...] = ("INIT", "TUNING")
# ext-tuner/example's names (plugin.c); a name it does not know parses as the first value here
COLLECTIVES = ("allreduce", "broadcast", "reduce", "allgather", "reducescatter")
ALGORITHMS = ("ring", "tree", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOCOLS = ("simple", "ll", "ll128")
SIMULATED_ALGORITHMS = ("ring", "tree")
"""The algorithms the simulated NCCL runs (model.ALGORITHMS); a rule naming another is IGNORE here."""
SIMULATED_PROTOCOLS = ("ll", "ll128", "simple")
PIPE_OPS, REG_BUFF = 1, 0  # what the simulated all-reduce call hands the plugin
_C_INT = re.compile(r"\s*([+-]?\d+)")


class Rule(NamedTuple):
    """One rule ext-tuner/example keeps (a line of its CSV file, parsed as plugin.c parses it)."""

    collective: str
    min_bytes: int
    max_bytes: int
    algorithm: str
    protocol: str
    channels: int
    n_nodes: int
    n_ranks: int
    num_pipe_ops: int = -1
    reg_buff: int = -1


class Choice(NamedTuple):
    """What NCCL runs one collective with: lower-case algorithm and protocol, and channels (0: NCCL's own
    count for that pair)."""

    algorithm: str
    protocol: str
    channels: int


def _atoi(text: str) -> int:
    m = _C_INT.match(text)
    return int(m.group(1)) if m else 0


def _strtoull(text: str) -> int:
    m = _C_INT.match(text)
    value = int(m.group(1)) if m else 0
    return min(value, 2**64 - 1) if value >= 0 else value % 2**64


def _dlopen(name: str, env: Mapping[str, str]) -> str | None:
    """The file dlopen would open for `name`, or None (a name without '/' is looked for on LD_LIBRARY_PATH
    only; dlopen also reads the loader's cache and system folders)."""
    if "/" in name:
        return name if os.path.isfile(name) else None
    for folder in env.get("LD_LIBRARY_PATH", "").split(":"):
        if folder and os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name)
    return None


def load(env: Mapping[str, str]) -> tuple[list[tuple[tuple[str, ...], str]], str | None]:
    """NCCL 2.28.9's tuner plugin loader: its lines as (subsystems, message), and the library it loaded (the
    example plugin) or None. A file whose name has no "tuner" in it stands for a library without an
    ncclTunerPlugin_v* symbol ("unsupported")."""
    said: list[tuple[tuple[str, ...], str]] = []
    requested = env.get("NCCL_TUNER_PLUGIN")
    if requested is not None:
        said.append((("ENV", "TUNING"), "NCCL_TUNER_PLUGIN set by environment to " + requested))
        if requested.lower() == "none":
            return said, None
    names = [requested or DEFAULT_LIBRARY]
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


def _rule(line: str) -> tuple[Rule, str] | None:
    """One CSV line as the example plugin parses it (strtok on ',': empty fields vanish; fewer than 8: skipped),
    with its "Loaded config" line (which shows the fields as written)."""
    fields = [t.strip(" \t") for t in line.split(",") if t][:10]
    if len(fields) < 8:
        return None
    coll, algo, proto = fields[0], fields[3], fields[4]
    rule = Rule(
        coll if coll in COLLECTIVES else "allreduce",
        _strtoull(fields[1]),
        _strtoull(fields[2]),
        algo if algo in ALGORITHMS else "ring",
        proto if proto in PROTOCOLS else "simple",
        _atoi(fields[5]),
        _atoi(fields[6]),
        _atoi(fields[7]),
        _atoi(fields[8]) if len(fields) > 8 else -1,
        _atoi(fields[9]) if len(fields) > 9 else -1,
    )
    loaded = (
        "TUNER/ExamplePlugin: Loaded config: %s [%d-%d] %s/%s channels=%d nodes=%d ranks=%d pipeOps=%s regBuff=%s"
        % (
            coll,
            rule.min_bytes,
            rule.max_bytes,
            algo,
            proto,
            rule.channels,
            rule.n_nodes,
            rule.n_ranks,
            "any" if rule.num_pipe_ops == -1 else rule.num_pipe_ops,
            "any" if rule.reg_buff == -1 else rule.reg_buff,
        )
    )
    return rule, loaded


def read_config(world: int, env: Mapping[str, str]) -> tuple[list[str], tuple[Rule, ...]]:
    """ext-tuner/example's pluginInit on one node of `world` ranks: its lines (TUNING) and the rules it keeps."""
    said = ["TUNER/ExamplePlugin: Initializing tuner for 1 nodes, %d ranks, 1 NVL domains" % world]
    config = env["NCCL_TUNER_CONFIG_FILE"] if "NCCL_TUNER_CONFIG_FILE" in env else DEFAULT_CONFIG
    try:
        with open(config, "rb") as f:
            text = f.read().decode("latin-1")
    except IsADirectoryError:
        text = ""  # fopen opens a folder; reading it gives no line
    except OSError:
        return said + ["TUNER/ExamplePlugin: Config file %s not found, using defaults" % config], ()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [line for line in lines if line and not line.startswith("#")]
    if not lines:
        return said + ["TUNER/ExamplePlugin: No valid configurations found in %s" % config], ()
    said.append("TUNER/ExamplePlugin: Allocated memory for %d configurations" % len(lines))
    parsed = [found for line in lines if (found := _rule(line)) is not None]
    rules = [rule for rule, _ in parsed]
    said += [loaded for _, loaded in parsed]
    said.append("TUNER/ExamplePlugin: Loaded %d tuning configurations from %s" % (len(rules), config))
    return said, tuple(rules)


def rules_for(env: Mapping[str, str]) -> tuple[Rule, ...] | None:
    """The rules NCCL runs with under `env`: None when no tuner plugin loads (NCCL's own tuning), else the
    example plugin's rules, () when its file is missing or holds none (then every call gets one channel)."""
    _, plugin = load(env)
    return None if plugin is None else read_config(1, env)[1]


def select(spec: str | None, known: tuple[str, ...]) -> tuple[str, ...] | None:
    """NCCL's list syntax: 'LL,Simple' allows those, '^LL128' allows all but those (names case-insensitive);
    None when unset."""
    if spec is None:
        return None
    exclude = spec.startswith("^")
    names = {n.strip().lower() for n in spec.lstrip("^").split(",") if n.strip()}
    return tuple(k for k in known if (k.lower() in names) != exclude)


def available(env: Mapping[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The algorithms and protocols NCCL_ALGO / NCCL_PROTO leave to the simulated NCCL (an empty or unset
    variable, or a selection of none, leaves them all)."""
    algo, proto = ((env.get(n) or "").strip() or None for n in ("NCCL_ALGO", "NCCL_PROTO"))
    return (
        select(algo, SIMULATED_ALGORITHMS) or SIMULATED_ALGORITHMS,
        select(proto, SIMULATED_PROTOCOLS) or SIMULATED_PROTOCOLS,
    )


def get_coll_info(
    rules: tuple[Rule, ...],
    nbytes: int,
    world: int,
    algorithms: tuple[str, ...],
    protocols: tuple[str, ...],
    own: tuple[str, str],
) -> tuple[Choice, list[str]]:
    """ext-tuner/example's pluginGetCollInfo for one all-reduce of `nbytes` on one node of `world` ranks, where
    NCCL allows `algorithms` x `protocols` and would itself pick the pair `own`: what NCCL then runs, and the
    plugin's lines (TUNING)."""
    said = []
    for rule in rules:
        matches = (
            rule.collective == "allreduce",
            rule.min_bytes <= nbytes <= rule.max_bytes,
            rule.n_nodes in (-1, 1),
            rule.n_ranks in (-1, world),
            rule.num_pipe_ops in (-1, PIPE_OPS),
            rule.reg_buff in (-1, REG_BUFF),
        )
        if not all(matches):
            said.append(
                "TUNER/ExamplePlugin: Config does not match - collType match=%d, size match=%d, nodes "
                "match=%d, ranks match=%d, pipeOps match=%d, regBuff match=%d" % matches
            )
            continue
        if rule.algorithm not in algorithms or rule.protocol not in protocols:
            said.append(
                "TUNER/ExamplePlugin: Algorithm/protocol combination [%s][%s] is marked as IGNORE"
                % (rule.algorithm, rule.protocol)
            )
            continue
        said.append(
            "TUNER/ExamplePlugin: Applied config for collType=allreduce, bytes=%d, pipeOps=%d, regBuff=%d: "
            "algo=%s, proto=%s, channels=%s (nodes=%d, ranks=%d)"
            % (
                nbytes,
                PIPE_OPS,
                REG_BUFF,
                rule.algorithm,
                rule.protocol,
                "default" if rule.channels == -1 else rule.channels,
                rule.n_nodes,
                rule.n_ranks,
            )
        )
        return Choice(rule.algorithm, rule.protocol, 0 if rule.channels == 0 else max(rule.channels, 1)), said
    said.append("TUNER/ExamplePlugin: No matching config found")
    return Choice(own[0], own[1], 1), said
