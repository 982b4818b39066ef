"""Raw benchmark records and the server's own signals -> Metrics, with the source of every number.

Pure functions only: text and records in, values out. The formats are SGLang 0.5.23's
(reference/sglang-0.5.23/INTERFACE.md sections 3-6).

Which number comes from where:

- decode_tok_s, output_tok_s, TTFT, ITL, TPOT: the client's own timings (BenchRecord), warmup excluded.
- accept_length, accept_rate: the per-request `meta_info` of /generate, summed over requests before
  dividing (a long request counts for more verify passes than a short one). Never the /server_info
  lifetime average, which includes warmup and earlier runs.
- verify_ms: only from the device timer (`sglang:forward_execution_seconds_total{category="target_verify"}`,
  fed when the server runs with SGLANG_ENABLE_METRICS_DEVICE_TIMER=1), as GPU seconds per decode pass.
  Without it verify_ms stays None: nothing the client sees separates verify from draft time, and a
  fixed share (the field report's 94-95%) would be an assumption dressed up as a measurement.
- cycle_ms: the wall time of one speculative cycle (draft + verify + draft-extend) as a request saw it.
  For each speculative request (latency - ttft) / spec_verify_ct, i.e. its accept length over its
  decode rate, then the median over requests. Without speculation, 1000 / decode_tok_s.
"""

from __future__ import annotations

import json
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from orchestrator.records import BenchRecord, MeasurementSummary, Metrics
from orchestrator.stats import bootstrap_ci
from orchestrator.trial.decodelog import parse_decode_log


class MetricMissing(ValueError):
    """A measurement could not produce a number the sweep needs (the trial fails with metric_missing)."""


# ---------------------------------------------------------------------------------------------
# Prometheus /metrics

VERIFY_SECONDS = "sglang:forward_execution_seconds_total"
DECODE_PASSES = "sglang:cuda_graph_passes_total"
DECODE_PASS_MODES = ("decode_cuda_graph", "decode_none")


def parse_prometheus(text: str) -> list[Sample]:
    """All samples of a Prometheus text exposition (e.g. SGLang's GET /metrics)."""
    try:
        return [s for family in text_string_to_metric_families(text) for s in family.samples]
    except ValueError as exc:
        raise ValueError(f"/metrics text is not Prometheus exposition format: {exc}") from exc


def pick_samples(samples: Sequence[Sample], name: str, labels: Mapping[str, str] | None = None) -> list[Sample]:
    """Samples with this exact name whose labels include every given label=value."""
    want = dict(labels or {})
    return [s for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in want.items())]


def _rank0(samples: Sequence[Sample], name: str, labels: Mapping[str, str]) -> float | None:
    # Scheduler series carry tp_rank; with --enable-metrics-for-all-schedulers every rank exports
    # its own, and only rank 0's describe one pass of the model.
    found = pick_samples(samples, name, labels)
    if any("tp_rank" in s.labels for s in found):
        found = [s for s in found if s.labels.get("tp_rank") == "0"]
    return float(sum(s.value for s in found)) if found else None


def _decode_passes(samples: Sequence[Sample]) -> float | None:
    per_mode = [_rank0(samples, DECODE_PASSES, {"mode": m}) for m in DECODE_PASS_MODES]
    found = [p for p in per_mode if p is not None]
    return sum(found) if found else None


def verify_ms_from_metrics(before: str, after: str) -> float | None:
    """Mean GPU time of one target-verify pass in ms between two /metrics scrapes, or None when the
    server did not run with SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 or no decode pass happened.

    One decode iteration of a speculative server is one verify pass, and SGLang counts decode
    iterations in cuda_graph_passes_total{mode="decode_cuda_graph"|"decode_none"}.
    """
    b, a = parse_prometheus(before), parse_prometheus(after)
    v0 = _rank0(b, VERIFY_SECONDS, {"category": "target_verify"})
    v1 = _rank0(a, VERIFY_SECONDS, {"category": "target_verify"})
    p0, p1 = _decode_passes(b), _decode_passes(a)
    if v0 is None or v1 is None or p0 is None or p1 is None:
        return None
    if p1 - p0 <= 0 or v1 - v0 < 0:
        return None  # no decode pass in between, or the server restarted (counters reset)
    return (v1 - v0) / (p1 - p0) * 1000.0


