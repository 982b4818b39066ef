#!/usr/bin/env python3
"""Fail on any function above the complexity limit, measured the way readers feel it: radon's cyclomatic
complexity, which counts boolean operators, comprehensions and conditional expressions as branches (ruff's
mccabe does not: it scored functions 8-10 that radon scores 19-44). `make check` runs it on orchestrator/.

    scripts/check_complexity.py [--max 15] PATH...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from radon.complexity import cc_visit
from radon.visitors import Function

DEFAULT_MAX = 15


def too_complex(paths: list[Path], limit: int) -> list[str]:
    """`file:line name (complexity)` for every function or method above `limit` in the Python files under `paths`."""
    found = []
    for path in paths:
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            for block in cc_visit(file.read_text(encoding="utf-8")):
                if isinstance(block, Function) and block.complexity > limit:
                    name = f"{block.classname}.{block.name}" if block.classname else block.name
                    found.append(f"{file}:{block.lineno} {name} ({block.complexity})")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=DEFAULT_MAX, help=f"the highest complexity allowed ({DEFAULT_MAX})")
    parser.add_argument("paths", nargs="+", type=Path)
    args = parser.parse_args(argv)
    found = too_complex(args.paths, args.max)
    for line in found:
        print(f"{line}: above {args.max}; split it into named steps", file=sys.stderr)
    if found:
        print(f"{len(found)} function(s) above complexity {args.max} (radon cc)", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
