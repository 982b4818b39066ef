"""`sweep validate` and `sweep plan` as a user runs them.

The table of bad experiments is the contract of issue 2: each mistake gives exit code 2 and one line
that names the file, the field path, the rule, the value received and the fix. Most cases go through
typer's CliRunner (fast); a few run the real `sweep` console script to prove there is no traceback.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.config import experiment as spec_mod
from orchestrator.search import space as sp

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "experiments" / "demo.yaml"
KIMI = ROOT / "experiments" / "kimi-k2.5-tp8.yaml"
SWEEP = Path(sys.executable).with_name("sweep")

Mutation = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutation:
    def mutate(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for p in parents:
            d = d.setdefault(p, {})
        d[last] = value

    return mutate


def _rename(path: str, new: str) -> Mutation:
    def mutate(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for p in parents:
            d = d[p]
        d[new] = d.pop(last)

    return mutate


def _delete(path: str) -> Mutation:
    def mutate(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for p in parents:
            d = d[p]
        del d[last]

    return mutate


def write_experiment(
    tmp_path: Path,
    mutate: Mutation | None = None,
    *,
    extra_space: dict[str, Any] | None = None,
    spaces: tuple[str, ...] = ("nccl", "eagle3"),
    text: Callable[[str], str] | None = None,
) -> Path:
    """The demo experiment, changed by `mutate`, under tmp_path/experiments/ with the shipped spaces
    (and `extra_space` as search_spaces/extra.yaml, named after `spaces`) beside it."""
    shutil.copytree(ROOT / "search_spaces", tmp_path / "search_spaces", dirs_exist_ok=True)
    (tmp_path / "experiments").mkdir(exist_ok=True)
    exp = tmp_path / "experiments" / "exp.yaml"
    if text is not None:
        exp.write_text(text(DEMO.read_text()))
        return exp
    data = copy.deepcopy(yaml.safe_load(DEMO.read_text()))
    names = list(spaces)
    if extra_space is not None:
        (tmp_path / "search_spaces" / "extra.yaml").write_text(yaml.safe_dump(extra_space))
        names.append("extra")
    data["search_space"] = [f"../search_spaces/{n}.yaml" for n in names]
    if mutate is not None:
        mutate(data)
    exp.write_text(yaml.safe_dump(data, sort_keys=False))
    return exp


def _bad_yaml(text: str) -> str:
    return text.replace("\nname: demo\n", "\nname: demo: two colons\n")


def _yaml_line() -> int:
    return _bad_yaml(DEMO.read_text()).splitlines().index("name: demo: two colons") + 1


_GRAPH_TAKES = (
    "SGLang's --cuda-graph-config takes a JSON object of phases (decode, prefill), each an object of "
    'settings, e.g. \'{{"decode":{{"backend":"full","max_bs":256}},"prefill":'
    '{{"backend":"breakable"}}}}\', but got '
)
_GRAPH_FIX = (
    "SGLang would refuse it when it reads its command line, so every trial would fail; fix the value "
    "(one quoted YAML string)"
)

# (id, how to break the demo, expected message with {exp} = experiment file, {spaces} = space folder)
BAD: list[tuple[str, dict[str, Any], str]] = [
    (
        "unknown top-level key",
        dict(mutate=_rename("budget", "budgett")),
        "{exp}: budgett: unknown key; did you mean 'budget'?",
    ),
    (
        "unknown top-level key before the spaces are read",
        dict(mutate=_rename("search_space", "search_spaces")),
        "{exp}: search_spaces: unknown key; did you mean 'search_space'?",
    ),
    (
        "unknown nested key",
        dict(mutate=_rename("budget.concurrent_trials", "concurent_trials")),
        "{exp}: budget.concurent_trials: unknown key; did you mean 'concurrent_trials'?",
    ),
    (
        "unknown key in a search-space parameter",
        dict(spaces=("eagle3",), extra_space={"params": {"NCCL_PROTO": {"choice": [None, "LL"]}}}),
        "{spaces}/extra.yaml: params.NCCL_PROTO.choice: unknown key; did you mean 'choices'?",
    ),
    (
        "unknown knob in a search space",
        dict(spaces=("eagle3",), extra_space={"params": {"NCCL_PROTOO": {"choices": [None, "LL"]}}}),
        "{spaces}/extra.yaml: params.NCCL_PROTOO: unknown knob; did you mean 'NCCL_PROTO'? "
        "(the catalogue is orchestrator/config/knobs.py)",
    ),
    (
        "bad enum value",
        dict(spaces=("eagle3",), extra_space={"params": {"NCCL_PROTO": {"choices": [None, "LL", "LL256"]}}}),
        "{spaces}/extra.yaml: params.NCCL_PROTO.choices: NCCL_PROTO must be one of {{LL, LL128, Simple}}, "
        "but got 'LL256'; fix or remove that value (NCCL_PROTO: NCCL protocol; LL wins for small messages)",
    ),
    (
        "buffer size not a power of two",
        dict(spaces=("eagle3",), extra_space={"params": {"NCCL_BUFFSIZE": {"choices": [None, 3000000]}}}),
        "{spaces}/extra.yaml: params.NCCL_BUFFSIZE.choices: NCCL_BUFFSIZE must be a positive power of two, "
        "but got 3000000 (nearest: 2097152, 4194304); fix or remove that value "
        "(NCCL_BUFFSIZE: NCCL per-channel buffer in bytes, default 4 MiB)",
    ),
    (
        "negative knob value",
        dict(spaces=("eagle3",), extra_space={"params": {"NCCL_MAX_NCHANNELS": {"choices": [None, -4]}}}),
        "{spaces}/extra.yaml: params.NCCL_MAX_NCHANNELS.choices: NCCL_MAX_NCHANNELS must be in [1, 64], "
        "but got -4; fix or remove that value (NCCL_MAX_NCHANNELS: deprecated since NCCL 2.28 (use NCCL_MAX_CTAS): "
        "upper bound on NCCL channels)",
    ),
    (
        "range outside the knob's bounds",
        dict(
            extra_space={
                "params": {"max_running_requests": {"low": 0, "high": 8, "when": {"speculative_algorithm": "EAGLE3"}}}
            }
        ),
        "{spaces}/extra.yaml: params.max_running_requests.low: max_running_requests must be in [1, 4096], "
        "but got 0; fix the bound (max_running_requests: scheduler concurrency cap)",
    ),
    (
        "range on a knob that is not an integer",
        dict(
            spaces=("eagle3",),
            extra_space={
                "params": {"NCCL_BUFFSIZE": {"low": 4096, "high": 65536, "when": {"speculative_algorithm": "EAGLE3"}}}
            },
        ),
        "{spaces}/extra.yaml: params.NCCL_BUFFSIZE: a low/high range needs an integer knob, but NCCL_BUFFSIZE "
        "is power_of_two; list its values with `choices:` (NCCL per-channel buffer in bytes, default 4 MiB)",
    ),
    ("zero trials", dict(mutate=_set("budget.trials", 0)), "{exp}: budget.trials: must be >= 1, but got 0"),
    (
        "negative concurrency",
        dict(mutate=_set("budget.concurrent_trials", -1)),
        "{exp}: budget.concurrent_trials: must be >= 1, but got -1",
    ),
    (
        "negative timeout",
        dict(mutate=_set("server.startup_timeout_s", -5)),
        "{exp}: server.startup_timeout_s: must be > 0.0, but got -5",
    ),
    (
        "low > high",
        dict(
            extra_space={
                "params": {"max_running_requests": {"low": 64, "high": 8, "when": {"speculative_algorithm": "EAGLE3"}}}
            }
        ),
        "{spaces}/extra.yaml: params.max_running_requests: `low <= high` must hold, but got (low=64, high=8); "
        "swap them",
    ),
    (
        "port range backwards",
        dict(mutate=_set("server.port_range", [32000, 31000])),
        "{exp}: server.port_range: must list the lower port first, but got [32000, 31000]; swap them",
    ),
    (
        "bad duration",
        dict(mutate=_set("budget.wall_time", "8 hours")),
        "{exp}: budget.wall_time: a duration looks like 8h, 30m, 90s or a number of seconds, but got '8 hours'",
    ),
    ("wrong type", dict(mutate=_set("server.tp", "eight")), "{exp}: server.tp: must be an integer, but got 'eight'"),
    (
        "bad enum field with did-you-mean",
        dict(mutate=_set("engine", "sglan")),
        "{exp}: engine: must be one of simulator, sglang, but got 'sglan'; did you mean 'sglang'?",
    ),
    (
        "unknown metric in constraints",
        dict(mutate=_set("objective.constraints", {"itl_ms_p999": {"max": 60}})),
        "{exp}: objective.constraints.itl_ms_p999: unknown key; did you mean 'itl_ms_p99'?",
    ),
    (
        "invalid YAML",
        dict(text=_bad_yaml),
        "{exp}:" + str(_yaml_line()) + ":11: not valid YAML: mapping values are not allowed here; "
        "fix the syntax at line " + str(_yaml_line()),
    ),
    (
        "missing required field",
        dict(mutate=_delete("promotion.model_name")),
        "{exp}: promotion.model_name: required field is missing; add `model_name:` under `promotion:`",
    ),
    (
        "space file not found",
        dict(mutate=_set("search_space", ["../search_spaces/nope.yaml"])),
        "{spaces}/nope.yaml: search space file not found; check `search_space` in {exp} "
        "(relative paths start at the experiment's folder)",
    ),
    (
        "env var not on the allow-list",
        dict(mutate=_set("server.env.LD_PRELOAD", "/tmp/x.so")),
        "{exp}: server.env.LD_PRELOAD: not on the allow-list (the NCCL_* and SGLANG_* variables of "
        "orchestrator/config/knobs.py, HF_HUB_OFFLINE, OMP_NUM_THREADS, PYTHONUNBUFFERED, TRANSFORMERS_OFFLINE); "
        "remove it",
    ),
    (
        "unknown env var",
        dict(mutate=_set("server.env.FOO", "1")),
        "{exp}: server.env.FOO: not on the allow-list (the NCCL_* and SGLANG_* variables of "
        "orchestrator/config/knobs.py, HF_HUB_OFFLINE, OMP_NUM_THREADS, PYTHONUNBUFFERED, TRANSFORMERS_OFFLINE); "
        "remove it",
    ),
    (
        "unknown NCCL variable",
        dict(mutate=_set("server.env.NCCL_PROTOCOL", "LL")),
        "{exp}: server.env.NCCL_PROTOCOL: not an NCCL variable this tool knows; remove it, or add it to "
        "orchestrator/config/knobs.py",
    ),
    (
        "secret in the environment",
        dict(mutate=_set("server.env.HF_TOKEN", "hf_plantedSecretValue123")),
        "{exp}: server.env.HF_TOKEN: looks like a secret, and secrets are never written into experiments, "
        "plans or MLflow; remove it and export it in the shell that starts the sweep (the server inherits it)",
    ),
    (
        "CUDA_VISIBLE_DEVICES fixed by the experiment",
        dict(mutate=_set("server.env.CUDA_VISIBLE_DEVICES", "0,1")),
        "{exp}: server.env.CUDA_VISIBLE_DEVICES: set per trial from the GPUs Ray assigns; a fixed value would "
        "put concurrent trials on the same GPUs; remove it",
    ),
    (
        "bad value of a fixed env knob",
        dict(mutate=_set("server.env.NCCL_DEBUG", "LOUD")),
        "{exp}: server.env: NCCL_DEBUG must be one of {{VERSION, WARN, INFO, TRACE}}, but got 'LOUD'",
    ),
    (
        "env var that the space sweeps",
        dict(mutate=_set("server.env.NCCL_PROTO", "LL")),
        "{exp}: server.env.NCCL_PROTO: also swept by the search space ({spaces}/nccl.yaml), so the baseline "
        "would not run the engine defaults; remove it from server.env",
    ),
    (
        "unknown SGLang flag",
        dict(mutate=_set("server.flags", {"mem-fraction-statc": 0.8})),
        "{exp}: server.flags.mem-fraction-statc: not a flag of sglang 0.5.23 (launch_server --help); "
        "did you mean 'mem-fraction-static'?",
    ),
    (
        "argparse abbreviation of a flag",
        dict(mutate=_set("server.flags", {"tp": 4})),
        "{exp}: server.flags.tp: not a flag of sglang 0.5.23 (launch_server --help); did you mean 'tp-size'?",
    ),
    (
        "malformed --cuda-graph-config",
        dict(mutate=_set("server.flags", {"cuda-graph-config": "{decode: full}"})),
        "{exp}: server.flags.cuda-graph-config: " + _GRAPH_TAKES + "'{{decode: full}}': not JSON (Expecting property "
        "name enclosed in double quotes: line 1 column 2 (char 1)); " + _GRAPH_FIX,
    ),
    (
        "--cuda-graph-config not an object",
        dict(mutate=_set("server.flags", {"cuda-graph-config": 64})),
        "{exp}: server.flags.cuda-graph-config: " + _GRAPH_TAKES + "64: a JSON int, not an object; " + _GRAPH_FIX,
    ),
    (
        "--cuda-graph-config with an unknown phase",
        dict(mutate=_set("server.flags", {"cuda-graph-config": '{"verify": {"backend": "full"}}'})),
        "{exp}: server.flags.cuda-graph-config: " + _GRAPH_TAKES + '\'{{"verify": {{"backend": "full"}}}}\': '
        "unknown phase 'verify'; " + _GRAPH_FIX,
    ),
    (
        "--cuda-graph-config without a value",
        dict(mutate=_set("server.flags", {"cuda-graph-config": True})),
        "{exp}: server.flags.cuda-graph-config: " + _GRAPH_TAKES + "True: true passes no value; " + _GRAPH_FIX,
    ),
    (
        "secret in a flag",
        dict(mutate=_set("server.flags", {"admin-api-key": "sk-not-for-disk"})),
        "{exp}: server.flags.admin-api-key: looks like a secret, and experiments, launch plans, MLflow and the "
        "exported env file are all written to disk; pass it to the server through its deployment environment "
        "instead",
    ),
    (
        "objective the baseline cannot have",
        dict(mutate=_set("objective.metric", "verify_ms")),
        "{exp}: objective.metric: verify_ms exists only with speculative decoding, but the baseline runs without "
        "it; use cycle_ms (one decode iteration, defined for every trial), decode_tok_s, or a latency percentile",
    ),
    (
        "managed flag",
        dict(mutate=_set("server.flags", {"tp-size": 4})),
        "{exp}: server.flags.tp-size: set by the sweep itself from server.tp; remove it from server.flags",
    ),
    (
        "flag that defeats a swept backend",
        dict(mutate=_set("server.flags", {"enable-mscclpp": True})),
        "{exp}: server.flags.enable-mscclpp: defeats all_reduce_backend nccl of the search space in SGLang 0.5.23 "
        "(MSCCL++ comes first in GroupCoordinator.all_reduce and takes every message up to 4 GiB), so that trial "
        "would run another backend than named; remove it from server.flags or that value from the space "
        "({spaces}/eagle3.yaml)",
    ),
    (
        "speculation without a draft model",
        dict(mutate=_delete("server.draft_model")),
        "{exp}: server.draft_model: required field is missing: the search space turns speculative decoding on "
        "(speculative_algorithm in {spaces}/eagle3.yaml); add the EAGLE-3 draft model path",
    ),
    (
        "when refers to a knob not in the space",
        dict(
            spaces=("nccl",),
            extra_space={
                "params": {"speculative_num_steps": {"low": 1, "high": 3, "when": {"speculative_algorithm": "EAGLE3"}}}
            },
        ),
        "{spaces}/extra.yaml: params.speculative_num_steps.when.speculative_algorithm: the condition refers to "
        "knob speculative_algorithm, which no search space of {exp} defines; add speculative_algorithm to a "
        "search space or drop the condition",
    ),
    (
        "when asks for a value the knob never takes",
        dict(
            extra_space={
                "params": {"max_running_requests": {"choices": [16, 48], "when": {"speculative_algorithm": "EAGLE"}}}
            }
        ),
        "{spaces}/extra.yaml: params.max_running_requests.when.speculative_algorithm: speculative_algorithm "
        "never takes the value 'EAGLE' (its values: None, EAGLE3), so max_running_requests would never be "
        "swept; fix the value",
    ),
    (
        "knob in two space files",
        dict(extra_space={"params": {"NCCL_PROTO": {"choices": [None, "LL"]}}}),
        "{exp}: search_space: knob NCCL_PROTO is defined in both {spaces}/nccl.yaml and {spaces}/extra.yaml; "
        "keep it in one of them",
    ),
    (
        "unknown sglang_version",
        dict(mutate=_set("sglang_version", "0.6.0")),
        "{exp}: sglang_version: must be one of 0.5.9, 0.5.16, 0.5.23 (the versions whose flag names this tool "
        "knows), but got '0.6.0'; set the version installed on the GPU hosts",
    ),
    (
        "baseline not in the space",
        dict(spaces=("eagle3",), extra_space={"params": {"NCCL_PROTO": {"choices": ["LL", "Simple"]}}}),
        "{spaces}/extra.yaml: params.NCCL_PROTO: the baseline (engine defaults, nothing set) must be a point of "
        "the space; add null (= not set) to its choices, e.g. choices: [null, LL, Simple]",
    ),
]

# Rich reads "[null, ...]" in a message as a markup tag and drops it; cli._fail must escape messages.
_MARKUP_EATEN: set[str] = set()


def _expected(template: str, exp: Path) -> str:
    return template.format(exp=exp, spaces=exp.parent.parent / "search_spaces")


@pytest.mark.parametrize(("case", "how", "message"), BAD, ids=[c[0] for c in BAD])
def test_bad_experiment_message(tmp_path: Path, case: str, how: dict[str, Any], message: str) -> None:
    """spec.load raises exactly this message (what, where, the value, the fix)."""
    exp = write_experiment(tmp_path, **how)
    with pytest.raises(spec_mod.SpecError) as err:
        spec_mod.load(exp)
    assert str(err.value) == _expected(message, exp)


@pytest.mark.parametrize(
    ("case", "how", "message"),
    [
        pytest.param(
            *c,
            id=c[0],
            marks=[
                pytest.mark.xfail(
                    strict=True, reason="cli._fail prints the message as rich markup, which eats [null, ...]"
                )
            ]
            if c[0] in _MARKUP_EATEN
            else [],
        )
        for c in BAD
    ],
)
def test_validate_prints_the_message_and_exits_2(tmp_path: Path, case: str, how: dict[str, Any], message: str) -> None:
    exp = write_experiment(tmp_path, **how)
    result = CliRunner().invoke(app, ["validate", str(exp)])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr == f"error: {_expected(message, exp)}\n"


def test_validate_missing_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert result.stderr == f"error: {tmp_path / 'nope.yaml'}: experiment file not found; check the path\n"


def test_validate_empty_file(tmp_path: Path) -> None:
    exp = tmp_path / "empty.yaml"
    exp.write_text("# nothing yet\n")
    result = CliRunner().invoke(app, ["validate", str(exp)])
    assert result.exit_code == 2
    assert result.stderr == f"error: {exp}: the experiment file is empty; it must be a YAML mapping (key: value)\n"


REAL_CASES = ("invalid YAML", "secret in the environment")


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """The `sweep` console script on a few experiments, started together (each one pays the imports)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    jobs: dict[str, tuple[Path, subprocess.Popen]] = {}
    for case in REAL_CASES:
        how = next(h for c, h, _ in BAD if c == case)
        exp = write_experiment(tmp_path_factory.mktemp("real"), **how)
        jobs[case] = (
            exp,
            subprocess.Popen(
                [str(SWEEP), "validate", str(exp)],
                cwd=ROOT,
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            ),
        )
    runs = {}
    for case, (exp, proc) in jobs.items():
        out, err = proc.communicate(timeout=120)
        runs[case] = exp, subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return runs


