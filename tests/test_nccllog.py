"""NCCL's own lines, parsed once for the trial and the probe: real texts from the H200 host (reference/measurements
and a captured log), the tuner plugin's lines as NCCL 2.28.9 printed them there
(docs/measurements/h200-tuner-plugin/), and older NCCL's and ext-tuner/example's tuner lines from their source."""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import pytest

from orchestrator.nccllog import (
    DeviceLog,
    NcclChoice,
    TunerLoad,
    choice_for,
    env_problems,
    parse_nccl_log,
    tuner_problems,
    version_of,
)


def _measurement_lines() -> list[str]:
    """The lines the H200 measurement's note quotes from its NCCL_DEBUG=INFO log (rank prefix as NCCL writes it)."""
    data = json.loads(
        resources.files("orchestrator.reference").joinpath("measurements/h200x2-nvlink-allreduce.json").read_text()
    )
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
    assert logs[0].env == {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "4"}
    assert choice_for(logs, 14336) == NcclChoice(algorithm="RING", protocol="LL", channels=1)


@pytest.mark.parametrize(
    "line,expected",
    [
        ("AllReduce: 14336 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}", ("AllReduce", 14336, "RING", "LL", 1)),
        ("AllReduce: 57344 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}", ("AllReduce", 57344, "RING", "LL", 2)),
        (
            "AllGather: 1048576 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={2..5}",
            ("AllGather", 1048576, "RING", "SIMPLE", 4),
        ),
        ("AllReduce: 458752 Bytes -> Algo 1 proto 2", ("AllReduce", 458752, "RING", "SIMPLE", None)),  # numeric form
        ("AllReduce: 458752 Bytes -> Algo 0 proto 1 channel{Lo..Hi}={0..3}", ("AllReduce", 458752, "TREE", "LL128", 4)),
    ],
)
def test_tuning_lines(line, expected):
    logs = parse_nccl_log(f"host:9:9 [3] NCCL INFO {line}")
    op, nbytes, algo, proto, channels = expected
    assert choice_for(logs, nbytes, op) == NcclChoice(algorithm=algo, protocol=proto, channels=channels)


@pytest.mark.parametrize(
    "line,name,value",
    [
        ("NCCL_PROTO set by environment to LL", "NCCL_PROTO", "LL"),
        ("NCCL_MAX_NCHANNELS set by environment to 4.", "NCCL_MAX_NCHANNELS", "4"),
        ("NCCL_NVLS_ENABLE set by environment to 0.", "NCCL_NVLS_ENABLE", "0"),
        ("NCCL_P2P_LEVEL set by environment to SYS", "NCCL_P2P_LEVEL", "SYS"),
        ("NCCL_ALGO set by environment to ^Tree", "NCCL_ALGO", "^Tree"),
        ("NCCL_BUFFSIZE set by environment to 16777216.", "NCCL_BUFFSIZE", "16777216"),
    ],
)
def test_set_by_environment_lines(line, name, value):
    assert parse_nccl_log(f"h:1:1 [0] NCCL INFO {line}")[0].env == {name: value}


