"""The time the driver reads: real for real executors, virtual for the model-backed executor.

Every reading of the time by the sweep's verbs (the wall-time budget, the confirmation's schedule,
waits, epochs written to files) goes through a Clock, so the same driver runs a night of real
servers in real time and a simulated night in milliseconds (testing/model_executor.py advances a
VirtualClock by the cost model's seconds), and a test can hand the driver a clock of its own instead
of asserting on wall-clock durations.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic seconds for budgets, epoch seconds for records, and a sleep."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (budgets and deadlines)."""
        ...

    def time(self) -> float:
        """Seconds since the epoch (what is written to files and MLflow)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Let `seconds` pass on this clock."""
        ...

    def spend(self, seconds: float) -> None:
        """Count work done outside the clock's sight (the probe run in-process, say) as `seconds`: a
        real clock saw the time pass already and does nothing; a virtual clock advances."""
        ...


class RealClock:
    """The machine's clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def spend(self, seconds: float) -> None:
        """The time already passed on the machine's clocks."""


class VirtualClock:
    """A clock that moves only when told: `advance(s)`, `advance_to(t)` or `sleep(s)`.

    It starts at `epoch` (seconds since the epoch, for records) with monotonic time 0. Thread-safe:
    the model-backed executor advances it while the driver reads it.
    """

    def __init__(self, epoch: float = 1_767_225_600.0):  # 2026-01-01 00:00 UTC: fixed, so records repeat
        self._epoch = float(epoch)
        self._now = 0.0
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def time(self) -> float:
        with self._lock:
            return self._epoch + self._now

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def spend(self, seconds: float) -> None:
        self.advance(max(seconds, 0.0))

    def advance(self, seconds: float) -> None:
        """Move forward by `seconds` (a negative value is refused: time never goes back)."""
        if seconds < 0:
            raise ValueError(f"a clock never goes back, but got advance({seconds})")
        with self._lock:
            self._now += seconds

    def advance_to(self, monotonic: float) -> None:
        """Move forward to `monotonic` seconds (no-op when already past it)."""
        with self._lock:
            self._now = max(self._now, monotonic)
