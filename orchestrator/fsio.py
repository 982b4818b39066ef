"""Atomic writes for what users and resume rely on: readers see the old file or the new one, never a part."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_atomic(path: str | os.PathLike[str], text: str, mode: int | None = None) -> Path:
    """Write `text` to `path`: a temporary file in the same folder, fsynced, then `os.replace`d over
    it, then the folder fsynced so the rename survives a crash. The file gets `mode`, or keeps the
    mode of the file it replaces (0644 for a new one)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates the file 0600.
        if mode is None:
            mode = target.stat().st_mode & 0o777 if target.exists() else 0o644
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:
        dir_fd = os.open(target.parent, os.O_RDONLY)
    except OSError:
        return target
    try:
        with contextlib.suppress(OSError):
            os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return target


def write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """`obj` as indented JSON with sorted keys (values JSON lacks, such as paths, as strings), atomically."""
    return write_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str))


def disk_failing(text: str) -> bool:
    """Whether an error's text is a full or failing disk: sqlite's SQLITE_FULL / SQLITE_IOERR words
    ("database or disk is full", "disk I/O error") or the OS's ENOSPC. One rule for the Optuna and the
    MLflow stores' messages."""
    return ("disk" in text and ("full" in text or "I/O" in text)) or "No space left on device" in text
