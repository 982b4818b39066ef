"""Every repeat of one trial's `sglang.bench_serving` in one process, so SGLang's import (minutes on
a small machine, tens of seconds on a GPU host) is paid once per trial, not once per repeat.

Run by the benchmark's interpreter (benchmark.client_python, else server.python), which has SGLang
but not this package: standard library only. Its one argument is a JSON object:

    {"module": "sglang.bench_serving", "metrics_url": "http://127.0.0.1:P/metrics",
     "runs": [{"argv": [...], "metrics_before": PATH, "metrics_after": PATH, "status": PATH}, ...]}

For each run it saves the server's /metrics text, runs the module as `__main__` with the run's argv
(runpy, as `python -m sglang.bench_serving ARGV` does; SGLang's own imports stay loaded between runs),
saves /metrics again and writes the run's status file: {"ok": true} or {"ok": false, "error": "..."}. A run that fails ends the process
(exit 1): later repeats would meet the same server.
"""

from __future__ import annotations

import json
import runpy
import sys
import traceback
import urllib.error
import urllib.request


def _save_metrics(url: str, path: str) -> None:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 (the trial's own loopback server)
            text = resp.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        text = ""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _status(path: str, **fields: object) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(fields, f)


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    for number, run in enumerate(spec["runs"]):
        print(f"=== repeat {number} ===", flush=True)
        _save_metrics(spec["metrics_url"], run["metrics_before"])
        sys.argv = [spec["module"], *run["argv"]]
        try:
            runpy.run_module(spec["module"], run_name="__main__", alter_sys=True)
        except SystemExit as exc:  # argparse's refusals and explicit exits
            if exc.code not in (None, 0):
                _status(run["status"], ok=False, error=f"exited with {exc.code!r}")
                return 1
        except Exception as exc:  # the benchmark's own failure is this run's result
            traceback.print_exc()
            _status(run["status"], ok=False, error=f"{type(exc).__name__}: {exc}"[:500])
            return 1
        _save_metrics(spec["metrics_url"], run["metrics_after"])
        _status(run["status"], ok=True)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
