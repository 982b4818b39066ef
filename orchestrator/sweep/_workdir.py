"""The work directory: where each file lives, the lock that makes one driver its owner, sweep.log."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit, urlunsplit

from orchestrator import redact
from orchestrator.config.experiment import SweepSpec
from orchestrator.errors import StateFileError, SweepError
from orchestrator.fsio import write_json

log = logging.getLogger("sweep")

__all__ = [
    "DATABASES",
    "STATE_FILES",
    "Paths",
    "SweepLog",
    "WorkdirLock",
    "adopt",
    "check_databases",
    "check_state_files",
    "default_workdir",
    "origin_of",
    "rebase_artifacts",
    "without_password",
    "write_json",
]


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


DATABASES = ("optuna.db", "mlflow.db")
"""The sqlite files a work directory may hold (Optuna's study, MLflow's store and registry)."""


def check_databases(root: Path, names: tuple[str, ...] = DATABASES) -> None:
    """StateFileError naming the file and the fix when one of the work directory's sqlite databases exists
    but cannot be used: a directory, unreadable, not SQLite, damaged (PRAGMA quick_check) or locked."""
    for name in names:
        path = root / name
        if not path.exists():
            continue
        if path.is_dir():
            raise StateFileError(
                f"{path} is a directory, where the sweep keeps its {_ROLE.get(name, 'database')}; move it away "
                "and restore the file from a backup, or start a new sweep in another --workdir"
            )
        if path.stat().st_size == 0:  # SQLite reads an empty file as an empty database; a sweep's never is one
            raise StateFileError(
                f"{path} is empty (0 bytes), where the sweep keeps its {_ROLE.get(name, 'database')}: "
                "it was emptied or cut short; restore it from a backup, delete it if no sweep ran "
                "here, or start a new sweep in another --workdir"
            )
        try:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
                verdict = db.execute("PRAGMA quick_check").fetchone()
        except sqlite3.Error as exc:
            verdict = (str(exc),)
        if verdict and verdict[0] != "ok":
            text = str(verdict[0]).splitlines()[0][:200]
            if "locked" in text:
                raise StateFileError(
                    f"{path} is locked by another process ({text}); wait for the sweep or "
                    "command using it to finish, or stop it, and run this again"
                )
            raise StateFileError(
                f"{path} is not a readable SQLite database ({text}): it was cut short, "
                f"overwritten or damaged, so the sweep's {_ROLE.get(name, 'database')} cannot be read; restore it "
                "from a backup, or start a new sweep in another --workdir"
            )


def origin_of(root: Path) -> Path | None:
    """The folder sweep.json says this work directory's own databases were in, when that is not `root`:
    the directory was moved or copied (sweep.json records absolute sqlite URLs). None otherwise."""
    try:
        data = json.loads((root / "sweep.json").read_bytes())
    except (OSError, ValueError):
        return None
    here = root.resolve()
    for key, name in (("optuna_storage", "optuna.db"), ("tracking_uri", "mlflow.db")):
        url = data.get(key) if isinstance(data, dict) else None
        if isinstance(url, str) and url.startswith("sqlite:///"):
            recorded = Path(url.removeprefix("sqlite:///"))
            if recorded.name == name and (here / name).is_file() and recorded.parent != here:
                return recorded.parent
    return None


def rebase_artifacts(root: Path, origin: Path) -> int:
    """Point the artifact locations in `root`'s own mlflow.db that lie under `origin`/mlartifacts at
    `root`/mlartifacts (MLflow records them as absolute file URIs); return how many rows changed."""
    old, new = (origin / "mlartifacts").as_uri(), (root.resolve() / "mlartifacts").as_uri()
    changed = 0
    with contextlib.closing(sqlite3.connect(root / "mlflow.db", timeout=30)) as db, db:
        for table, column in (("experiments", "artifact_location"), ("runs", "artifact_uri")):
            changed += db.execute(
                f"UPDATE {table} SET {column} = ? || substr({column}, ?) "  # noqa: S608 - fixed names
                f"WHERE {column} = ? OR substr({column}, 1, ?) = ?",
                (new, len(old) + 1, old, len(old) + 1, old + "/"),
            ).rowcount
    return changed


def adopt(root: Path) -> Path | None:
    """When `root` was moved or copied: make its own mlflow.db record its own artifact folder (so a resumed
    sweep never writes into, and export never reads from, the original), say so, and return the origin."""
    origin = origin_of(root)
    if origin is None:
        return None
    how = "copied" if (origin / "sweep.json").exists() else "moved"
    try:
        rebased = rebase_artifacts(root, origin) if (root / "mlflow.db").is_file() else 0
    except sqlite3.Error as exc:
        raise StateFileError(
            f"{root} was {how} from {origin}, and its mlflow.db cannot be updated to its new "
            f"place ({exc}); check the file is writable, or start a new sweep in another "
            "--workdir"
        ) from None
    log.warning(
        "%s was %s from %s: reading its own optuna.db and mlflow.db%s",
        root,
        how,
        origin,
        f" ({rebased} artifact location(s) now point into it)" if rebased else "",
    )
    return origin


STATE_FILES = (
    "sweep.json",
    "summary.json",
    "experiment.json",
    "ray-processes.json",
    "overhead.jsonl",
    "sweep.log",
    "report.html",
    "champion.env",
)
"""Files the driver writes at the top of the work directory (replaced atomically or appended)."""


def check_state_files(root: Path) -> None:
    """StateFileError when a directory (or anything but a file) stands where the driver writes one of its
    files: the write would fail half-way through the sweep instead."""
    for name in STATE_FILES:
        path = root / name
        if path.exists() and not path.is_file():
            raise StateFileError(
                f"{path} is a directory (or not a regular file), where the sweep writes its "
                f"{name}; move it away and run the same command again"
            )


_ROLE = {"optuna.db": "study (Optuna)", "mlflow.db": "MLflow runs and registry"}


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
            if (self.root / ".lock").is_dir():
                raise SweepError(
                    f"{self.root / '.lock'} is a directory, where the sweep keeps its lock file; "
                    "remove it (rmdir) and run the same command again"
                ) from None
            what = "is a file, not a directory" if self.root.is_file() else (exc.strerror or str(exc)).lower()
            raise SweepError(
                f"--workdir {self.root}: cannot be the work directory ({what}); pass a directory "
                f"you can write to, e.g. --workdir runs/NAME"
            ) from None
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            self._file = None
            raise SweepError(
                f"{self.root}: another `sweep run` is using this work directory; "
                f"wait for it, or pass --workdir to start a separate sweep"
            ) from None
        try:
            check_state_files(self.root)
            check_databases(self.root)  # before anything reads them: one message, not SQLAlchemy's traceback
            adopt(self.root)
        except StateFileError:
            self.release()
            raise

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
