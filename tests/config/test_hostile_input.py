"""Hostile and half-wrong experiment files: each is refused with one message, in bounded time and
memory, and nothing a user would regret is accepted (issue 11's measured defects, one row each)."""

from __future__ import annotations

import copy
import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.config import experiment as spec_mod
from orchestrator.config import fields, yamlfile
from orchestrator.config.space import MAX_ENUMERATED, SearchSpace, check_enumerable, size, weighted_points
from orchestrator.errors import SpecError
from orchestrator.search import space as sp

SPACE = {
    "params": {
        "NCCL_PROTO": {"choices": [None, "LL", "Simple"]},
        "speculative_algorithm": {"choices": [None, "EAGLE3"]},
        "speculative_num_steps": {"low": 1, "high": 4, "when": {"speculative_algorithm": "EAGLE3"}},
        "speculative_eagle_topk": {"choices": [2, 4], "when": {"speculative_algorithm": "EAGLE3"}},
        "speculative_num_draft_tokens": {"choices": [4, 8], "when": {"speculative_algorithm": "EAGLE3"}},
    }
}
BASE: dict[str, Any] = {
    "name": "hostile",
    "engine": "simulator",
    "server": {"model": "m", "draft_model": "d", "tp": 2, "env": {"NCCL_DEBUG": "INFO"}},
    "search_space": ["space.yaml"],
    "promotion": {"model_name": "hostile-model"},
}


def _write(tmp_path: Path, data: dict, space: dict | None = None) -> Path:
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space or SPACE))
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(data, sort_keys=False))
    return exp


def _with(path: str, value: Any) -> dict:
    data = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return data


def test_base_experiment_loads(tmp_path: Path) -> None:
    s = spec_mod.load(_write(tmp_path, BASE))
    assert s.server.tp == 2 and sp.census(s.space)[0] == 3 * (1 + 4 * 2 * 2)


# ------------------------------------------------------------- values accepted before, wrong


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("sampler.seed", 1e30, "sampler.seed: must be an integer, but got 1e+30"),
        ("sampler.seed", -1, "sampler.seed: must be >= 0, but got -1"),
        ("sampler.seed", 2**32, "sampler.seed: must be <= 4294967295, but got 4294967296"),
        ("server.tp", True, "server.tp: must be an integer, but got True"),
        ("server.tp", 2.0, "server.tp: must be an integer, but got 2.0"),
        (
            "budget.wall_time",
            float("nan"),
            "budget.wall_time: a duration must be > 0 and at most 365d (in seconds: 3.1536e+07), but got nan",
        ),
        (
            "budget.wall_time",
            float("inf"),
            "budget.wall_time: a duration must be > 0 and at most 365d (in seconds: 3.1536e+07), but got inf",
        ),
        ("budget.concurrent_trials", 1e9, "budget.concurrent_trials: must be an integer, but got 1000000000.0"),
        ("budget.concurrent_trials", 10**9, "budget.concurrent_trials: must be <= 1024, but got 1000000000"),
        ("budget.trial_timeout_s", float("inf"), "budget.trial_timeout_s: must be a finite number, but got inf"),
        ("benchmark.timeout_s", 1e300, "benchmark.timeout_s: must be <= 2592000.0, but got 1e+300"),
        (
            "server.model",
            "m\nx",
            "server.model: must not contain control characters (it reaches a command line or an "
            "environment), but got '\\n' at position 1; remove it",
        ),
        (
            "server.draft_model",
            "d\x00",
            "server.draft_model: must not contain control characters (it reaches a command "
            "line or an environment), but got '\\x00' at position 1; remove it",
        ),
        (
            "server.env",
            {"NCCL_DEBUG_SUBSYS": "INIT", "OMP_NUM_THREADS": "4\n"},
            "server.env: must not contain control characters (it reaches a command line or an environment), but got "
            "'\\n' at position 1; remove it",
        ),
        (
            "server.env",
            {"OMP_NUM_THREADS": True},
            "server.env.OMP_NUM_THREADS: must be a string or an integer, but got True",
        ),
        (
            "server.flags",
            {"mem-fraction-static": "0.8\n--x"},
            "server.flags: mem-fraction-static must not contain control characters (it becomes a command-line argument), "
            "but got '\\n' at position 3; remove it",
        ),
        (
            "server.flags",
            {"mem-fraction-static": float("nan")},
            "server.flags: mem-fraction-static must be a finite number, but got nan",
        ),
        (
            "simulator.hardware_profile",
            "h100-imaginary",
            "simulator.hardware_profile: no built-in hardware profile 'h100-imaginary' (built-in: h200-nvlink, h200-nvlink-x8, "
            "pcie-rtxpro6000-x8, pcie-rtxpro6000-x8-turin); or give a path to a .yaml/.json file, but got 'h100-imaginary'",
        ),
        (
            "simulator.model_profile",
            "h200-nvlink",
            "simulator.model_profile: 'h200-nvlink' is a hardware profile, not a model profile (the model profiles: "
            "kimi-k2.5), but got 'h200-nvlink'",
        ),
        (
            "simulator.faults",
            ["explode"],
            "simulator.faults.0: must be a known fault (never_ready, env_drop, nccl_hang, draft_wiring_broken, slow_start, "
            "crash_after_tokens, hang_after_tokens, oom_above_draft_tokens, nccl_hang_when), but got 'explode'; see "
            "orchestrator/simulator/faults.py for the syntax",
        ),
        (
            "simulator.faults",
            [{"fault": "crash_after_tokens=many"}],
            "simulator.faults.0.fault: fault crash_after_tokens needs a whole number >= 0, but got 'many'; see "
            "orchestrator/simulator/faults.py for the syntax",
        ),
        (
            "tracking.uri",
            "foo://bar",
            "tracking.uri: must be an MLflow tracking URI (http://..., https://..., file://..., "
            "sqlite://..., a database URL), but got 'foo://bar'; e.g. http://127.0.0.1:5000, or "
            "leave it out for the work directory's sqlite store",
        ),
        (
            "tracking.uri",
            "127.0.0.1:5000",
            "tracking.uri: must be an MLflow tracking URI (http://..., https://..., "
            "file://..., sqlite://..., a database URL), but got '127.0.0.1:5000'; e.g. "
            "http://127.0.0.1:5000, or leave it out for the work directory's sqlite store",
        ),
        (
            "objective.constraints",
            {"itl_ms_p99": {"max": float("nan")}},
            "objective.constraints.itl_ms_p99.max: must be a finite number, but got nan",
        ),
    ],
)
def test_wrong_values_are_refused(tmp_path: Path, path: str, value: Any, message: str) -> None:
    exp = _write(tmp_path, _with(path, value))
    with pytest.raises(SpecError) as err:
        spec_mod.load(exp)
    assert str(err.value) == f"{exp}: {message}"