def test_a_captured_two_rank_log():
    logs = parse_nccl_log(CAPTURED)
    assert sorted(logs) == [0, 1]
    assert all(log.version == "2.28.9+cuda13.0" for log in logs.values())
    # the first choice logged for a size is kept (later calls of the same size may differ)
    assert choice_for(logs, 57344) == NcclChoice(algorithm="RING", protocol="LL", channels=2)
    assert choice_for(logs, 1048576) is None and choice_for(logs, 1048576, "AllGather").channels == 4
    assert env_problems({"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "4", "NCCL_DEBUG": "INFO"}, logs, range(2)) == []


@pytest.mark.parametrize(
    "edit,problem",
    [
        (
            ("[1] NCCL INFO NCCL_PROTO set by environment to LL\n", ""),
            "NCCL did not report NCCL_PROTO on device(s) 1 (reported on 0)",
        ),
        (
            (
                "[1] NCCL INFO NCCL_MAX_NCHANNELS set by environment to 4.",
                "[1] NCCL INFO NCCL_MAX_NCHANNELS set by environment to 2.",
            ),
            "NCCL on device 1 took NCCL_MAX_NCHANNELS='2', requested '4'",
        ),
    ],
)
def test_env_problems_name_the_device_and_the_value(edit, problem):
    logs = parse_nccl_log(CAPTURED.replace(*edit))
    assert env_problems({"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "4"}, logs, range(2)) == [problem]


def test_a_variable_nccl_never_mentions_proves_nothing_and_other_lines_are_ignored():
    logs = parse_nccl_log(CAPTURED + "garbage\nNCCL INFO no prefix\n")
    assert env_problems({"NCCL_P2P_LEVEL": "SYS"}, logs, range(2)) == []
    assert parse_nccl_log("") == {}


def test_per_device_summary_of_a_server_log():
    """What a trial records per device: hosts, pids, and how many calls took each algorithm/protocol."""
    logs = parse_nccl_log(CAPTURED + "[default1]:vm:472:472 [1] NCCL INFO AllReduce: 14336 Bytes -> Algo 1 proto 0\n")
    assert logs[0].pids == (471,) and logs[0].hosts == ("vm",)
    assert logs[0].env == {"NCCL_NVLS_ENABLE": "0", "NCCL_MAX_NCHANNELS": "4", "NCCL_PROTO": "LL"}
    assert logs[0].collectives == {"AllReduce RING/LL": 2, "AllReduce TREE/SIMPLE": 1}
    assert logs[0].max_bytes == {"AllReduce RING/LL": 57344, "AllReduce TREE/SIMPLE": 57344}
    # torchrun's "[default1]:" prefix; the numeric form counts under NCCL's names
    assert logs[1].collectives == {"AllReduce RING/LL": 2, "AllGather RING/SIMPLE": 1}


def test_a_device_that_printed_nothing_is_named_when_the_world_is_given():
    one = parse_nccl_log("\n".join(line for line in CAPTURED.splitlines() if "[1]" not in line))
    assert env_problems({"NCCL_PROTO": "LL"}, one, range(2)) == [
        "NCCL did not report NCCL_PROTO on device(s) 1 (reported on 0)"
    ]
    assert env_problems({"NCCL_PROTO": "LL"}, one, one) == []


# --- the tuner plugin ------------------------------------------------------------------------------

SO = "/opt/nccl/libnccl-tuner-example.so"
CSV = "/srv/nccl-tuner.csv"

TUNER_CASES = [
    (
        "2.2x loaded",
        [
            f"TUNER/Plugin: Plugin name set by env to {SO}",
            "TUNER/Plugin: Using Example (v5)",
            "TUNER/ExamplePlugin: Initializing tuner for 1 nodes, 2 ranks, 0 NVL domains",
            f"TUNER/ExamplePlugin: Loaded 6 tuning configurations from {CSV}",
        ],
        TunerLoad(opened=SO, plugin="Example (v5)", rules=f"6 from {CSV}"),
    ),
    (
        "2.2x not found",
        [f"TUNER/Plugin: Could not find: {SO} libnccl-tuner-{SO}.so. Using internal tuner plugin."],
        TunerLoad(
            not_found=f"{SO} libnccl-tuner-{SO}.so",
            internal=f"TUNER/Plugin: Could not find: {SO} libnccl-tuner-{SO}.so. Using internal tuner plugin.",
        ),
    ),
    ("2.19 loaded", ["TUNER/Plugin: Using tuner plugin Example"], TunerLoad(plugin="Example")),
    (
        "2.19 no symbol",
        [
            "TUNER/Plugin: Failed to find ncclTunerPlugin_v3 symbol.",
            "TUNER/Plugin: Failed to find ncclTunerPlugin_v2 symbol, using internal tuner instead.",
        ],
        TunerLoad(internal="TUNER/Plugin: Failed to find ncclTunerPlugin_v2 symbol, using internal tuner instead."),
    ),
    # NCCL_TUNER_PLUGIN unset: NCCL's search for its default libnccl-tuner.so is no failed load
    (
        "net plugin's tuner instead",
        [
            "TUNER/Plugin: Could not find: libnccl-tuner.so. Using internal tuner plugin.",
            "TUNER/Plugin: Using nccl_ofi_tuner (v3)",
        ],
        TunerLoad(plugin="nccl_ofi_tuner (v3)"),
    ),
    (
        "2.28 unsupported",
        [f"External tuner plugin {SO} is unsupported"],
        TunerLoad(internal=f"External tuner plugin {SO} is unsupported"),
    ),
    (
        "2.2x requested, loaded",
        [
            f"TUNER/Plugin: NCCL_TUNER_PLUGIN set to {SO}",
            f"TUNER/Plugin: Plugin name set by env to {SO}",
            "TUNER/Plugin: Using Example (v4)",
        ],
        TunerLoad(requested=SO, opened=SO, plugin="Example (v4)"),
    ),
]


@pytest.mark.parametrize(("lines", "expected"), [c[1:] for c in TUNER_CASES], ids=[c[0] for c in TUNER_CASES])
def test_tuner_plugin_lines(lines, expected):
    logs = parse_nccl_log("".join(f"vm:471:500 [0] NCCL INFO {line}\n" for line in lines))
    assert logs[0].tuner == expected


def _two_devices(*lines: str, on: tuple[int, ...] = (0, 1)) -> str:
    return "".join(f"vm:{470 + d}:{470 + d} [{d}] NCCL INFO {line}\n" for d in on for line in lines)


TUNER_PROBLEMS = [
    (
        "every device uses it",
        _two_devices(f"TUNER/Plugin: Plugin name set by env to {SO}", "TUNER/Plugin: Using Example (v5)"),
        [],
    ),
    (
        "one device fell back",
        _two_devices(f"TUNER/Plugin: Plugin name set by env to {SO}", "TUNER/Plugin: Using Example (v5)", on=(0,))
        + _two_devices(f"TUNER/Plugin: Could not find: {SO}. Using internal tuner plugin.", on=(1,)),
        [f"NCCL_TUNER_PLUGIN={SO} was not loaded on device 1: NCCL could not open {SO} and used its internal tuner"],
    ),
    (
        "a net plugin's tuner is not the requested one",
        _two_devices(
            f"TUNER/Plugin: Could not find: {SO}. Using internal tuner plugin.",
            "TUNER/Plugin: Using nccl_ofi_tuner (v3)",
            on=(0,),
        )
        + _two_devices("TUNER/Plugin: Using Example (v5)", on=(1,)),
        [
            f"NCCL_TUNER_PLUGIN={SO} was not loaded on device 0: NCCL could not open {SO} and used nccl_ofi_tuner (v3) "
            f"instead"
        ],
    ),
    (
        "no TUNER line on one device",
        _two_devices("TUNER/Plugin: Using Example (v5)", on=(1,)),
        [
            f"NCCL_TUNER_PLUGIN={SO}: device 0 logged no 'TUNER/Plugin: Using <name>' line (NCCL_DEBUG=INFO with INIT or "
            f"TUNING in NCCL_DEBUG_SUBSYS prints it), so nothing proves the plugin loaded there"
        ],
    ),
]


@pytest.mark.parametrize(("log", "problems"), [c[1:] for c in TUNER_PROBLEMS], ids=[c[0] for c in TUNER_PROBLEMS])
def test_tuner_problems_name_the_device_and_the_reason(log, problems):
    assert tuner_problems(SO, parse_nccl_log(log), range(2)) == problems


def test_the_tuner_variables_are_not_expected_as_set_by_environment_lines():
    logs = parse_nccl_log(_two_devices("TUNER/Plugin: Using Example (v5)"))
    assert env_problems({"NCCL_TUNER_PLUGIN": SO, "NCCL_TUNER_CONFIG_FILE": CSV}, logs, range(2)) == []


# --- NCCL 2.28.9's own tuner lines, logged on the H200 host (docs/measurements/h200-tuner-plugin/) -------

H200_TUNER_LOGS = Path(__file__).resolve().parents[1] / "docs" / "measurements" / "h200-tuner-plugin"
PROBE_SO = "/tmp/nccl_tuner_min/libnccl-tuner-sglang-sweep-probe.so"
NOSYM_SO = "/tmp/nccl_tuner_min/libnccl-tuner-sglang-sweep-nosym.so"


def _h200_log(name: str) -> dict[int, DeviceLog]:
    logs = parse_nccl_log((H200_TUNER_LOGS / f"{name}.log").read_text())
    assert list(logs) == [0] and version_of(logs) == "2.28.9+cuda13.0"
    assert logs[0].calls == ()  # one rank: NCCL tunes nothing, so no per-size TUNING line
    return logs


def test_the_h200_tuner_plugin_logs():
    """(a) the plugin loaded, with its name and library; (b) a path that is not there; (c) no tuner variable."""
    loaded = _h200_log("a")
    assert loaded[0].tuner == TunerLoad(requested=PROBE_SO, opened=PROBE_SO, plugin="sglang-sweep-probe (v5)")
    assert tuner_problems(PROBE_SO, loaded, [0]) == []
    # NCCL 2.28.9 echoes NCCL_TUNER_PLUGIN, not NCCL_TUNER_CONFIG_FILE (only the plugin reads that)
    assert loaded[0].env["NCCL_TUNER_PLUGIN"] == PROBE_SO and "NCCL_TUNER_CONFIG_FILE" not in loaded[0].env
    assert env_problems({"NCCL_TUNER_PLUGIN": PROBE_SO, "NCCL_TUNER_CONFIG_FILE": "/tmp/x.csv"}, loaded, [0]) == []

    missing = _h200_log("b")
    assert missing[0].tuner == TunerLoad(requested="/nonexistent/libx.so", not_found="/nonexistent/libx.so")
    assert tuner_problems("/nonexistent/libx.so", missing, [0]) == [
        "NCCL_TUNER_PLUGIN=/nonexistent/libx.so was not loaded on device 0: NCCL could not open "
        "/nonexistent/libx.so and used its internal tuner"
    ]

    # NCCL still looks for its default libnccl-tuner.so and says it could not find it: no plugin asked for
    assert "TUNER/Plugin: Could not find: libnccl-tuner.so" in (H200_TUNER_LOGS / "c.log").read_text()
    assert _h200_log("c")[0].tuner == TunerLoad()


def test_the_h200_library_that_is_no_tuner():
    logs = _h200_log("d")
    said = f"External tuner plugin {NOSYM_SO} is unsupported"
    assert logs[0].tuner == TunerLoad(requested=NOSYM_SO, internal=said)
    assert tuner_problems(NOSYM_SO, logs, [0]) == [
        f"NCCL_TUNER_PLUGIN={NOSYM_SO} was not loaded on device 0: NCCL said {said!r} and used its internal tuner"
    ]


def test_a_requested_default_name_that_is_not_found_is_kept():
    """Only the default search with NCCL_TUNER_PLUGIN unset is dropped: asked for by name, a miss counts."""
    logs = parse_nccl_log(
        "vm:1:1 [0] NCCL INFO NCCL_TUNER_PLUGIN set by environment to libnccl-tuner.so\n"
        "vm:1:1 [0] NCCL INFO TUNER/Plugin: Could not find: libnccl-tuner.so\n"
    )
    assert logs[0].tuner == TunerLoad(requested="libnccl-tuner.so", not_found="libnccl-tuner.so")
