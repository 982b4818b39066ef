"""Issue 23, item 8: the validation gaps, each through `sweep validate` (typer's runner, in process) or the
command it concerns: one message naming the field, the rule and the fix, exit code 2, never a traceback."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest
from e2e_helpers import demo_experiment, write_experiment
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.config import experiment as spec_mod
from orchestrator.config.flags import dash_problem
from orchestrator.config.yamlfile import parse
from orchestrator.simulator.cli import sglang_parser


def _validate(tmp_path: Path, text: str | None = None, **overrides: object) -> tuple[int, str]:
    exp = write_experiment(tmp_path, demo_experiment(**overrides))
    if text is not None:
        exp.write_text(exp.read_text() + text)
    result = CliRunner().invoke(app, ["validate", str(exp)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result.exit_code, " ".join(result.output.split())


def _refused(tmp_path: Path, text: str | None = None, **overrides: object) -> str:
    code, output = _validate(tmp_path, text, **overrides)
    assert code == 2, output
    assert output.count("error:") == 1, output
    return output


@pytest.mark.parametrize(
    "value",
    ["--foo", "-x", "--", "-1e3", "-5x", "--x=1", "--model-path", "-1", "-0.5", "-.5", "-", "- x", "--a b", "plain"],
)
def test_a_flag_value_that_starts_with_a_dash_is_refused_where_sglangs_parser_refuses_it(value: str) -> None:
    """The rule against an argparse parser of `sglang serve` 0.5.23's own flags (orchestrator/simulator/cli.py,
    built from the --help dump): a value that parser reads as another option is refused, every other one
    passes. The word follows its flag, as the launch plan writes it (config/render.py::flag_args)."""
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            sglang_parser().parse_args(["--model-path", "m", "--served-model-name", value])
            parser_takes_it = True
        except SystemExit:
            parser_takes_it = False
    assert (dash_problem(value) is None) == parser_takes_it


def test_a_server_flag_value_starting_with_dashes_is_one_message(tmp_path: Path) -> None:
    text = _refused(tmp_path, server={"flags": {"served-model-name": "--enable-metrics"}})
    assert "server.flags.served-model-name: the value '--enable-metrics' starts with '-', so SGLang's parser" in text


def test_a_model_path_starting_with_dashes_is_one_message(tmp_path: Path) -> None:
    text = _refused(tmp_path, server={"model": "--tp-size"})
    assert "server.model: the value '--tp-size' starts with '-'" in text


def test_a_server_python_that_does_not_exist_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "venv" / "bin" / "python"
    text = _refused(tmp_path, server={"python": str(missing)})
    assert f"server.python: {missing} does not exist on this machine; give the interpreter" in text
    plain = tmp_path / "not-executable"
    plain.write_text("")
    os.chmod(plain, 0o644)
    text = _refused(tmp_path, server={"python": str(plain)})
    assert f"server.python: {plain} is not executable on this machine" in text


def test_a_client_python_that_does_not_exist_is_named(tmp_path: Path) -> None:
    text = _refused(tmp_path, benchmark={"client_python": "no-such-python-here"})
    assert "benchmark.client_python: no-such-python-here does not exist on this machine" in text


@pytest.mark.parametrize("host", ["192.0.2.1", "no-such-host.invalid"])
def test_a_server_host_that_is_not_an_address_of_this_machine_is_refused(tmp_path: Path, host: str) -> None:
    """192.0.2.1 is TEST-NET-1 (RFC 5737): no machine has it. Only a bind is tried, nothing is sent."""
    text = _refused(tmp_path, server={"host": host})
    assert f"server.host: {host} is not an address" in text and "keep 127.0.0.1" in text


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])  # noqa: S104 - a bind test, nothing listens
def test_loopback_and_every_interface_are_addresses_of_this_machine(tmp_path: Path, host: str) -> None:
    code, output = _validate(tmp_path, server={"host": host, "python": None})
    assert code == 0, output


def test_plan_still_plans_for_another_host(tmp_path: Path) -> None:
    """`sweep plan` starts nothing here: it may plan an experiment whose interpreter lives on the GPU hosts."""
    exp = write_experiment(tmp_path, demo_experiment(server={"python": "/opt/venv/bin/python"}))
    result = CliRunner().invoke(app, ["plan", str(exp), "--limit", "1"])
    assert result.exit_code == 0, result.output


def test_wall_time_1_30_is_not_read_as_90_seconds(tmp_path: Path) -> None:
    """YAML 1.1 (PyYAML's default) reads 1:30 as base 60, the integer 90: the sweep would have run 90 s."""
    assert parse("wall_time: 1:30\nport: 190:20\n", "x") == {"wall_time": "1:30", "port": "190:20"}
    assert parse("a: 90\nb: 1.5\nc: 0x1f\nd: .inf\ne: -3\n", "x") == {
        "a": 90,
        "b": 1.5,
        "c": 31,
        "d": float("inf"),
        "e": -3,
    }
    exp = write_experiment(tmp_path, demo_experiment())
    exp.write_text(exp.read_text().replace("wall_time: 30m", "wall_time: 1:30"))
    assert "wall_time: 1:30" in exp.read_text()
    result = CliRunner().invoke(app, ["validate", str(exp)])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert "budget.wall_time" in text and "base-60 (1:30 = 90 s); write the unit, e.g. 1.5h or 90m" in text


@pytest.mark.parametrize("where", ["model", "flags", "env"])
def test_a_right_to_left_override_in_a_value_that_reaches_argv_is_refused(tmp_path: Path, where: str) -> None:
    """U+202E makes `--served-model-name abc\u202edcba` read differently on screen from what runs."""
    server = (
        {"model": "Kimi\u202e5.2K"}
        if where == "model"
        else (
            {"flags": {"served-model-name": "x\u202ey"}}
            if where == "flags"
            else {"env": {"NCCL_TUNER_CONFIG_FILE": "/etc/t\u202eune.conf"}}
        )
    )
    text = _refused(tmp_path, server=server)
    assert "U+202E RIGHT-TO-LEFT OVERRIDE" in text and f"server.{where}" in text


@pytest.mark.parametrize(
    "command",
    [["status"], ["run", "{exp}"], ["export", "-o", "{out}"], ["sync"], ["report"], ["ui"], ["probe", "{exp}"]],
)
def test_an_empty_workdir_is_refused_not_taken_as_the_current_directory(tmp_path: Path, command: list[str]) -> None:
    exp = write_experiment(tmp_path, demo_experiment())
    argv = [a.format(exp=exp, out=tmp_path / "c.env") for a in command]
    result = CliRunner().invoke(app, [*argv, "--workdir", ""])
    text = " ".join(result.output.replace("│", " ").split())  # click's error box
    assert result.exit_code == 2, text
    assert "Invalid value for '--workdir'" in text and "an empty path, which would mean the current directory" in text
    assert not (tmp_path / "runs").exists() and spec_mod.load(exp).name == "demo"


def test_a_probe_json_from_another_machine_is_not_reused_on_engine_sglang(tmp_path: Path) -> None:
    """On engine sglang probe.json's `host` says only "this host (8 CUDA device(s), ...)": one copied with a
    work directory from another machine was reused. It now records the machine's host name; a file from
    another machine, or one that names none (written before), is probed again."""
    import socket

    from orchestrator.probe import run_probe
    from orchestrator.probe.result import read_probe
    from orchestrator.sweep._probe_stage import reusable

    spec = spec_mod.load(
        write_experiment(tmp_path, demo_experiment(name="elsewhere", probe={"enabled": True, "budget": 12}))
    )
    probed = run_probe(spec, tmp_path / "wd", budget=12)
    assert probed.machine == "" and reusable(probed, spec) is None  # the simulator's host is its profile
    real = spec.model_copy(update={"engine": "sglang"})
    here = probed.model_copy(update={"engine": "sglang", "machine": socket.gethostname()})
    assert reusable(here, real) is None
    for other in ("gpu-node-7", ""):
        why = reusable(here.model_copy(update={"machine": other}), real) or ""
        assert f"not on this one ({socket.gethostname()})" in why, why
    old = tmp_path / "old-probe.json"  # a file written before the field existed still reads
    old.write_text((tmp_path / "wd" / "probe.json").read_text().replace('"machine": "",', ""))
    assert read_probe(old).machine == ""
