"""How the simulator resolves launches where SGLang 0.5.23 lets one setting win over another: the
--cuda-graph-config JSON over the disable flags, and the EAGLE settings SGLang completes by itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.simulator import cli, evaluate, load_hardware, load_model, params_from_launch

HELP = Path(cli.__file__).resolve().parents[1] / "reference" / "sglang_0_5_23" / "launch_server_help.txt"
PCIE, KIMI = load_hardware("pcie-rtxpro6000-x8"), load_model("kimi-k2.5")
BASE = ["--model-path", "m", "--tp", "8"]
FULL = '{"decode":{"backend":"full"}}'


def test_the_reference_help_says_the_json_config_wins():
    assert "JSON wins over the per-phase --cuda-graph-* convenience flags and over legacy flags" in " ".join(
        HELP.read_text(encoding="utf-8").split()
    )


@pytest.mark.parametrize(
    "flags,graph,max_bs",
    [
        ([], True, None),
        (["--disable-cuda-graph"], False, None),
        (["--disable-cuda-graph", "--cuda-graph-config", FULL], True, None),  # issue 11: JSON wins
        (["--cuda-graph-config", FULL, "--disable-cuda-graph"], True, None),  # whatever the order
        (["--disable-decode-cuda-graph", "--cuda-graph-config", FULL], True, None),
        (["--cuda-graph-backend-decode", "disabled", "--cuda-graph-config", FULL], True, None),
        (["--disable-cuda-graph", "--cuda-graph-config", '{"decode":{"backend":"breakable"}}'], True, None),
        (["--cuda-graph-config", '{"decode":{"backend":"disabled"}}'], False, None),
        (
            ["--cuda-graph-backend-decode", "full", "--cuda-graph-config", '{"decode":{"backend":"disabled"}}'],
            False,
            None,
        ),
        # Keys the JSON does not name stay with the flags.
        (["--disable-cuda-graph", "--cuda-graph-config", '{"decode":{"max_bs":64}}'], False, 64),
        (["--disable-cuda-graph", "--cuda-graph-config", '{"prefill":{"backend":"full"}}'], False, None),
        (["--cuda-graph-max-bs-decode", "16"], True, 16),
        (["--cuda-graph-max-bs-decode", "16", "--cuda-graph-config", '{"decode":{"max_bs":64}}'], True, 64),
    ],
)
def test_cuda_graph_config_resolves_as_sglang(flags, graph, max_bs):
    params = params_from_launch(BASE + flags, {})
    assert (params["cuda_graph"], params["cuda_graph_max_bs"]) == (graph, max_bs)


def test_a_launch_the_json_config_overrides_runs_as_fast_as_one_with_graphs():
    with_graphs = evaluate(params_from_launch(BASE, {}), PCIE, KIMI)
    overridden = evaluate(
        params_from_launch(BASE + ["--disable-cuda-graph", "--cuda-graph-config", FULL], {}), PCIE, KIMI
    )
    eager = evaluate(params_from_launch(BASE + ["--disable-cuda-graph"], {}), PCIE, KIMI)
    assert overridden == with_graphs
    assert eager.decode_tok_s < overridden.decode_tok_s


EAGLE = BASE + ["--speculative-algorithm", "EAGLE3"]


@pytest.mark.parametrize(
    "flags,expected",
    [
        # Steps and top-k 1 without draft tokens: SGLang completes them to steps + 1, with its warning.
        (["--speculative-num-steps", "3", "--speculative-eagle-topk", "1"], (3, 1, 4)),
        (["--speculative-num-steps", "5", "--speculative-eagle-topk", "1"], (5, 1, 6)),
        (
            ["--speculative-num-steps", "2", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"],
            (2, 1, 3),
        ),
        ([], (3, 1, 4)),  # nothing given: SGLang's auto choice
    ],
)
def test_eagle_settings_sglang_completes_are_completed(flags, expected):
    res = cli.resolve(cli.parse(EAGLE + flags, {})[0])
    assert res.error is None and res.unsupported is None
    args = res.args
    assert (
        args["speculative_num_steps"],
        args["speculative_eagle_topk"],
        args["speculative_num_draft_tokens"],
    ) == expected
    given_ndt = "--speculative-num-draft-tokens" in flags
    assert any("adjusted to speculative_num_steps + 1" in w for w in res.log_warnings) == (
        bool(flags) and not given_ndt
    )
    steps, topk, ndt = expected
    partial = evaluate(params_from_launch(EAGLE + flags, {}), PCIE, KIMI)
    explicit = evaluate(
        params_from_launch(
            EAGLE
            + [
                "--speculative-num-steps",
                str(steps),
                "--speculative-eagle-topk",
                str(topk),
                "--speculative-num-draft-tokens",
                str(ndt),
            ],
            {},
        ),
        PCIE,
        KIMI,
    )
    assert partial.ok and partial == explicit


def test_the_model_completes_top_k_one_without_draft_tokens_too():
    partial = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 1}
    assert evaluate(partial, PCIE, KIMI) == evaluate({**partial, "speculative_num_draft_tokens": 4}, PCIE, KIMI)


@pytest.mark.parametrize(
    "flags,error,unsupported",
    [
        (["--speculative-eagle-topk", "2"], "AssertionError", None),  # top-k without steps: SGLang's assert
        (["--speculative-num-steps", "3", "--speculative-eagle-topk", "2"], None, "--speculative-num-draft-tokens"),
        (["--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"], None, "TypeError"),
        (["--speculative-num-steps", "3"], None, "--speculative-eagle-topk"),
    ],
)
def test_eagle_settings_sglang_does_not_complete_are_refused(flags, error, unsupported):
    res = cli.resolve(cli.parse(EAGLE + flags, {})[0])
    assert res.error == error
    assert (res.unsupported is None) if unsupported is None else (unsupported in (res.unsupported or ""))
    with pytest.raises(ValueError, match=error or "set --"):
        params_from_launch(EAGLE + flags, {})
    params = {
        "speculative_algorithm": "EAGLE3",
        **{f[2:].replace("-", "_"): int(v) for f, v in zip(flags[::2], flags[1::2])},
    }
    assert not evaluate(params, PCIE, KIMI).ok


def test_the_server_refuses_top_k_above_one_without_draft_tokens_in_one_line():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.simulator",
            *EAGLE,
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "set --speculative-num-draft-tokens" in proc.stdout + proc.stderr


# SGLang's argparse type for the flag (parse_cuda_graph_config_arg) refuses these before resolution:
# argparse prints `error: argument --cuda-graph-config: <its sentence>` and exits 2.
MALFORMED_GRAPH_CONFIG = [
    ("{decode: full}", "--cuda-graph-config must be JSON: Expecting property name enclosed in double quotes"),
    ("", "--cuda-graph-config must be JSON: Expecting value: line 1 column 1 (char 0)"),
    ("[1, 2]", "--cuda-graph-config must be a JSON object, got list"),
    ("64", "--cuda-graph-config must be a JSON object, got int"),
    (
        '{"verify":{"backend":"full"}}',
        "--cuda-graph-config: unknown phase 'verify', expected one of ('decode', 'prefill')",
    ),
    ('{"decode":"full"}', "--cuda-graph-config['decode'] must be a JSON object, got str"),
]


@pytest.mark.parametrize("value,sentence", MALFORMED_GRAPH_CONFIG)
def test_a_malformed_cuda_graph_config_is_refused_when_parsed(capsys, value, sentence):
    with pytest.raises(SystemExit) as exit_:
        cli.parse(BASE + ["--cuda-graph-config", value], {})
    assert exit_.value.code == 2
    assert f"sglang serve: error: argument --cuda-graph-config: {sentence}" in capsys.readouterr().err
    with pytest.raises(ValueError, match="exit code 2"):
        params_from_launch(BASE + ["--cuda-graph-config", value], {})


@pytest.mark.parametrize("value", ["{}", FULL, '{"prefill":{}}', '{"decode":{"max_bs":64,"bs":[1,2,4]}}'])
def test_a_well_formed_cuda_graph_config_is_kept_as_given(value):
    assert cli.parse(BASE + ["--cuda-graph-config", value], {})[0].cuda_graph_config == value


@pytest.mark.parametrize("value", [v for v, _ in MALFORMED_GRAPH_CONFIG] + ["{}", FULL, '{"prefill":{}}'])
def test_the_experiment_check_refuses_what_the_server_refuses(value):
    """server.flags are checked before any launch by the orchestrator's own rule; it must agree with the parser."""
    from orchestrator.config import flags

    try:
        cli.parse(BASE + ["--cuda-graph-config", value], {})
        refused = False
    except SystemExit:
        refused = True
    assert (flags.cuda_graph_config_problem(value) is not None) == refused


def test_the_server_refuses_a_malformed_cuda_graph_config_in_one_line_with_exit_code_2():
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.simulator", *BASE, "--cuda-graph-config", '{"decode":{"backend":"full"}'],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        "sglang serve: error: argument --cuda-graph-config: --cuda-graph-config "
        "must be JSON: Expecting ',' delimiter: line 1 column 29 (char 28)"
    )
