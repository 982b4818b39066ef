"""The seam between the sweep and where trials run: a TrialSpec goes in, a Finished comes back.

A worker that is lost or a trial that raises is turned into a FAILED outcome by the executor
(`worker_lost`, `internal_error`): the loop sees outcomes only, never a transport's exception.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from orchestrator.clock import Clock
from orchestrator.records import FailureKind, TrialOutcome, TrialSpec, TrialStatus


@dataclass(frozen=True)
class ExecutorInfo:
    """Where trials run: the cluster's address (None in-process), its GPUs and the trial slots."""

    address: str | None
    gpus: float
    slots: int
    owns_processes: bool = False
    """This process started the workers' runtime (a local Ray instance): its child processes are
    recorded in the work directory so that a resumed driver can end them if this one is killed."""


@dataclass(frozen=True)
class Finished:
    """A trial that ended, however it ended."""

    handle: int
    spec: TrialSpec
    outcome: TrialOutcome
    files: dict[str, bytes] = field(default_factory=dict)
    """The trial's files, for a worker on another host (a file already here is kept as it is)."""
    lost: str | None = None
    """Set when the executor made the outcome itself: the worker was lost or the trial raised."""


class Executor(Protocol):
    """Runs trials, at most `slots` at a time."""

    @property
    def clock(self) -> Clock:
        """The time the driver reads while this executor runs its trials (RealClock but for the model-backed one)."""
        ...

    def start(self) -> ExecutorInfo:
        """Acquire the workers; raises a UserError when they cannot be had."""
        ...

    def idle(self) -> int:
        """Slots free for another submit()."""
        ...

    def submit(self, spec: TrialSpec) -> int:
        """Start a trial on a free slot; returns its handle."""
        ...

    def wait(self, timeout_s: float) -> list[Finished]:
        """The trials that ended, waiting up to `timeout_s` for at least one."""
        ...

    def abort(self, handle: int) -> None:
        """Kill the trial's server now; its outcome still comes back through wait()."""
        ...

    def close(self) -> None:
        """Release the workers (idempotent)."""
        ...


def made_outcome(spec: TrialSpec, kind: FailureKind, reason: str, finished_at: float) -> TrialOutcome:
    """The outcome of a trial whose worker never returned one."""
    return TrialOutcome(
        number=spec.number,
        params=spec.params,
        role=spec.role,
        status=TrialStatus.FAILED,
        failure_kind=kind,
        reason=reason,
        trial_dir=spec.trial_dir,
        finished_at=finished_at,
    )


def last_line(text: str) -> str:
    """The last non-empty line of a traceback (the exception), at most 300 characters."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else "an exception"
