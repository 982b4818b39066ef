"""The outbox: MLflow writes that waited out an outage, one typed JSON line each, sent again later.

`<outbox_dir>/outbox.jsonl` holds one `OutboxEntry` per line (keys sorted), in the order the writes
were asked for. The line formats are those of earlier versions, which stay readable:

    {"op": "log_trial", "parent_run_id": str, "run_id": str | null,
     "outcome_path": "<trial_dir>/outcome.json", "extra_metrics": {str: float},
     "extra_tags": {str: str}, "queued_at": ISO-8601, "error": str}
    {"op": "kill_trial", "run_id": str, ...}          (written by earlier versions only)
    {"op": "end_sweep", "parent_run_id": str, "status": "FINISHED" | "FAILED" | "KILLED", ...}
    {"op": "log_sweep_summary", "parent_run_id": str, "summary_dir": str,
     "metrics": {str: float}, "tags": {str: str}, ...}

Replaying is idempotent and in order. A line that can never be sent (unreadable, its files gone,
or refused by MLflow) moves to `outbox.rejected.jsonl`; an outage stops the replay and keeps the
rest. `Backoff` remembers a recent outage so that writes go straight to the outbox for a while
(30 s, doubling up to 10 min) instead of waiting on a server that hangs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from orchestrator.fsio import write_atomic
from orchestrator.records import Frozen, TrialOutcome
from orchestrator.tracking import convert, runs
from orchestrator.tracking._client import Store
from orchestrator.tracking.outage import Failure, classify

log = logging.getLogger(__name__)

OUTBOX_FILE = "outbox.jsonl"
REJECTED_FILE = "outbox.rejected.jsonl"
"""Outbox lines that can never be sent (unreadable, files gone, refused), kept for inspection."""
OUTBOX_FILES_DIR = "outbox-files"
_LOCK_FILE = "outbox.lock"
_BACKOFF_FIRST_S = 30.0
_BACKOFF_MAX_S = 600.0


class _Entry(Frozen):
    queued_at: str = ""
    """ISO-8601 UTC time the write was queued."""
    error: str = ""
    """Why it was queued: the outage's error, shortened and redacted."""


class LogTrial(_Entry):
    """A finished trial to log on its child run (`Tracker.log_trial`)."""

    op: Literal["log_trial"] = "log_trial"
    parent_run_id: str
    run_id: str | None = None
    outcome_path: str
    """The trial's outcome.json, or a copy of the outcome under `outbox-files/outcomes/`."""
    extra_metrics: dict[str, float] = Field(default_factory=dict)
    extra_tags: dict[str, str] = Field(default_factory=dict)


class KillTrial(_Entry):
    """Close a trial's run as KILLED; only earlier versions queue these, they are still replayed."""

    op: Literal["kill_trial"] = "kill_trial"
    run_id: str


class EndSweep(_Entry):
    """Close the sweep's parent run."""

    op: Literal["end_sweep"] = "end_sweep"
    parent_run_id: str
    status: Literal["FINISHED", "FAILED", "KILLED"]


class LogSweepSummary(_Entry):
    """The sweep's summary for its parent run; the files wait in `summary_dir`."""

    op: Literal["log_sweep_summary"] = "log_sweep_summary"
    parent_run_id: str
    summary_dir: str
    metrics: dict[str, float] = Field(default_factory=dict)
    tags: dict[str, str] = Field(default_factory=dict)


OutboxEntry = Annotated[LogTrial | KillTrial | EndSweep | LogSweepSummary, Field(discriminator="op")]
_ENTRY: TypeAdapter[OutboxEntry] = TypeAdapter(OutboxEntry)


def parse_line(line: str) -> OutboxEntry:
    """One outbox line as its entry; raises ValueError (pydantic's ValidationError) if it is not one."""
    return _ENTRY.validate_json(line)


def render_line(entry: OutboxEntry) -> str:
    """One outbox line (no newline), keys sorted as earlier versions wrote them."""
    return json.dumps(entry.model_dump(mode="json"), sort_keys=True)


