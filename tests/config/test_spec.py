"""Experiment loading: the parts of spec.py and the knob catalogue that the CLI table does not reach."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from orchestrator.config import experiment as spec_mod
from orchestrator.config import knobs
from orchestrator.config.experiment import SpecError

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "experiments" / "demo.yaml"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("8h", 8 * 3600),
        ("30m", 1800),
        ("90s", 90),
        ("1.5d", 1.5 * 86400),
        ("45", 45),
        (" 2h ", 7200),
        (600, 600),
        (0.5, 0.5),
    ],
)
def test_durations(text, seconds) -> None:
    assert spec_mod.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["8 hours", "h", "-1h", "0", 0, "1w", True, "8h30m"])
def test_bad_durations(text) -> None:
    with pytest.raises(ValueError, match="duration"):
        spec_mod.parse_duration(text)


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("NCCL_PROTO", "LL", None),
        ("NCCL_PROTO", "ll", "must be one of {LL, LL128, Simple}, but got 'll'"),
        ("NCCL_NTHREADS", 256, None),
        ("NCCL_NTHREADS", "256", None),  # an environment value is a string in the end
        ("NCCL_NTHREADS", 100, "must be one of {64, 128, 256, 512}, but got 100"),
        ("NCCL_P2P_DISABLE", 1, None),
        ("NCCL_BUFFSIZE", 4194304, None),
        ("NCCL_BUFFSIZE", 0, "must be a positive power of two, but got 0"),
        ("NCCL_BUFFSIZE", 1000, "must be a positive power of two, but got 1000 (nearest: 512, 1024)"),
        ("NCCL_BUFFSIZE", 2048, "must be in [4096, 1073741824], but got 2048"),
        ("NCCL_MAX_NCHANNELS", 0, "must be in [1, 64], but got 0"),
        ("NCCL_MAX_NCHANNELS", "8", "must be an integer, but got '8'"),
        ("NCCL_MAX_NCHANNELS", True, "must be an integer, but got True"),
        ("speculative_num_steps", 4, None),
        ("speculative_eagle_topk", 0, "must be in [1, 16], but got 0"),
        (
            "speculative_algorithm",
            "eagle3",
            "must be one of {EAGLE3, EAGLE, STANDALONE, DFLASH, NGRAM}, but got 'eagle3'",
        ),
        ("cuda_graph", False, None),
        ("cuda_graph", "no", "must be true or false, but got 'no'"),
        ("all_reduce_path", None, None),  # None is "not set" for every knob
    ],
)
def test_knob_values(name, value, problem) -> None:
    assert knobs.KNOBS[name].check(value) == problem


@pytest.mark.parametrize(
    ("name", "allowed"),
    [
        ("NCCL_PROTO", True),
        ("NCCL_DEBUG", True),
        ("SGLANG_ENABLE_METRICS_DEVICE_TIMER", True),
        ("HF_HUB_OFFLINE", True),
        ("OMP_NUM_THREADS", True),
        ("HF_TOKEN", False),
        ("AWS_SECRET_ACCESS_KEY", False),
        ("SGLANG_API_KEY", False),
        ("WANDB_API_KEY", False),
        ("LD_PRELOAD", False),
        ("PATH", False),
        ("NCCL_SOMETHING_NEW", False),
        ("SGLANG_SOMETHING_NEW", False),
        ("CUDA_VISIBLE_DEVICES", False),
        ("CUDA_DEVICE_MAX_CONNECTIONS", False),
    ],
)
def test_env_allow_list(name: str, allowed: bool) -> None:
    assert (knobs.env_rule(name) is None) is allowed


def test_every_env_rule_says_how_to_fix_it() -> None:
    for name in ("HF_TOKEN", "LD_PRELOAD", "NCCL_SOMETHING_NEW", "SGLANG_SOMETHING_NEW", "CUDA_VISIBLE_DEVICES"):
        assert "remove it" in knobs.env_rule(name)


def test_demo_loads_into_one_merged_space() -> None:
    s = spec_mod.load(DEMO)
    assert s.space.name == "nccl+eagle3"
    assert list(s.space.params)[:2] == ["NCCL_PROTO", "NCCL_ALGO"]
    assert s.space.params["speculative_num_steps"].when == {"speculative_algorithm": "EAGLE3"}
    assert s.budget.wall_time == 1800.0
    assert s.server.env["SGLANG_ENABLE_METRICS_DEVICE_TIMER"] == "1"  # env values become strings
    assert s.source == str(DEMO)


def test_round_trip_through_json() -> None:
    s = spec_mod.load(DEMO)
    assert spec_mod.SweepSpec.model_validate(s.model_dump(mode="json")) == s


def test_models_are_frozen() -> None:
    s = spec_mod.load(DEMO)
    with pytest.raises(ValueError):
        s.budget.trials = 3  # type: ignore[misc]


def _experiment(tmp_path: Path, data: dict) -> Path:
    shutil.copytree(ROOT / "search_spaces", tmp_path / "search_spaces", dirs_exist_ok=True)
    (tmp_path / "experiments").mkdir(exist_ok=True)
    exp = tmp_path / "experiments" / "exp.yaml"
    exp.write_text(yaml.safe_dump(data, sort_keys=False))
    return exp


def _demo() -> dict:
    return yaml.safe_load(DEMO.read_text())


def test_several_mistakes_are_listed_one_per_line(tmp_path: Path) -> None:
    data = _demo()
    data["budget"]["trials"] = 0
    data["benchmark"]["concurrency"] = "two"
    exp = _experiment(tmp_path, data)
    with pytest.raises(SpecError) as err:
        spec_mod.load(exp)
    assert str(err.value).splitlines() == [
        f"{exp}: benchmark.concurrency: must be an integer, but got 'two'",
        f"{exp}: budget.trials: must be >= 1, but got 0",
    ]


def test_union_type_errors_become_one_line(tmp_path: Path) -> None:
    data = _demo()
    data["server"]["flags"] = {"mem-fraction-static": [0.8, 0.9]}
    exp = _experiment(tmp_path, data)
    with pytest.raises(SpecError) as err:
        spec_mod.load(exp)
    assert str(err.value) == (
        f"{exp}: server.flags.mem-fraction-static: must be a string or an integer or a "
        f"number or true or false, but got [0.8, 0.9]"
    )


def test_when_cycle_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "search_spaces").mkdir()
    (tmp_path / "search_spaces" / "cycle.yaml").write_text(
        yaml.safe_dump(
            {
                "params": {
                    "NCCL_PROTO": {"choices": [None, "LL"], "when": {"NCCL_ALGO": "Ring"}},
                    "NCCL_ALGO": {"choices": [None, "Ring"], "when": {"NCCL_PROTO": "LL"}},
                }
            },
            sort_keys=False,
        )
    )
    data = _demo()
    data["search_space"] = ["../search_spaces/cycle.yaml"]
    del data["server"]["draft_model"]
    exp = _experiment(tmp_path, data)
    with pytest.raises(SpecError) as err:
        spec_mod.load(exp)
    assert str(err.value) == (
        f"{tmp_path / 'search_spaces' / 'cycle.yaml'}: params.NCCL_PROTO.when: the `when` "
        f"conditions of NCCL_PROTO, NCCL_ALGO depend on each other in a cycle; break the cycle"
    )


def test_a_single_space_file_and_absolute_paths(tmp_path: Path) -> None:
    data = _demo()
    data["search_space"] = str(ROOT / "search_spaces" / "nccl.yaml")
    exp = _experiment(tmp_path, data)
    s = spec_mod.load(exp)
    assert s.search_space == (str(ROOT / "search_spaces" / "nccl.yaml"),)
    assert "speculative_algorithm" not in s.space.params


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", "the experiment file must be a YAML mapping (key: value), but got a list"),
        ("", "the experiment file is empty; it must be a YAML mapping (key: value)"),
    ],
)
def test_not_a_mapping(tmp_path: Path, text: str, message: str) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text(text)
    with pytest.raises(SpecError) as err:
        spec_mod.load(exp)
    assert str(err.value) == f"{exp}: {message}"


def test_search_space_must_be_named(tmp_path: Path) -> None:
    data = _demo()
    del data["search_space"]
    exp = _experiment(tmp_path, data)
    with pytest.raises(SpecError) as err:
        spec_mod.load(exp)
    assert str(err.value) == (
        f"{exp}: search_space: must be a list of search-space files, but got nothing; "
        f"e.g. search_space: [../search_spaces/nccl.yaml]"
    )


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        (
            {"fault": "never_ready", "whenn": {"NCCL_ALGO": "Tree"}},
            "simulator.faults.0.whenn: unknown key; did you mean 'when'?",
        ),
        (
            {"fault": "never_ready", "when": {"NCCL_ALG": "Tree"}},
            "simulator.faults.0.when.NCCL_ALG: not a knob of the search space, so the fault would never fire; "
            "did you mean 'NCCL_ALGO'?",
        ),
        (3, "simulator.faults.0: must be a string or a mapping (key: value), but got 3"),
    ],
)
def test_simulator_fault_mistakes(tmp_path: Path, fault, message: str) -> None:
    data = _demo()
    data["simulator"]["faults"] = [fault]
    exp = _experiment(tmp_path, data)
    with pytest.raises(SpecError) as err:
        spec_mod.load(exp)
    assert str(err.value) == f"{exp}: {message}"


def test_simulator_faults_with_conditions_load(tmp_path: Path) -> None:
    data = _demo()
    data["simulator"]["faults"] = ["slow_start=1", {"fault": "never_ready", "when": {"NCCL_ALGO": ["Tree", "Ring"]}}]
    s = spec_mod.load(_experiment(tmp_path, data))
    assert s.simulator.faults[0] == "slow_start=1"
    assert s.simulator.faults[1].when == {"NCCL_ALGO": ["Tree", "Ring"]}
