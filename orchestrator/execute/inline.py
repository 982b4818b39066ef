"""Trials in this process, one thread per slot, no Ray: the loop's logic tested in seconds.

Each trial still starts its own server process (the simulator, or SGLang), exactly as a Ray worker
would; only the transport is missing.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
import traceback
from pathlib import Path

from orchestrator.clock import RealClock
from orchestrator.execute.base import ExecutorInfo, Finished, last_line, made_outcome
from orchestrator.records import FailureKind, TrialSpec
from orchestrator.trial.runner import run_trial
from orchestrator.trial.server import reap_orphan

log = logging.getLogger("sweep")


class InlineExecutor:
    """Runs `slots` trials at a time in threads of this process."""

    def __init__(self, slots: int):
        self.slots = slots
        self.clock = RealClock()
        self._done: queue.Queue[Finished] = queue.Queue()
        self._running: dict[int, tuple[TrialSpec, threading.Thread]] = {}
        """Submitted and not yet returned by wait(): a slot is free once its outcome is collected, as on Ray."""
        self._lock = threading.Lock()
        self._next = 0

    def start(self) -> ExecutorInfo:
        return ExecutorInfo(address=None, gpus=0.0, slots=self.slots)

    def idle(self) -> int:
        with self._lock:
            return self.slots - len(self._running)

    def submit(self, spec: TrialSpec) -> int:
        with self._lock:
            if len(self._running) >= self.slots:
                raise RuntimeError(f"submit() with all {self.slots} slots busy")
            self._next += 1
            handle = self._next
            thread = threading.Thread(target=self._run, args=(handle, spec), name=f"trial-{spec.number}", daemon=True)
            self._running[handle] = (spec, thread)
        thread.start()
        return handle

    def _run(self, handle: int, spec: TrialSpec) -> None:
        try:
            finished = Finished(handle, spec, run_trial(spec, node=socket.gethostname()))
        except Exception as exc:  # noqa: BLE001 - a bug in the trial code becomes its outcome, as on Ray
            text = traceback.format_exc()
            log.error("trial %d raised:\n%s", spec.number, text)
            finished = Finished(
                handle,
                spec,
                made_outcome(
                    spec,
                    FailureKind.internal_error,
                    f"the trial raised {last_line(text)} (traceback in sweep.log)",
                    time.time(),
                ),
                lost=repr(exc),
            )
        self._done.put(finished)

    def wait(self, timeout_s: float) -> list[Finished]:
        try:
            first = self._done.get(timeout=timeout_s)
        except queue.Empty:
            return []
        found = [first]
        while not self._done.empty():
            found.append(self._done.get_nowait())
        with self._lock:
            for finished in found:
                self._running.pop(finished.handle, None)
        return found

    def abort(self, handle: int) -> None:
        with self._lock:
            running = self._running.get(handle)
        if running is not None:
            spec, trial = running
            threading.Thread(target=self._kill_servers, args=(trial, Path(spec.trial_dir)), daemon=True).start()

    @staticmethod
    def _kill_servers(trial: threading.Thread, trial_dir: Path) -> None:
        """Kill whatever server the trial starts until it returns (it may be between two starts, and a
        loaded machine may take minutes to start one)."""
        while trial.is_alive():
            if msg := reap_orphan(trial_dir):
                log.info(msg)
            time.sleep(0.1)

    def close(self) -> None:
        """Threads of trials still running finish on their own; their servers are supervised by the runner."""