class Backoff:
    """After a failed call, how long to send writes straight to the outbox (30 s, doubling to 10 min)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failures = 0
        self._down_until = 0.0

    def active(self) -> bool:
        """Whether MLflow failed recently enough that writes should not wait on it."""
        return time.monotonic() < self._down_until

    def down(self) -> None:
        """A call failed: open (or lengthen) the window."""
        with self._lock:
            self._failures += 1
            window = min(_BACKOFF_MAX_S, _BACKOFF_FIRST_S * 2 ** (self._failures - 1))
            self._down_until = time.monotonic() + window

    def up(self) -> None:
        """A call succeeded: close the window."""
        with self._lock:
            self._failures = 0
            self._down_until = 0.0


class Outbox:
    """The outbox file of one work directory: append, count, replay; safe across threads and
    processes (`sweep sync` beside a running sweep)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / OUTBOX_FILE
        self.backoff = Backoff()
        self._lock = threading.RLock()

    def pending(self) -> int:
        """How many writes wait."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return 0
        return sum(1 for line in text.splitlines() if line.strip())

    def append(self, entry: OutboxEntry) -> None:
        """Add one line, flushed to disk before returning."""
        with self._locked(), open(self.path, "a", encoding="utf-8") as f:
            f.write(render_line(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def outcome_file(self, outcome: TrialOutcome) -> Path:
        """Where a queued `LogTrial` finds this outcome: the trial's outcome.json if it holds exactly
        this outcome, else a copy written under the outbox folder."""
        if outcome.trial_dir:
            path = Path(outcome.trial_dir) / "outcome.json"
            try:
                if TrialOutcome.model_validate_json(path.read_text(encoding="utf-8")) == outcome:
                    return path.resolve()
            except (OSError, ValueError):
                pass
        role = convert.role_text(outcome.role)
        path = self.folder / OUTBOX_FILES_DIR / "outcomes" / f"{role}-{outcome.number:04d}.json"
        write_atomic(path, outcome.model_dump_json(indent=2) + "\n")
        return path.resolve()

    def summary_stage(self, parent_run_id: str) -> Path:
        """The folder where a sweep summary's files wait until they are sent."""
        return self.folder / OUTBOX_FILES_DIR / f"summary-{convert.safe_name(parent_run_id)}"

    def replay(self, store: Store) -> tuple[int, int]:
        """Send the queued writes in order; return (replayed, still pending). A bug raises."""
        with self._locked():
            try:
                lines = self.path.read_text(encoding="utf-8").splitlines()
            except FileNotFoundError:
                return 0, 0
            replayed, keep, rejected = 0, [], []
            unreachable = False
            for line in (item for item in lines if item.strip()):
                sent = "kept" if unreachable else _send_line(store, line)
                if sent == "sent":
                    replayed += 1
                elif sent == "rejected":
                    rejected.append(line)
                else:
                    keep.append(line)
                    unreachable = unreachable or (sent == "failed" and not store.reachable())
            self._settle(rejected, keep)
        if unreachable:
            self.backoff.down()
        elif replayed:
            self.backoff.up()
        return replayed, len(keep)

    def _settle(self, rejected: list[str], keep: list[str]) -> None:
        """Rejected lines appended to REJECTED_FILE, the outbox rewritten with the lines kept for later."""
        if rejected:
            with open(self.folder / REJECTED_FILE, "a", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in rejected))
        write_atomic(self.path, "".join(line + "\n" for line in keep))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One writer at a time, across threads and processes."""
        with self._lock:
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(self.folder / _LOCK_FILE, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)


def _send_line(store: Store, line: str) -> Literal["sent", "rejected", "failed"]:
    """Send one outbox line: "sent"; "rejected" when it can never be sent (unreadable, its files gone,
    MLflow refused it); "failed" when MLflow could not be reached (kept for later). A bug raises."""
    try:
        send = _sender(store, parse_line(line))
    except (ValueError, OSError) as e:
        # Unreadable line or input files gone: retrying can never help.
        log.warning("outbox line cannot be replayed, moved to %s: %s", REJECTED_FILE, convert.short(e))
        return "rejected"
    try:
        send()
    except Exception as e:
        failure = classify(e)
        if failure is Failure.bug:
            raise
        if failure is Failure.refused:
            log.warning("MLflow refused an outbox line, moved to %s: %s", REJECTED_FILE, convert.short(e))
            return "rejected"
        log.warning("outbox replay failed, kept for later: %s", convert.short(e))
        return "failed"
    return "sent"


def _sender(store: Store, entry: OutboxEntry) -> Callable[[], object]:
    """The MLflow calls that send one entry, after reading its files.

    Everything that fails for good (files gone, unreadable outcome) fails here, before any MLflow
    call, so that a failure of the returned callable is about MLflow.
    """
    if isinstance(entry, LogTrial):
        outcome = TrialOutcome.model_validate_json(Path(entry.outcome_path).read_text(encoding="utf-8"))
        return lambda: runs.write_trial(
            store, entry.parent_run_id, outcome, entry.run_id, entry.extra_metrics, entry.extra_tags
        )
    if isinstance(entry, KillTrial):
        return lambda: store.client().set_terminated(entry.run_id, "KILLED")
    if isinstance(entry, EndSweep):
        return lambda: store.client().set_terminated(entry.parent_run_id, entry.status)
    stage = Path(entry.summary_dir)
    if not (stage / "results.csv").is_file():
        raise FileNotFoundError(f"summary files are gone: {stage}")

    def send() -> None:
        runs.write_summary(store, entry.parent_run_id, stage, entry.metrics, entry.tags)
        shutil.rmtree(stage, ignore_errors=True)

    return send
