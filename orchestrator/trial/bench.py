"""The built-in benchmark client: drive load against a running server, return raw per-request records.

It speaks SGLang's native streaming `/generate` (the same request `sglang.bench_serving --backend
sglang` sends), keeps `concurrency` requests in flight, and records for every request the arrival
time and token count of each streamed chunk plus the final `meta_info`. It computes nothing: turning
records into numbers is metrics.py's job, so the raw data can be kept (bench.jsonl) and re-analysed.

Token counts come from `meta_info.completion_tokens` deltas between chunks, not from counting text,
so a speculative chunk carrying several tokens is counted right and no tokenizer is needed.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from orchestrator.records import BenchRecord

# A fixed word list gives prompts of a known length without a tokenizer or a dataset download.
_WORDS = (
    "the quick brown fox jumps over a lazy dog while engineers tune collective communication "
    "for speculative decoding on eight accelerators connected by a slow bus"
).split()


_TRANSPORT_ERRORS = {
    cls.__name__
    for cls in (
        httpx.TimeoutException,
        httpx.ReadTimeout,
        httpx.ConnectTimeout,
        httpx.PoolTimeout,
        httpx.ConnectError,
        httpx.RemoteProtocolError,
        httpx.ReadError,
    )
}


SYNTHETIC = "synthetic: the builtin generator's 25-word list"
"""Where the builtin client's prompts come from without benchmark.dataset_path. Acceptance measured on them
is inflated (random prompts gave 74.6% acceptance against 48.5% on chat for Kimi-K3, lightseekorg/tokenspeed
#1305), so every view that shows it says so (Metrics.sources["prompts"], the plan's warning)."""


def make_prompt(rng: random.Random, length: int) -> str:
    """A prompt of `length` words (one word is about one token for the simulator's tokenizer)."""
    return " ".join(rng.choice(_WORDS) for _ in range(length))


def prompt_source(dataset_path: str | None) -> str:
    """Where the builtin client's prompts come from, in words (Metrics.sources["prompts"])."""
    return SYNTHETIC if not dataset_path else f"real text: {dataset_path}"


_TEXT_KEYS = ("prompt", "text", "instruction", "question", "input")


def _first_prompt(item: Any) -> str | None:
    """The first user text of one dataset entry: ShareGPT (`conversations`: the first human turn, the format
    bench_serving reads with --dataset-path), MT-Bench (`turns`), or a `prompt`/`text`/... field."""
    if isinstance(item, str):
        return item
    if not isinstance(item, dict):
        return None
    for turn in item.get("conversations") or ():
        if isinstance(turn, dict) and turn.get("from") in ("human", "user") and isinstance(turn.get("value"), str):
            return str(turn["value"])
    turns = item.get("turns")
    if isinstance(turns, list) and turns and isinstance(turns[0], str):
        return turns[0]
    return next((str(item[k]) for k in _TEXT_KEYS if isinstance(item.get(k), str)), None)


def _entries(text: str) -> Iterator[Any]:
    """A JSON list (ShareGPT) or JSON lines."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        yield from json.loads(stripped)
        return
    for line in text.splitlines():
        if line.strip():
            yield json.loads(line)


def load_prompts(path: str) -> list[str]:
    """The prompts of a dataset file (ShareGPT JSON as bench_serving's --dataset-path reads it, MT-Bench
    question.jsonl, or JSON lines with a `prompt`/`text` field); ValueError saying what is wrong and the fix."""
    where = f"benchmark.dataset_path {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"{where}: cannot read it ({exc}); fix the path, or remove it for the synthetic prompts"
        ) from None
    try:
        prompts = [p for p in map(_first_prompt, _entries(text)) if p and p.strip()]
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not a JSON list or JSON lines ({exc})") from None
    if not prompts:
        raise ValueError(
            f"{where}: no prompt found; give ShareGPT JSON (conversations with a human turn), MT-Bench "
            f"question.jsonl (turns) or JSON lines with a prompt or text field"
        )
    return prompts


def _pick(prompts: Sequence[str] | None, rng: random.Random, length: int) -> str:
    """A synthetic prompt of `length` words, or a dataset prompt (drawn by `rng`) cut to `length` words."""
    if not prompts:
        return make_prompt(rng, length)
    return " ".join(rng.choice(prompts).split()[:length])


async def _one_request(
    client: httpx.AsyncClient,
    url: str,
    *,
    index: int,
    prompt: str,
    input_len: int,
    output_len: int,
    warmup: bool,
) -> BenchRecord:
    body = {
        "text": prompt,
        "sampling_params": {"max_new_tokens": output_len, "temperature": 0.0, "ignore_eos": True},
        "stream": True,
    }
    start_wall = time.time()
    t0 = time.perf_counter()
    chunk_times: list[float] = []
    chunk_tokens: list[int] = []
    meta: dict[str, Any] = {}
    seen = 0
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:500]
                return BenchRecord(
                    index=index,
                    warmup=warmup,
                    ok=False,
                    start_s=start_wall,
                    prompt_tokens=input_len,
                    error=f"HTTP {resp.status_code}: {text}",
                )
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                now = time.perf_counter() - t0
                meta = event.get("meta_info") or meta
                total = int(meta.get("completion_tokens", seen))
                if total > seen:
                    chunk_times.append(now)
                    chunk_tokens.append(total - seen)
                    seen = total
        latency = time.perf_counter() - t0
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as exc:
        return BenchRecord(
            index=index,
            warmup=warmup,
            ok=False,
            start_s=start_wall,
            prompt_tokens=input_len,
            completion_tokens=seen,
            error=f"{type(exc).__name__}: {exc}"[:500],
            chunk_times_s=tuple(chunk_times),
            chunk_tokens=tuple(chunk_tokens),
            meta_info=meta,
        )
    ok = seen > 0 and meta.get("finish_reason") is not None
    return BenchRecord(
        index=index,
        warmup=warmup,
        ok=ok,
        error=None if ok else f"stream ended after {seen} tokens without a finish_reason",
        prompt_tokens=int(meta.get("prompt_tokens", input_len)),
        completion_tokens=seen,
        start_s=start_wall,
        ttft_s=chunk_times[0] if chunk_times else None,
        latency_s=latency,
        chunk_times_s=tuple(chunk_times),
        chunk_tokens=tuple(chunk_tokens),
        meta_info=meta,
    )


async def run_async(
    base_url: str,
    *,
    requests: int,
    concurrency: int,
    input_len: int,
    output_len: int,
    warmup_requests: int = 1,
    seed: int = 0,
    timeout_s: float = 600.0,
    request_timeout_s: float | None = None,
    prompts: Sequence[str] | None = None,
) -> list[BenchRecord]:
    """Send `warmup_requests` then `requests` streaming requests, `concurrency` at a time, on `prompts` (a
    dataset's, cut to `input_len` words) or, without them, synthetic prompts of `input_len` words.

    `timeout_s` bounds the whole benchmark; a request that sends no byte for `request_timeout_s`
    (default: the whole budget) fails with a timeout record instead of blocking the trial.
    """
    rng = random.Random(seed)
    url = base_url.rstrip("/") + "/generate"
    read_timeout = request_timeout_s or timeout_s
    limits = httpx.Limits(max_connections=concurrency + 1, max_keepalive_connections=concurrency + 1)
    timeout = httpx.Timeout(connect=10.0, read=read_timeout, write=10.0, pool=read_timeout)
    records: list[BenchRecord] = []
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        for i in range(warmup_requests):
            records.append(
                await _one_request(
                    client,
                    url,
                    index=-(i + 1),
                    prompt=_pick(prompts, rng, input_len),
                    input_len=input_len,
                    output_len=output_len,
                    warmup=True,
                )
            )
            if not records[-1].ok:
                return records  # a server that fails warmup would fail (or hang) every request
        texts = [_pick(prompts, rng, input_len) for _ in range(requests)]
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(requests):
            queue.put_nowait(i)

        aborted = False

        async def worker() -> None:
            nonlocal aborted
            while not aborted:
                try:
                    i = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                record = await _one_request(
                    client,
                    url,
                    index=i,
                    prompt=texts[i],
                    input_len=input_len,
                    output_len=output_len,
                    warmup=False,
                )
                records.append(record)
                # A stalled or unreachable server stalls every later request too: stop sending.
                if record.error and record.error.split(":")[0] in _TRANSPORT_ERRORS:
                    aborted = True

        workers = [asyncio.create_task(worker()) for _ in range(max(1, concurrency))]
        try:
            await asyncio.wait_for(asyncio.gather(*workers), timeout=timeout_s)
        except asyncio.TimeoutError:
            for w in workers:
                w.cancel()
            done = {r.index for r in records}
            records.extend(
                BenchRecord(index=i, ok=False, error=f"benchmark deadline of {timeout_s:.0f}s passed")
                for i in range(requests)
                if i not in done
            )
    return sorted(records, key=lambda r: r.index)


def run(base_url: str, **kwargs: Any) -> list[BenchRecord]:
    """Synchronous wrapper of run_async (see there for the arguments)."""
    return asyncio.run(run_async(base_url, **kwargs))


def bench_serving_argv(
    python: str,
    base_url: str,
    *,
    model: str,
    tokenizer: str | None,
    dataset_path: str | None,
    requests: int,
    concurrency: int,
    input_len: int,
    output_len: int,
    warmup_requests: int,
    seed: int,
    output_file: str,
) -> list[str]:
    """argv of SGLang's own benchmark (`--benchmark.engine bench_serving`), streaming /generate like ours.

    Fixed lengths need `--random-range-ratio 1.0` (its default 0.0 draws lengths from U[1, len]).
    `--output-file` appends one JSON line per run; the caller gives each run a fresh file.
    """
    argv = [
        python,
        "-m",
        "sglang.bench_serving",
        "--backend",
        "sglang",
        "--base-url",
        base_url,
        "--model",
        model,
        "--tokenizer",
        tokenizer or model,
        "--random-input-len",
        str(input_len),
        "--random-output-len",
        str(output_len),
        "--random-range-ratio",
        "1.0",
        "--num-prompts",
        str(requests),
        "--max-concurrency",
        str(concurrency),
        "--request-rate",
        "inf",
        "--warmup-requests",
        str(warmup_requests),
        "--seed",
        str(seed),
        "--output-file",
        output_file,
    ]
    if dataset_path:
        argv += ["--dataset-name", "random", "--dataset-path", dataset_path]
    else:
        argv += ["--dataset-name", "random-ids"]
    return argv