# ---------------------------------------------------------------------------------------------
# sglang.bench_serving JSONL


def read_bench_serving_jsonl(text: str) -> list[dict[str, Any]]:
    """The runs in a bench_serving --output-file (one JSON object per line; the file appends, and
    values such as `"request_rate": Infinity` are allowed)."""
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)  # Python's json accepts Infinity/NaN, as bench_serving writes them.
        except json.JSONDecodeError as exc:
            raise ValueError(f"bench_serving output line {number} is not JSON ({exc.msg}): {line[:80]!r}") from exc
        if not isinstance(row, dict):
            raise ValueError(f"bench_serving output line {number} is not a JSON object: {line[:80]!r}")
        rows.append(row)
    return rows


def _finite(row: Mapping[str, Any], key: str) -> float | None:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def metrics_from_bench_serving(row: Mapping[str, Any], requested: int | None = None) -> Metrics:
    """Metrics from one bench_serving result row; with `requested` (the `--num-prompts` asked for),
    requests it did not complete count as failed.

    decode_tok_s is 1000 / median_tpot_ms (TPOT is (latency - ttft) / (output_len - 1) per request,
    so this is the median per-request decode rate). accept_length there is the server-lifetime
    average, warmup and earlier runs included, and is labelled so.
    """
    completed = int(_finite(row, "completed") or 0)
    output_tok_s = _finite(row, "output_throughput")
    tpot = _finite(row, "median_tpot_ms")
    if completed <= 0:
        raise MetricMissing("bench_serving completed no request (completed=0)")
    if output_tok_s is None or output_tok_s <= 0:
        raise MetricMissing(f"bench_serving row has no positive output_throughput: {row.get('output_throughput')!r}")
    if tpot is None or tpot <= 0:
        raise MetricMissing(
            f"bench_serving row has no positive median_tpot_ms ({row.get('median_tpot_ms')!r}): "
            "decode rate needs requests with at least 2 output tokens"
        )
    decode = 1000.0 / tpot
    accept = _finite(row, "accept_length")
    errors = row.get("errors")
    failed = sum(1 for e in errors if e) if isinstance(errors, list) else 0
    if requested is not None:
        failed = max(failed, requested - completed)
    sources = {
        "decode_tok_s": "bench_serving:1000/median_tpot_ms",
        "output_tok_s": "bench_serving:output_throughput",
        "ttft_ms": "bench_serving",
        "itl_ms": "bench_serving:per_token",
        "tpot_ms": "bench_serving",
    }
    if accept is not None:
        sources["accept_length"] = "bench_serving:server_lifetime"
        sources["cycle_ms"] = "derived:server_lifetime_accept_length/decode_tok_s"
        cycle = accept / decode * 1000.0
    else:
        sources["cycle_ms"] = "derived:1000/decode_tok_s"
        cycle = 1000.0 / decode
    sources["verify_ms"] = "unavailable:bench_serving_has_no_verify_timer"
    return Metrics(
        decode_tok_s=decode,
        output_tok_s=output_tok_s,
        ttft_ms_p50=_finite(row, "median_ttft_ms"),
        ttft_ms_p99=_finite(row, "p99_ttft_ms"),
        itl_ms_p50=_finite(row, "median_itl_ms"),
        itl_ms_p99=_finite(row, "p99_itl_ms"),
        tpot_ms_p50=tpot,
        accept_length=accept,
        cycle_ms=cycle,
        requests_ok=completed,
        requests_failed=failed,
        sources=sources,
    )


# ---------------------------------------------------------------------------------------------
# Records -> Metrics


def _itl_values(record: BenchRecord) -> list[float]:
    """Per-token inter-token latencies of one streamed request, like bench_serving: a chunk that
    carries k tokens after a gap g gives k values g/k; the first token-carrying chunk is the TTFT,
    and chunks without tokens do not reset the clock."""
    times = record.chunk_times_s
    tokens = record.chunk_tokens if record.chunk_tokens else (1,) * len(times)
    if len(tokens) != len(times):
        raise MetricMissing(f"request {record.index}: {len(times)} chunk times but {len(tokens)} chunk token counts")
    values: list[float] = []
    previous: float | None = None
    for t, k in zip(times, tokens):
        if k <= 0:
            continue
        if previous is not None:
            values.extend([(t - previous) / k] * k)
        previous = t
    return values