def test_a_range_bound_must_be_a_strict_integer(tmp_path: Path) -> None:
    space = copy.deepcopy(SPACE)
    space["params"]["speculative_num_steps"]["high"] = True
    exp = _write(tmp_path, BASE, space)
    with pytest.raises(SpecError, match=r"params.speculative_num_steps.high: must be an integer, but got True"):
        spec_mod.load(exp)


def test_attention_mode_needs_speculation(tmp_path: Path) -> None:
    space = copy.deepcopy(SPACE)
    space["params"]["speculative_attention_mode"] = {"choices": [None, "prefill", "decode"]}
    exp = _write(tmp_path, BASE, space)
    with pytest.raises(SpecError) as err:
        spec_mod.load(exp)
    assert str(err.value) == (
        f"{tmp_path / 'space.yaml'}: params.speculative_attention_mode: passed to SGLang only "
        f"with speculative decoding, so without it every value would be the same server counted "
        f"twice; add `when: {{speculative_algorithm: EAGLE3}}`"
    )
    space["params"]["speculative_attention_mode"]["when"] = {"speculative_algorithm": "EAGLE3"}
    spec_mod.load(_write(tmp_path, BASE, space))


# ------------------------------------------------------------- the simulator's vocabulary, at the edge


def test_fault_grammar_matches_the_simulators_parser() -> None:
    from orchestrator.simulator.faults import _NAMES, parse_faults

    assert set(fields.FAULTS) == set(_NAMES)
    samples = [
        "never_ready",
        "never_ready=1",
        "slow_start",
        "slow_start=2.5",
        "slow_start=-1",
        "slow_start=x",
        "crash_after_tokens=40",
        "crash_after_tokens=-3",
        "crash_after_tokens=",
        "nccl_hang",
        "nccl_hang_when=NCCL_ALGO:Tree",
        "nccl_hang_when=NCCL_ALGO:Tree,NCCL_PROTO:LL",
        "nccl_hang_when=x",
        "env_drop",
        "oom_above_draft_tokens=64",
        "hang_after_tokens=3",
        "boom",
        "boom=1",
    ]
    for spec in samples:
        try:
            parse_faults([spec])
            simulator_ok = True
        except ValueError:
            simulator_ok = False
        assert (fields.fault_problem(spec) is None) == simulator_ok, spec


