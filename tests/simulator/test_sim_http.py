"""A real simulator process seen from outside: SGLang's HTTP surface, metrics, logs, rank workers."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sim_helpers import Sim, descendants, environ_of, wait_gone

METRIC_NAMES = set(
    (Path(__file__).resolve().parents[2] / "orchestrator/reference/sglang_0_5_23/metric_names.txt").read_text().split()
)
NCCL_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,TUNING", "NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "4"}
STEPS, TOPK, NDT = 3, 2, 6


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory):
    sim = Sim(
        tmp_path_factory.mktemp("http"),
        "--tp-size",
        "8",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-num-steps",
        str(STEPS),
        "--speculative-eagle-topk",
        str(TOPK),
        "--speculative-num-draft-tokens",
        str(NDT),
        "--enable-metrics",
        "--decode-log-interval",
        "5",
        "--sim-noise",
        "0",
        "--sim-seed",
        "1",
        env={**NCCL_ENV, "SGLANG_ENABLE_METRICS_DEVICE_TIMER": "1", "SGLANG_RECORD_STEP_TIME": "1"},
    )
    sim.wait_ready()
    sim.workers(8)
    yield sim
    kids = descendants(sim.proc.pid)
    assert sim.stop() == 0
    assert wait_gone(kids) == []


def stream_generate(url: str, max_new_tokens: int, text: str = "tell me about rings") -> list[dict]:
    events = []
    body = {
        "text": text,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True},
        "stream": True,
    }
    with httpx.stream("POST", url + "/generate", json=body, timeout=30) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))
    return events


def test_health_ready_and_model_endpoints(spec_server):
    url = spec_server.url
    for path in ("/health", "/health_generate", "/ready"):
        assert httpx.get(url + path).status_code == 200
    info = httpx.get(url + "/model_info").json()
    assert info["model_path"] == "kimi-k2.5" and info["is_generation"] is True
    assert httpx.get(url + "/get_model_info").json() == info
    models = httpx.get(url + "/v1/models").json()
    assert models["data"][0]["id"] == "kimi-k2.5"


def test_streaming_generate_meta_info_is_consistent(spec_server):
    events = stream_generate(spec_server.url, 60)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts[0] == 1 and counts[-1] == 60 and counts == sorted(counts)
    assert all(0 < b - a <= STEPS + 1 for a, b in zip(counts, counts[1:]))  # one verify cycle per event
    assert any(b - a > 1 for a, b in zip(counts, counts[1:]))
    last = chunks[-1]
    assert len(last["output_ids"]) == 60 and last["text"].startswith(chunks[0]["text"])
    meta = last["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 60}
    assert meta["spec_accept_length"] == pytest.approx(meta["completion_tokens"] / meta["spec_verify_ct"])
    assert meta["spec_num_proposed_drafts"] == meta["spec_verify_ct"] * (NDT - 1)
    assert meta["spec_accept_rate"] == pytest.approx(meta["spec_num_correct_drafts"] / meta["spec_num_proposed_drafts"])
    assert meta["prompt_tokens"] == 4 and meta["e2e_latency"] > 0


def test_non_streaming_generate_and_openai_completions(spec_server):
    url = spec_server.url
    out = httpx.post(
        url + "/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 12}}, timeout=30
    ).json()
    assert out["meta_info"]["completion_tokens"] == 12 and len(out["output_ids"]) == 12
    done = httpx.post(
        url + "/v1/completions", json={"model": "kimi-k2.5", "prompt": "hi there", "max_tokens": 9}, timeout=30
    ).json()
    assert done["object"] == "text_completion" and done["usage"]["completion_tokens"] == 9
    deltas = []
    with httpx.stream(
        "POST",
        url + "/v1/completions",
        timeout=30,
        json={"prompt": "hi", "max_tokens": 10, "stream": True, "stream_options": {"include_usage": True}},
    ) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                deltas.append(json.loads(line[6:]))
    assert "".join(d["choices"][0]["text"] for d in deltas if d["choices"]).count(" ") == 10
    assert deltas[-1]["usage"]["completion_tokens"] == 10
    assert httpx.post(url + "/generate", json={"sampling_params": {}}).status_code == 400


def test_server_info_reports_resolved_args_and_lifetime_acceptance(spec_server):
    stream_generate(spec_server.url, 80)
    info = httpx.get(spec_server.url + "/server_info").json()
    assert info["version"] == "0.5.23" and info["tp_size"] == 8
    assert info["speculative_num_draft_tokens"] == NDT and info["max_running_requests"] == 48
    state = info["internal_states"][0]
    assert 1.0 < state["avg_spec_accept_length"] <= STEPS + 1
    assert state["last_gen_throughput"] > 0 and state["step_time_dict"]
    assert httpx.get(spec_server.url + "/get_server_info").json()["version"] == "0.5.23"


def test_metrics_use_sglang_names_and_the_device_timer(spec_server):
    stream_generate(spec_server.url, 40)
    text = httpx.get(spec_server.url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for f in families.values():
        exposed = f.name + "_total" if f.type == "counter" else f.name
        assert exposed in METRIC_NAMES, exposed
    for name in (
        "sglang:gen_throughput",
        "sglang:num_running_reqs",
        "sglang:spec_accept_length",
        "sglang:spec_accept_rate",
        "sglang:spec_num_steps",
        "sglang:spec_num_draft_tokens",
        "sglang:spec_verify_calls",
        "sglang:generation_tokens",
        "sglang:prompt_tokens",
        "sglang:time_to_first_token_seconds",
        "sglang:inter_token_latency_seconds",
        "sglang:e2e_request_latency_seconds",
        "sglang:cuda_graph_passes",
        "sglang:is_cuda_graph",
    ):
        assert name in families, name
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    steps = [v for (n, lb), v in samples.items() if n == "sglang:spec_num_steps"]
    assert steps == [STEPS]
    verify = [(dict(lb), v) for (n, lb), v in samples.items() if n == "sglang:forward_execution_seconds_total"]
    categories = {lb["category"] for lb, _ in verify}
    assert {"target_verify", "eagle_draft", "eagle_draft_extend", "extend"} <= categories
    gauge_labels = next(dict(lb) for (n, lb), _ in samples.items() if n == "sglang:gen_throughput")
    assert set(gauge_labels) == {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}


def test_logs_are_sglangs(spec_server):
    stream_generate(spec_server.url, 50)
    log = spec_server.log()
    assert "The server is fired up and ready to roll!" in log
    assert re.search(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] Prefill batch, #new-seq: 1, ", log, re.M)
    decode = re.search(
        r"^\[[\d\- :]+ TP0\] Decode batch, #running-req: \d+, #token: \d+, token usage: [\d.]+, "
        r"accept len: (?P<al>[\d.]+), accept rate: (?P<ar>[\d.]+), cuda graph: (?P<cg>True|False), "
        r"gen throughput \(token/s\): (?P<tps>[\d.]+), #queue-req: \d+$",
        log,
        re.M,
    )
    assert decode and decode["cg"] == "True" and float(decode["tps"]) > 0
    # 0.5.23 custom_all_reduce_utils.py can_use_custom_all_reduce_with_nvlink, for V2 and then V1 (no [AR]
    # line on CUDA: that one is ROCm's)
    for cls in ("CustomAllReduceV2", "CustomAllreduce"):
        assert re.search(
            rf"^\[[\d\- :]+ TP0\] {cls} is disabled because it's not supported on more than two "
            r"PCIe-only GPUs\.",
            log,
            re.M,
        )
    assert "[AR]" not in log


def test_each_rank_prints_nccl_lines_from_its_own_environment(spec_server):
    log = spec_server.log()
    workers = descendants(spec_server.proc.pid)
    assert len(workers) == 8
    for rank in range(8):
        prefix = rf"^\S+:\d+:\d+ \[{rank}\] NCCL INFO "
        assert re.search(prefix + r"NCCL version 2\.28\.9\+cuda13\.0$", log, re.M)
        assert re.search(prefix + r"NCCL_PROTO set by environment to LL$", log, re.M)
        assert re.search(prefix + r"NCCL_MAX_NCHANNELS set by environment to 4\.$", log, re.M)
        assert re.search(
            prefix + r"AllReduce: \d+ Bytes -> Algo RING proto LL channel\{Lo\.\.Hi\}=\{0\.\.\d+\}$", log, re.M
        )
    for pid in workers:
        env = environ_of(pid)
        assert env["NCCL_PROTO"] == "LL" and env["NCCL_MAX_NCHANNELS"] == "4"
        assert env["NCCL_GRAPH_REGISTER"] == "0"  # SGLang sets it for TP > 1 with CUDA graphs


def test_metrics_without_device_timer_and_without_speculation(sim_factory):
    sim = sim_factory("--tp-size", "2", "--enable-metrics", "--sim-noise", "0")
    sim.wait_ready()
    stream_generate(sim.url, 10)
    families = {f.name for f in text_string_to_metric_families(httpx.get(sim.url + "/metrics").text)}
    assert "sglang:forward_execution_seconds" not in families
    assert "sglang:cuda_graph_passes" in families
    log = sim.log()
    assert "NCCL INFO" not in log  # NCCL_DEBUG not set
    assert not re.search(r"Decode batch.*accept len", log)


def test_sigterm_stops_server_and_workers(sim_factory):
    sim = sim_factory("--tp-size", "4")
    sim.wait_ready()
    assert httpx.get(sim.url + "/metrics").status_code == 404  # no --enable-metrics
    workers = sim.workers(4)
    assert len(workers) == 4
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.wait_exit() == 0
    assert wait_gone(workers) == []


def test_workers_die_with_a_killed_server(sim_factory):
    sim = sim_factory("--tp-size", "8")
    sim.wait_ready()
    workers = sim.workers(8)
    sim.proc.kill()  # no chance to clean up: the workers notice their parent is gone
    sim.wait_exit()
    assert wait_gone(workers, timeout_s=3.0) == []
