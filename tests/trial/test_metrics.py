"""Metrics from raw records and SGLang's own signals, on text in the exact 0.5.23 formats."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from orchestrator.records import BenchRecord, Metrics
from orchestrator.trial.decodelog import parse_decode_log
from orchestrator.trial.metrics import (
    MetricMissing,
    compute,
    metrics_from_bench_serving,
    parse_prometheus,
    pick_samples,
    read_bench_serving_jsonl,
    summarize,
    verify_ms_from_metrics,
)

T0 = 1_800_000_000.0


def rec(
    index,
    *,
    start=0.0,
    ttft=0.1,
    latency=1.1,
    tokens=51,
    warmup=False,
    ok=True,
    error=None,
    chunks=(),
    chunk_tokens=(),
    meta=None,
):
    return BenchRecord(
        index=index,
        warmup=warmup,
        ok=ok,
        error=error,
        completion_tokens=tokens,
        start_s=T0 + start,
        ttft_s=ttft,
        latency_s=latency,
        chunk_times_s=chunks,
        chunk_tokens=chunk_tokens,
        meta_info=meta or {},
    )


PLAIN = [
    rec(0, start=0.0, ttft=0.1, latency=2.1, tokens=101),  # 100 tokens / 2.0 s = 50 tok/s
    rec(1, start=0.5, ttft=0.2, latency=1.2, tokens=41),  # 40 / 1.0 = 40
    rec(2, start=1.0, ttft=0.3, latency=2.3, tokens=121),  # 120 / 2.0 = 60
]


# --- compute: plain decoding ------------------------------------------------------------------


def test_plain_decoding_numbers():
    m = compute(PLAIN)
    assert m.decode_tok_s == pytest.approx(50.0)
    assert m.output_tok_s == pytest.approx(263 / 3.3)  # all tokens over first start .. last end
    assert m.ttft_ms_p50 == pytest.approx(200.0)
    assert m.tpot_ms_p50 == pytest.approx(20.0)
    assert (m.requests_ok, m.requests_failed) == (3, 0)
    # No speculation: no acceptance, one token per cycle.
    assert m.accept_length is None and m.accept_rate is None and m.verify_ms is None
    assert m.cycle_ms == pytest.approx(20.0)
    assert m.sources["cycle_ms"] == "derived:1000/decode_tok_s"


def test_warmup_and_failed_requests_do_not_count():
    noisy = [
        rec(9, start=-30.0, ttft=5.0, latency=10.0, tokens=3, warmup=True),
        *PLAIN,
        rec(10, start=0.2, ttft=None, latency=None, tokens=0, ok=False, error="HTTP 500"),
    ]
    m = compute(noisy)
    assert m.decode_tok_s == pytest.approx(50.0)
    assert m.output_tok_s == pytest.approx(263 / 3.3)
    assert m.ttft_ms_p99 < 400
    assert (m.requests_ok, m.requests_failed) == (3, 1)


def test_itl_splits_a_speculative_chunk_into_per_token_gaps():
    # Chunk 1 is the first token (TTFT). Chunk 2 brings 3 tokens after 30 ms: 10, 10, 10.
    # Chunk 3 carries no token and does not reset the clock; chunk 4 brings 2 tokens 30 ms after
    # chunk 2: 15, 15.
    r = rec(0, ttft=0.100, latency=0.160, tokens=6, chunks=(0.100, 0.130, 0.140, 0.160), chunk_tokens=(1, 3, 0, 2))
    m = compute([r])
    assert m.itl_ms_p50 == pytest.approx(10.0)
    assert m.itl_ms_p99 == pytest.approx(15.0)


def test_chunks_without_token_counts_count_one_token_each():
    r = rec(0, ttft=0.1, latency=0.3, tokens=3, chunks=(0.1, 0.2, 0.3))
    assert compute([r]).itl_ms_p50 == pytest.approx(100.0)


# --- compute: acceptance --------------------------------------------------------------------

# num_draft_tokens = 6 (5 drafts per verify). A long request accepts well, a short one not at all.
LONG = dict(completion_tokens=100, spec_verify_ct=25, spec_num_correct_drafts=75)
SHORT = dict(completion_tokens=10, spec_verify_ct=10, spec_num_correct_drafts=0)


def spec_records(long_meta, short_meta):
    return [
        rec(0, ttft=0.1, latency=0.6, tokens=100, meta=long_meta),  # 25 cycles in 0.5 s: 20 ms
        rec(1, ttft=0.1, latency=0.35, tokens=10, meta=short_meta),  # 10 cycles in 0.25 s: 25 ms
    ]


ACCEPT_RATE_CASES = [
    (
        "proposed drafts reported",
        {**LONG, "spec_num_proposed_drafts": 125},
        {**SHORT, "spec_num_proposed_drafts": 50},
        None,
        75 / 175,
        "meta_info:sum_correct/sum_proposed",
    ),
    ("draft token count given", LONG, SHORT, 6, 75 / 175, "meta_info:sum_correct/(sum_verify_ct*(num_draft_tokens-1))"),
    (
        "only per-request rates",
        {"spec_verify_ct": 25, "spec_accept_rate": 0.6, "completion_tokens": 100},
        {"spec_verify_ct": 10, "spec_accept_rate": 0.0, "completion_tokens": 10},
        None,
        75 / 175,
        "meta_info:verify_ct_weighted_spec_accept_rate",
    ),
    (
        "nothing to compute it from",
        {"spec_verify_ct": 25, "completion_tokens": 100},
        {"spec_verify_ct": 10, "completion_tokens": 10},
        None,
        None,
        "unavailable:meta_info_lacks_spec_num_correct_drafts",
    ),
]


@pytest.mark.parametrize(
    ("long_meta", "short_meta", "ndt", "rate", "source"),
    [c[1:] for c in ACCEPT_RATE_CASES],
    ids=[c[0] for c in ACCEPT_RATE_CASES],
)
def test_acceptance_is_weighted_by_verify_passes(long_meta, short_meta, ndt, rate, source):
    m = compute(spec_records(long_meta, short_meta), num_draft_tokens=ndt)
    # 110 tokens over 35 verify passes, not the mean of the per-request ratios (4.0 and 1.0 -> 2.5).
    assert m.accept_length == pytest.approx(110 / 35)
    assert m.sources["accept_length"] == "meta_info:sum_completion_tokens/sum_spec_verify_ct"
    assert (m.accept_rate is None) if rate is None else (m.accept_rate == pytest.approx(rate))
    assert m.sources["accept_rate"] == source


def test_cycle_is_derived_per_request_and_verify_stays_unmeasured_without_device_timer():
    m = compute(spec_records(LONG, SHORT), num_draft_tokens=6)
    assert m.cycle_ms == pytest.approx(22.5)  # median of 20 ms and 25 ms
    assert m.sources["cycle_ms"].startswith("derived:")
    assert m.verify_ms is None
    assert m.sources["verify_ms"].startswith("unavailable:")


# GET /metrics as SGLang 0.5.23 exports it with SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 (tp_rank 1
# only appears with --enable-metrics-for-all-schedulers and must not be added in).
LABELS = 'engine_type="unified",model_name="kimi",moe_ep_rank="0",pp_rank="0"'


def scrape(verify_s0, verify_s1, graph, eager, draft=1.0):
    return f"""# HELP sglang:forward_execution_seconds_total GPU time per forward category.
