"""The `demo_spec` fixture: a probe-sized experiment over the demo's spaces (probe_helpers.write_spec)."""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_helpers import write_spec

from orchestrator.config.experiment import SweepSpec


@pytest.fixture
def demo_spec(tmp_path: Path) -> SweepSpec:
    return write_spec(tmp_path)