def _spec(record: BenchRecord) -> tuple[int, int] | None:
    """(completion tokens, verify passes) when the request went through speculative decoding."""
    vct = record.meta_info.get("spec_verify_ct")
    if not isinstance(vct, (int, float)) or vct <= 0:
        return None
    ct = record.meta_info.get("completion_tokens", record.completion_tokens)
    return int(ct), int(vct)


def _numbers(values: Sequence[Any]) -> list[float] | None:
    """The values as floats when every one is a number (JSON's meta_info may lack or null a field)."""
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return [float(v) for v in values]
    return None


def _accept_rate(spec_records: Sequence[BenchRecord], num_draft_tokens: int | None) -> tuple[float | None, str]:
    metas = [r.meta_info for r in spec_records]
    vct = [float(m["spec_verify_ct"]) for m in metas]
    correct = _numbers([m.get("spec_num_correct_drafts") for m in metas])
    proposed = _numbers([m.get("spec_num_proposed_drafts") for m in metas])
    if correct is not None:
        if proposed is not None and sum(proposed) > 0:
            return sum(correct) / sum(proposed), "meta_info:sum_correct/sum_proposed"
        if num_draft_tokens is not None and num_draft_tokens > 1:
            return (
                sum(correct) / (sum(vct) * (num_draft_tokens - 1)),
                "meta_info:sum_correct/(sum_verify_ct*(num_draft_tokens-1))",
            )
    rates = _numbers([m.get("spec_accept_rate") for m in metas])
    if rates is not None:
        # SGLang's per-request rate is correct / (verify_ct * (ndt - 1)); with one ndt per server,
        # weighting by verify_ct gives exactly sum(correct) / sum(verify_ct * (ndt - 1)).
        return (sum(r * v for r, v in zip(rates, vct)) / sum(vct), "meta_info:verify_ct_weighted_spec_accept_rate")
    return None, "unavailable:meta_info_lacks_spec_num_correct_drafts"


def _log_accept_length(log_text: str, start: float, end: float) -> float | None:
    """Mean `accept len` of the Decode batch lines logged while the measured requests ran, weighted by
    #running-req (each line covers the same number of iterations; the count is per request)."""
    lines = [ln for ln in parse_decode_log(log_text) if ln.accept_len is not None]
    # Log timestamps are local wall time with 1 s resolution: allow 1 s on either side.
    window = [
        (ln.accept_len, max(ln.running_req, 1))
        for ln in lines
        if ln.accept_len is not None and start - 1.0 <= ln.timestamp.timestamp() <= end + 1.0
    ]
    if not window:
        return None
    return sum(length * w for length, w in window) / sum(w for _, w in window)