# TYPE sglang:forward_execution_seconds_total counter
sglang:forward_execution_seconds_total{{category="target_verify",{LABELS},tp_rank="0"}} {verify_s0}
sglang:forward_execution_seconds_total{{category="target_verify",{LABELS},tp_rank="1"}} {verify_s1}
sglang:forward_execution_seconds_total{{category="eagle_draft",{LABELS},tp_rank="0"}} {draft}
# HELP sglang:cuda_graph_passes_total Number of forward passes by mode.
# TYPE sglang:cuda_graph_passes_total counter
sglang:cuda_graph_passes_total{{mode="decode_cuda_graph",{LABELS},tp_rank="0"}} {graph}
sglang:cuda_graph_passes_total{{mode="decode_none",{LABELS},tp_rank="0"}} {eager}
sglang:cuda_graph_passes_total{{mode="prefill_none",{LABELS},tp_rank="0"}} 77.0
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{{{LABELS},tp_rank="0"}} 812.4
"""


def test_verify_ms_from_the_device_timer():
    before = scrape(10.0, 99.0, 1000, 10)
    after = scrape(10.7, 199.0, 1030, 15, draft=5.0)
    m = compute(spec_records(LONG, SHORT), metrics_before=before, metrics_after=after)
    assert m.verify_ms == pytest.approx(0.7 / 35 * 1000)  # 20 ms per decode pass
    assert m.sources["verify_ms"] == "device_timer"


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("sglang:gen_throughput 812.4\n", "sglang:gen_throughput 800.0\n"),  # device timer off
        (scrape(10.0, 0, 1000, 10), scrape(10.0, 0, 1000, 10)),  # no decode pass
    ],
)
def test_no_verify_ms_without_timer_or_passes(before, after):
    assert verify_ms_from_metrics(before, after) is None


def test_prometheus_sample_lookup_by_labels():
    samples = parse_prometheus(scrape(10.0, 99.0, 1000, 10))

    def values(name: str, labels: dict[str, str] | None = None) -> list[float]:
        return [s.value for s in pick_samples(samples, name, labels)]

    assert values("sglang:gen_throughput") == [812.4]
    assert values("sglang:cuda_graph_passes_total", {"mode": "decode_none"}) == [10]
    assert values("sglang:forward_execution_seconds_total", {"category": "target_verify", "tp_rank": "1"}) == [99.0]
    assert values("sglang:spec_accept_length") == []


def test_accept_length_from_the_decode_log_when_requests_carry_no_meta_info():
    def line(offset_s, running, accept):
        ts = dt.datetime.fromtimestamp(T0 + offset_s).strftime("%Y-%m-%d %H:%M:%S")
        return (
            f"[{ts} TP0] Decode batch, #running-req: {running}, #token: 5120, token usage: 0.02, "
            f"accept len: {accept:.2f}, accept rate: 0.71, cuda graph: True, "
            f"gen throughput (token/s): 812.40, #queue-req: 0"
        )

    log = "\n".join(
        [
            line(-60, 1, 1.00),  # warmup, a minute before: outside the measured window
            line(1, 8, 3.00),
            line(2, 2, 2.00),
        ]
    )
    m = compute(PLAIN, log_text=log)
    assert m.accept_length == pytest.approx((3.0 * 8 + 2.0 * 2) / 10)
    assert m.sources["accept_length"] == "decode_log:running_req_weighted_mean_in_window"
    assert m.cycle_ms == pytest.approx(m.accept_length / 50.0 * 1000)


MISSING_CASES = [
    ("no records", [], "no successful measured request"),
    ("only warmup", [rec(0, warmup=True)], "1 warmup"),
    (
        "all failed",
        [rec(0, ok=False, error="connection refused", ttft=None, latency=None)],
        "first error: connection refused",
    ),
    ("single-token answers", [rec(0, tokens=1)], "at least|>= 2 completion tokens"),
]


@pytest.mark.parametrize(("records", "message"), [c[1:] for c in MISSING_CASES], ids=[c[0] for c in MISSING_CASES])
def test_metric_missing(records, message):
    with pytest.raises(MetricMissing, match=message) as info:
        compute(records)
    assert isinstance(info.value, ValueError)


# --- decode log lines -------------------------------------------------------------------------

LOG_CASES = [
    (
        "reference line",
        "[2026-11-29 13:14:07 TP0] Decode batch, #running-req: 8, #token: 5120, token usage: 0.02, "
        "accept len: 3.12, accept rate: 0.71, cuda graph: True, gen throughput (token/s): 812.40, #queue-req: 0",
        dict(
            ranks={"TP": 0},
            running_req=8,
            num_tokens=5120,
            token_usage=0.02,
            accept_len=3.12,
            accept_rate=0.71,
            cuda_graph=True,
            gen_throughput=812.40,
            queue_req=0,
            iteration=None,
            timestamp=dt.datetime(2026, 11, 29, 13, 14, 7),
        ),
    ),
    (
        "no speculation, TP 1 (no prefix)",
        "[2026-11-29 13:14:07] Decode batch, #running-req: 1, #token: 130, token usage: 0.00, "
        "cuda graph: False, gen throughput (token/s): 88.80, #queue-req: 3",
        dict(
            ranks={},
            running_req=1,
            accept_len=None,
            accept_rate=None,
            cuda_graph=False,
            gen_throughput=88.8,
            queue_req=3,
        ),
    ),
    (
        "iteration counter (SGLANG_LOG_FORWARD_ITERS=1)",
        "[2026-11-29 13:14:07 TP0] Decode batch [1240], #running-req: 4, #token: 900, token usage: 0.01, "
        "accept len: 2.40, accept rate: 0.60, cuda graph: True, gen throughput (token/s): 104.70, #queue-req: 0",
        dict(iteration=1240, accept_len=2.40, gen_throughput=104.7),
    ),
    (
        "milliseconds (SGLANG_LOG_MS=1), DP and TP prefix, extra fields",
        "[2026-11-29 13:14:07.123 DP1 TP3] Decode batch, #running-req: 2, #token: 512, token usage: 0.10, "
        "cuda graph: True, gen throughput (token/s): 75.90, #queue-req: 0, est. decode TFLOPS/s (per GPU): 12.30",
        dict(
            ranks={"DP": 1, "TP": 3},
            timestamp=dt.datetime(2026, 11, 29, 13, 14, 7, 123000),
            extra={"est. decode TFLOPS/s (per GPU)": "12.30"},
        ),
    ),
]


@pytest.mark.parametrize(("line", "expected"), [c[1:] for c in LOG_CASES], ids=[c[0] for c in LOG_CASES])
def test_parse_decode_log(line, expected):
    (parsed,) = parse_decode_log(f"some other line\n{line}\n")
    for key, value in expected.items():
        assert getattr(parsed, key) == value, key


def test_parse_decode_log_ignores_other_lines():
    text = (
        "[2026-11-29 13:14:05 TP0] Prefill batch, #new-seq: 1, #new-token: 128, #cached-token: 0, "
        "token usage: 0.00, #running-req: 0, #queue-req: 0, #pending-token: 0, cuda graph: False, "
        "input throughput (token/s): 0.00\n"
        "[2026-11-29 13:14:06] The server is fired up and ready to roll!\n"
    )
    assert parse_decode_log(text) == []


# --- bench_serving JSONL ----------------------------------------------------------------------

ROW = (
    '{"tag": null, "backend": "sglang", "dataset_name": "random-ids", "request_rate": Infinity, '
    '"max_concurrency": 1, "duration": 12.5, "completed": 16, "total_output_tokens": 8192, '
    '"output_throughput": 655.4, "median_ttft_ms": 41.0, "p99_ttft_ms": 95.5, '
    '"median_itl_ms": 9.1, "p99_itl_ms": 30.2, "median_tpot_ms": 10.6, "accept_length": 2.91}'
)


def test_bench_serving_jsonl_with_infinity_and_appended_runs():
    rows = read_bench_serving_jsonl(ROW + "\n\n" + ROW.replace('"completed": 16', '"completed": 15') + "\n")
    assert [r["completed"] for r in rows] == [16, 15]
    assert math.isinf(rows[0]["request_rate"])


def test_bench_serving_jsonl_names_the_broken_line():
    with pytest.raises(ValueError, match="line 2"):
        read_bench_serving_jsonl(ROW + "\n" + ROW[:40] + "\n")


def test_metrics_from_bench_serving_labels_its_lifetime_accept_length():
    m = metrics_from_bench_serving(read_bench_serving_jsonl(ROW)[0])
    assert m.decode_tok_s == pytest.approx(1000 / 10.6)
    assert (m.output_tok_s, m.ttft_ms_p50, m.ttft_ms_p99, m.itl_ms_p50, m.itl_ms_p99, m.tpot_ms_p50) == (
        655.4,
        41.0,
        95.5,
        9.1,
        30.2,
        10.6,
    )
    assert m.accept_length == 2.91
    assert m.sources["accept_length"] == "bench_serving:server_lifetime"
    assert m.requests_ok == 16


def test_metrics_from_bench_serving_counts_requests_it_did_not_complete_as_failed():
    row = read_bench_serving_jsonl(ROW)[0]
    assert metrics_from_bench_serving(row, requested=20).requests_failed == 4
    assert metrics_from_bench_serving(row, requested=16).requests_failed == 0
    assert metrics_from_bench_serving(row).requests_failed == 0


@pytest.mark.parametrize(
    "change", ['"completed": 0', '"completed": Infinity', '"output_throughput": 0.0', '"median_tpot_ms": NaN']
)
def test_metrics_from_bench_serving_without_results(change):
    key = change.split(":")[0]
    row = read_bench_serving_jsonl(__import__("re").sub(key + r": [^,]+", change, ROW))[0]
    with pytest.raises(MetricMissing):
        metrics_from_bench_serving(row)


# --- repeats ----------------------------------------------------------------------------------


def m(decode, *, verify=None, ok=8, failed=0, verify_source=None):
    sources = {"decode_tok_s": "client"}
    if verify_source:
        sources["verify_ms"] = verify_source
    return Metrics(
        decode_tok_s=decode,
        output_tok_s=decode * 4,
        verify_ms=verify,
        requests_ok=ok,
        requests_failed=failed,
        sources=sources,
    )


def test_summarize_one_repeat_interval_is_the_value():
    median, summary = summarize([m(88.8, verify=21.7)])
    assert median.decode_tok_s == 88.8
    assert summary.repeats == 1
    assert summary.ci95_low["decode_tok_s"] == summary.ci95_high["decode_tok_s"] == 88.8
    assert "ttft_ms_p50" not in summary.median


def test_summarize_medians_intervals_and_counts():
    repeats = [
        m(82.0, verify=22.0),
        m(89.0, verify=None, failed=2),
        m(85.0, verify=21.0),
        m(84.0, verify=21.5),
        m(86.0, verify=21.8, verify_source="device_timer"),
    ]
    median, summary = summarize(repeats, seed=1)
    assert median.decode_tok_s == 85.0
    assert median.output_tok_s == 340.0
    assert median.verify_ms == pytest.approx(21.65)  # over the 4 repeats that measured it
    assert (median.requests_ok, median.requests_failed) == (40, 2)  # a failure is not hidden
    assert summary.ci95_low["decode_tok_s"] <= 85.0 <= summary.ci95_high["decode_tok_s"]
    assert summary.median["verify_ms"] == pytest.approx(21.65)
    assert median.sources["verify_ms"] == "device_timer"
    assert summarize(repeats, seed=1) == (median, summary)


def test_summarize_nothing_is_an_error():
    with pytest.raises(MetricMissing):
        summarize([])
