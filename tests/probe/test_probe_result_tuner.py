"""The probe's ranking with keep_within, probe.json, and the nccl-tuner rules parsed back field by field."""

from __future__ import annotations

import pytest
from probe_helpers import write_spec

from orchestrator.probe import (
    DEFAULTS_LABEL,
    NcclChoice,
    ProbeResult,
    ProbeRow,
    SettingRecord,
    parse_tuner_config,
    rank_settings,
    render_tuner_config,
    run_probe,
    tuner_rules,
)
from orchestrator.probe.sizes import message_sizes
from orchestrator.probe.tuner import COLLECTIVES, SIZE_MAX, TunerRule

SIZES = message_sizes(7168, 2, draft_tokens=[2, 4], large=(1 << 20,))
LL, SIMPLE = (
    NcclChoice(algorithm="RING", protocol="LL", channels=2),
    NcclChoice(algorithm="RING", protocol="SIMPLE", channels=8),
)


def _result(settings: dict[str, tuple[dict[str, str], dict[str, float] | None]]) -> ProbeResult:
    """settings: label -> (env, size label -> graph latency; None = the setting hung)."""
    records, rows = [], []
    for label, (env, latencies) in settings.items():
        status = "ok" if latencies is not None else "hang"
        records.append(SettingRecord(setting=label, env=env, status=status, seconds=1.0))
        for size in SIZES:
            us = None if latencies is None else latencies[size.label]
            rows.append(
                ProbeRow(
                    setting=label,
                    env=env,
                    size=size.label,
                    nbytes=size.nbytes,
                    mode="graph",
                    median_us=us,
                    repeats=5 if us else 0,
                    status=status,
                    nccl_choice=None if us is None else (SIMPLE if size.kind == "large" else LL),
                )
            )
    return ProbeResult(
        experiment="e",
        engine="simulator",
        host="h",
        tp=8,
        nccl_version="2.28.9",
        sizes=SIZES,
        settings=tuple(records),
        rows=tuple(rows),
        space_settings=4,
        searched=False,
        seconds=4.0,
    )


def _lat(decode: float, v2: float, v4: float, large: float = 500.0) -> dict[str, float]:
    return {"decode": decode, "verify-2": v2, "verify-4": v4, "large-1MiB": large}


RESULT = _result(
    {
        DEFAULTS_LABEL: ({}, _lat(80, 80, 90)),
        "NCCL_PROTO=LL": ({"NCCL_PROTO": "LL"}, _lat(40, 40, 50, 900)),  # score 45: the best at verify sizes
        "NCCL_MAX_NCHANNELS=2": ({"NCCL_MAX_NCHANNELS": "2"}, _lat(50, 50, 58)),  # 54 = 1.2 x 45
        "NCCL_ALGO=Tree": ({"NCCL_ALGO": "Tree"}, _lat(60, 60, 60, 400)),  # 60: outside 1.2
        "NCCL_PROTO=LL128": ({"NCCL_PROTO": "LL128"}, None),  # hung
    }
)


def test_ranking_by_verify_latency_keeps_those_within_and_always_the_defaults():
    ranked = rank_settings(RESULT, keep_within=1.2)
    assert [(r.rank, r.setting, r.score_us, r.kept) for r in ranked] == [
        (1, "NCCL_PROTO=LL", 45.0, True),
        (2, "NCCL_MAX_NCHANNELS=2", 54.0, True),
        (3, "NCCL_ALGO=Tree", 60.0, False),
        (4, DEFAULTS_LABEL, 85.0, True),
        (5, "NCCL_PROTO=LL128", None, False),
    ]
    assert ranked[1].relative == pytest.approx(1.2)
    assert [r.kept for r in rank_settings(RESULT)] == [True, True, True, True, False]


def test_keep_within_below_one_is_refused():
    with pytest.raises(ValueError, match="keep_within is a ratio to the best latency and must be >= 1.0, but got 0.8"):
        rank_settings(RESULT, keep_within=0.8)