@pytest.mark.parametrize("case", REAL_CASES)
def test_real_process_exits_2_with_one_line_and_no_traceback(real_runs, case: str) -> None:
    exp, proc = real_runs[case]
    message = next(m for c, _, m in BAD if c == case)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    assert proc.stderr == f"error: {_expected(message, exp)}\n"
    assert "hf_plantedSecretValue123" not in proc.stderr  # the value of a rejected secret is never echoed


@pytest.mark.parametrize("experiment", [DEMO, KIMI], ids=["demo", "kimi-k2.5-tp8"])
def test_validate_accepts_the_shipped_experiments(experiment: Path) -> None:
    result = CliRunner().invoke(app, ["validate", str(experiment)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"OK {experiment}")


def test_plan_json_starts_with_the_baseline() -> None:
    result = CliRunner().invoke(app, ["plan", str(DEMO), "--json", "--limit", "3"])
    assert result.exit_code == 0, result.output
    plans = json.loads(result.stdout)["launches"]
    assert isinstance(plans, list) and len(plans) == 3
    for p in plans:
        assert set(p) == {"params", "argv", "env"}
        assert all(isinstance(a, str) for a in p["argv"])
        assert all(isinstance(v, str) for v in p["env"].values())
    s = spec_mod.load(DEMO)
    assert plans[0]["params"] == {name: None for name in s.space.params}
    assert not any(a.startswith("--speculative") for a in plans[0]["argv"])
    assert not any(k.startswith("NCCL_") and k not in s.server.env for k in plans[0]["env"])
    for p in plans[1:]:
        assert sp.infeasible_reason(p["params"]) is None
        assert p["params"] != plans[0]["params"]
        for name, value in p["params"].items():
            if name.startswith("NCCL_") and value is not None:
                assert p["env"][name] == str(value)


def test_plan_text_counts_infeasible_points_by_rule() -> None:
    result = CliRunner().invoke(app, ["plan", str(DEMO), "--limit", "1"])
    assert result.exit_code == 0, result.output
    total, feasible, reasons = sp.census(spec_mod.load(DEMO).space)
    lines = result.stdout.splitlines()
    assert f"demo: {total} distinct combinations, {feasible} feasible, {total - feasible} infeasible" in lines
    assert (
        f"{reasons['draft tokens - 1 <= topk + (steps - 1) * topk^2']:>8} infeasible: draft tokens - 1 <= "
        f"topk + (steps - 1) * topk^2" in lines
    )
    assert "baseline: engine defaults" in lines