def _pctl(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def _measured_ok(records: Sequence[BenchRecord]) -> tuple[list[BenchRecord], int]:
    """(the successful measured requests, how many measured ones failed); MetricMissing when none succeeded."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    failed = len(measured) - len(ok)
    if not ok:
        first_error = next((r.error for r in measured if r.error), None)
        raise MetricMissing(
            f"no successful measured request: {len(records)} records, "
            f"{len(records) - len(measured)} warmup, {failed} failed"
            + (f" (first error: {first_error})" if first_error else "")
        )
    return ok, failed


def _decode_rates(ok: Sequence[BenchRecord]) -> tuple[list[float], list[float]]:
    """(decode rates in tokens/s, TPOTs in ms) of the requests with >= 2 tokens and latency > ttft."""
    decode_rates, tpots = [], []
    for r in ok:
        if r.latency_s is None or r.ttft_s is None:
            continue
        decode_s = r.latency_s - r.ttft_s
        if r.completion_tokens >= 2 and decode_s > 0:
            decode_rates.append((r.completion_tokens - 1) / decode_s)
            tpots.append(decode_s / (r.completion_tokens - 1) * 1000.0)
    if not decode_rates:
        raise MetricMissing(
            f"decode rate needs an ok request with >= 2 completion tokens and latency > ttft; "
            f"none of the {len(ok)} ok requests qualifies"
        )
    return decode_rates, tpots


def _output_tok_s(ok: Sequence[BenchRecord]) -> float:
    """Completion tokens over the span from the first request's start to the last one's end."""
    ended = [(r.start_s, r.latency_s, r.completion_tokens) for r in ok if r.latency_s is not None]
    span = (max(start + latency for start, latency, _ in ended) - min(start for start, _, _ in ended)) if ended else 0.0
    if span <= 0:
        raise MetricMissing("output throughput needs request start and end times; the measured span is 0")
    return sum(tokens for _, _, tokens in ended) / span


@dataclass
class _Speculation:
    """What the measured requests tell of speculative decoding, with the source of each number."""

    accept_length: float | None = None
    accept_rate: float | None = None
    cycle_ms: float | None = None
    sources: dict[str, str] = field(default_factory=dict)


def _from_meta_info(
    spec_pairs: Sequence[tuple[BenchRecord, tuple[int, int]]], num_draft_tokens: int | None
) -> _Speculation:
    found = _Speculation(accept_length=sum(ct for _, (ct, _) in spec_pairs) / sum(v for _, (_, v) in spec_pairs))
    found.sources["accept_length"] = "meta_info:sum_completion_tokens/sum_spec_verify_ct"
    found.accept_rate, found.sources["accept_rate"] = _accept_rate([r for r, _ in spec_pairs], num_draft_tokens)
    cycles = [
        (r.latency_s - r.ttft_s) / verify_ct * 1000.0
        for r, (_, verify_ct) in spec_pairs
        if r.latency_s is not None and r.ttft_s is not None and r.latency_s > r.ttft_s
    ]
    if cycles:
        found.cycle_ms = float(np.median(cycles))
        found.sources["cycle_ms"] = "derived:median_per_request_(latency-ttft)/spec_verify_ct"
    return found


def _from_log(ok: Sequence[BenchRecord], log_text: str, decode_tok_s: float) -> _Speculation:
    start = min(r.start_s for r in ok)
    end = max(r.start_s + (r.latency_s or 0.0) for r in ok)
    found = _Speculation(accept_length=_log_accept_length(log_text, start, end))
    if found.accept_length is not None:
        found.sources["accept_length"] = "decode_log:running_req_weighted_mean_in_window"
        found.cycle_ms = found.accept_length / decode_tok_s * 1000.0
        found.sources["cycle_ms"] = "derived:accept_length/decode_tok_s"
    return found


def _speculation(
    ok: Sequence[BenchRecord], num_draft_tokens: int | None, log_text: str | None, decode_tok_s: float
) -> _Speculation:
    """Accept length and rate and the cycle time: from meta_info when the requests carry it, else from the
    scheduler log; without either the cycle is one token's decode time."""
    spec_pairs = [(r, pair) for r in ok if (pair := _spec(r)) is not None]
    if spec_pairs:
        found = _from_meta_info(spec_pairs, num_draft_tokens)
    elif log_text:
        found = _from_log(ok, log_text, decode_tok_s)
    else:
        found = _Speculation()
    if found.accept_length is None:
        found.cycle_ms = 1000.0 / decode_tok_s
        found.sources["cycle_ms"] = "derived:1000/decode_tok_s"
    return found


def _verify_ms(
    metrics_before: str | None, metrics_after: str | None, speculative: bool, sources: dict[str, str]
) -> float | None:
    """verify_ms from the device timer between the two scrapes, its source noted in `sources`."""
    verify_ms = None
    if metrics_before is not None and metrics_after is not None:
        verify_ms = verify_ms_from_metrics(metrics_before, metrics_after)
    if verify_ms is not None:
        sources["verify_ms"] = "device_timer"
    elif speculative:
        sources["verify_ms"] = "unavailable:needs_SGLANG_ENABLE_METRICS_DEVICE_TIMER=1_and_/metrics_before_and_after"
    return verify_ms


def compute(
    records: Sequence[BenchRecord],
    *,
    num_draft_tokens: int | None = None,
    metrics_before: str | None = None,
    metrics_after: str | None = None,
    log_text: str | None = None,
) -> Metrics:
    """Metrics of one measurement from its per-request records (warmup excluded).

    `num_draft_tokens` lets the accept rate be computed when meta_info lacks proposed-draft counts;
    `metrics_before`/`metrics_after` (GET /metrics just before and after the measured requests)
    give verify_ms from SGLang's device timer; `log_text` (the server log) is a fallback source of
    accept_length when the requests carried no meta_info. Raises MetricMissing when no measured
    request succeeded or the decode rate cannot be computed.
    """
    ok, failed = _measured_ok(records)
    decode_rates, tpots = _decode_rates(ok)
    decode_tok_s = float(np.median(decode_rates))
    output_tok_s = _output_tok_s(ok)
    ttfts = [r.ttft_s * 1000.0 for r in ok if r.ttft_s is not None]
    itls = [v * 1000.0 for r in ok for v in _itl_values(r)]
    sources = {
        "decode_tok_s": "client:median_per_request_(completion_tokens-1)/(latency-ttft)",
        "output_tok_s": "client:sum_completion_tokens/(last_end-first_start)",
        "ttft_ms": "client",
        "itl_ms": "client:per_token_chunk_gap/k",
        "tpot_ms": "client",
    }
    spec = _speculation(ok, num_draft_tokens, log_text, decode_tok_s)
    sources.update(spec.sources)
    verify_ms = _verify_ms(metrics_before, metrics_after, spec.accept_length is not None, sources)
    return Metrics(
        decode_tok_s=decode_tok_s,
        output_tok_s=output_tok_s,
        ttft_ms_p50=_pctl(ttfts, 50),
        ttft_ms_p99=_pctl(ttfts, 99),
        itl_ms_p50=_pctl(itls, 50),
        itl_ms_p99=_pctl(itls, 99),
        tpot_ms_p50=_pctl(tpots, 50),
        accept_length=spec.accept_length,
        accept_rate=spec.accept_rate,
        verify_ms=verify_ms,
        cycle_ms=spec.cycle_ms,
        requests_ok=len(ok),
        requests_failed=failed,
        sources=sources,
    )


# ---------------------------------------------------------------------------------------------
# Repeats -> median + interval

SUMMARY_FIELDS: tuple[str, ...] = tuple(
    name for name, f in Metrics.model_fields.items() if f.annotation is float or float in typing.get_args(f.annotation)
)
"""The Metrics fields that get a median and a bootstrap interval."""


def _medians(repeats: Sequence[Metrics], seed: int, n_boot: int) -> tuple[dict[str, float], ...]:
    """(medians, interval lows, interval highs) of SUMMARY_FIELDS over the repeats that have a finite value."""
    medians: dict[str, float] = {}
    lows: dict[str, float] = {}
    highs: dict[str, float] = {}
    for name in SUMMARY_FIELDS:
        values = [getattr(m, name) for m in repeats if getattr(m, name) is not None]
        values = [float(v) for v in values if math.isfinite(v)]
        if not values:
            continue
        medians[name] = float(np.median(values))
        lows[name], highs[name] = bootstrap_ci(values, n_boot=n_boot, seed=seed)
    return medians, lows, highs


def _merged_sources(repeats: Sequence[Metrics]) -> dict[str, str]:
    """Each number's sources over the repeats (distinct ones joined by ' | '), and how many were summarised."""
    sources: dict[str, str] = {}
    for key in sorted({k for m in repeats for k in m.sources}):
        distinct = sorted({m.sources[key] for m in repeats if key in m.sources})
        sources[key] = " | ".join(distinct)
    if len(repeats) > 1:
        sources["summary"] = f"median_of_{len(repeats)}_repeats"
    return sources


def summarize(repeats: Sequence[Metrics], *, seed: int = 0, n_boot: int = 2000) -> tuple[Metrics, MeasurementSummary]:
    """The field-wise median of r repeated measurements, and their medians with bootstrap 95%
    intervals. A field missing (None) in some repeats is summarised over the others. Request
    counts add up over repeats, so a failure in one repeat is not hidden by the median."""
    if not repeats:
        raise MetricMissing("summarize needs at least one measurement, but got none")
    medians, lows, highs = _medians(repeats, seed, n_boot)
    median_metrics = Metrics.model_validate(
        {
            **{name: medians.get(name) for name in SUMMARY_FIELDS},
            "requests_ok": sum(m.requests_ok for m in repeats),
            "requests_failed": sum(m.requests_failed for m in repeats),
            "sources": _merged_sources(repeats),
        }
    )
    summary = MeasurementSummary(repeats=len(repeats), median=medians, ci95_low=lows, ci95_high=highs)
    return median_metrics, summary
