"""Why a trial failed, from what it left behind: the server's exit status and log, the benchmark's
records. Pure rules (text and values in, a FailureKind and the reason in words out), table-tested."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.records import BenchRecord, FailureKind

_OOM_MARKERS = ("out of memory", "outofmemoryerror", "not enough memory")
_PORT_MARKERS = ("address already in use", "errno 98")


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


def classify_exit(log_text: str, returncode: int | None) -> Failure:
    """Why a server process ended, from its log and exit status."""
    low = log_text.lower()
    how = describe_returncode(returncode)
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
        return Failure(FailureKind.nccl_hang,
                       f"server alive but no token for {stall_timeout_s:g}s (benchmark.stall_timeout_s) after "
                       f"{sum(r.ok for r in measured)} good request(s): a collective is hung")
    warm_failed = [r for r in failed if r.warmup]
    if warm_failed:
        return Failure(FailureKind.bench_error, f"the warm-up request failed: {warm_failed[0].error}")
    if not any(r.ok for r in measured):
        return Failure(FailureKind.bench_error,
                       f"all {len(measured)} requests failed; first error: {failed[0].error}")
    return f"{len(failed)} of {len(records)} requests failed: {failed[0].error}"


class TrialFailed(Exception):
    """Control flow inside one trial: a Failure the outcome will report (never leaves the trial)."""

    def __init__(self, failure: Failure):
        super().__init__(failure.reason)
        self.failure = failure
