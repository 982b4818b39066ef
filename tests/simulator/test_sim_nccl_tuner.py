"""The simulated ranks' tuner-plugin lines against NCCL 2.28.9's own, logged on a real H200
(docs/measurements/h200-tuner-plugin/): same lines, same prefix, and orchestrator.nccllog reads the same."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import orchestrator.simulator
from orchestrator.nccllog import TunerLoad, parse_nccl_log, tuner_problems

REAL_LOGS = Path(__file__).resolve().parents[2] / "docs" / "measurements" / "h200-tuner-plugin"
WORKER = Path(orchestrator.simulator.__file__).with_name("_rank_worker.py")
PREFIX = re.compile(r"^[^\s:\[\]]+:\d+:\d+ \[\d+\] NCCL INFO ")
SUBSYS = "INIT,ENV,TUNING"  # as in the real runs
RULES = "# collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks\nallreduce,0,65536,ring,ll,2,1,2\n"


def simulated(env: dict[str, str], world: int = 2) -> str:
    """What `world` simulated ranks print with `env` (parent pid 0: each prints, then exits)."""
    out = []
    for rank in range(world):
        done = subprocess.run(
            [
                sys.executable,
                "-I",
                "-S",
                str(WORKER),
                "test",
                str(rank),
                str(world),
                "0",
                "2.28.9+cuda13.0",
                "1024 RING LL 4",
            ],
            env={"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": SUBSYS, **env},
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        out.append(done.stdout)
    return "".join(out)


def tuner_messages(text: str, device: int) -> list[str]:
    """NCCL's own tuner-loading lines of `device`, without the prefix (not the plugin's, not the one at destroy)."""
    wanted = (
        "NCCL_TUNER_PLUGIN set by environment to ",
        "TUNER/Plugin: ",
        "Successfully loaded external tuner plugin ",
        "External tuner plugin ",
    )
    messages = [PREFIX.sub("", line) for line in text.splitlines() if re.match(rf"^\S+ \[{device}\] NCCL INFO ", line)]
    return [m for m in messages if m.startswith(wanted) and not m.startswith("TUNER/Plugin: Closing tuner")]


def renamed(load: TunerLoad, old: dict[str, str]) -> TunerLoad:
    """`load` with the real run's library paths and plugin name replaced (old -> new)."""

    def swap(value: str | None) -> str | None:
        for a, b in old.items():
            value = value.replace(a, b) if value is not None else None
        return value

    return TunerLoad(**{field: swap(getattr(load, field)) for field in TunerLoad.model_fields})


REAL_PROBE = "/tmp/nccl_tuner_min/libnccl-tuner-sglang-sweep-probe.so"
REAL_NOSYM = "/tmp/nccl_tuner_min/libnccl-tuner-sglang-sweep-nosym.so"


@pytest.mark.parametrize(
    ("case", "real_log", "make_env"),
    [
        (
            "(a) a tuner library that exists",
            "a",
            lambda tmp: (
                {
                    "NCCL_TUNER_PLUGIN": str(tmp / "libnccl-tuner-example.so"),
                    "NCCL_TUNER_CONFIG_FILE": str(tmp / "rules.csv"),
                },
                {REAL_PROBE: str(tmp / "libnccl-tuner-example.so"), "sglang-sweep-probe": "Example"},
            ),
        ),
        ("(b) a path that does not exist", "b", lambda tmp: ({"NCCL_TUNER_PLUGIN": "/nonexistent/libx.so"}, {})),
        ("(c) NCCL_TUNER_PLUGIN unset", "c", lambda tmp: ({}, {})),
        (
            "(d) a library that is no tuner",
            "d",
            lambda tmp: ({"NCCL_TUNER_PLUGIN": str(tmp / "libnccl-net.so")}, {REAL_NOSYM: str(tmp / "libnccl-net.so")}),
        ),
    ],
)
def test_the_simulated_ranks_print_and_parse_as_nccl_2_28_9_did_on_the_h200(case, real_log, make_env, tmp_path):
    (tmp_path / "libnccl-tuner-example.so").write_bytes(b"\x7fELF")
    (tmp_path / "libnccl-net.so").write_bytes(b"\x7fELF")
    (tmp_path / "rules.csv").write_text(RULES)
    env, old_to_new = make_env(tmp_path)
    real_text = (REAL_LOGS / f"{real_log}.log").read_text()
    real = parse_nccl_log(real_text)[0]
    sim_text = simulated(env)
    sim = parse_nccl_log(sim_text)

    assert all(
        PREFIX.match(line) for text in (real_text, sim_text) for line in text.splitlines() if " NCCL INFO " in line
    ), case
    want_lines = tuner_messages(real_text, 0)
    for a, b in old_to_new.items():
        want_lines = [line.replace(a, b) for line in want_lines]
    want = renamed(real.tuner, old_to_new)
    requested = env.get("NCCL_TUNER_PLUGIN")
    for device in (0, 1):
        assert tuner_messages(sim_text, device) == want_lines, case
        got = sim[device].tuner
        if real_log == "a":  # the real run's plugin was a minimal one; the simulated is ext-tuner/example
            assert got.rules == f"1 from {tmp_path / 'rules.csv'}"
            got = got.model_copy(update={"rules": None})
        assert got == want, case
    if real.tuner.requested:  # the trial's verdict on the plugin, as a user reads it
        want_problems = tuner_problems(real.tuner.requested, {0: real}, [0])
        for a, b in old_to_new.items():
            want_problems = [p.replace(a, b) for p in want_problems]
        assert tuner_problems(requested or "", sim, [0, 1]) == [
            p.replace("device 0", f"device {d}") for d in (0, 1) for p in want_problems
        ], case


