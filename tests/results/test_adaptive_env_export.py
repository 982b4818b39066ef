"""The env export carries the adaptive config (issue 35): on a finished simulator sweep whose champion is an
EAGLE-3 chain, `sweep export --format adaptive-config` writes the slots from the measured loads, and
`sweep export --format env --with-adaptive-config FILE` copies that JSON beside the env file and adds
--speculative-adaptive --speculative-adaptive-config PATH to the champion's flags. serve-champion (the worker
image's entrypoint) accepts the result through its allow-list, and SGLang 0.5.23's parser and resolution rules
(simulator/cli.py, from speculative_hook.py `_init_adaptive_speculative_params`) run it as asked."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from e2e_helpers import chain_space, served_experiment, sweep, write_experiment

from orchestrator.config import adaptive
from orchestrator.records import ServingConfig
from orchestrator.results import adaptive_export as ax
from orchestrator.results import entrypoint, export
from orchestrator.simulator.cli import resolve, sglang_parser

CHAIN = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 1}


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 4-trial simulator sweep over no speculation or a 3-step EAGLE-3 chain, confirmed at 1 and 4
    streams: its champion is the chain (the demo model's speculation wins by far at one stream)."""
    tmp = tmp_path_factory.mktemp("adaptive-env")
    space = chain_space(tmp / "chain.yaml", NCCL_ALGO={"choices": [None, "Ring", "Tree"]})
    data = served_experiment(
        name="adaptive-env",
        search_space=[str(space)],
        budget={"trials": 4, "concurrent_trials": 2},
        promotion={"concurrency": [1, 4], "min_rounds": 3, "max_rounds": 3},
    )
    wd = tmp / "wd"
    proc = sweep("run", str(write_experiment(tmp, data)), "--workdir", str(wd))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return wd


def test_the_env_export_carries_the_adaptive_config_the_sweep_measured(finished: Path, tmp_path: Path) -> None:
    slots = tmp_path / "slots.json"
    made = sweep("export", "--format", "adaptive-config", "--workdir", str(finished), "-o", str(slots))
    assert made.returncode == 0, made.stdout + made.stderr
    env_file = tmp_path / "champion.env"
    done = sweep(
        "export", "--workdir", str(finished), "-o", str(env_file), "--with-adaptive-config", str(slots), cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout + done.stderr
    copy = tmp_path / "champion.adaptive.json"
    assert copy.read_text() == slots.read_text()  # the file the flag points at: the export's own slots
    env, args = export.split_args(export.parse_env(env_file.read_text()))
    at = args.index("--speculative-adaptive-config")
    assert args[at + 1] == str(copy.resolve()) and "--speculative-adaptive" in args
    assert adaptive.load(args[at + 1]).candidate_steps == adaptive.load(str(slots)).candidate_steps
    assert f"--speculative-adaptive-config {copy.resolve()}" in env_file.read_text().splitlines()[0]
    # SGLang 0.5.23's parser takes the flags, and its rules run them: steps 3 among the slots' steps
    ns = sglang_parser().parse_args(["--model-path", "m", *args])
    resolved = resolve(ns)
    assert resolved.error is None and resolved.unsupported is None, resolved
    assert ns.speculative_adaptive and ns.speculative_num_steps == 3
    # serve-champion's allow-list lets both flags through, the path as written
    argv, _, _ = entrypoint.launch({"CHAMPION_ENV": str(env_file), "MODEL_PATH": "/m", "SGLANG_PYTHON": sys.executable})
    assert argv[argv.index("--speculative-adaptive-config") + 1] == str(copy.resolve())


def test_a_container_path_and_a_relative_one(finished: Path, tmp_path: Path) -> None:
    slots = tmp_path / "slots.json"
    assert sweep("export", "--format", "adaptive-config", "--workdir", str(finished), "-o", str(slots)).returncode == 0
    out = tmp_path / "champion.env"
    common = ["export", "--format", "docker-env", "--workdir", str(finished), "-o", str(out)]
    mounted = sweep(*common, "--with-adaptive-config", str(slots), "--adaptive-config-path", "/config/a.json")
    assert mounted.returncode == 0, mounted.stdout + mounted.stderr
    args = json.loads(next(ln for ln in out.read_text().splitlines() if ln.startswith("SGLANG_SWEEP_ARGS_JSON="))[23:])
    assert args[args.index("--speculative-adaptive-config") + 1] == "/config/a.json"
    relative = sweep(*common, "--with-adaptive-config", str(slots), "--adaptive-config-path", "a.json")
    assert relative.returncode == 2 and "is relative" in relative.stderr + relative.stdout
    assert "Traceback" not in relative.stderr
    alone = sweep(*common, "--adaptive-config-path", "/config/a.json")
    assert alone.returncode == 2 and "needs --with-adaptive-config" in alone.stderr + alone.stdout


def _config(params: dict, args: tuple[str, ...]) -> ServingConfig:
    return ServingConfig(
        experiment="x",
        trial_number=1,
        run_id="r",
        engine="sglang",
        sglang_version="0.5.23",
        params=params,
        env={},
        sglang_args=args,
        metrics={},
        fingerprint_hash="",
        created_at="2026-12-07T00:00:00Z",
    )


@pytest.mark.parametrize(
    ("params", "text", "message"),
    [
        ({"speculative_algorithm": None}, '{"1": {"candidate_steps": [0, 3]}}', "runs no speculation"),
        (
            {"speculative_algorithm": "DFLASH", "speculative_dflash_block_size": 8},
            '{"1": {"candidate_steps": [0, 3]}}',
            "only for an EAGLE/EAGLE3 chain",
        ),
        (CHAIN, '{"1": {"candidate_steps": [0, 1]}}', "--speculative-num-steps 3 is not among"),
        (CHAIN, '{"x": 1}', "at least one integer-string BS key"),
        (CHAIN, "not json", "not an adaptive config"),
    ],
)
def test_what_sglang_would_not_run_is_refused(params: dict, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("-", "\\-")):
        ax.carried(_config(params, ()), text, "/config/a.json")


def test_the_flags_follow_the_champions_own() -> None:
    argv = ("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1")
    carried = ax.carried(_config(CHAIN, argv), '{"1": {"candidate_steps": [0, 3]}}', "/c/a.json")
    assert carried.sglang_args == (*argv, "--speculative-adaptive", "--speculative-adaptive-config", "/c/a.json")
    assert carried.params["speculative_adaptive"] is True
    with pytest.raises(ValueError, match="holds a NUL byte"):
        ax.carried(_config(CHAIN, argv), '{"1": {"candidate_steps": [3]}}', "/c/a\0.json")
