"""The simulator's command line is SGLang 0.5.23's: same flags, same rejections, same resolution."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from orchestrator.simulator import cli
from orchestrator.simulator.faults import Faults, parse_faults


def parse(*argv: str):
    return cli.parse(["--model-path", "m", *argv], {})


WELL_FORMED = {"cuda_graph_config": "{}"}
"""A value for the flags whose argparse type checks more than a number."""


def test_every_flag_of_the_help_dump_is_accepted():
    options, _ = cli.sglang_options()
    assert len(options) == 529  # 530 options in the dump, minus -h/--help
    help_text = cli._help_text()
    for opt in options:
        value = [] if opt.nargs is None else [opt.choices[0] if opt.choices else WELL_FORMED.get(opt.dest, "1")]
        for flag in opt.strings:
            assert flag in help_text
            ns, _ = parse(flag, *value) if flag != "--model-path" else cli.parse([flag, "m"], {})
            assert hasattr(ns, opt.dest)


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["--model-path", "m", "--cuda-graph-max-bs", "8"],
            "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill",
        ),
        (["--model-path", "m", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--tp-size", "8"], "the following arguments are required: --model-path"),
        (["--model-path", "m", "--tp-size", "eight"], "argument --tp-size/--tensor-parallel-size: invalid int value"),
        (["--model-path", "m", "--speculative-attention-mode", "tree"], "invalid choice: 'tree'"),
        (
            ["--model-path", "m", "--cuda-graph-config", "1"],
            "argument --cuda-graph-config: --cuda-graph-config must be a JSON object, got int",
        ),
        (["--model-path", "m", "--sim-fault", "explode"], "unknown fault 'explode'"),
        (["--model-path", "m", "--sim-noi", "0"], "unrecognized arguments: --sim-noi"),  # ours never abbreviate
    ],
)
def test_bad_command_lines_exit_2_with_argparse_messages(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse(argv, {})
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_abbreviations_resolve_as_in_sglang():
    ns, _ = parse("--tp", "8", "--speculative-algo", "EAGLE3")
    assert ns.tp_size == 8 and ns.speculative_algorithm == "EAGLE3"


def test_simulator_flags_and_faults_from_the_environment():
    _, sim = cli.parse(
        [
            "--model-path",
            "m",
            "--hardware-profile",
            "h200-nvlink",
            "--sim-seed",
            "4",
            "--sim-noise",
            "0",
            "--sim-fault",
            "env_drop",
        ],
        {"SWEEP_SIM_FAULTS": "slow_start=2;never_ready"},
    )
    assert sim.hardware_profile == "h200-nvlink" and sim.seed == 4 and sim.noise == 0
    assert sim.faults == Faults(env_drop=True, slow_start_s=2.0, never_ready=True)


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("never_ready", Faults(never_ready=True)),
        ("slow_start=1.5", Faults(slow_start_s=1.5)),
        ("crash_after_tokens=100", Faults(crash_after_tokens=100)),
        ("nccl_hang", Faults(nccl_hang_when=())),
        (
            "nccl_hang_when=NCCL_PROTO:Simple,NCCL_ALGO:Tree",
            Faults(nccl_hang_when=(("NCCL_PROTO", "Simple"), ("NCCL_ALGO", "Tree"))),
        ),
        ("oom_above_draft_tokens=16", Faults(oom_above_draft_tokens=16)),
        ("env_drop", Faults(env_drop=True)),
    ],
)
def test_fault_specs(spec, expected):
    assert parse_faults([spec]) == expected


@pytest.mark.parametrize(
    "spec", ["slow_start=soon", "crash_after_tokens=-1", "nccl_hang_when=NCCL_PROTO", "env_drop=1", "melt"]
)
def test_bad_fault_specs_name_the_spec(spec):
    with pytest.raises(ValueError, match=re.escape(spec)):
        parse_faults([spec])


def test_hang_condition_matches_all_pairs():
    f = parse_faults(["nccl_hang_when=NCCL_PROTO:Simple,NCCL_ALGO:Tree"])
    assert f.hangs({"NCCL_PROTO": "Simple", "NCCL_ALGO": "Tree"})
    assert not f.hangs({"NCCL_PROTO": "Simple"})


@pytest.mark.parametrize(
    "flags,steps,topk,ndt,warned",
    [
        ([], None, None, None, False),
        (["--speculative-algorithm", "EAGLE3"], 3, 1, 4, False),  # SGLang's auto choice for DeepSeek-style models
        (
            [
                "--speculative-algorithm",
                "eagle3",
                "--speculative-num-steps",
                "3",
                "--speculative-eagle-topk",
                "1",
                "--speculative-num-draft-tokens",
                "8",
            ],
            3,
            1,
            4,
            True,
        ),
        (
            [
                "--speculative-algorithm",
                "NEXTN",
                "--speculative-num-steps",
                "2",
                "--speculative-eagle-topk",
                "4",
                "--speculative-num-draft-tokens",
                "8",
            ],
            2,
            4,
            8,
            False,
        ),
    ],
)
def test_eagle_resolution(flags, steps, topk, ndt, warned):
    res = cli.resolve(parse(*flags)[0])
    args = res.args
    assert (args["speculative_num_steps"], args["speculative_eagle_topk"], args["speculative_num_draft_tokens"]) == (
        steps,
        topk,
        ndt,
    )
    assert any("adjusted to speculative_num_steps + 1" in w for w in res.log_warnings) == warned
    if flags:
        assert args["max_running_requests"] == 48


def test_partial_eagle_parameters_fail_with_sglangs_assertion_traceback():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.simulator",
            "--model-path",
            "m",
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-eagle-topk",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1
    assert "Traceback (most recent call last):" in proc.stderr
    assert proc.stderr.rstrip().endswith("AssertionError")
