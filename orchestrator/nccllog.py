"""What NCCL says it did: one pure parser of its NCCL_DEBUG=INFO lines, for a trial's ranks (trial.observe)
and for the probe's (probe.gpu).

NCCL prefixes every line with `host:pid:tid [device] NCCL INFO ` (torchrun may put `[default0]:` in front;
the `host:pid:tid ` part may be missing). The messages read here, as NCCL 2.28 prints them:

    NCCL version 2.28.9+cuda13.0                                          INIT
    NCCL_PROTO set by environment to LL                                   ENV; NCCL_PARAM integers end in '.':
    NCCL_MAX_NCHANNELS set by environment to 4.                             "4." is read as "4"
    AllReduce: 14336 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}    TUNING, one per call; older NCCL
                                                                            prints `Algo 1 proto 0` (enums)
    NCCL_TUNER_PLUGIN set by environment to /opt/libnccl-tuner-x.so       ENV|TUNING: echoed before the library
                                                                            is opened, whatever comes of it
    TUNER/Plugin: Using sglang-sweep-probe (v5)                           INIT|TUNING: the plugin is the tuner
    Successfully loaded external tuner plugin /opt/libnccl-tuner-x.so     INIT|TUNING: ... from this library
    TUNER/Plugin: Could not find: /nonexistent/libx.so                    INIT|TUNING: the library did not open
    External tuner plugin /opt/libfoo.so is unsupported                   INIT|TUNING: it opened, but exports no
                                                                            ncclTunerPlugin_v2..v5 struct
    TUNER/Plugin: Could not find: libnccl-tuner.so                        INIT|TUNING: NCCL_TUNER_PLUGIN unset and
                                                                            NCCL's default library absent: nothing
                                                                            asked for, nothing failed (not recorded)
    TUNER/ExamplePlugin: Loaded 8 tuning configurations from <file>       TUNING: ext-tuner/example read its rules

The tuner lines above are NCCL 2.28.9's, seen on the H200 host (docs/measurements/h200-tuner-plugin/, with
a minimal plugin, bench/nccl_tuner_min/); the ExamplePlugin line is ext-tuner/example's source, not seen there.
Older NCCL says `TUNER/Plugin: NCCL_TUNER_PLUGIN set to <name>` and `TUNER/Plugin: Plugin name set by env to
<lib>` (2.2x), `Could not find: <names>. Using internal tuner plugin.`, `TUNER/Plugin: Using tuner plugin
<name>` (2.19-2.2x), and `Failed to find ncclTunerPlugin_v2 symbol, using internal tuner instead.` when the
library opened but exports no tuner. All of them are read. NCCL does not echo NCCL_TUNER_CONFIG_FILE (the
plugin reads it), so the TUNER/Plugin lines are the proof that a rule file is in use. Lines of other formats
are ignored, so a whole server log can be given.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import Field

from orchestrator.records import Frozen

__all__ = [
    "NOT_ECHOED",
    "TUNER_MASKED",
    "DeviceLog",
    "NcclCall",
    "NcclChoice",
    "TunerLoad",
    "choice_for",
    "env_problems",
    "parse_nccl_log",
    "release",
    "tuner_masked",
    "tuner_problems",
    "version_mismatch",
    "version_of",
]

# NCCL's ncclAlgo/ncclProto enums (src/include/device.h), for the numeric form of the TUNING line.
_ALGORITHMS = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
_PROTOCOLS = ("LL", "LL128", "SIMPLE")

_LINE = re.compile(
    r"(?:(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) )?\[(?P<device>\d+)\] NCCL INFO "
    r"(?P<message>.*?)\s*$"
)
_VERSION = re.compile(r"^NCCL version (?P<version>\S+)")
_SET = re.compile(r"^(?P<name>NCCL_[A-Z0-9_]+) set by environment to (?P<value>.*)$")
_CHOICE = re.compile(
    r"^(?P<op>[A-Za-z]+): (?P<bytes>\d+) Bytes -> Algo (?P<algo>\S+) proto (?P<proto>\S+)"
    r"(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d+)\.\.(?P<hi>\d+)\})?"
)
_TUNER_PLUGIN_VAR = "NCCL_TUNER_PLUGIN"
_TUNER_DEFAULT = "libnccl-tuner.so"
"""The library NCCL looks for when NCCL_TUNER_PLUGIN is unset."""
_TUNER_REQUESTED = re.compile(r"^TUNER/Plugin: NCCL_TUNER_PLUGIN set to (?P<name>.+)$")
_TUNER_OPENED = re.compile(
    r"^(?:TUNER/Plugin: Plugin name set by env to|Successfully loaded external tuner plugin) "
    r"(?P<path>.+)$"
)
_TUNER_INTERNAL = re.compile(r"^TUNER/Plugin: (?:.*Using internal tuner plugin\.?|.*using internal tuner instead\.?)$")
_TUNER_NOT_FOUND = re.compile(r"^TUNER/Plugin: Could not find:\s*(?P<names>.*?)(?:\. Using internal tuner plugin\.?)?$")
_TUNER_USING = re.compile(r"^TUNER/Plugin: Using (?:tuner plugin (?P<old>.+)|(?P<name>.+?) \(v(?P<version>\d+)\))$")
_TUNER_UNSUPPORTED = re.compile(r"^External tuner plugin (?P<name>.+) is unsupported$")
_TUNER_RULES = re.compile(r"^TUNER/ExamplePlugin: Loaded (?P<n>\d+) tuning configurations from (?P<file>.+)$")

NOT_ECHOED = frozenset(
    {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "NCCL_TUNER_PLUGIN", "NCCL_TUNER_CONFIG_FILE"}
)
"""Variables not held to a `... set by environment to ...` line: NCCL does not echo them, so their absence
from its log proves nothing. NCCL 2.28.9 does echo NCCL_TUNER_PLUGIN (TunerLoad.requested), older NCCL does
not; the tuner plugin is proven by the TUNER/Plugin lines instead (tuner_problems)."""

TUNER_MASKED = ("NCCL_ALGO", "NCCL_PROTO")
"""Set beside NCCL_TUNER_PLUGIN, these mask the plugin: NCCL offers it only the algorithms/protocols they allow."""


def tuner_masked(env: Mapping[str, str]) -> str | None:
    """The one message for an environment that loads a tuner plugin and sets NCCL_ALGO / NCCL_PROTO too
    (names: from the experiment's server.env or its space), or None."""
    if not env.get("NCCL_TUNER_PLUGIN") or str(env["NCCL_TUNER_PLUGIN"]).lower() == "none":
        return None
    masking = [name for name in TUNER_MASKED if name in env]
    if not masking:
        return None
    shown = ", ".join(f"{n}={env[n]}" if env[n] != "" else n for n in masking)
    return (
        f"NCCL_TUNER_PLUGIN loads a tuner plugin, but {shown} {'is' if len(masking) == 1 else 'are'} set too: "
        f"NCCL_ALGO / NCCL_PROTO mask the plugin (NCCL offers it only what they allow), so its rule file does "
        f"not decide what runs; remove them from server.env and the space (sweep export --tuner-file leaves "
        f"them out)"
    )


class NcclChoice(Frozen):
    """The algorithm, protocol and channel count NCCL chose for one collective call."""

    algorithm: str
    """NCCL's name in upper case: RING, TREE, NVLS, ..."""
    protocol: str
    """LL, LL128 or SIMPLE."""
    channels: int | None
    """Channels used (Hi - Lo + 1); None when the line does not say."""


class NcclCall(Frozen):
    """The first TUNING line logged for one collective and message size."""

    collective: str
    """As NCCL names it: AllReduce, AllGather, ..."""
    nbytes: int
    choice: NcclChoice


class TunerLoad(Frozen):
    """What one device said about loading a tuner plugin (TUNER/Plugin lines). Empty when NCCL_TUNER_PLUGIN
    was not set and NCCL did not find its default libnccl-tuner.so either."""

    requested: str | None = None
    """NCCL_TUNER_PLUGIN as NCCL read it (2.28: `NCCL_TUNER_PLUGIN set by environment to ...`; 2.2x:
    `TUNER/Plugin: NCCL_TUNER_PLUGIN set to ...`), printed before the library is opened."""
    opened: str | None = None
    """The library NCCL loaded the tuner from (2.28: `Successfully loaded external tuner plugin ...`; 2.2x:
    `Plugin name set by env to ...`)."""
    plugin: str | None = None
    """The plugin NCCL uses as its tuner (`Using <name> (v<N>)`), with its interface version when given."""
    not_found: str | None = None
    """The names NCCL could not open (`Could not find: ...`)."""
    internal: str | None = None
    """The line saying NCCL fell back to its internal tuner, when one did."""
    rules: str | None = None
    """ext-tuner/example's `Loaded N tuning configurations from FILE`, as `N from FILE`."""


class DeviceLog(Frozen):
    """What NCCL printed for one device: its version, the variables it took from the environment, its
    choice per collective call, and what it said about a tuner plugin."""

    device: int
    """NCCL's CUDA device index (the `[n]` of its lines); the TP rank on a single host."""
    hosts: tuple[str, ...] = ()
    pids: tuple[int, ...] = ()
    version: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    """`NCCL_X set by environment to V` lines: name -> V (an integer's trailing '.' removed)."""
    collectives: dict[str, int] = Field(default_factory=dict)
    """'AllReduce RING/LL' -> number of calls logged with that choice."""
    max_bytes: dict[str, int] = Field(default_factory=dict)
    """Largest message logged per choice, same keys as collectives."""
    calls: tuple[NcclCall, ...] = ()
    """The first choice logged per (collective, size), in log order (later calls of a size may differ)."""
    tuner: TunerLoad = Field(default_factory=TunerLoad)


def _name(token: str, names: tuple[str, ...]) -> str:
    return names[int(token)] if token.isdigit() and int(token) < len(names) else token.upper()


def _tuner_line(tuner: dict[str, str], message: str) -> bool:
    """Record a TUNER/Plugin line in `tuner`; False when `message` is not one."""
    if m := _TUNER_REQUESTED.match(message):
        tuner.setdefault("requested", m["name"].strip())
    elif m := _TUNER_OPENED.match(message):
        tuner.setdefault("opened", m["path"].strip())
    elif _TUNER_INTERNAL.match(message):
        tuner.setdefault("internal", message)
        if n := _TUNER_NOT_FOUND.match(message):
            tuner.setdefault("not_found", n["names"].strip())
    elif m := _TUNER_NOT_FOUND.match(message):
        tuner.setdefault("not_found", m["names"].strip())
    elif m := _TUNER_USING.match(message):
        tuner.setdefault("plugin", m["old"] or f"{m['name']} (v{m['version']})")
    elif m := _TUNER_UNSUPPORTED.match(message):
        tuner.setdefault("internal", message)
    elif m := _TUNER_RULES.match(message):
        tuner.setdefault("rules", f"{m['n']} from {m['file'].strip()}")
    else:
        return False
    return True


def _tuner_load(tuner: dict[str, str]) -> TunerLoad:
    """The TunerLoad of one device's recorded lines. With NCCL_TUNER_PLUGIN unset, NCCL looks for its default
    libnccl-tuner.so and says `Could not find: libnccl-tuner.so` when it is absent (2.28.9; older NCCL adds
    `. Using internal tuner plugin.`): no plugin was asked for and none failed, so that is not recorded."""
    if "requested" not in tuner and tuner.get("not_found") == _TUNER_DEFAULT:
        tuner = {
            k: v for k, v in tuner.items() if k != "not_found" and not (k == "internal" and _TUNER_NOT_FOUND.match(v))
        }
    return TunerLoad(**tuner)


def parse_nccl_log(text: str) -> dict[int, DeviceLog]:
    """Device -> what NCCL printed there, for every device that printed an NCCL INFO line."""
    acc: dict[int, dict[str, Any]] = {}
    for raw in text.splitlines():
        m = _LINE.search(raw)
        if not m:
            continue
        device, message = int(m["device"]), m["message"]
        info = acc.setdefault(
            device,
            {
                "hosts": set(),
                "pids": set(),
                "version": None,
                "env": {},
                "collectives": {},
                "max_bytes": {},
                "calls": {},
                "tuner": {},
            },
        )
        if m["host"] is not None:
            info["hosts"].add(m["host"])
            info["pids"].add(int(m["pid"]))
        if v := _VERSION.match(message):
            info["version"] = info["version"] or v["version"]
        elif s := _SET.match(message):
            value = s["value"].strip()
            if value.endswith(".") and value[:-1].lstrip("-").isdigit():
                value = value[:-1]  # NCCL_PARAM integers are printed as "%lld."
            info["env"][s["name"]] = value
            if s["name"] == _TUNER_PLUGIN_VAR:  # NCCL 2.28 echoes it before opening the library
                info["tuner"].setdefault("requested", value)
        elif c := _CHOICE.match(message):
            choice = NcclChoice(
                algorithm=_name(c["algo"], _ALGORITHMS),
                protocol=_name(c["proto"], _PROTOCOLS),
                channels=int(c["hi"]) - int(c["lo"]) + 1 if c["lo"] is not None else None,
            )
            nbytes = int(c["bytes"])
            key = f"{c['op']} {choice.algorithm}/{choice.protocol}"
            info["collectives"][key] = info["collectives"].get(key, 0) + 1
            info["max_bytes"][key] = max(info["max_bytes"].get(key, 0), nbytes)
            info["calls"].setdefault((c["op"], nbytes), NcclCall(collective=c["op"], nbytes=nbytes, choice=choice))
        else:
            _tuner_line(info["tuner"], message)
    return {
        device: DeviceLog(
            device=device,
            hosts=tuple(sorted(i["hosts"])),
            pids=tuple(sorted(i["pids"])),
            version=i["version"],
            env=i["env"],
            collectives=i["collectives"],
            max_bytes=i["max_bytes"],
            calls=tuple(i["calls"].values()),
            tuner=_tuner_load(i["tuner"]),
        )
        for device, i in sorted(acc.items())
    }


def version_of(logs: Mapping[int, DeviceLog]) -> str | None:
    """The NCCL version the devices report (the first one found)."""
    return next((log.version for log in logs.values() if log.version), None)


def choice_for(logs: Mapping[int, DeviceLog], nbytes: int, collective: str = "AllReduce") -> NcclChoice | None:
    """NCCL's choice for a call of `nbytes`, from the lowest device that logged one."""
    for log in logs.values():
        for call in log.calls:
            if call.collective == collective and call.nbytes == nbytes:
                return call.choice
    return None


def _devices(items: Iterable[int]) -> str:
    return ", ".join(map(str, items))


def env_problems(requested: Mapping[str, str], logs: Mapping[int, DeviceLog], devices: Iterable[int]) -> list[str]:
    """Where NCCL's own lines contradict the requested NCCL variables: a variable NCCL echoed on some of
    `devices` but not all, or with another value. A variable NCCL never mentions proves nothing."""
    devices = sorted(devices)
    problems = []
    for name, want in requested.items():
        if not name.startswith("NCCL_") or name in NOT_ECHOED:
            continue
        seen = {d: log.env[name] for d, log in sorted(logs.items()) if name in log.env}
        if not seen:
            continue
        lacking = [d for d in devices if d not in seen]
        if lacking:
            problems.append(
                f"NCCL did not report {name} on device(s) {_devices(lacking)} (reported on {_devices(sorted(seen))})"
            )
        problems += [
            f"NCCL on device {d} took {name}={v!r}, requested {str(want)!r}" for d, v in seen.items() if v != str(want)
        ]
    return problems


def tuner_problems(plugin: str, logs: Mapping[int, DeviceLog], devices: Iterable[int]) -> list[str]:
    """Why the tuner plugin `plugin` (NCCL_TUNER_PLUGIN) is not proven on each of `devices`: every one must
    log `TUNER/Plugin: Using <name>` and no fallback to the internal tuner. One problem per device, naming
    it and NCCL's reason."""
    problems = []
    for device in sorted(devices):
        log = logs.get(device)
        tuner = log.tuner if log else TunerLoad()
        where = f"device {device}"
        if tuner.internal or tuner.not_found:
            why = f"NCCL could not open {tuner.not_found}" if tuner.not_found else f"NCCL said {tuner.internal!r}"
            used = f"used {tuner.plugin} instead" if tuner.plugin else "used its internal tuner"
            problems.append(f"NCCL_TUNER_PLUGIN={plugin} was not loaded on {where}: {why} and {used}")
        elif tuner.plugin is None:
            problems.append(
                f"NCCL_TUNER_PLUGIN={plugin}: {where} logged no 'TUNER/Plugin: Using <name>' line "
                f"(NCCL_DEBUG=INFO with INIT or TUNING in NCCL_DEBUG_SUBSYS prints it), so nothing "
                f"proves the plugin loaded there"
            )
    return problems


def release(version: str) -> str:
    """NCCL's release of a version string: `2.30.7+cuda13.0` (its INIT line) and `2.30.7` (the
    nvidia-nccl-cu13 wheel) are both 2.30.7."""
    return version.strip().split("+", 1)[0]


def version_mismatch(
    probe: str | None, servers: Mapping[str, str | None], *, probe_where: str = "the probe"
) -> list[str]:
    """Warnings where the NCCL the probe measured is not the one the server loads: `probe` is the probe's
    version (probe.json's nccl_version, or the NCCL wheel of the probe's interpreter), `servers` maps where
    a server's NCCL was read (`trial 3`, `server.python /opt/venv/bin/python`) to what it loaded (a
    fingerprint's `nccl`: one version, or several joined with ', ' when its ranks disagreed). Unknown
    versions prove nothing and give no warning."""
    problems: list[str] = []
    by_version: dict[str, list[str]] = {}
    for where, loaded in servers.items():
        versions = sorted({release(v) for v in (loaded or "").split(",") if v.strip()})
        if len(versions) > 1:
            problems.append(
                f"{where}: its ranks loaded different NCCL versions ({', '.join(versions)}); every rank "
                f"of a server must load one NCCL (one torch in the server's environment)"
            )
        for v in versions:
            by_version.setdefault(v, []).append(where)
    if probe is None or not probe.strip():
        return problems
    measured = release(probe)
    for version, places in sorted(by_version.items()):
        if version != measured:
            shown = ", ".join(places[:5]) + (f" and {len(places) - 5} more" if len(places) > 5 else "")
            problems.append(
                f"{probe_where} measured NCCL {measured} but {shown} loaded NCCL {version}: the probe's "
                f"ranking of NCCL settings may not hold for the server; install one torch (one NCCL) "
                f"for both (pyproject's probe and sglang extras pin torch 2.14.1, NCCL 2.30.7) and "
                f"probe again"
            )
    return problems