def test_profile_names_match_the_simulators() -> None:
    from orchestrator.simulator.profiles import builtin_names, load_hardware, load_model

    assert sorted(fields.simulator_profiles()) == builtin_names()
    for name, kind in fields.simulator_profiles().items():
        (load_hardware if kind == "hardware" else load_model)(name)


# ------------------------------------------------------------- bounded loading


BOMB = (
    "\n".join(
        ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
        + [f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")]
    )
    + "\n"
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (BOMB, ":6:4: expands to more than 100000 values through its aliases (&anchor/*alias); write the values out"),
        ("a: " + "[" * 2000 + "]" * 2000 + "\n", ":1:67: nested more than 64 levels deep; flatten it"),
        (
            "name: x\nengine: simulator\nname: y\n",
            ":3:1: duplicate key 'name' (the later one would silently win); keep one of them",
        ),
        ("a: &a [*a]\n", ":1:4: an anchor refers to itself (a recursive alias); write the values out"),
        ("a: {b: 1, b: 2}\n", ":1:11: duplicate key 'b' (the later one would silently win); keep one of them"),
        ("a: &x {b: 1}\nc:\n  <<: *x\n  b: 2\n", None),  # a merge key overriding is not a duplicate
    ],
)
def test_hostile_yaml(tmp_path: Path, text: str, message: str | None) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text(text)
    if message is None:
        yamlfile.parse(text, str(exp))
        return
    with pytest.raises(SpecError) as err:
        spec_mod.load(exp)
    assert str(err.value) == f"{exp}{message}"


def test_files_that_are_not_regular_files(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * (yamlfile.MAX_BYTES + 1))
    for path, message in [
        (fifo, f"{fifo}: is a device, FIFO or socket, not a YAML file; name the experiment file"),
        (Path("/dev/zero"), "/dev/zero: is a device, FIFO or socket, not a YAML file; name the experiment file"),
        (Path("/dev/urandom"), "/dev/urandom: is a device, FIFO or socket, not a YAML file; name the experiment file"),
        (
            big,
            f"{big}: the experiment file is {yamlfile.MAX_BYTES + 4} bytes, more than the {yamlfile.MAX_BYTES} a "
            f"experiment may have; name the right file",
        ),
        (big / "x", f"{big / 'x'}: cannot read the experiment file: Not a directory; check the path"),
    ]:
        with pytest.raises(SpecError) as err:
            spec_mod.load(path)
        assert str(err.value) == message


def test_a_fifo_as_search_space_is_refused_without_waiting(tmp_path: Path) -> None:
    exp = _write(tmp_path, _with("search_space", ["fifo.yaml"]))
    os.mkfifo(tmp_path / "fifo.yaml")
    with pytest.raises(SpecError, match="is a device, FIFO or socket"):
        spec_mod.load(exp)


# ------------------------------------------------------------- bounded arithmetic

LINKED = {
    "params": {
        "SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2": {"choices": [None, "1"]},
        "SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB": {
            "low": 0,
            "high": 1 << 20,
            "when": {"SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2": "1"},
        },
        "SGLANG_FORCE_CUSTOM_ALL_REDUCE_V2_PULL_SIZE_KB": {
            "low": 0,
            "high": 1 << 20,
            "when": {"SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB": [5, 9]},
        },
    }
}


