"""The committed bench results are a reference: one current file per benchmark, each saying what made it.

Every JSON result under bench/ carries a `meta` block (bench/_result.py writes it; older results were given
one rebuilt from git log, marked `reconstructed`) naming the commit its tree was at and the exact command,
so docs/benchmarks.md's figures can be traced and regenerated. Old variants and tuning runs stay in git
history, not in the tree: bench/ holds fewer than 40 files.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
MAX_FILES = 40
HASH = re.compile(r"^[0-9a-f]{40}$")


def committed(pattern: str) -> list[Path]:
    """The files of bench/ git tracks (a fresh clone's view); the folder's own files outside a checkout."""
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "--", pattern],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return sorted(p for p in BENCH.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return [REPO / line for line in out.splitlines() if line and (REPO / line).exists()]


RESULTS = [p for p in committed("bench/*.json") if p.suffix == ".json"]


def test_bench_keeps_fewer_than_40_files():
    files = committed("bench")
    assert len(files) < MAX_FILES, (
        f"bench/ holds {len(files)} files (at most {MAX_FILES - 1}): keep one current result per benchmark "
        "and leave old variants to git history"
    )


def test_there_are_committed_results():
    assert RESULTS, "no bench/*.json result is committed"


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_every_result_names_its_commit_and_command(path: Path):
    data = json.loads(path.read_text(encoding="utf-8"))
    meta = data.get("meta") if isinstance(data, dict) else None
    where = path.relative_to(REPO)
    assert isinstance(meta, dict), f"{where}: no `meta` block; write results through bench/_result.py"
    assert HASH.match(str(meta.get("commit"))), (
        f"{where}: meta.commit is not a full commit hash: {meta.get('commit')!r}"
    )
    command = meta.get("command")
    assert isinstance(command, str) and command.startswith("python bench/"), (
        f"{where}: meta.command must be the command line that made it (python bench/<script> ...), got {command!r}"
    )
    script = command.split()[1]
    assert (REPO / script).is_file(), f"{where}: meta.command runs {script}, which is not in the repository"
    for key in ("date", "machine", "load"):
        assert key in meta, f"{where}: meta has no {key!r}"
    if meta.get("reconstructed"):
        assert HASH.match(str(meta.get("written_in"))), f"{where}: a reconstructed meta names the commit that wrote it"


def test_the_helper_writes_commit_date_machine_load_and_command(tmp_path: Path):
    sys.path.insert(0, str(BENCH))
    try:
        import _result
    finally:
        sys.path.remove(str(BENCH))
    run = _result.start([str(BENCH / "gate_power.py"), "--runs", "10", "-o", "out dir/x.json"])
    out = _result.write(tmp_path / "sub" / "x.json", {"rows": [1, 2]}, run)
    assert out is not None
    data = json.loads(out.read_text(encoding="utf-8"))
    assert list(data) == ["meta", "rows"] and data["rows"] == [1, 2]
    meta = data["meta"]
    assert meta["command"] == "python bench/gate_power.py --runs 10 -o 'out dir/x.json'"
    assert meta["commit"] is None or HASH.match(meta["commit"])
    assert set(meta["machine"]) == {"cores", "python", "system"}
    assert set(meta["load"]) == {"start", "end"}
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", meta["date"])
    assert _result.write(None, {"rows": []}, run) is None
