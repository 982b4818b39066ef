"""NCCL's own lines, parsed: real texts from the H200 host (reference/measurements and a captured log)."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest

from orchestrator.probe.tuning import NcclChoice, choice_for, env_problems, parse_nccl_log, version_of


def _measurement_lines() -> list[str]:
    """The lines the H200 measurement's note quotes from its NCCL_DEBUG=INFO log (rank prefix as NCCL writes it)."""
    data = json.loads(resources.files("orchestrator.reference").joinpath(
        "measurements/h200x2-nvlink-allreduce.json").read_text())
    notes = json.dumps(data)
    return [f"h200:1:1 [0] {line}" for line in re.findall(r"'(NCCL INFO [^']*)'", notes)]


# Captured on the H200 host (rank 0), the second rank as NCCL writes it, and SGLang lines between.
CAPTURED = """\
vm:471:471 [0] NCCL INFO ENV/Plugin: Could not find: libnccl-env.so
vm:471:471 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
vm:471:471 [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.
vm:471:471 [0] NCCL INFO NCCL_MAX_NCHANNELS set by environment to 4.
vm:471:471 [0] NCCL INFO Channel 00/04 : 0
vm:471:471 [0] NCCL INFO NCCL_PROTO set by environment to LL
vm:472:472 [1] NCCL INFO NCCL version 2.28.9+cuda13.0
vm:472:472 [1] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.
vm:472:472 [1] NCCL INFO NCCL_MAX_NCHANNELS set by environment to 4.
vm:472:472 [1] NCCL INFO NCCL_PROTO set by environment to LL
[2026-11-29 13:14:07 TP0] Load weight end. type=DeepseekV3ForCausalLM
vm:471:471 [0] NCCL INFO AllReduce: 14336 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}
vm:471:471 [0] NCCL INFO AllReduce: 57344 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}
vm:471:471 [0] NCCL INFO AllReduce: 57344 Bytes -> Algo TREE proto SIMPLE channel{Lo..Hi}={0..7}
vm:472:472 [1] NCCL INFO AllReduce: 14336 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}
vm:472:472 [1] NCCL INFO AllGather: 1048576 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..3}
"""


def test_the_measurement_notes_lines():
    logs = parse_nccl_log("\n".join(_measurement_lines()))
    assert list(logs) == [0]
    assert version_of(logs) == "2.28.9+cuda13.0"
    assert dict(logs[0].set_by_environment) == {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "4"}
    assert choice_for(logs, 14336) == NcclChoice(algorithm="RING", protocol="LL", channels=1)


@pytest.mark.parametrize("line,expected", [
    ("AllReduce: 14336 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}", ("AllReduce", 14336, "RING", "LL", 1)),
    ("AllReduce: 57344 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}", ("AllReduce", 57344, "RING", "LL", 2)),
    ("AllGather: 1048576 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={2..5}",
     ("AllGather", 1048576, "RING", "SIMPLE", 4)),
    ("AllReduce: 458752 Bytes -> Algo 1 proto 2", ("AllReduce", 458752, "RING", "SIMPLE", None)),  # numeric form
    ("AllReduce: 458752 Bytes -> Algo 0 proto 1 channel{Lo..Hi}={0..3}", ("AllReduce", 458752, "TREE", "LL128", 4)),
])
def test_tuning_lines(line, expected):
    logs = parse_nccl_log(f"host:9:9 [3] NCCL INFO {line}")
    op, nbytes, algo, proto, channels = expected
    assert choice_for(logs, nbytes, op) == NcclChoice(algorithm=algo, protocol=proto, channels=channels)


@pytest.mark.parametrize("line,name,value", [
    ("NCCL_PROTO set by environment to LL", "NCCL_PROTO", "LL"),
    ("NCCL_MAX_NCHANNELS set by environment to 4.", "NCCL_MAX_NCHANNELS", "4"),
    ("NCCL_NVLS_ENABLE set by environment to 0.", "NCCL_NVLS_ENABLE", "0"),
    ("NCCL_P2P_LEVEL set by environment to SYS", "NCCL_P2P_LEVEL", "SYS"),
    ("NCCL_ALGO set by environment to ^Tree", "NCCL_ALGO", "^Tree"),
    ("NCCL_BUFFSIZE set by environment to 16777216.", "NCCL_BUFFSIZE", "16777216"),
])
def test_set_by_environment_lines(line, name, value):
    assert parse_nccl_log(f"h:1:1 [0] NCCL INFO {line}")[0].set_by_environment == {name: value}


def test_a_captured_two_rank_log():
    logs = parse_nccl_log(CAPTURED)
    assert sorted(logs) == [0, 1]
    assert all(log.version == "2.28.9+cuda13.0" for log in logs.values())
    # the first choice logged for a size is kept (later calls of the same size may differ)
    assert choice_for(logs, 57344) == NcclChoice(algorithm="RING", protocol="LL", channels=2)
    assert choice_for(logs, 1048576) is None and choice_for(logs, 1048576, "AllGather").channels == 4
    assert env_problems({"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "4", "NCCL_DEBUG": "INFO"}, logs, 2) == []


@pytest.mark.parametrize("edit,problem", [
    (("[1] NCCL INFO NCCL_PROTO set by environment to LL\n", ""), "NCCL did not report NCCL_PROTO on device(s) 1"),
    (("[1] NCCL INFO NCCL_MAX_NCHANNELS set by environment to 4.", "[1] NCCL INFO NCCL_MAX_NCHANNELS set by environment to 2."),
     "NCCL on device 1 took NCCL_MAX_NCHANNELS='2', requested '4'"),
])
def test_env_problems_name_the_device_and_the_value(edit, problem):
    logs = parse_nccl_log(CAPTURED.replace(*edit))
    assert env_problems({"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "4"}, logs, 2) == [problem]


def test_a_variable_nccl_never_mentions_proves_nothing_and_other_lines_are_ignored():
    logs = parse_nccl_log(CAPTURED + "garbage\nNCCL INFO no prefix\n")
    assert env_problems({"NCCL_P2P_LEVEL": "SYS"}, logs, 2) == []
    assert parse_nccl_log("") == {}
