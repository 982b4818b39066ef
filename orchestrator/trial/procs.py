"""The trial's reader of other processes' state (/proc, through psutil): environment, command line,
parent, children, liveness, nice value (execute/processes.py reads /proc/<pid>/stat itself to find what a
killed driver left behind). Every function answers None / False / [] for a process that is gone or
not ours, never raises for that."""

from __future__ import annotations

import os

import psutil


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def environ(pid: int) -> dict[str, str] | None:
    """The environment `pid` was exec'ed with, or None if it cannot be read."""
    try:
        return psutil.Process(pid).environ()
    except psutil.Error:
        return None


def cmdline(pid: int) -> tuple[str, ...] | None:
    """The argv of `pid` (or its process title when it set one), or None if it cannot be read."""
    try:
        parts = psutil.Process(pid).cmdline()
    except psutil.Error:
        return None
    # setproctitle leaves the title padded with spaces.
    return tuple(p.strip() for p in parts if p.strip())


def parent(pid: int) -> int | None:
    """The parent pid of `pid`, or None."""
    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return None


def exe(pid: int) -> str | None:
    """The executable of `pid`, or None when it cannot be read."""
    try:
        return psutil.Process(pid).exe() or None
    except psutil.Error:
        return None


def niceness(pid: int) -> int | None:
    """The nice value `pid` runs at (0 is the default; higher yields the CPU to others), or None."""
    try:
        return int(psutil.Process(pid).nice())
    except psutil.Error:
        return None


def start_time(pid: int) -> float | None:
    """When `pid` started (seconds since the epoch): tells a live pid from a reused one."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def descendants(pid: int) -> list[int]:
    """All live descendants of `pid` (children, grandchildren, ...), sorted."""
    try:
        return sorted(p.pid for p in psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def group_alive(pgid: int) -> bool:
    """Whether process group `pgid` has a member that is not a zombie."""
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except (OSError, psutil.Error):
            continue
    return False


def listens_on(pid: int, port: int) -> bool | None:
    """Whether `pid` or one of its descendants holds a listening TCP socket on `port`; None when that
    cannot be read (the process is gone, or another user's)."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    readable = False
    for proc in tree:
        try:
            conns = proc.net_connections(kind="tcp")
        except psutil.Error:
            continue
        readable = True
        if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns):
            return True
    return False if readable else None