def test_tuner_rules_pick_each_sizes_winner_and_end_with_catch_alls():
    rules = tuner_rules(RESULT)
    decode, v2, v4, large = (s.nbytes for s in SIZES)
    assert (
        rules
        == (
            TunerRule("allreduce", 0, int((v4 * large) ** 0.5), "ring", "ll", 2, 1, 8),  # decode..verify-4: LL won
            TunerRule("allreduce", int((v4 * large) ** 0.5) + 1, large, "ring", "simple", 8, 1, 8),  # 1 MiB: Tree won
            TunerRule("allreduce", 0, SIZE_MAX, "ring", "simple", 8, 1, 8),
            *(TunerRule(c, 0, SIZE_MAX, "ring", "simple", 8, 1, 8) for c in COLLECTIVES[1:]),
        )
    )


def test_the_rendered_file_parses_back_rule_by_rule_for_a_real_simulated_probe(tmp_path):
    spec = write_spec(tmp_path, simulator={"hardware_profile": "pcie-rtxpro6000-x8-turin"})
    result = run_probe(spec, tmp_path / "wd", budget=20)
    text = render_tuner_config(result)
    parsed = parse_tuner_config(text)
    assert parsed == tuner_rules(result)
    assert all(line.startswith("#") for line in text.splitlines()[:5])
    for rule in parsed:  # every field of every rule
        assert rule.collective in COLLECTIVES and rule.algorithm in ("ring", "tree")
        assert rule.protocol in ("ll", "ll128", "simple") and rule.channels >= 1
        assert (rule.n_nodes, rule.n_ranks, rule.num_pipe_ops, rule.reg_buff) == (1, 8, None, None)
    allreduce = [r for r in parsed if r.collective == "allreduce"]
    assert allreduce[0].min_bytes == 0 and allreduce[-1].max_bytes == SIZE_MAX
    sized = allreduce[:-1]
    assert all(a.max_bytes + 1 == b.min_bytes for a, b in zip(sized, sized[1:]))  # the ranges tile, no gap
    assert {r.collective for r in parsed if (r.min_bytes, r.max_bytes) == (0, SIZE_MAX)} == set(COLLECTIVES)


def test_a_probe_without_nccl_choices_has_no_rules():
    bare = RESULT.model_copy(update={"rows": tuple(r.model_copy(update={"nccl_choice": None}) for r in RESULT.rows)})
    with pytest.raises(ValueError, match="the probe recorded no NCCL choice"):
        tuner_rules(bare)


@pytest.mark.parametrize(
    "line,message",
    [
        ("allreduce,0,100,ring,ll,2,1", "line 1: a rule has 8 to 10 comma-separated fields, but got 7"),
        ("allsum,0,100,ring,ll,2,1,8", "line 1: collective must be one of allreduce, allgather"),
        ("allreduce,0,100,star,ll,2,1,8", "line 1: algorithm must be one of tree, ring"),
        ("allreduce,0,100,ring,fast,2,1,8", "line 1: protocol must be one of ll, ll128, simple, but got 'fast'"),
        ("allreduce,0,1k,ring,ll,2,1,8", "line 1: max_bytes must be an integer, but got '1k'"),
        ("allreduce,100,0,ring,ll,2,1,8", r"line 1: min_bytes <= max_bytes must hold, but got \(100, 0\)"),
    ],
)
def test_bad_tuner_lines_name_the_line_and_field(line, message):
    with pytest.raises(ValueError, match=message):
        parse_tuner_config(line)


def test_optional_fields_and_comments_parse():
    rules = parse_tuner_config("# c\n\nallreduce,0,65536,tree,simple,2,1,-1\nallgather,0,10,ring,ll,4,1,8,-1,1\n")
    assert rules[0] == TunerRule("allreduce", 0, 65536, "tree", "simple", 2, 1, -1)
    assert rules[1] == TunerRule("allgather", 0, 10, "ring", "ll", 4, 1, 8, num_pipe_ops=-1, reg_buff=1)
    assert rules[1].line() == "allgather,0,10,ring,ll,4,1,8,-1,1"
