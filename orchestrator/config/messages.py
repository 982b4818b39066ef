"""Pydantic's validation errors in the user's words: one line per wrong field, with the rule, the value
received (cut when long) and the fix (did-you-mean for unknown keys)."""

from __future__ import annotations

import difflib
import re
import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from orchestrator.config import yamlfile

# Type tags pydantic appends to the location of an error inside a union (`flags.x.str`, `.int`, ...).
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|list\[.*\]|tuple\[.*\]|dict\[.*\]|[a-z-]+\[.*\])$")

_TYPE_WORDS = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping (key: value)",
    "model_type": "a mapping (key: value)",
    "model_attributes_type": "a mapping (key: value)",
}


def did_you_mean(word: str, options: list[str], what: str = "known keys") -> str:
    """`did you mean 'X'?` for the closest option, else the list of options."""
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if not close:  # case slips: nccl_proto -> NCCL_PROTO
        close = [o for o in options if o.lower() == word.lower()][:1]
    return f"did you mean {close[0]!r}?" if close else f"{what}: {', '.join(sorted(options))}"


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)) and len(value) > 8:
        return f"a list of {len(value)} items"
    return yamlfile.shorten(repr(value))


def _members(ann: Any) -> list[Any]:
    """The alternatives of a union annotation (None left out); [ann] for anything else."""
    if get_origin(ann) in (Union, types.UnionType):
        return [a for a in get_args(ann) if a is not type(None)]
    return [ann]


def _is_model(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, BaseModel)


def _walk(model: type[BaseModel], loc: tuple) -> tuple[tuple, Any]:
    """pydantic's error location without its union tags (`flags.x.str`, `faults.0.FaultSpec.when`),
    and the annotation found there (a model class when the location is a section)."""
    ann: Any = model
    clean: list = []
    for part in loc:
        ann, kept = _step(ann, part)
        if kept:
            clean.append(part)
    members = _members(ann)
    return tuple(clean), next((m for m in members if _is_model(m)), members[0] if len(members) == 1 else None)


def _step(ann: Any, part: Any) -> tuple[Any, bool]:
    """One part of the location: the annotation below it, and whether the part is the user's (not a tag)."""
    members = _members(ann)
    if len(members) > 1 and isinstance(part, str):
        tagged = [m for m in members if getattr(m, "__name__", None) == part]
        if tagged or _UNION_TAG.match(part):
            return (tagged[0] if tagged else None), False
    if len(members) > 1:
        ann = next((m for m in members if _is_model(m) or get_origin(m)), members[0])
    else:
        ann = members[0]
    return _inside(ann, part), True


def _inside(ann: Any, part: Any) -> Any:
    """The annotation of `part` inside `ann`: a model's field, a mapping's value, a sequence's item."""
    if _is_model(ann):
        field = ann.model_fields.get(str(part))
        return field.annotation if field else None
    if get_origin(ann) is dict:
        return get_args(ann)[1]  # a key of a mapping (space params, objective constraints)
    if get_origin(ann) in (tuple, list):
        return get_args(ann)[0]
    return None


_BOUNDS = {
    "greater_than_equal": (">=", "ge"),
    "greater_than": (">", "gt"),
    "less_than_equal": ("<=", "le"),
    "less_than": ("<", "lt"),
}


