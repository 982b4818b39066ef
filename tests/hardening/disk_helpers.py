"""Filling a filesystem to its last byte and inode, shared by the hardening tests that run on a full disk."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest


def fill(folder: Path) -> Path:
    """Take every free byte of the filesystem under `folder`: one big file, then small ones."""
    filler = folder / "filler"
    # Unbuffered, and the suppress outside the file: CI failed here (ENOSPC on the `with` line) when the
    # buffered file's close flushed the bytes the full disk had refused, after the suppress had already exited.
    with contextlib.suppress(OSError), open(filler, "wb", buffering=0) as f:
        while True:
            f.write(b"\0" * (1 << 20))
            f.flush()
    for i in range(10_000):  # the last blocks, and inodes
        try:
            (folder / f"filler-{i}").write_bytes(b"\0" * 512)
        except OSError:
            break
    with pytest.raises(OSError):  # full: a new megabyte finds no room (the glob "filler-*" removes the probe)
        (folder / "filler-probe").write_bytes(b"\0" * (1 << 20))
    return filler
