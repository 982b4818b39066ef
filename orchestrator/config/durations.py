"""Durations as an experiment writes them: '8h', '30m', '90s', '1.5d' or a number of seconds.

YAML 1.1 readers take `1:30` as base 60 (90); the loader reads it as text and this module refuses it,
naming the unit to write.
"""

from __future__ import annotations

import math
import re

from orchestrator.config import yamlfile

_MAX_DURATION = 365 * 86400.0
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_duration(value: str | float | int) -> float:
    """'8h', '30m', '90s', '1.5d' or a number of seconds -> seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not value > 0 or not math.isfinite(value) or value > _MAX_DURATION:
            raise ValueError(
                f"a duration must be > 0 and at most 365d (in seconds: {_MAX_DURATION:g}), but got {value}"
            )
        return float(value)
    m = _DURATION.match(str(value)[:64])
    if not m and re.fullmatch(r"\s*\d+(?::\d+)+\s*", str(value)[:64]):
        raise ValueError(
            f"a duration looks like 8h, 30m, 90s or a number of seconds, but got {str(value)!r}, "
            f"which YAML 1.1 readers take as base-60 ({str(value).strip()} = "
            f"{_base60(str(value))} s); write the unit, e.g. 1.5h or 90m for an hour and a half"
        )
    if not m:
        raise ValueError(
            f"a duration looks like 8h, 30m, 90s or a number of seconds, but got {yamlfile.shorten(repr(value))}"
        )
    seconds = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    if not seconds > 0 or not math.isfinite(seconds) or seconds > _MAX_DURATION:
        raise ValueError(f"a duration must be > 0 and at most 365d, but got {value!r}")
    return seconds


def _base60(text: str) -> int:
    total = 0
    for part in text.strip().split(":"):
        total = total * 60 + int(part)
    return total
