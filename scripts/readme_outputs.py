"""Regenerate README.md's example outputs from one sweep, so they cannot drift apart.

Each example block in README.md sits between two marker comments:

    <!-- readme-output:NAME ... -->
        (an indented code block, rewritten by this script)
    <!-- /readme-output -->

and this script rewrites what is between them from real commands, stamping the opening marker with the commit
and the date. The blocks:

    demo      the end of `sweep run experiments/demo.yaml` (its summary: verdict, promotion, env file)
    validate  `sweep validate experiments/kimi-k2.5-tp8.yaml`, and the same file with `budget` misspelt
    plan      `sweep plan experiments/kimi-k2.5-tp8.yaml`, the lines README shows (the rest as "...")
    status    `sweep status --workdir WD` of the demo's sweep

Run it from the repository root:

    .venv/bin/python scripts/readme_outputs.py                       # runs the demo sweep in /tmp/readme-demo
    .venv/bin/python scripts/readme_outputs.py --workdir runs/demo   # a finished demo sweep instead
    .venv/bin/python scripts/readme_outputs.py --only validate,plan  # the blocks that need no sweep

A sweep this script ran keeps its console output in WD/readme-run-output.txt; with --workdir of a sweep it did
not run, the demo block is left as it is (said on stderr) and the others are regenerated.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
KIMI = "experiments/kimi-k2.5-tp8.yaml"
DEMO = "experiments/demo.yaml"
RUN_OUTPUT = "readme-run-output.txt"
COLUMNS = "120"
MARKERS = re.compile(
    r"(?P<open><!-- readme-output:(?P<name>[a-z-]+)(?: [^\n]*?)? -->\n)(?P<body>.*?)(?P<close><!-- /readme-output -->)",
    re.DOTALL,
)
PLAN_LINES = (r"^\S+: \d+ distinct combinations", r"infeasible: ", r"^(one trial|expected GPU-time)", r"^night: ")
"""The lines of `sweep plan` README shows; the others become '...'."""


class Failed(Exception):
    """A command this script ran did not do what the README shows; the message says which and why."""


def sweep_bin() -> str:
    found = Path(sys.executable).parent / "sweep"
    if found.exists():
        return str(found)
    on_path = shutil.which("sweep")
    if on_path is None:
        raise Failed("no `sweep` command next to this Python or on PATH: run `make install` first")
    return on_path


def run(argv: list[str], *, cwd: Path = REPO, ok: tuple[int, ...] = (0,)) -> str:
    """The command's console output (stdout then stderr), as a terminal of COLUMNS columns without colour."""
    env = {**os.environ, "COLUMNS": COLUMNS, "NO_COLOR": "1", "TERM": "dumb"}
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=3600, check=False)
    if proc.returncode not in ok:
        raise Failed(
            f"`{' '.join(argv)}` exited {proc.returncode} (expected {ok}):\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    return proc.stdout + proc.stderr


def git_stamp() -> str:
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "unknown", ""
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    return f"{commit}{' with uncommitted changes' if dirty else ''} on {date}"


def code_block(lines: list[str]) -> str:
    """An indented markdown code block, one blank line before and after."""
    body = "\n".join(("    " + line).rstrip() for line in lines)
    return f"\n{body}\n\n"


def shell(command: list[str], output: str) -> list[str]:
    return [f"$ {' '.join(command)}", *output.rstrip("\n").splitlines()]


def keep_only(text: str, patterns: tuple[str, ...]) -> list[str]:
    """The lines matching `patterns`, with '...' where lines were left out in between or after."""
    kept: list[str] = []
    skipped = False
    for line in text.rstrip("\n").splitlines():
        if any(re.search(p, line.strip()) for p in patterns):
            if skipped and kept:
                kept.append("...")
            kept.append(line)
            skipped = False
        else:
            skipped = True
    if skipped and kept:
        kept.append("...")
    return kept


def summary_section(output: str) -> list[str]:
    """What `sweep run` printed from its summary rule on (the verdict, the promotion, where things are)."""
    lines = output.rstrip("\n").splitlines()
    starts = [i for i, line in enumerate(lines) if re.fullmatch(r"[─━-]+ summary [─━-]+", line.strip())]
    if not starts:
        raise Failed("the sweep's output has no summary section (did the run finish?)")
    return [line for line in lines[starts[-1] + 1 :] if line.strip()]


# ---------------------------------------------------------------------------- the blocks


def block_validate(_wd: Path | None) -> list[str]:
    ok = run([sweep_bin(), "validate", KIMI])
    with tempfile.TemporaryDirectory(prefix="readme-typo-") as tmp:
        exp = Path(tmp) / "experiments"
        exp.mkdir()
        text = (REPO / KIMI).read_text(encoding="utf-8")
        (exp / "typo.yaml").write_text(re.sub(r"(?m)^budget:", "budjet:", text, count=1), encoding="utf-8")
        bad = run([sweep_bin(), "validate", "experiments/typo.yaml"], cwd=Path(tmp), ok=(2,))
    return [*shell(["sweep", "validate", KIMI], ok), *shell(["sweep", "validate", "experiments/typo.yaml"], bad)]


def block_plan(_wd: Path | None) -> list[str]:
    text = run([sweep_bin(), "plan", KIMI])
    lines = keep_only(text, PLAN_LINES)
    if not lines:
        raise Failed(f"`sweep plan {KIMI}` printed none of the lines README shows ({PLAN_LINES})")
    return [f"$ sweep plan {KIMI}", *lines]


def block_status(wd: Path | None) -> list[str]:
    assert wd is not None
    return shell(["sweep", "status", "--workdir", str(wd)], run([sweep_bin(), "status", "--workdir", str(wd)]))


def block_demo(wd: Path | None) -> list[str] | None:
    assert wd is not None
    saved = wd / RUN_OUTPUT
    if not saved.exists():
        print(f"demo block left as it is: {saved} is missing (only a sweep this script ran keeps it)", file=sys.stderr)
        return None
    return summary_section(saved.read_text(encoding="utf-8"))


BLOCKS: dict[str, Callable[[Path | None], list[str] | None]] = {
    "demo": block_demo,
    "validate": block_validate,
    "plan": block_plan,
    "status": block_status,
}


# ---------------------------------------------------------------------------- the demo sweep


def run_demo(wd: Path, trials: int | None) -> Path:
    """`sweep run experiments/demo.yaml --workdir WD`, its console output kept in WD/RUN_OUTPUT."""
    if wd.exists() and any(wd.iterdir()):
        raise Failed(f"{wd} exists and is not empty: remove it, or pass it as --workdir if it is a finished sweep")
    experiment = REPO / DEMO
    if trials is not None:  # a shorter sweep to try the script on; README's own blocks come from the full demo
        data = yaml.safe_load(experiment.read_text(encoding="utf-8"))
        data["budget"]["trials"] = trials
        data["search_space"] = [str((experiment.parent / f).resolve()) for f in data["search_space"]]
        experiment = wd.parent / f"{wd.name}-demo-{trials}.yaml"
        experiment.parent.mkdir(parents=True, exist_ok=True)
        experiment.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    print(f"running sweep run {experiment} --workdir {wd} (minutes)", file=sys.stderr, flush=True)
    output = run([sweep_bin(), "run", str(experiment), "--workdir", str(wd)])
    (wd / RUN_OUTPUT).write_text(output, encoding="utf-8")
    return wd


def regenerate(text: str, wd: Path | None, stamp: str, only: set[str] | None) -> tuple[str, list[str]]:
    """README's text with every marked block rewritten; and the names rewritten."""
    done: list[str] = []
    found = {m.group("name") for m in MARKERS.finditer(text)}
    unknown = found - set(BLOCKS)
    if unknown:
        raise Failed(f"README.md has markers for unknown blocks {sorted(unknown)}; known: {sorted(BLOCKS)}")

    def one(m: re.Match[str]) -> str:
        name = m.group("name")
        if only is not None and name not in only:
            return m.group(0)
        lines = BLOCKS[name](wd)
        if lines is None:
            return m.group(0)
        done.append(name)
        return (
            f"<!-- readme-output:{name} scripts/readme_outputs.py at {stamp} -->\n{code_block(lines)}{m.group('close')}"
        )

    return MARKERS.sub(one, text), done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, help="a finished sweep of experiments/demo.yaml (no new run)")
    ap.add_argument("--run-dir", type=Path, default=Path("/tmp/readme-demo"), help="where the demo sweep runs")
    ap.add_argument("--trials", type=int, help="run the demo with this many trials (to try the script quickly)")
    ap.add_argument("--only", help="comma-separated block names (default: every marked block)")
    ap.add_argument("--readme", type=Path, default=README)
    args = ap.parse_args(argv)
    try:
        text = args.readme.read_text(encoding="utf-8")
        if not MARKERS.search(text):
            raise Failed(f"{args.readme} has no <!-- readme-output:NAME --> ... <!-- /readme-output --> markers")
        only = set(args.only.split(",")) if args.only else None
        needs_sweep = only is None or bool(only & {"demo", "status"})
        wd = args.workdir
        if wd is not None and not (wd / "sweep.json").exists():
            raise Failed(f"--workdir {wd}: no sweep.json there (not a sweep's work directory)")
        if wd is None and needs_sweep:
            wd = run_demo(args.run_dir.resolve(), args.trials)
        new, done = regenerate(text, wd.resolve() if wd else None, git_stamp(), only)
    except Failed as exc:
        print(f"readme_outputs: {exc}", file=sys.stderr)
        return 2
    args.readme.write_text(new, encoding="utf-8")
    print(f"rewrote {', '.join(done) or 'nothing'} in {args.readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
