"""What NCCL says it did: a pure parser of its NCCL_DEBUG=INFO output (subsystems INIT, ENV, TUNING).

NCCL prefixes every line with `host:pid:tid [device] NCCL INFO `. The lines read here:

    NCCL version 2.28.9+cuda13.0                                        (INIT)
    NCCL_PROTO set by environment to LL                                 (ENV; integers end in '.')
    AllReduce: 14336 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}  (TUNING, one per call)

Older NCCL prints numbers for the algorithm and protocol (`Algo 1 proto 0`); they are named with
NCCL's enums. Lines of other formats are ignored, so a whole server log can be given.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from orchestrator.records import Frozen

# NCCL's ncclAlgo/ncclProto enums (src/include/device.h), for the numeric form of the TUNING line.
_ALGORITHMS = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")
_PROTOCOLS = ("LL", "LL128", "SIMPLE")

_PREFIX = re.compile(r"^(?:\S+:\d+:\d+ )?\[(?P<device>\d+)\] NCCL INFO (?P<message>.*)$")
_VERSION = re.compile(r"^NCCL version (?P<version>\S+)")
_SET = re.compile(r"^(?P<name>NCCL_[A-Z0-9_]+) set by environment to (?P<value>.*)$")
_CHOICE = re.compile(r"^(?P<op>[A-Za-z]+): (?P<bytes>\d+) Bytes -> Algo (?P<algo>\S+) proto (?P<proto>\S+)"
                     r"(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d+)\.\.(?P<hi>\d+)\})?")


class NcclChoice(Frozen):
    """The algorithm, protocol and channel count NCCL chose for one collective call."""

    algorithm: str
    """NCCL's name in upper case: RING, TREE, NVLS, ..."""
    protocol: str
    """LL, LL128 or SIMPLE."""
    channels: int | None
    """Channels used (Hi - Lo + 1); None when the line does not say."""


@dataclass(frozen=True)
class DeviceLog:
    """What one device (rank) printed."""

    version: str | None = None
    set_by_environment: Mapping[str, str] = field(default_factory=dict)
    """Variable -> the value NCCL took, as NCCL echoes it (the integer's trailing '.' removed)."""
    choices: Mapping[tuple[str, int], NcclChoice] = field(default_factory=dict)
    """(collective, bytes) -> the first choice logged for that call size."""


def _name(token: str, names: tuple[str, ...]) -> str:
    return names[int(token)] if token.isdigit() and int(token) < len(names) else token.upper()


def parse_nccl_log(text: str) -> dict[int, DeviceLog]:
    """Device -> what NCCL printed there, for every device that printed an NCCL INFO line."""
    version: dict[int, str] = {}
    env: dict[int, dict[str, str]] = {}
    choices: dict[int, dict[tuple[str, int], NcclChoice]] = {}
    for line in text.splitlines():
        m = _PREFIX.match(line.strip())
        if not m:
            continue
        device, message = int(m["device"]), m["message"].strip()
        env.setdefault(device, {})
        choices.setdefault(device, {})
        if v := _VERSION.match(message):
            version.setdefault(device, v["version"])
        elif s := _SET.match(message):
            value = s["value"].strip()
            if value.endswith(".") and value[:-1].lstrip("-").isdigit():
                value = value[:-1]  # NCCL_PARAM integers are printed as "%lld."
            env[device][s["name"]] = value
        elif c := _CHOICE.match(message):
            channels = int(c["hi"]) - int(c["lo"]) + 1 if c["lo"] is not None else None
            key = (c["op"], int(c["bytes"]))
            choices[device].setdefault(key, NcclChoice(algorithm=_name(c["algo"], _ALGORITHMS),
                                                       protocol=_name(c["proto"], _PROTOCOLS), channels=channels))
    return {d: DeviceLog(version.get(d), env[d], choices[d]) for d in sorted(env)}


def version_of(logs: Mapping[int, DeviceLog]) -> str | None:
    """The NCCL version the devices report (the first one found)."""
    return next((log.version for log in logs.values() if log.version), None)


def choice_for(logs: Mapping[int, DeviceLog], nbytes: int, collective: str = "AllReduce") -> NcclChoice | None:
    """NCCL's choice for a call of `nbytes`, from the lowest device that logged one."""
    for log in logs.values():
        if (collective, nbytes) in log.choices:
            return log.choices[(collective, nbytes)]
    return None


_NOT_ECHOED = frozenset({"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"})


def env_problems(requested: Mapping[str, str], logs: Mapping[int, DeviceLog], world: int) -> list[str]:
    """Where NCCL's own lines contradict the requested NCCL variables: a variable NCCL echoed on some
    devices but not all `world` of them, or with another value. One NCCL never mentions proves nothing."""
    problems = []
    for name, want in sorted(requested.items()):
        if not name.startswith("NCCL_") or name in _NOT_ECHOED:
            continue
        seen = {d: log.set_by_environment[name] for d, log in logs.items() if name in log.set_by_environment}
        if not seen:
            continue
        lacking = [d for d in range(world) if d not in seen]
        if lacking:
            problems.append(f"NCCL did not report {name} on device(s) {', '.join(map(str, lacking))}")
        problems += [f"NCCL on device {d} took {name}={v!r}, requested {want!r}" for d, v in seen.items() if v != want]
    return problems
