"""Which sizes and which NCCL settings a probe measures, and how a large NCCL space is searched."""

from __future__ import annotations

import itertools

import pytest
from probe_helpers import write_spec

from orchestrator.probe.run import probe_sizes
from orchestrator.probe.settings import DEFAULTS_LABEL, NcclSetting, SettingSearch, nccl_dimensions, space_size
from orchestrator.probe.sizes import message_sizes

KIMI_TOKEN = 7168 * 2


def test_kimi_sizes_for_the_demo_experiment(demo_spec):
    sizes = {s.label: s for s in probe_sizes(demo_spec)}
    assert sizes["decode"].nbytes == KIMI_TOKEN
    drafts = sorted(int(label.split("-")[1]) for label in sizes if label.startswith("verify-"))
    assert drafts == sorted(v for v in demo_spec.space.params["speculative_num_draft_tokens"].values() if v <= 16)
    assert all(sizes[f"verify-{n}"].nbytes == n * KIMI_TOKEN for n in drafts)
    assert sizes["prefill-64"].nbytes == 64 * KIMI_TOKEN  # the benchmark's prompt, below the prefill chunk
    assert [s.nbytes for s in sizes.values() if s.kind == "large"] == [1 << 20, 16 << 20, 32 << 20]


def test_concurrency_multiplies_decode_and_verify_tokens_and_big_drafts_are_left_out():
    sizes = message_sizes(7168, 2, draft_tokens=[4, 32, 0], concurrency=4, prefill_tokens=8192, large=())
    assert [(s.label, s.tokens, s.nbytes) for s in sizes] == [
        ("decode", 4, 4 * KIMI_TOKEN),
        ("verify-4", 16, 16 * KIMI_TOKEN),
        ("prefill-8192", 8192, 8192 * KIMI_TOKEN),
    ]
    with pytest.raises(ValueError, match=r"must be >= 1, but got \(7168, 2, 0\)"):
        message_sizes(7168, 2, concurrency=0)


def test_the_prefill_chunk_is_capped_by_the_chunked_prefill_flag(tmp_path):
    spec = write_spec(tmp_path, benchmark={"input_len": 20000}, server={"flags": {"chunked-prefill-size": 4096}})
    assert [s.label for s in probe_sizes(spec) if s.kind == "prefill"] == ["prefill-4096"]


def test_nccl_dimensions_of_the_demo_space(demo_spec):
    dims = nccl_dimensions(demo_spec)
    assert set(dims) == {"NCCL_PROTO", "NCCL_ALGO", "NCCL_MAX_CTAS", "NCCL_BUFFSIZE", "NCCL_NTHREADS", "NCCL_P2P_LEVEL"}
    assert all(values[0] is None for values in dims.values())
    assert space_size(dims) == 3456


def test_a_conditional_nccl_dimension_can_also_be_unset(tmp_path):
    spec = write_spec(
        tmp_path,
        space={
            "NCCL_PROTO": {"choices": ["LL", "Simple"], "when": {"cuda_graph": False}},
            "cuda_graph": {"choices": [None, False]},
        },
    )
    assert nccl_dimensions(spec) == {"NCCL_PROTO": (None, "LL", "Simple")}


def test_setting_labels_and_env():
    assert NcclSetting.of({"NCCL_PROTO": None}).label == DEFAULTS_LABEL
    s = NcclSetting.of({"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": 8, "NCCL_ALGO": None})
    assert s.label == "NCCL_MAX_NCHANNELS=8 NCCL_PROTO=LL" and s.as_env() == {
        "NCCL_MAX_NCHANNELS": "8",
        "NCCL_PROTO": "LL",
    }


def _drain(search: SettingSearch, objective) -> list[NcclSetting]:
    asked = []
    while (s := search.ask()) is not None:
        asked.append(s)
        search.tell(s, objective(s.as_env()))
    return asked


SMALL = {"NCCL_PROTO": (None, "LL", "Simple"), "NCCL_P2P_LEVEL": (None, "SYS")}


def test_a_small_space_is_enumerated_defaults_first():
    asked = _drain(SettingSearch(SMALL, budget=10), lambda env: 1.0)
    assert asked[0].is_defaults and len(asked) == 6 == len(set(asked))


def _interaction(env: dict[str, str]) -> float:
    """A latency surface like a PCIe host's: LL helps only with P2P across sockets; channels have an interior optimum."""
    us = 100.0
    if env.get("NCCL_P2P_LEVEL") == "SYS":
        us -= 10 + (35 if env.get("NCCL_PROTO") == "LL" else 0)
    us += abs(int(env.get("NCCL_MAX_NCHANNELS", "8")) - 4) * 0.5
    return us + (3 if env.get("NCCL_ALGO") == "Tree" else 0)


def test_a_large_space_is_searched_within_the_budget_and_finds_the_interaction(demo_spec):
    dims = nccl_dimensions(demo_spec)
    search = SettingSearch(dims, budget=40, seed=3)
    asked = _drain(search, _interaction)
    assert not search.enumerates and len(asked) == 40 == len(set(asked)) and asked[0].is_defaults
    best_possible = min(
        _interaction(NcclSetting.of(dict(zip(dims, c))).as_env()) for c in itertools.product(*dims.values())
    )
    assert _interaction(search.best().as_env()) == best_possible
    again = SettingSearch(dims, budget=40, seed=3)
    assert _drain(again, _interaction) == asked  # deterministic for a seed


def test_failed_settings_are_told_as_none_and_never_best():
    search = SettingSearch(SMALL, budget=10)
    _drain(search, lambda env: None if env.get("NCCL_PROTO") == "LL" else 5.0 - len(env))
    assert search.best().as_env() == {"NCCL_P2P_LEVEL": "SYS", "NCCL_PROTO": "Simple"}


def test_misuse_is_refused_with_the_rule():
    with pytest.raises(ValueError, match="a probe budget must be >= 1 setting, but got 0"):
        SettingSearch(SMALL, budget=0)
    with pytest.raises(ValueError, match="'NCCL_PROTO=LL' was never asked for"):
        SettingSearch(SMALL).tell(NcclSetting.of({"NCCL_PROTO": "LL"}), 1.0)