def test_two_linked_ranges_are_counted_without_enumerating(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    walked: list[int] = []  # the classes the census looks at, one per representative point

    def counting(*args: Any, **kwargs: Any) -> Iterator[tuple[dict[str, Any], int]]:
        for point in weighted_points(*args, **kwargs):
            walked.append(point[1])
            yield point

    monkeypatch.setattr(sp, "weighted_points", counting)
    exp = _write(tmp_path, BASE, LINKED)
    s = spec_mod.load(exp)
    total, feasible, _ = sp.census(s.space)
    n = 1 << 20
    assert total == feasible == 1 + (n + 1 - 2) + 2 * (n + 1)
    # Over three million points, counted from a handful of classes: the ranges were never walked.
    assert sum(walked) == total and len(walked) < 100, len(walked)
    with pytest.raises(SpecError, match=f"more than {MAX_ENUMERATED:,}; narrow the ranges"):
        check_enumerable(s.space, "the grid sampler")


def test_class_counting_equals_enumeration_on_small_spaces() -> None:
    import random

    from orchestrator.config.eagle import infeasible
    from orchestrator.config.space import ParamSpec, points

    names = [
        "speculative_algorithm",
        "speculative_num_steps",
        "speculative_eagle_topk",
        "speculative_num_draft_tokens",
        "cuda_graph_max_bs",
        "max_running_requests",
    ]
    rng = random.Random(11)
    for _ in range(200):
        chosen = rng.sample(names, rng.randint(1, 5))
        params = {}
        for i, k in enumerate(chosen):
            values: list[Any] = [None, "EAGLE3"] if k == "speculative_algorithm" else [None, 1, 2, 3, 4, 8]
            p: dict[str, Any] = (
                {"choices": rng.sample(values, rng.randint(1, len(values)))}
                if rng.random() < 0.5 or k == "speculative_algorithm"
                else {"low": 1, "high": rng.randint(1, 9)}
            )
            if i and rng.random() < 0.7:
                p["when"] = {rng.choice(chosen[:i]): rng.sample([None, 1, 2, 3, "EAGLE3"], rng.randint(1, 3))}
            params[k] = ParamSpec(**p)
        space = SearchSpace(params=params)
        every = list(points(space))
        assert size(space) == len(every)
        assert sp.census(space)[:2] == (len(every), sum(infeasible(q) is None for q in every))


# ------------------------------------------------------------- the CLI, bounded


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


@pytest.mark.parametrize("command", ["validate", "plan"])
def test_cli_refuses_a_bomb_in_bounded_time_and_memory(tmp_path: Path, command: str) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(BOMB)
    exp = _write(tmp_path, BASE)
    space.write_text(BOMB)
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", command, str(exp)],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=_limited,
    )  # a hang guard only
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith(f"error: {space}:6:4: expands to more than 100000 values")


# ------------------------------------------------------------- what SGLang's own parser does with fixed flags


@pytest.mark.parametrize(
    ("flag", "knob", "space_entry"),
    [
        ("cuda-graph-config", "cuda_graph", {"choices": [None, False]}),
        ("cuda-graph-config", "cuda_graph_max_bs", {"choices": [None, 64]}),
        ("cuda-graph-bs-decode", "cuda_graph_max_bs", {"choices": [None, 64]}),
    ],
)
def test_fixed_flags_that_sglang_lets_win_over_a_swept_knob(
    tmp_path: Path, flag: str, knob: str, space_entry: dict
) -> None:
    from orchestrator.config import flags

    help_text = (
        Path(flags.__file__).parent.parent / "reference" / "sglang_0_5_23" / "launch_server_help.txt"
    ).read_text()
    assert "JSON wins over the per-phase --cuda-graph-* convenience flags" in " ".join(help_text.split())
    space = copy.deepcopy(SPACE)
    space["params"][knob] = space_entry
    exp = _write(tmp_path, _with("server.flags", {flag: '{"decode":{"backend":"full"}}'}), space)
    with pytest.raises(SpecError) as err:
        spec_mod.load(exp)
    assert str(err.value) == (
        f"{exp}: server.flags.{flag}: SGLang lets this flag win over the swept knob {knob} "
        f"({tmp_path / 'space.yaml'}), so every value of {knob} would run the same server; "
        f"remove it from server.flags or {knob} from the space"
    )
    # Without the knob swept: allowed (a well-formed value; a malformed --cuda-graph-config is refused on its own).
    spec_mod.load(_write(tmp_path, _with("server.flags", {flag: '{"decode":{"backend":"full"}}'})))


def test_a_huge_value_is_never_quoted_back_whole(tmp_path: Path) -> None:
    exp = _write(tmp_path, _with("simulator.hardware_profile", "a" * 5000))
    with pytest.raises(SpecError) as err:
        spec_mod.load(exp)
    assert "...(5002 characters)" in str(err.value) and len(str(err.value)) < 600


def test_long_lists_in_a_space_are_capped(tmp_path: Path) -> None:
    space = copy.deepcopy(SPACE)
    space["params"]["speculative_num_steps"]["when"] = {"speculative_algorithm": ["EAGLE3", *range(5000)]}
    exp = _write(tmp_path, BASE, space)
    with pytest.raises(SpecError) as err:
        spec_mod.load(exp)
    assert str(err.value).endswith(
        "params.speculative_num_steps.when.speculative_algorithm: must have at most "
        "1000 items, but got 5001; shorten it"
    )
