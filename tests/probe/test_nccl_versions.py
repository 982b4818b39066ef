"""One NCCL for the probe and the server (issue 19): the version each side loaded, from NCCL's own
`NCCL version 2.30.7+cuda13.0` line (probe.json, a trial's fingerprint) or the NCCL wheel an interpreter
has installed, and the warning `sweep plan` and the report give when they differ."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest
from probe_helpers import write_spec

from orchestrator.nccllog import parse_nccl_log, release, version_mismatch
from orchestrator.probe import probe_sizes
from orchestrator.probe.result import ProbeResult, probed_nccl, write_probe

SWEEP = [sys.executable, "-m", "orchestrator.cli"]


@pytest.mark.parametrize(
    ("given", "want"), [("2.30.7+cuda13.0", "2.30.7"), ("2.30.7", "2.30.7"), (" 2.28.9+cuda12.9 ", "2.28.9")]
)
def test_release_reads_the_init_line_and_the_wheel_alike(given, want):
    assert release(given) == want


def test_same_release_no_warning_and_unknown_proves_nothing():
    assert version_mismatch("2.30.7+cuda13.0", {"trial 1": "2.30.7+cuda13.0", "server.python x": "2.30.7"}) == []
    assert version_mismatch(None, {"trial 1": "2.30.7+cuda13.0"}) == []
    assert version_mismatch("2.30.7", {"trial 1": None}) == []


def test_probe_and_server_differ_names_both_and_the_fix():
    (warning,) = version_mismatch(
        "2.28.9+cuda12.9", {"trial 1": "2.30.7+cuda13.0", "trial 2": "2.30.7+cuda13.0"}, probe_where="probe.json"
    )
    assert warning.startswith("probe.json measured NCCL 2.28.9 but trial 1, trial 2 loaded NCCL 2.30.7")
    assert "torch 2.14.1" in warning and "probe again" in warning


def test_ranks_that_loaded_two_ncclss_are_a_warning_of_their_own():
    # A trial's fingerprint joins the versions its ranks printed (observe.fingerprint).
    log = "h:1:1 [0] NCCL INFO NCCL version 2.30.7+cuda13.0\nh:2:2 [1] NCCL INFO NCCL version 2.28.9+cuda12.9\n"
    joined = ", ".join(sorted({d.version for d in parse_nccl_log(log).values() if d.version}))
    warnings = version_mismatch("2.30.7", {"trial 4": joined})
    assert warnings[0] == (
        "trial 4: its ranks loaded different NCCL versions (2.28.9, 2.30.7); every rank of a "
        "server must load one NCCL (one torch in the server's environment)"
    )
    assert any("loaded NCCL 2.28.9" in w for w in warnings[1:])


def _probe_json(workdir: Path, spec, version: str | None) -> None:
    write_probe(
        ProbeResult(
            experiment=spec.name,
            engine=spec.engine,
            host="8x H200",
            tp=spec.server.tp,
            nccl_version=version,
            sizes=probe_sizes(spec),
            settings=(),
            rows=(),
            space_settings=0,
            searched=False,
            seconds=0.0,
        ),
        workdir / "probe.json",
    )


def test_probed_nccl_reads_probe_json_and_says_none_without_one(tmp_path):
    spec = write_spec(tmp_path)
    assert probed_nccl(tmp_path) is None
    _probe_json(tmp_path, spec, "2.30.7+cuda13.0")
    assert probed_nccl(tmp_path) == "2.30.7+cuda13.0"
    (tmp_path / "probe.json").write_text("{not json")
    assert probed_nccl(tmp_path) is None


def _interpreter_with_nccl(root: Path, version: str) -> Path:
    """A real virtual environment whose installed distributions include nvidia-nccl-cu13 `version`
    (its metadata only: the versions fingerprint reads metadata, never loads the library)."""
    venv.EnvBuilder(with_pip=False).create(root)
    (site,) = root.glob("lib/python*/site-packages")
    info = site / f"nvidia_nccl_cu13-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: nvidia-nccl-cu13\nVersion: {version}\n")
    return root / "bin" / "python"


def test_sweep_plan_warns_when_server_python_loads_another_nccl_than_probe_json(tmp_path):
    python = _interpreter_with_nccl(tmp_path / "server-venv", "2.28.9")
    spec = write_spec(tmp_path, engine="sglang", server={"python": str(python)})
    workdir = tmp_path / "runs" / spec.name
    workdir.mkdir(parents=True)
    _probe_json(workdir, spec, "2.30.7+cuda13.0")
    got = subprocess.run(
        [*SWEEP, "plan", "exp.yaml", "--limit", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert got.returncode == 0, got.stderr
    text = " ".join(got.stdout.split())
    assert (
        f"warning: runs/{spec.name}/probe.json measured NCCL 2.30.7 but server.python {python} loaded NCCL 2.28.9"
    ) in text

    _probe_json(workdir, spec, "2.28.9+cuda12.9")
    got = subprocess.run(
        [*SWEEP, "plan", "exp.yaml", "--limit", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert got.returncode == 0, got.stderr
    assert "measured NCCL" not in got.stdout
