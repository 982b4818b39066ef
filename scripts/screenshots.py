"""Regenerate docs/screenshots/ from a finished sweep, in the browser the UI tests use.

`sweep ui` serves the sweep's MLflow store; Debian's Chromium, driven by Playwright with the UI tests' own
flags (tests/e2e/browser_helpers.py), opens the views README.md links and saves them:

    mlflow-trials.png   the ranked trials view `sweep ui` prints (the champion marked)
    mlflow-parent.png   the sweep's parent run: which configuration won and by how much
    report.png          the work directory's report.html

and docs/screenshots/README.md says when, at which commit and from which sweep they were made. Run it from the
repository root on a finished sweep of experiments/demo.yaml (`make demo` leaves one in runs/demo):

    .venv/bin/python scripts/screenshots.py --workdir runs/demo
    .venv/bin/python scripts/screenshots.py --workdir /tmp/readme-demo --out /tmp/shots   # somewhere else

Needs the test extra (Playwright) and Chromium (`make browser` installs Debian's).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from readme_outputs import git_stamp  # the same stamp as the README's outputs (this script's folder)

from orchestrator.tracking import convert

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "screenshots"
WAIT_MS = 90_000
SETTLE_MS = 3_000
"""After a view's text appears, the time its tables and plots take to finish drawing (the MLflow UI polls, so
the network never goes idle)."""


class Failed(Exception):
    """What did not work, and what to do about it."""


def browser_settings() -> tuple[str, list[str]]:
    """The UI tests' Chromium and flags, so the screenshots are what the tests see."""
    sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "e2e")]
    try:
        from browser_helpers import CHROMIUM, FLAGS
    except ImportError as exc:
        raise Failed(
            f"cannot read the UI tests' browser settings ({exc}); install the test extra: make install"
        ) from exc
    if not Path(CHROMIUM).exists():
        raise Failed(f"no Chromium at {CHROMIUM}: run `make browser` (Debian's chromium package)")
    return CHROMIUM, list(FLAGS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_ui(wd: Path) -> tuple[subprocess.Popen[str], str]:
    """`sweep ui --workdir WD` on a free port, and the ranked-trials URL it prints."""
    sweep = Path(sys.executable).parent / "sweep"
    proc = subprocess.Popen(
        [str(sweep), "ui", "--workdir", str(wd), "--port", str(free_port())],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert proc.stdout is not None
    text, deadline = "", time.monotonic() + 300
    while "viewStateShareKey" not in text:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise Failed(f"sweep ui exited {proc.returncode} before it printed its URL:\n{text[-2000:]}")
        if time.monotonic() > deadline:
            stop(proc)
            raise Failed(f"sweep ui printed no ranked-trials URL within 300 s:\n{text[-2000:]}")
        text += line
    found = re.search(r"(http://\S+viewStateShareKey\S*)", " ".join(text.split()))
    if found is None:
        stop(proc)
        raise Failed(f"no URL in sweep ui's output:\n{text[-2000:]}")
    url = found.group(1)
    wait_health(url.split("#")[0].rstrip("/"), proc)
    return proc, url


def wait_health(base: str, proc: subprocess.Popen[str], deadline_s: float = 300) -> None:
    """Until MLflow behind `sweep ui` answers /health (the URL is printed before it does)."""
    import httpx

    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop(proc)
    raise Failed(f"sweep ui's MLflow did not answer {base}/health within {deadline_s:.0f} s")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def wait_text(page: Any, text: str | re.Pattern[str], view: str) -> None:
    try:
        page.get_by_text(text).first.wait_for(timeout=WAIT_MS)
    except Exception as exc:  # playwright's TimeoutError: one message naming the view
        raise Failed(f"{view}: {text!r} did not appear within {WAIT_MS // 1000} s ({type(exc).__name__})") from exc


def _close_assistant(page: Any) -> None:
    """MLflow 3.17 opens its Assistant over a third of the page on a browser's first visit: close it."""
    button = page.locator('[data-component-id="mlflow.assistant.chat_panel.close"]')
    if button.count():
        button.first.click()
        page.wait_for_timeout(SETTLE_MS)


def _snap(page: Any, path: Path, written: list[Path]) -> None:
    page.wait_for_timeout(SETTLE_MS)
    _close_assistant(page)
    page.screenshot(path=str(path))
    written.append(path)


def shoot(wd: Path, out: Path, width: int, height: int) -> list[Path]:
    from playwright.sync_api import sync_playwright

    chromium, flags = browser_settings()
    summary = json.loads((wd / "summary.json").read_text(encoding="utf-8"))
    state = json.loads((wd / "sweep.json").read_text(encoding="utf-8"))
    decision = summary.get("decision") or {}
    deployed = (decision.get("deployed") or summary.get("champion") or {}).get("number")
    out.mkdir(parents=True, exist_ok=True)
    proc, url = start_ui(wd)
    written: list[Path] = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=flags)
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(url, wait_until="domcontentloaded")
            trial = f"trial-{deployed:04d}" if deployed is not None else re.compile(r"trial-\d{4}")
            wait_text(page, trial, "the ranked trials view (knob columns, the deployed trial first)")
            _snap(page, out / "mlflow-trials.png", written)
            base = url.split("#")[0]
            experiment = url.split("/experiments/")[1].split("/")[0].split("?")[0]
            page.goto(f"{base}{convert.run_path(experiment, state['parent_run_id'])}")
            wait_text(page, re.compile("deployed", re.IGNORECASE), "the parent run")
            _snap(page, out / "mlflow-parent.png", written)
            version = decision.get("model_version") or summary.get("model_version")
            if version:
                model = state.get("model_name") or "sglang-sweep-demo"
                page.goto(f"{base}#/models/{model}/versions/{version}?{convert.ML_VIEW}")
                wait_text(page, re.compile("knob", re.IGNORECASE), "the model version page")
                _snap(page, out / "mlflow-model-version.png", written)
            report = wd / "report.html"
            if report.exists():
                page.goto(report.as_uri(), wait_until="load")
                page.wait_for_timeout(SETTLE_MS)
                written.append(out / "report.png")
                page.screenshot(path=str(written[-1]), full_page=False)
            else:
                print(f"report.png not made: {report} is missing (sweep report --workdir {wd})", file=sys.stderr)
            browser.close()
    finally:
        stop(proc)
    return written


def write_readme(out: Path, wd: Path, files: list[Path]) -> Path:
    state = json.loads((wd / "sweep.json").read_text(encoding="utf-8"))
    lines = [
        "# Screenshots",
        "",
        f"Made by `scripts/screenshots.py` at {git_stamp()}, from the finished sweep",
        f"`{state.get('experiment', '?')}` (its work directory was `{wd}`), in Debian's Chromium through Playwright",
        "with the UI tests' flags. Do not edit them by hand; regenerate them:",
        "",
        "    make demo",
        "    .venv/bin/python scripts/screenshots.py --workdir runs/demo",
        "",
        *[f"- `{f.name}`" for f in files],
        "",
    ]
    readme = out / "README.md"
    readme.write_text("\n".join(lines), encoding="utf-8")
    return readme


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, required=True, help="a finished sweep (runs/demo after make demo)")
    ap.add_argument("--out", type=Path, default=OUT, help="where the PNGs and README.md go (docs/screenshots)")
    ap.add_argument("--width", type=int, default=2400)
    ap.add_argument("--height", type=int, default=1000)
    args = ap.parse_args(argv)
    wd = args.workdir.resolve()
    try:
        for name in ("sweep.json", "summary.json"):
            if not (wd / name).exists():
                raise Failed(f"--workdir {wd}: no {name} (a finished sweep's work directory is needed)")
        files = shoot(wd, args.out, args.width, args.height)
        readme = write_readme(args.out, wd, files)
    except Failed as exc:
        print(f"screenshots: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # Playwright's errors (a page that would not load, a browser that would not start)
        if type(exc).__module__.startswith("playwright"):
            print(f"screenshots: the browser failed: {str(exc).splitlines()[0]}", file=sys.stderr)
            return 1
        raise
    for f in [*files, readme]:
        print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
