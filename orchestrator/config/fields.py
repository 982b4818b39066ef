"""Field types of the experiment with finite ranges: strict integers (`true` is not 1, 1e30 is not
an integer), finite floats, and text without control characters for everything that reaches an
argv, an environment or an env file.

Also the simulator's vocabulary (profile names, fault syntax), checked at the edge. The simulator
room imports nothing of ours and config may import only leaves, so the profile names are read from
the simulator's package data and the fault grammar is restated here; tests/config/test_hostile_input.py
holds both to the simulator's own parser.
"""

from __future__ import annotations

import math
import re
import unicodedata
from importlib import resources
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from orchestrator.config import knobs

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""C0 and C1 controls, and the bidirectional controls (U+202E right-to-left override and its kin), which make
a command line or a file read differently on screen from what runs."""


def _named(char: str) -> str:
    """`char` as the message shows it: repr for the C0 controls ('\\n'), else its code point and name."""
    if ord(char) < 0x20 or ord(char) == 0x7F:
        return repr(char)
    return f"U+{ord(char):04X} {unicodedata.name(char, 'a C1 control')}"


def no_control(value: str) -> str:
    """`value` unchanged, or ValueError naming the first control character (newline, NUL, ...)."""
    if m := _CONTROL.search(value):
        raise ValueError(
            f"must not contain control characters (it reaches a command line or an environment), "
            f"but got {_named(m.group())} at position {m.start()}; remove it"
        )
    return value


Text = Annotated[str, AfterValidator(no_control)]
"""One line of text that ends up in an argv, an environment or an env file."""


def Int(ge: int, le: int) -> Any:  # noqa: N802 - reads as a type in annotations
    """A strict integer in [ge, le]: YAML `true` and `1e30` are refused, not taken as 1 or truncated."""
    return Field(strict=True, ge=ge, le=le)


MAX_SECONDS = 30 * 86400.0
"""Longest timeout (30 days): larger values overflow the timers that wait on them."""

Seconds = Annotated[float, Field(strict=True, gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
"""A duration in seconds (strict: `true` is not one second; an integer is fine)."""
Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]


def Fraction(ge: float, le: float) -> Any:  # noqa: N802 - reads as a type in annotations
    """A strict, finite number in [ge, le] (`true` is not 1.0)."""
    return Field(strict=True, ge=ge, le=le, allow_inf_nan=False)


def finite_scalar(value: object) -> str | None:
    """Why a flag value cannot be passed to SGLang, or None (text without control characters, finite numbers)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, but got {value}"
    if isinstance(value, str) and (m := _CONTROL.search(value)):
        return (
            f"must not contain control characters (it becomes a command-line argument), but got "
            f"{_named(m.group())} at position {m.start()}; remove it"
        )
    return None


TRACKING_SCHEMES = ("http", "https", "file", "sqlite", "postgresql", "mysql", "mssql", "databricks")
"""URI schemes of the MLflow tracking stores this tool can talk to."""


def tracking_uri_problem(uri: str) -> str | None:
    """Why MLflow would refuse `uri` as a tracking store, or None (the scheme is checked, not reachability)."""
    scheme, sep, rest = uri.partition("://")
    scheme = scheme.split("+", 1)[0].lower()  # postgresql+psycopg2://
    if not sep and uri.startswith("file:"):
        return None
    if not sep or scheme not in TRACKING_SCHEMES or not rest:
        return (
            f"must be an MLflow tracking URI ({', '.join(s + '://...' for s in TRACKING_SCHEMES[:4])}, a "
            f"database URL), but got {uri!r}; e.g. http://127.0.0.1:5000, or leave it out for the work "
            f"directory's sqlite store"
        )
    return None


def _tracking_uri(value: str) -> str:
    if problem := tracking_uri_problem(value):
        raise ValueError(problem)
    return value


TrackingUri = Annotated[Text, AfterValidator(_tracking_uri)]


# ---------------------------------------------------------------- the simulator's vocabulary