def _message(e: ErrorDetails, model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """One error of pydantic's in our words: the rule, the value received, the fix."""
    kind, value = e["type"], e.get("input")
    if kind == "extra_forbidden":
        _, owner = _walk(model, tuple(e["loc"][:-1]))
        options = [o for o in (owner.model_fields if _is_model(owner) else ()) if o not in ("space", "source")]
        return f"unknown key; {did_you_mean(str(loc[-1]), options)}"
    if kind == "missing":
        parent = ".".join(map(str, loc[:-1]))
        return f"required field is missing; add `{loc[-1]}:`" + (f" under `{parent}:`" if parent else "")
    ruled = _rule_message(kind, value, e.get("ctx") or {})
    if ruled is not None:
        return ruled
    msg = str(e["msg"]).removeprefix("Value error, ")
    if "but got" in msg or isinstance(value, dict):
        return msg
    return f"{msg}, but got {_shown(value)}"


def _rule_message(kind: str, value: Any, ctx: dict[str, Any]) -> str | None:
    """The message of one of pydantic's own rules (type, bound, finite, literal, pattern, length); None for
    the others (a validator's own message)."""
    if kind in _TYPE_WORDS:
        return f"must be {_TYPE_WORDS[kind]}, but got {_shown(value)}"
    if kind in _BOUNDS:
        op, k = _BOUNDS[kind]
        return f"must be {op} {ctx.get(k)}, but got {_shown(value)}"
    if kind == "finite_number":
        return f"must be a finite number, but got {_shown(value)}"
    if kind == "literal_error":
        return _literal_message(value, ctx)
    if kind == "string_pattern_mismatch":
        return (
            f"must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit, "
            f"but got {_shown(value)}"
        )
    if kind in ("too_long", "too_short"):
        return _length_message(kind, value, ctx)
    return None


def _literal_message(value: Any, ctx: dict[str, Any]) -> str:
    options = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
    hint = difflib.get_close_matches(str(value), options, n=1, cutoff=0.6)
    return f"must be one of {', '.join(options)}, but got {_shown(value)}" + (
        f"; did you mean {hint[0]!r}?" if hint else ""
    )


def _length_message(kind: str, value: Any, ctx: dict[str, Any]) -> str:
    want = ctx.get("max_length") if kind == "too_long" else ctx.get("min_length")
    if kind == "too_long" and isinstance(want, int) and want > 8:  # a cap on a list, not a pair's size
        return f"must have at most {want} items, but got {ctx.get('actual_length')}; shorten it"
    return f"must have {want} items, but got {ctx.get('actual_length')}: {_shown(value)}"


Errors = dict[tuple[Any, ...], list[tuple[ErrorDetails, bool]]]


def format_errors(err: ValidationError, model: type[BaseModel], where: str) -> str:
    """One line per wrong field: `file: field.path: rule, but got value; fix`."""
    by_path = _without_union_noise(_by_path(err, model))
    lines = []
    for loc, errs in by_path.items():
        lines += _path_lines(where, loc, errs, model)
    return "\n".join(dict.fromkeys(lines))


def _by_path(err: ValidationError, model: type[BaseModel]) -> Errors:
    """pydantic's errors grouped by the user's path (union tags left out), each marked when it is a key's."""
    by_path: Errors = {}
    for e in err.errors():
        loc = tuple(e["loc"])
        is_key = bool(loc) and loc[-1] == "[key]"
        clean, _ = _walk(model, loc[:-1] if is_key else loc)
        by_path.setdefault(clean, []).append((e, is_key))
    return by_path


def _without_union_noise(by_path: Errors) -> Errors:
    """A union member that did not fit (`must be a string`) is noise when another member's fields were checked
    deeper down (the user wrote that member), or when one member's own rule fired (a fault string of the
    wrong syntax is not "not a mapping")."""
    for loc in list(by_path):
        deeper = any(len(other) > len(loc) and other[: len(loc)] == loc for other in by_path)
        if deeper or any(e["type"] not in _TYPE_WORDS for e, _ in by_path[loc]):
            by_path[loc] = [(e, k) for e, k in by_path[loc] if e["type"] not in _TYPE_WORDS]
    return by_path


def _path_lines(
    where: str, loc: tuple[Any, ...], errs: list[tuple[ErrorDetails, bool]], model: type[BaseModel]
) -> list[str]:
    path = ".".join(str(p) for p in loc) or "(top level)"
    if len(errs) > 1 and all(e["type"] in _TYPE_WORDS for e, _ in errs):
        kinds = list(dict.fromkeys(_TYPE_WORDS[e["type"]] for e, _ in errs))
        return [f"{where}: {path}: must be {' or '.join(kinds)}, but got {_shown(errs[0][0].get('input'))}"]
    lines = []
    for e, is_key in errs:
        if is_key and e["type"] == "literal_error":
            options = re.findall(r"'([^']*)'", str((e.get("ctx") or {}).get("expected", "")))
            lines.append(f"{where}: {path}: unknown key; {did_you_mean(str(loc[-1]), options)}")
        elif is_key:
            lines.append(f"{where}: {path}: {str(e['msg']).removeprefix('Value error, ')}")
        else:
            lines.append(f"{where}: {path}: {_message(e, model, loc)}")
    return lines
