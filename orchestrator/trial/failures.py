"""Why a trial failed, from what it left behind: the server's exit status and log, the benchmark's
records. Pure rules (text and values in, a FailureKind and the reason in words out), table-tested."""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.records import BenchRecord, FailureKind

_OOM_MARKERS = (
    "out of memory",
    "outofmemoryerror",
    "not enough memory",
    # SGLang 0.5.23, sglang/srt/mem_cache/kv_cache_configurator.py::KVCacheConfigurator._profile_available_bytes:
    # "Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=..." (a ValueError)
    "leave no gpu memory",
)
_PORT_MARKERS = ("address already in use", "errno 98")
_NCCL_MARKERS = (
    "nccl error",
    "ncclsystemerror",
    "ncclinternalerror",
    "ncclinvalidusage",
    "ncclunhandledcudaerror",
    "distbackenderror",
)
_IMPORT_ERRORS = ("ImportError", "ModuleNotFoundError")
_ARGUMENT_ERRORS = ("ValueError", "AssertionError", "TypeError", "NotImplementedError")

# A Python exception line as a traceback ends: at the start of a line, a dotted name ending in Error,
# Exception or Exit, then its message. SGLang's logger prefix (`[2026-12-01 21:00:00 TP0] `) never
# starts such a line; the traceback's own lines are written raw.
_EXCEPTION_LINE = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit))(?::\s?(.*))?$")
# argparse refuses a value before any traceback, as `<prog>: error: <message>` after its usage block.
# SGLang 0.5.23 names its parser `sglang serve`, two words (sglang/srt/server_args.py::prepare_server_args,
# argparse.ArgumentParser(prog="sglang serve")): "sglang serve: error: argument --x: invalid choice: ...".
# A program name is one or two words of letters, digits, '.', '_' or '-' (never a logger's "[...]" prefix).
_ARGPARSE_LINE = re.compile(r"^(?:usage: .*|(?P<prog>[\w.-]+(?: [\w.-]+)?): error: (?P<msg>.+))$")


@dataclass(frozen=True)
class Failure:
    """A failure the trial's outcome reports."""

    kind: FailureKind
    reason: str


def describe_returncode(code: int | None) -> str:
    """'exit code 1' or 'killed by signal 9 (SIGKILL)', the distinction a user needs."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclass(frozen=True)
class LoggedException:
    """The exception a server's log ends with: its type as printed (e.g. torch.OutOfMemoryError) and message."""

    name: str
    message: str
    refusal: bool = False
    """argparse's refusal of the command line (`name` is then the parser's program, e.g. `sglang serve`)."""

    def __str__(self) -> str:
        if self.refusal:  # argparse's own words: "sglang serve: error: argument --x: invalid choice: ..."
            return f"{self.name}: error: {self.message}"
        return f"{self.name}: {self.message}" if self.message else self.name


def last_exception(log_text: str) -> LoggedException | None:
    """The last exception printed in `log_text` (a traceback's closing line, or argparse's refusal), or None.

    SGLang 0.5.23 prints a failing child's traceback and then kills its own process tree with SIGKILL
    (sglang/srt/entrypoints/engine.py::launch_phase_sigquit_handler -> srt/utils/common.py::kill_process_tree),
    so the exception is the cause and the signal only how the launcher went."""
    found: LoggedException | None = None
    for line in log_text.splitlines():
        line = line.rstrip()
        m = _EXCEPTION_LINE.match(line)
        if m:
            found = LoggedException(m.group(1), (m.group(2) or "").strip()[:600])
            continue
        a = _ARGPARSE_LINE.match(line)
        if a and a.group("msg"):
            found = LoggedException(a.group("prog"), a.group("msg").strip()[:600], refusal=True)
    return found


def _category(exc: LoggedException, *, starting: bool) -> tuple[FailureKind, str]:
    short = exc.name.rsplit(".", 1)[-1]
    low = str(exc).lower()
    if any(m in low for m in _OOM_MARKERS):
        return FailureKind.oom, "server ran out of memory"
    if any(m in low for m in _PORT_MARKERS):
        return FailureKind.port_in_use, "server could not bind its port"
    if any(m in low for m in _NCCL_MARKERS):
        return FailureKind.server_crash, "server hit an NCCL error"
    if short in _IMPORT_ERRORS:
        return FailureKind.server_crash, "server could not import a module"
    if exc.refusal:  # argparse exits with 2 before anything starts, whatever `starting` says
        return FailureKind.server_crash, "server refused its arguments"
    if starting and short in _ARGUMENT_ERRORS:
        return FailureKind.server_crash, "server refused its arguments"
    return FailureKind.server_crash, "server died"


def classify_exit(log_text: str, returncode: int | None, *, starting: bool = True) -> Failure:
    """Why a server process ended: from the exception its log ends with first (OOM, port in use, NCCL
    error, import error, and while `starting` a refused argument), from markers in the log next, from
    the exit status last."""
    low = log_text.lower()
    how = describe_returncode(returncode)
    exc = last_exception(log_text)
    if exc is not None:
        kind, what = _category(exc, starting=starting)
        return Failure(kind, f"{what}: {exc} ({how})")
    if any(m in low for m in _OOM_MARKERS):
        return Failure(FailureKind.oom, f"server ran out of GPU memory ({how})")
    if any(m in low for m in _PORT_MARKERS):
        return Failure(FailureKind.port_in_use, f"server could not bind its port ({how})")
    return Failure(FailureKind.server_crash, f"server died ({how})")


def classify_records(records: Sequence[BenchRecord], *, stall_timeout_s: float) -> Failure | str | None:
    """What the failed requests of a benchmark against a live server mean: a Failure, a warning (some
    requests failed, the measurement stands), or None when every request worked.

    A server that died is classify_exit's question; ask it first.
    """
    failed = [r for r in records if not r.ok]
    if not failed:
        return None
    measured = [r for r in records if not r.warmup]
    if any(r.error and "timeout" in r.error.lower() for r in failed):
        # A live server that stops producing tokens is hung, however many requests worked before.
        return Failure(
            FailureKind.nccl_hang,
            f"server alive but no token for {stall_timeout_s:g}s (benchmark.stall_timeout_s) after "
            f"{sum(r.ok for r in measured)} good request(s): a collective is hung",
        )
    warm_failed = [r for r in failed if r.warmup]
    if warm_failed:
        return Failure(FailureKind.bench_error, f"the warm-up request failed: {warm_failed[0].error}")
    if not any(r.ok for r in measured):
        return Failure(FailureKind.bench_error, f"all {len(measured)} requests failed; first error: {failed[0].error}")
    return f"{len(failed)} of {len(records)} requests failed: {failed[0].error}"


class TrialFailed(Exception):
    """Control flow inside one trial: a Failure the outcome will report (never leaves the trial)."""

    def __init__(self, failure: Failure):
        super().__init__(failure.reason)
        self.failure = failure
