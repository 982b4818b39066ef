"""Bounded reading of the user's YAML: regular files only, a size cap, a loader that refuses alias
expansion beyond a small budget, nesting beyond a sane depth and duplicate keys.

An experiment is a few kilobytes written by a person; anything far beyond that (an alias bomb, 1000
levels of nesting, /dev/zero, a FIFO) is refused with one message in bounded time and memory. So is a
value no process could be given (`arg_problem`: a lone surrogate from a "\\udc80" escape, a value
past Linux's 128 KiB for one argument or variable), wherever in the document it stands.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from orchestrator.errors import SpecError

MAX_BYTES = 1 << 20
"""Largest file read (1 MiB): experiments and search spaces are a few kilobytes."""
MAX_DEPTH = 64
"""Deepest nesting of mappings and lists."""
MAX_NODES = 100_000
"""Most values the document may hold once its aliases are expanded (a billion-laughs bomb is refused)."""
MAX_ARG_BYTES = 128 * 1024
"""Linux's MAX_ARG_STRLEN: the most bytes of one argument or one NAME=value variable, its NUL included;
execve refuses a longer one (E2BIG), so every launch of a server given it would fail."""
_SURROGATE = re.compile("[\ud800-\udfff]")


def arg_problem(text: str) -> str | None:
    """Why `text` cannot be one argument or one NAME=value variable of a process, or None: a NUL byte
    (C strings end there), a lone surrogate (half of a UTF-16 pair, no character: it has no UTF-8 form),
    or more than MAX_ARG_BYTES - 1 bytes."""
    if "\0" in text:
        return (
            f"holds a NUL byte (at position {text.index(chr(0))}), which no argument or environment variable can carry"
        )
    return _unencodable(text)


def _unencodable(text: str) -> str | None:
    """arg_problem without the NUL byte, which the fields that reach a process refuse as a control character."""
    if m := _SURROGATE.search(text):
        return (
            f"holds a lone surrogate {m.group()!r} at position {m.start()} (half of a UTF-16 pair, not a character: "
            "it has no UTF-8 form); write the character itself"
        )
    size = len(text.encode("utf-8"))
    if size >= MAX_ARG_BYTES:
        return (
            f"is {size} bytes, more than the {MAX_ARG_BYTES - 1} that Linux passes in one argument or variable "
            "(MAX_ARG_STRLEN, 128 KiB), so no process could be started with it"
        )
    return None


def bounded(message: str, token: int = 200) -> str:
    """`message` with every run of more than `token` non-blank characters cut (a 5000-character value
    quoted back, a key of a megabyte), so what reaches the terminal stays readable."""
    return re.sub(
        r"\S{%d,}" % (token + 1), lambda m: f"{m.group()[: token // 2]}...({len(m.group())} characters)", message
    )


def shorten(text: str, limit: int = 80) -> str:
    """`text` cut to `limit` characters with an ellipsis, so a message never embeds a huge value."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_text(path: Path, what: str, *, named_in: str | None = None) -> str:
    """The UTF-8 text of a regular file of at most MAX_BYTES; SpecError for anything else."""
    try:
        info = path.stat()
    except FileNotFoundError:
        fix = (
            f"check `search_space` in {named_in} (relative paths start at the experiment's folder)"
            if named_in
            else "check the path"
        )
        raise SpecError(f"{path}: {what} file not found; {fix}") from None
    except (OSError, ValueError) as exc:  # ENOTDIR (a path under a file), ELOOP, ENAMETOOLONG, NUL in the path
        raise SpecError(
            f"{path}: cannot read the {what} file: {getattr(exc, 'strerror', None) or exc}; check the path"
        ) from None
    if stat.S_ISDIR(info.st_mode):
        raise SpecError(f"{path}: is a directory, not a {what} file; name the YAML file")
    if not stat.S_ISREG(info.st_mode):
        raise SpecError(f"{path}: is a device, FIFO or socket, not a YAML file; name the {what} file")
    if info.st_size > MAX_BYTES:
        raise SpecError(
            f"{path}: the {what} file is {info.st_size} bytes, more than the {MAX_BYTES} a "
            f"{what} may have; name the right file"
        )
    try:
        # O_NONBLOCK: should the file be swapped for a FIFO after the check, open() must not wait for a writer.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise SpecError(f"{path}: is a device, FIFO or socket, not a YAML file; name the {what} file")
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the {what} file: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise SpecError(
            f"{path}: the {what} file is larger than the {MAX_BYTES} bytes a {what} may have; name the right file"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: the {what} file is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None


class _Refused(yaml.YAMLError):
    """A document this loader will not build, with the place and the rule."""

    def __init__(self, problem: str, mark: Any) -> None:
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark


class BoundedLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses deep nesting while composing, and after composing refuses duplicate
    keys, recursive anchors and documents whose aliases expand past MAX_NODES values."""

    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nested more than {MAX_DEPTH} levels deep; flatten it", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_node(self) -> Node | None:
        node = super().get_single_node()
        if node is not None:
            _check(node)
        return node


_SEXAGESIMAL = {
    # PyYAML's YAML 1.1 patterns without the base-60 forms, which read `wall_time: 1:30` as the integer 90
    # (YAML 1.2 dropped them): such a value stays text, and the field that gets it says what it takes.
    "tag:yaml.org,2002:int": re.compile(
        r"""^(?:[-+]?0b[0-1_]+
                    |[-+]?0[0-7_]+
                    |[-+]?(?:0|[1-9][0-9_]*)
                    |[-+]?0x[0-9a-fA-F_]+)$""",
        re.X,
    ),
    "tag:yaml.org,2002:float": re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
                    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
}
BoundedLoader.yaml_implicit_resolvers = {
    first: [(tag, _SEXAGESIMAL.get(tag, pattern)) for tag, pattern in resolvers]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _check(root: Node) -> None:
    """Duplicate keys, recursive anchors and the expanded size, in one walk over the node graph
    (aliases are shared nodes, so each node is sized once)."""
    sizes: dict[int, int] = {}
    busy: set[int] = set()

    def size(node: Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if isinstance(node, ScalarNode) and (why := _unencodable(node.value)):
            raise _Refused(f"the value {shorten(repr(node.value), 40)} {why}", node.start_mark)
        if key in busy:
            raise _Refused("an anchor refers to itself (a recursive alias); write the values out", node.start_mark)
        busy.add(key)
        total = 1
        if isinstance(node, MappingNode):
            seen: set[tuple[str, str]] = set()
            for k, v in node.value:
                if isinstance(k, ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
                    if (k.tag, k.value) in seen:
                        raise _Refused(
                            f"duplicate key {shorten(repr(k.value), 40)} (the later one would "
                            f"silently win); keep one of them",
                            k.start_mark,
                        )
                    seen.add((k.tag, k.value))
                total += size(k) + size(v)
                if total > MAX_NODES:
                    break
        elif isinstance(node, SequenceNode):
            for item in node.value:
                total += size(item)
                if total > MAX_NODES:
                    break
        busy.discard(key)
        if total > MAX_NODES:
            raise _Refused(
                f"expands to more than {MAX_NODES} values through its aliases (&anchor/*alias); write the values out",
                node.start_mark,
            )
        sizes[key] = total
        return total

    size(root)


def parse(text: str, where: str) -> Any:
    """The data of one YAML document, bounded; SpecError naming the line on any problem."""
    try:
        return yaml.load(text, Loader=BoundedLoader)  # noqa: S506 - BoundedLoader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if isinstance(exc, _Refused):  # the problem names its own fix
            raise SpecError(f"{where}{at}: {problem}") from None
        line = f"line {mark.line + 1}" if mark else "the file"
        raise SpecError(
            f"{where}{at}: not valid YAML: {shorten(str(problem), 200)}; fix the syntax at {line}"
        ) from None
    except RecursionError:  # a guard behind MAX_DEPTH, should a construction path recurse further
        raise SpecError(f"{where}: nested too deeply; flatten it") from None