def test_the_real_cases_are_the_ones_the_readme_names():
    """The four logs read as docs/measurements/h200-tuner-plugin/README.md says (guards the table above)."""
    loads = {name: parse_nccl_log((REAL_LOGS / f"{name}.log").read_text())[0].tuner for name in "abcd"}
    assert loads["a"].plugin == "sglang-sweep-probe (v5)" and loads["a"].opened == REAL_PROBE
    assert loads["b"].not_found == "/nonexistent/libx.so"
    assert loads["c"] == TunerLoad()
    assert loads["d"].internal == f"External tuner plugin {REAL_NOSYM} is unsupported"


@pytest.mark.parametrize(
    ("case", "env", "want"),
    [
        (
            "none turns the plugin off after the echo",
            {"NCCL_TUNER_PLUGIN": "none"},
            ["NCCL_TUNER_PLUGIN set by environment to none"],
        ),
        (
            "a bare name not on LD_LIBRARY_PATH: both names NCCL tries",
            {"NCCL_TUNER_PLUGIN": "example"},
            [
                "NCCL_TUNER_PLUGIN set by environment to example",
                "TUNER/Plugin: Could not find: example libnccl-tuner-example.so",
            ],
        ),
        (
            "a lib*.so name is tried as it is",
            {"NCCL_TUNER_PLUGIN": "libnccl-tuner-example.so"},
            [
                "NCCL_TUNER_PLUGIN set by environment to libnccl-tuner-example.so",
                "TUNER/Plugin: Could not find: libnccl-tuner-example.so",
            ],
        ),
        (
            "a bare name found on LD_LIBRARY_PATH as libnccl-tuner-<name>.so",
            {"NCCL_TUNER_PLUGIN": "example", "LD_LIBRARY_PATH": "{tmp}"},
            [
                "NCCL_TUNER_PLUGIN set by environment to example",
                "TUNER/Plugin: Using Example (v5)",
                "Successfully loaded external tuner plugin {tmp}/libnccl-tuner-example.so",
            ],
        ),
    ],
)
def test_how_the_simulated_nccl_looks_for_the_library(case, env, want, tmp_path):
    (tmp_path / "libnccl-tuner-example.so").write_bytes(b"\x7fELF")
    env = {k: v.format(tmp=tmp_path) for k, v in env.items()}
    assert tuner_messages(simulated(env, world=1), 0) == [w.format(tmp=tmp_path) for w in want], case


@pytest.mark.parametrize(
    ("case", "config", "want"),
    [
        ("no file", None, ["Config file {cfg} not found, using defaults"]),
        ("comments only", "# collective,min_bytes,...\n\n", ["No valid configurations found in {cfg}"]),
        (
            "two rules and a short line",
            "# c\nallreduce,0,65536,ring,ll,2,1,2\nallreduce,1,2\n"
            "allreduce, 0, 18446744073709551615, ring, simple, -1, 1, 2, 1, 0\n",
            [
                "Allocated memory for 3 configurations",
                "Loaded config: allreduce [0-65536] ring/ll channels=2 nodes=1 ranks=2 pipeOps=any regBuff=any",
                "Loaded config: allreduce [0-18446744073709551615] ring/simple channels=-1 nodes=1 ranks=2 pipeOps=1 regBuff=0",
                "Loaded 2 tuning configurations from {cfg}",
            ],
        ),
    ],
)
def test_the_example_plugin_says_what_ext_tuner_example_says_about_its_config_file(case, config, want, tmp_path):
    """Wording from NCCL's ext-tuner/example/plugin.c (pluginInit, loadConfig), NCCL_TUNING lines."""
    (tmp_path / "libnccl-tuner-example.so").write_bytes(b"\x7fELF")
    cfg = tmp_path / "rules.csv"
    if config is not None:
        cfg.write_text(config)
    text = simulated(
        {"NCCL_TUNER_PLUGIN": str(tmp_path / "libnccl-tuner-example.so"), "NCCL_TUNER_CONFIG_FILE": str(cfg)}, world=2
    )
    said = [
        PREFIX.sub("", line).removeprefix("TUNER/ExamplePlugin: ")
        for line in text.splitlines()
        if re.match(r"^\S+ \[0\] NCCL INFO TUNER/ExamplePlugin: ", line)
    ]
    init = "Initializing tuner for 1 nodes, 2 ranks, 1 NVL domains"
    assert said[: len(want) + 1] == [init, *(w.format(cfg=cfg) for w in want)], case


def test_without_the_tuning_subsystem_only_the_echo_and_the_loader_lines_show(tmp_path):
    (tmp_path / "libnccl-tuner-example.so").write_bytes(b"\x7fELF")
    lib = str(tmp_path / "libnccl-tuner-example.so")
    for subsys, want in [
        ("INIT", ["TUNER/Plugin: Using Example (v5)", f"Successfully loaded external tuner plugin {lib}"]),
        ("ENV", [f"NCCL_TUNER_PLUGIN set by environment to {lib}"]),
    ]:
        text = simulated({"NCCL_TUNER_PLUGIN": lib, "NCCL_DEBUG_SUBSYS": subsys}, world=1)
        assert tuner_messages(text, 0) == want and "ExamplePlugin" not in text, subsys
