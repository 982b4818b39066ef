"""One result file per bench run, saying inside it what made it.

Every bench script takes `-o/--out FILE` (where its result JSON goes; nothing is written without it) and
writes through `write`, which puts a `meta` block first: the commit the tree was at (and whether it had
uncommitted changes), the date, the machine (cores, Python, OS: no host name), the load average at the
start and at the end, the exact command line and the seconds it took. tests/test_bench_results.py checks
that every committed result names its commit and command.

    run = _result.start()            # at the top of main(), after parsing the arguments
    ...
    _result.write(args.out, {"summary": ...}, run)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def add_output(ap: argparse.ArgumentParser, *aliases: str) -> None:
    """`-o/--out/--output FILE` (and any older spelling in `aliases`, e.g. "--json") as `args.out`."""
    ap.add_argument(
        "-o",
        "--out",
        "--output",
        *aliases,
        dest="out",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the result JSON here (with the commit, date, machine, load and command inside)",
    )


@dataclass
class Run:
    """What is known of a run at its start."""

    argv: list[str]
    started: float = field(default_factory=time.time)
    load_start: list[float] | None = field(default_factory=lambda: _load())


def start(argv: list[str] | None = None) -> Run:
    return Run(list(sys.argv if argv is None else argv))


def command(argv: list[str]) -> str:
    """The command line as typed from the repository root: `python bench/x.py --flag ...`."""
    script = Path(argv[0]).resolve() if argv else Path("?")
    try:
        shown = str(script.relative_to(REPO))
    except ValueError:
        shown = argv[0] if argv else "?"
    return shlex.join(["python", shown, *argv[1:]])


def machine() -> dict[str, Any]:
    """The machine without its name: what a figure's reader needs to compare it."""
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.machine()}",
    }


def git_commit(repo: Path = REPO) -> tuple[str | None, bool | None]:
    """(HEAD's hash, whether tracked files differ from it) or (None, None) outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    return head, bool(status.strip())


def meta(run: Run) -> dict[str, Any]:
    commit, dirty = git_commit()
    return {
        "commit": commit,
        "dirty": dirty,
        "date": datetime.fromtimestamp(run.started, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(),
        "load": {"start": run.load_start, "end": _load()},
        "command": command(run.argv),
        "seconds": round(time.time() - run.started, 1),
    }


def write(path: Path | None, result: dict[str, Any], run: Run, *, indent: int = 1) -> Path | None:
    """`result` with the run's `meta` first, as JSON at `path`; nothing (and a hint) without a path."""
    if path is None:
        print("(no result file: name one with -o FILE)", file=sys.stderr)
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"meta": meta(run), **{k: v for k, v in result.items() if k != "meta"}}
    path.write_text(json.dumps(body, indent=indent, default=str) + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)
    return path


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
