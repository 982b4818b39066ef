"""The SGLang scheduler's `Decode batch, ...` log lines as values (SGLang 0.5.23's format,
reference/sglang-0.5.23/INTERFACE.md): the fallback source of accept_length when the requests carried
no meta_info (metrics.compute). Pure: text in, lines out."""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field

__all__ = ["DecodeLogLine", "parse_decode_log"]

_DECODE_RE = re.compile(
    r"\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:[.,]\d{1,6})?)"
    r"(?P<prefix>(?: [A-Z]+-?\d+)*)\] "
    r"Decode batch(?: \[(?P<iter>\d+)\])?, (?P<fields>.*)$"
)
_PREFIX_RE = re.compile(r"([A-Z]+)-?(\d+)")


@dataclass(frozen=True)
class DecodeLogLine:
    """One `Decode batch, ...` line of the SGLang scheduler log."""

    timestamp: _dt.datetime
    """Server local time, as logged (seconds, or milliseconds with SGLANG_LOG_MS=1)."""
    ranks: dict[str, int]
    """Logger prefix, e.g. {"TP": 0} or {"DP": 1, "TP": 0}; empty for TP=1."""
    running_req: int
    gen_throughput: float
    """token/s over the last decode_log_interval iterations."""
    queue_req: int | None = None
    num_tokens: int | None = None
    token_usage: float | None = None
    accept_len: float | None = None
    accept_rate: float | None = None
    cuda_graph: bool | None = None
    iteration: int | None = None
    extra: dict[str, str] = field(default_factory=dict)
    """Fields this parser does not interpret (DSpark cap len, MFU, occupancy...)."""


def _num(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _count(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _parse_timestamp(ts: str) -> _dt.datetime:
    ts = ts.replace(",", ".")
    fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in ts else "%Y-%m-%d %H:%M:%S"
    return _dt.datetime.strptime(ts, fmt)


def _fields(text: str) -> dict[str, str]:
    """`key: value, key: value` -> {key: value}; parts without `: ` are left out."""
    values: dict[str, str] = {}
    for part in text.split(", "):
        key, sep, value = part.partition(": ")
        if sep:
            values[key.strip()] = value.strip()
    return values


def _line(m: re.Match[str]) -> DecodeLogLine | None:
    """The line a match of _DECODE_RE describes, or None without a running count and throughput."""
    values = _fields(m.group("fields"))
    running = _num(values.pop("#running-req", None))
    tps = _num(values.pop("gen throughput (token/s)", None))
    if running is None or tps is None:
        return None
    graph_key = next((k for k in values if k.endswith("graph")), None)
    graph = values.pop(graph_key) if graph_key else None
    return DecodeLogLine(
        timestamp=_parse_timestamp(m.group("ts")),
        ranks={k: int(v) for k, v in _PREFIX_RE.findall(m.group("prefix") or "")},
        running_req=int(running),
        gen_throughput=tps,
        queue_req=_count(values.pop("#queue-req", None)),
        num_tokens=_count(values.pop("#token", None)),
        token_usage=_num(values.pop("token usage", None)),
        accept_len=_num(values.pop("accept len", None)),
        accept_rate=_num(values.pop("accept rate", None)),
        cuda_graph={"True": True, "False": False}.get(graph) if graph is not None else None,
        iteration=int(m.group("iter")) if m.group("iter") else None,
        extra=values,
    )


def parse_decode_log(text: str) -> list[DecodeLogLine]:
    """Every `Decode batch` line in a server log, in order. Other lines are ignored."""
    found = (_line(m) for raw in text.splitlines() if (m := _DECODE_RE.search(raw)))
    return [line for line in found if line is not None]
