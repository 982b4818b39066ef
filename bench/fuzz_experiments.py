"""Mutated experiment files through the real `sweep validate` and `sweep plan`, each under a time and
memory limit (issue 11's measurement): counts of clean errors, hangs, tracebacks and files accepted
though wrong. `python bench/fuzz_experiments.py [--sweep PATH] [--sample N] [-o OUT]`.

--sweep may name another checkout's console script (or `python -m orchestrator.cli` of it, via
--python and --root) to measure before/after.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "config"))

import _result  # noqa: E402  (bench/_result.py: the result file and what made it)
from hostile_mutations import Mutation, materialize, mutations  # noqa: E402

TIME_LIMIT_S = 20
MEMORY_LIMIT = 2 << 30


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def classify(m: Mutation, rc: int | None, output: str) -> str:
    """clean_error | hang | traceback | accepted_wrong | accepted."""
    if rc is None:
        return "hang"
    if "Traceback" in output or rc not in (0, 2):
        return "traceback"
    if rc == 2:
        return "clean_error" if output.lstrip().startswith(("error:", "Usage:")) else "traceback"
    return "accepted_wrong" if m.must_refuse else "accepted"


def run_one(m: Mutation, folder: Path, command: str, python: str, root: Path) -> tuple[str, float]:
    exp = materialize(m, folder)
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [python, "-m", "orchestrator.cli", command, str(exp)],
            cwd=root,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=TIME_LIMIT_S,
            preexec_fn=_limits,
            env={**os.environ, "PYTHONPATH": str(root), "COLUMNS": "200"},
        )
        rc, output = proc.returncode, proc.stderr + proc.stdout
    except subprocess.TimeoutExpired:
        rc, output = None, ""
    return classify(m, rc, output), time.monotonic() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose orchestrator is measured")
    ap.add_argument("--sample", type=int, default=None)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--match", default=None, help="only the mutations whose name contains one of these (a|b|c)")
    _result.add_output(ap, "--json")
    args = ap.parse_args()
    run = _result.start()
    cases = mutations(seed=11, sample=args.sample)
    if args.match:
        cases = [m for m in cases if any(word in m.name for word in args.match.split("|"))]
    results: dict[str, Counter[str]] = {}
    bad: list[str] = []
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        for command in ("validate", "plan"):
            futures = [
                (m, pool.submit(run_one, m, Path(tmp) / command / str(i), command, args.python, args.root))
                for i, m in enumerate(cases)
            ]
            counts: Counter[str] = Counter()
            for m, f in futures:
                kind, _ = f.result()
                counts[kind] += 1
                if kind in ("hang", "traceback", "accepted_wrong"):
                    bad.append(f"{command}: {kind}: {m.name}")
            results[command] = counts
    for command, counts in results.items():
        print(f"{command}: {len(cases)} files: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for line in bad:
        print("  " + line)
    _result.write(args.out, {c: dict(v) for c, v in results.items()} | {"bad": bad}, run, indent=2)


if __name__ == "__main__":
    main()
