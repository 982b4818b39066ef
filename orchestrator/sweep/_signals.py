"""Ctrl-C and SIGTERM: the handler only counts presses; the loop acts on them between steps."""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any


class Interrupts:
    """Presses of Ctrl-C (or SIGTERMs): 1 finish the trials in flight, 2 abort them now."""

    def __init__(self) -> None:
        self.pressed = 0
        self.announced = 0
        """Presses the loop has acted on already."""
        self.how = "Ctrl-C"
        """How the last press came: Ctrl-C or the signal's name."""
        self._old: tuple[Any, Any] | None = None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        # Only count here: printing from a signal handler can hit a reentrant write on stdout.
        self.pressed += 1
        self.how = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name

    def install(self) -> None:
        """Take SIGINT and SIGTERM (again: ray.init() puts its own SIGTERM handler in place)."""
        old = signal.signal(signal.SIGINT, self._handler), signal.signal(signal.SIGTERM, self._handler)
        if self._old is None:
            self._old = old

    def restore(self) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old[0])
            signal.signal(signal.SIGTERM, self._old[1])
            self._old = None

    def new_presses(self) -> list[int]:
        """The presses (1, 2) not acted on yet, marked as acted on; presses past the second change nothing."""
        fresh = list(range(self.announced + 1, min(self.pressed, 2) + 1))
        self.announced = max(self.announced, min(self.pressed, 2))
        return fresh
