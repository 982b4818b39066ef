"""SGLang's Prometheus metrics (`--enable-metrics`, GET /metrics) for one simulated server.

The `sglang:*` series with SGLang's label names (model_name, engine_type, tp_rank, pp_rank,
moe_ep_rank on scheduler metrics; model_name on tokenizer metrics), produced by prometheus_client
from a registry owned by the server (no global registry). Only names listed in
`orchestrator/reference/sglang_0_5_23/metric_names.txt` are emitted.
`sglang:forward_execution_seconds_total` is fed only with SGLANG_ENABLE_METRICS_DEVICE_TIMER=1.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# SGLang's default histogram buckets (observability/metrics_collector.py).
_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
_ITL_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.035,
    0.04,
    0.06,
    0.08,
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
)
_E2E_BUCKETS = (
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
    10.0,
    20.0,
    40.0,
    60.0,
    80.0,
    100.0,
    200.0,
    400.0,
    600.0,
    1200.0,
    1800.0,
    2400.0,
)


class Metrics:
    """SGLang's scheduler and tokenizer metrics for one server; `device_timer` mirrors the env var."""

    def __init__(self, model_name: str, *, speculative: bool, device_timer: bool):
        self.registry = CollectorRegistry(auto_describe=True)
        self.speculative = speculative
        self.labels = {
            "model_name": model_name,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        names = tuple(self.labels)
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"sglang:{name}", doc, names, registry=r)

        self.gen_throughput = gauge("gen_throughput", "The generation throughput (token/s).")
        self.num_running_reqs = gauge("num_running_reqs", "The number of running requests.")
        self.num_queue_reqs = gauge("num_queue_reqs", "The number of requests in the waiting queue.")
        self.num_used_tokens = gauge("num_used_tokens", "The number of used tokens.")
        self.token_usage = gauge("token_usage", "The token usage.")
        self.is_cuda_graph = gauge("is_cuda_graph", "Whether the batch is using CUDA graph.")
        self.cache_hit_rate = gauge("cache_hit_rate", "The prefix cache hit rate.")
        self.max_total_num_tokens = gauge("max_total_num_tokens", "Maximum total number of tokens in the KV pool.")
        self.spec_accept_length = gauge(
            "spec_accept_length",
            "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
        )
        self.spec_accept_rate = gauge(
            "spec_accept_rate", "Speculative decoding acceptance rate (accepted drafts / proposed drafts)."
        )
        self.spec_num_steps = gauge("spec_num_steps", "The number of speculative steps.")
        self.spec_num_draft_tokens = gauge("spec_num_draft_tokens", "The number of speculative draft tokens.")
        self.cuda_graph_passes = Counter(
            "sglang:cuda_graph_passes", "Forward passes by CUDA graph mode.", (*names, "mode"), registry=r
        )
        self.forward_seconds = (
            Counter(
                "sglang:forward_execution_seconds",
                "GPU execution time of forward passes (device timer).",
                (*names, "category"),
                registry=r,
            )
            if device_timer
            else None
        )
        tok_names = ("model_name",)
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens", "Number of prefill tokens processed.", (*tok_names, "is_streaming"), registry=r
        )
        self.generation_tokens = Counter(
            "sglang:generation_tokens",
            "Number of generation tokens processed.",
            (*tok_names, "is_streaming"),
            registry=r,
        )
        self.cached_tokens = Counter("sglang:cached_tokens", "Number of cached prompt tokens.", tok_names, registry=r)
        self.num_requests = Counter("sglang:num_requests", "Number of requests processed.", tok_names, registry=r)
        self.num_aborted = Counter("sglang:num_aborted_requests", "Number of requests aborted.", tok_names, registry=r)
        self.spec_verify_calls = Counter(
            "sglang:spec_verify_calls", "Speculative verify forward calls.", tok_names, registry=r
        )
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            tok_names,
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            tok_names,
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            tok_names,
            buckets=_E2E_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "sglang:request_time_per_output_token_seconds",
            "Histogram of (finished_time - first_token_time) / (completion_tokens - 1).",
            tok_names,
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self._model = {"model_name": model_name}

    # Scheduler side -------------------------------------------------------------------------------
    def set_static(self, *, spec_steps: int, spec_draft_tokens: int, max_total_tokens: int) -> None:
        self.max_total_num_tokens.labels(**self.labels).set(max_total_tokens)
        if self.speculative:
            self.spec_num_steps.labels(**self.labels).set(spec_steps)
            self.spec_num_draft_tokens.labels(**self.labels).set(spec_draft_tokens)

    def decode_pass(self, *, cuda_graph: bool, seconds: Mapping[str, float]) -> None:
        """One decode iteration; `seconds` is its device time per forward category."""
        mode = "decode_cuda_graph" if cuda_graph else "decode_none"
        self.cuda_graph_passes.labels(**self.labels, mode=mode).inc()
        if self.forward_seconds is not None:
            for category, s in seconds.items():
                self.forward_seconds.labels(**self.labels, category=category).inc(s)

    def prefill_pass(self, seconds: float) -> None:
        if self.forward_seconds is not None:
            self.forward_seconds.labels(**self.labels, category="extend").inc(seconds)

    def report(
        self,
        *,
        running: int,
        queued: int,
        used_tokens: int,
        token_usage: float,
        gen_throughput: float,
        cuda_graph: bool,
        accept_length: float | None,
        accept_rate: float | None,
    ) -> None:
        """The gauges SGLang refreshes at each decode-log interval."""
        lb = self.labels
        self.num_running_reqs.labels(**lb).set(running)
        self.num_queue_reqs.labels(**lb).set(queued)
        self.num_used_tokens.labels(**lb).set(used_tokens)
        self.token_usage.labels(**lb).set(token_usage)
        self.gen_throughput.labels(**lb).set(gen_throughput)
        self.is_cuda_graph.labels(**lb).set(1 if cuda_graph else 0)
        if self.speculative and accept_length is not None:
            self.spec_accept_length.labels(**lb).set(accept_length)
            self.spec_accept_rate.labels(**lb).set(accept_rate or 0.0)

    def queue_state(self, *, running: int, queued: int, cache_hit_rate: float) -> None:
        self.num_running_reqs.labels(**self.labels).set(running)
        self.num_queue_reqs.labels(**self.labels).set(queued)
        self.cache_hit_rate.labels(**self.labels).set(cache_hit_rate)

    # Tokenizer side -------------------------------------------------------------------------------
    def first_token(self, ttft_s: float) -> None:
        self.ttft.labels(**self._model).observe(ttft_s)

    def chunk(self, interval_s: float, tokens: int) -> None:
        """A streamed chunk of `tokens` tokens `interval_s` after the previous one (split per token)."""
        for _ in range(tokens):
            self.itl.labels(**self._model).observe(interval_s / tokens)

    def finished(
        self,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int,
        streaming: bool,
        e2e_s: float,
        decode_s: float,
        verify_ct: int,
        aborted: bool,
    ) -> None:
        m, flag = self._model, "true" if streaming else "false"
        self.prompt_tokens.labels(**m, is_streaming=flag).inc(prompt_tokens)
        self.generation_tokens.labels(**m, is_streaming=flag).inc(completion_tokens)
        self.cached_tokens.labels(**m).inc(cached_tokens)
        self.num_requests.labels(**m).inc()
        if aborted:
            self.num_aborted.labels(**m).inc()
            return
        self.e2e.labels(**m).observe(e2e_s)
        if completion_tokens > 1:
            self.tpot.labels(**m).observe(decode_s / (completion_tokens - 1))
        if verify_ct:
            self.spec_verify_calls.labels(**m).inc(verify_ct)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
