"""The `demo_spec` fixture: experiments/demo.yaml with its spaces, loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_helpers import write_spec

from orchestrator.config.experiment import SweepSpec


@pytest.fixture
def demo_spec(tmp_path: Path) -> SweepSpec:
    return write_spec(tmp_path)
