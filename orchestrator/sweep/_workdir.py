"""The work directory: where each file lives, the lock that makes one driver its owner, sweep.log."""

from __future__ import annotations

import fcntl
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit, urlunsplit

from orchestrator import redact
from orchestrator.config.experiment import SweepSpec
from orchestrator.errors import SweepError
from orchestrator.fsio import write_json

log = logging.getLogger("sweep")

__all__ = ["Paths", "SweepLog", "WorkdirLock", "default_workdir", "without_password", "write_json"]


@dataclass(frozen=True)
class Paths:
    root: Path
    storage: str | None = None
    """An Optuna RDB URL (postgresql://...) instead of the work directory's sqlite file."""

    @property
    def optuna_url(self) -> str:
        return self.storage or f"sqlite:///{self.root / 'optuna.db'}"

    @property
    def mlflow_url(self) -> str:
        return f"sqlite:///{self.root / 'mlflow.db'}"

    @property
    def state(self) -> Path:
        return self.root / "sweep.json"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def ray_processes(self) -> Path:
        """The local Ray instance's processes, for a resumed driver to end if this one is killed."""
        return self.root / "ray-processes.json"

    @property
    def overhead(self) -> Path:
        """Per-trial orchestration timings, one JSON line each (bench/orchestration_overhead.py)."""
        return self.root / "overhead.jsonl"

    def trial_dir(self, number: int) -> Path:
        return self.root / "trials" / f"{number:04d}"

    def confirm_dir(self, i: int, who: str) -> Path:
        return self.root / "confirm" / f"{i:02d}-{who}"


def default_workdir(spec: SweepSpec) -> Path:
    return Path("runs") / spec.name


def without_password(url: str) -> str:
    """A storage URL safe to write down: postgresql://user:secret@host/db -> postgresql://user:***@host/db."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


class WorkdirLock:
    """An exclusive flock on <workdir>/.lock, held while the driver runs; the kernel drops it when we die."""

    def __init__(self, root: Path):
        self.root = root
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._file = open(self.root / ".lock", "w")  # noqa: SIM115 - held open for the sweep's lifetime
        except OSError as exc:  # a file in the way, a path under a file, /proc, no permission, a full disk
            what = "is a file, not a directory" if self.root.is_file() else (exc.strerror or str(exc)).lower()
            raise SweepError(f"--workdir {self.root}: cannot be the work directory ({what}); pass a directory "
                             f"you can write to, e.g. --workdir runs/NAME") from None
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            self._file = None
            raise SweepError(f"{self.root}: another `sweep run` is using this work directory; "
                             f"wait for it, or pass --workdir to start a separate sweep") from None

    def release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class _RedactSecrets(logging.Filter):
    """sweep.log never holds a secret from the environment, whatever a message quotes."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact.redact_text(record.getMessage())
        record.args = ()
        return True


class _QuietFileHandler(logging.FileHandler):
    """sweep.log on a full or failing disk: a line that cannot be written is dropped (the sweep's own
    writes then fail with one message) instead of logging printing a traceback for each record."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        pass


class SweepLog:
    """sweep.log: the driver's own log and the package's modules (tracking's outbox warnings among them)."""

    def __init__(self, root: Path):
        self.root = root
        self._handler: logging.Handler | None = None

    def open(self) -> None:
        handler = _QuietFileHandler(self.root / "sweep.log", encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        handler.addFilter(_RedactSecrets())
        for logger in (log, logging.getLogger("orchestrator")):
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
        self._handler = handler

    def close(self) -> None:
        if self._handler is not None:
            log.removeHandler(self._handler)
            logging.getLogger("orchestrator").removeHandler(self._handler)
            self._handler.close()
            self._handler = None
