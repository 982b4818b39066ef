"""The `sim_factory` fixture: simulators that are always stopped and leave no process behind."""

from __future__ import annotations

import pytest
from sim_helpers import Sim, descendants, wait_gone


@pytest.fixture
def sim_factory(tmp_path):
    """Start simulators; every one is stopped and checked for leftover processes at teardown."""
    started: list[Sim] = []

    def start(*args: str, **kwargs) -> Sim:
        sim = Sim(tmp_path, *args, **kwargs)
        started.append(sim)
        return sim

    yield start
    for sim in started:
        kids = descendants(sim.proc.pid) if sim.proc.poll() is None else []
        sim.stop()
        assert wait_gone(kids + sim.workers_seen) == [], f"processes left behind by {sim.url}"
