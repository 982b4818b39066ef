"""Free ports for the servers the tests start: never the same one twice in a session, never another worker's.

`bind(("127.0.0.1", 0))` then close hands out an ephemeral port the kernel may hand out again at once: CI once
gave two of a test's three simulators the same port, and the second died with "address already in use" (and
both wrote the same sim-PORT.log). Here each xdist worker owns its own band below the kernel's ephemeral range
(32768-60999 by default, where bind(0) and outgoing connections take theirs) and above Ray's worker ports
(10002-19999 by default), and hands each port out once, after checking that nothing holds it now.
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.trial.server import port_is_free


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


LOW, HIGH = 20000, min(32767, _ephemeral_low() - 1)
"""The band the workers share out: above Ray's default worker ports, below this kernel's ephemeral range."""
if HIGH - LOW < 2000:  # a kernel whose ephemeral range starts low: the band under Ray's worker ports instead
    LOW, HIGH = 2000, 9999

_given: set[int] = set()
"""Every port handed out, whatever the host: some servers (Ray's agents) bind 0.0.0.0 besides the address asked."""
_next: list[int] = []


def worker_band(worker: str | None = None, workers: int | None = None) -> range:
    """The ports of xdist worker `worker` ("gw3") of `workers`; the whole band outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "") if worker is None else worker
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) if workers is None else workers
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    size = (HIGH - LOW + 1) // max(workers, 1)
    start = LOW + (index % max(workers, 1)) * size
    return range(start, start + size)


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` nothing holds now and this process has not handed out before, on any host."""
    band = worker_band()
    start = _next[-1] if _next else band.start + os.getpid() % len(band)
    for step in range(len(band)):
        port = band.start + (start - band.start + step) % len(band)
        if port not in _given and port_is_free(host, port):
            _given.add(port)
            _next[:] = [port + 1]
            return port
    raise RuntimeError(f"no free port left on {host} in {band.start}-{band.stop - 1} (tests/ports.py)")
