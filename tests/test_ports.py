"""tests/ports.py: the ports the tests' servers get are never handed out twice and never collide across workers."""

from __future__ import annotations

import socket
from pathlib import Path

import ports


def test_a_session_never_gets_the_same_port_twice():
    """CI gave two simulators of one test the same bind(0) port; here 300 in a row are all different."""
    got = [ports.free_port() for _ in range(300)]
    assert len(set(got)) == len(got)
    assert all(p in ports.worker_band() for p in got)


def test_a_port_something_listens_on_is_skipped():
    band = ports.worker_band()
    ports.free_port()  # now the next one is tried first
    held = band.start + (ports._next[-1] - band.start) % len(band)
    with socket.socket() as s:
        s.bind(("127.0.0.1", held))
        s.listen()
        assert ports.free_port() != held


def test_the_workers_bands_are_apart_and_outside_the_ephemeral_and_ray_ranges():
    for workers in (1, 2, 3, 8):
        bands = [ports.worker_band(f"gw{i}", workers) for i in range(workers)]
        for a, b in zip(bands, bands[1:], strict=False):
            assert a.stop <= b.start
        assert bands[0].start > 19999 or bands[-1].stop - 1 < 10002  # Ray's default worker ports: 10002-19999
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        assert bands[-1].stop - 1 < low
        assert all(len(b) >= 1000 for b in bands)