# What orchestrator/simulator/faults.py parses: name -> the argument it takes (None: no argument).
FAULTS: dict[str, str | None] = {
    "never_ready": None,
    "env_drop": None,
    "nccl_hang": None,
    "draft_wiring_broken": None,
    "slow_start": "seconds",
    "crash_after_tokens": "count",
    "hang_after_tokens": "count",
    "oom_above_draft_tokens": "count",
    "nccl_hang_when": "VAR:VALUE[,VAR:VALUE...]",
}


def fault_problem(spec: str) -> str | None:
    """Why the simulator would refuse fault `spec` (its --sim-fault syntax), or None."""
    name, has_arg, arg = spec.strip().partition("=")
    name = name.strip()
    if name not in FAULTS:
        return f"must be a known fault ({', '.join(FAULTS)}), but got {spec!r}"
    takes = FAULTS[name]
    if takes is None:
        return f"fault {name} takes no value, but got {arg!r}" if has_arg else None
    if not has_arg:
        return f"fault {name} needs a value ({name}=<{takes}>), but got {spec!r}"
    if takes == "count":
        if not re.fullmatch(r"\s*\d{1,9}\s*", arg):
            return f"fault {name} needs a whole number >= 0, but got {arg!r}"
    elif takes == "seconds":
        try:
            seconds = float(arg)
        except ValueError:
            seconds = math.nan
        if not (math.isfinite(seconds) and 0 <= seconds <= MAX_SECONDS):
            return f"fault {name} needs seconds between 0 and {MAX_SECONDS:g}, but got {arg!r}"
    else:
        for item in arg.split(","):
            var, sep, _ = item.strip().partition(":")
            if not sep or not var.strip():
                return f"fault {name} expects {takes}, but got {arg!r}"
    return None


def simulator_profiles() -> dict[str, str]:
    """The simulator's built-in profiles, name -> kind (hardware or model), read from its package data."""
    folder = resources.files("orchestrator").joinpath("simulator").joinpath("profiles")
    out: dict[str, str] = {}
    for entry in folder.iterdir():
        if entry.name.endswith(".yaml"):
            m = re.search(r"^kind:\s*(\w+)", entry.read_text(encoding="utf-8"), re.MULTILINE)
            out[entry.name[:-5]] = m.group(1) if m else "unknown"
    return out


def profile_problem(value: str, kind: str) -> str | None:
    """Why the simulator would not find `value` as a `kind` profile (a built-in name or a .yaml/.json
    path), or None."""
    if value.endswith((".yaml", ".yml", ".json")) or "/" in value:
        return None  # a profile file, e.g. one a probe wrote on a real host; the simulator reads it
    known = simulator_profiles()
    names = sorted(n for n, k in known.items() if k == kind)
    if known.get(value) == kind:
        return None
    if value in known:
        return f"{value!r} is a {known[value]} profile, not a {kind} profile (the {kind} profiles: {', '.join(names)})"
    return f"no built-in {kind} profile {value!r} (built-in: {', '.join(names)}); or give a path to a .yaml/.json file"


def _fault(value: str) -> str:
    if problem := fault_problem(value):
        raise ValueError(f"{problem}; see orchestrator/simulator/faults.py for the syntax")
    return value


def _profile(kind: str) -> AfterValidator:
    def check(value: str) -> str:
        if problem := profile_problem(value, kind):
            raise ValueError(problem)
        return value

    return AfterValidator(check)


Fault = Annotated[Text, AfterValidator(_fault)]
"""A simulator fault in its --sim-fault syntax."""
HardwareProfile = Annotated[Text, _profile("hardware")]
ModelProfile = Annotated[Text, _profile("model")]


def _allowed_env_name(name: str) -> str:
    if why := knobs.env_rule(name):
        raise ValueError(why)
    return name


EnvName = Annotated[str, AfterValidator(_allowed_env_name)]
"""An environment variable an experiment may set (knobs.env_rule: the allow-list, no secrets)."""
