"""SGLang 0.5.23's HTTP surface over the simulated scheduler (reference INTERFACE.md sections 3-5).

Routes: /health and /health_generate (503 while starting; afterwards a one-token generation that
must finish within SGLANG_HEALTH_CHECK_TIMEOUT, default 20 s), /ready, /model_info, /server_info
(+ the deprecated /get_* spellings), /v1/models, POST /generate (native; streaming is SSE with one
event per decode iteration, cumulative text and output_ids, ending `data: [DONE]`; greedy tokens of the
simulated model, with return_logprob / logprob_start_len / top_logprobs_num as SGLang reports them), POST
/v1/completions (OpenAI, streaming or not), GET/POST /flush_cache, and /metrics with
--enable-metrics.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from orchestrator.simulator.engine import Engine, Request, detokenize, tokenize
from orchestrator.simulator.logs import Log
from orchestrator.simulator.telemetry import Metrics


@dataclass
class ServerState:
    """What the routes read: resolved args, the engine, and whether start-up has finished."""

    args: dict[str, Any]
    model_info: dict[str, Any]
    served_model_name: str
    draft_tokens: int
    log: Log
    metrics: Metrics | None
    env: dict[str, str]
    engine: Engine | None = None
    up: bool = False
    startup_time: float = field(default_factory=time.time)
    launch_command: str = ""
    memory_usage: dict[str, float] = field(default_factory=dict)


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def build(state: ServerState) -> Starlette:
    """The Starlette app for one simulated server."""

    async def health(_: HttpRequest) -> Response:
        if not state.up or state.engine is None:
            return Response(status_code=503)
        if state.env.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "1") == "0":
            return Response(status_code=200)
        req = Request(input_ids=[0], max_new_tokens=1, internal="health")
        state.engine.submit(req)
        timeout = float(state.env.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        try:
            await asyncio.wait_for(_until_finished(req), timeout)
        except asyncio.TimeoutError:
            state.engine.abort(req)
            state.log.main(
                f"Health check failed. Server couldn't get a response from detokenizer for last {timeout:g} seconds."
            )
            return Response(status_code=503)
        return Response(status_code=200)

    async def ready(_: HttpRequest) -> Response:
        return Response(status_code=200 if state.up else 503)

    async def model_info(request: HttpRequest) -> Response:
        if request.url.path == "/get_model_info":
            state.log.main(
                "Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                "Please use '/model_info' instead."
            )
        return JSONResponse(state.model_info)

    async def server_info(_: HttpRequest) -> Response:
        engine = state.engine
        internal = dict(state.args)
        internal.update(
            world_size=state.args.get("tp_size", 1),
            startup_time=state.startup_time,
            effective_max_running_requests_per_dp=state.args.get("max_running_requests"),
            last_gen_throughput=engine.last_gen_throughput if engine else 0.0,
            memory_usage=state.memory_usage,
        )
        if state.args.get("speculative_algorithm") and engine:
            internal["avg_spec_accept_length"] = engine.avg_spec_accept_length()
        if state.env.get("SGLANG_RECORD_STEP_TIME") == "1" and engine:
            internal["step_time_dict"] = {k: list(v) for k, v in engine.step_time_dict.items()}
        info = dict(state.args)
        # As a real 0.5.23 server reports them: the resolved device, and "ready" once up (its /get_server_info).
        info.update(device=state.args.get("device") or "cuda", status="ready" if state.up else "starting")
        info.update(
            launch_command=state.launch_command,
            kv_events=None,
            startup_time=state.startup_time,
            internal_states=[internal],
            version="0.5.23",
            frontend="python",
            max_total_num_tokens=engine.max_total_tokens if engine else None,
        )
        return JSONResponse(info)

    async def models(_: HttpRequest) -> Response:
        name = state.served_model_name
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": int(state.startup_time),
                        "owned_by": "sglang",
                        "root": name,
                        "parent": None,
                        "max_model_len": state.model_info.get("context_length"),
                    }
                ],
            }
        )

    async def flush_cache(_: HttpRequest) -> Response:
        if state.engine is not None and state.engine.flush_cache():
            state.log.scheduler("Cache flushed successfully!")
            return PlainTextResponse(
                "Cache flushed.\nPlease check backend logs for more details. (When there are "
                "running or waiting requests, the operation will not be performed.)\n"
            )
        return PlainTextResponse("Cache not flushed: there are running or waiting requests.\n", status_code=400)

    async def metrics(_: HttpRequest) -> Response:
        assert state.metrics is not None
        return Response(state.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def generate(request: HttpRequest) -> Response:
        parsed = await _parse_native(request)
        if isinstance(parsed, Response):
            return parsed
        req, stream = parsed
        if state.engine is None:
            return _error("The server is not ready yet.", 503)
        state.engine.submit(req)
        if stream:
            return StreamingResponse(_guard(req, _native_stream(req)), media_type="text/event-stream")
        if not await _wait_or_disconnect(req, request):
            return Response(status_code=499)
        return JSONResponse(_native_out(req))

    async def completions(request: HttpRequest) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return _error("Invalid JSON body")
        prompt = body.get("prompt", "")
        if isinstance(prompt, list):
            if prompt and isinstance(prompt[0], int):
                ids = list(prompt)
            elif len(prompt) == 1 and isinstance(prompt[0], str):
                ids = tokenize(prompt[0])
            else:
                return _error("The simulator serves one prompt per request.")
        else:
            ids = tokenize(str(prompt))
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _error(f"max_tokens must be a positive integer, but got {max_tokens!r}")
        if state.engine is None:
            return _error("The server is not ready yet.", 503)
        req = Request(input_ids=ids or [0], max_new_tokens=max_tokens, stream=bool(body.get("stream")))
        state.engine.submit(req)
        created = int(time.time())
        name = body.get("model") or state.served_model_name
        if req.stream:
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(
                _guard(req, _openai_stream(req, created, name, usage)), media_type="text/event-stream"
            )
        if not await _wait_or_disconnect(req, request):
            return Response(status_code=499)
        return JSONResponse(
            {
                "id": req.rid,
                "object": "text_completion",
                "created": created,
                "model": name,
                "choices": [
                    {
                        "index": 0,
                        "text": detokenize(req.output_ids),
                        "logprobs": None,
                        "finish_reason": "length",
                        "matched_stop": None,
                    }
                ],
                "usage": _usage(req),
            }
        )

    async def _parse_native(request: HttpRequest) -> tuple[Request, bool] | Response:
        try:
            body = await request.json()
        except ValueError:
            return _error("Invalid JSON body")
        if not isinstance(body, dict):
            return _error("The request body must be a JSON object")
        text, ids = body.get("text"), body.get("input_ids")
        if isinstance(text, list) or (isinstance(ids, list) and ids and isinstance(ids[0], list)):
            return _error("The simulator serves one prompt per request (no batch /generate).")
        if text is None and ids is None:
            return _error("Either text or input_ids should be provided.")
        input_ids = list(ids) if ids is not None else tokenize(str(text))
        sp = body.get("sampling_params") or {}
        max_new = sp.get("max_new_tokens", 128)
        if not isinstance(max_new, int) or max_new < 1:
            return _error(f"max_new_tokens must be a positive integer, but got {max_new!r}")
        stream = bool(body.get("stream", False))
        logprobs = _logprob_options(body)
        if isinstance(logprobs, Response):
            return logprobs
        return Request(input_ids=input_ids or [0], max_new_tokens=max_new, stream=stream, **logprobs), stream

    def _native_out(req: Request) -> dict:
        return {
            "text": detokenize(req.output_ids),
            "output_ids": list(req.output_ids),
            "meta_info": req.meta_info(state.draft_tokens),
        }

    async def _native_stream(req: Request) -> AsyncIterator[bytes]:
        sent = 0
        while True:
            await req.wake.wait()
            req.wake.clear()
            if len(req.output_ids) > sent or req.finished:
                sent = len(req.output_ids)
                yield _sse(_native_out(req))
            if req.finished:
                break
        yield b"data: [DONE]\n\n"

    async def _openai_stream(req: Request, created: int, name: str, usage: bool) -> AsyncIterator[bytes]:
        sent = 0
        while True:
            await req.wake.wait()
            req.wake.clear()
            if len(req.output_ids) > sent:
                delta = detokenize(req.output_ids[sent:])
                sent = len(req.output_ids)
                yield _sse(
                    {
                        "id": req.rid,
                        "object": "text_completion",
                        "created": created,
                        "model": name,
                        "choices": [
                            {
                                "index": 0,
                                "text": delta,
                                "logprobs": None,
                                "finish_reason": "length" if req.finished else None,
                                "matched_stop": None,
                            }
                        ],
                        "usage": None,
                    }
                )
            if req.finished:
                break
        if usage:
            yield _sse(
                {
                    "id": req.rid,
                    "object": "text_completion",
                    "created": created,
                    "model": name,
                    "choices": [],
                    "usage": _usage(req),
                }
            )
        yield b"data: [DONE]\n\n"

    async def _guard(req: Request, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """A stream whose client disconnects aborts its request, as SGLang does."""
        try:
            async for chunk in body:
                yield chunk
        finally:
            if not req.finished and state.engine is not None:
                state.engine.abort(req)

    async def _wait_or_disconnect(req: Request, request: HttpRequest) -> bool:
        waiter = asyncio.ensure_future(_until_finished(req))
        while not waiter.done():
            done, _ = await asyncio.wait({waiter}, timeout=1.0)
            if not done and await request.is_disconnected():
                waiter.cancel()
                if state.engine is not None:
                    state.engine.abort(req)
                return False
        return True

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/health_generate", health, methods=["GET"]),
        Route("/ready", ready, methods=["GET"]),
        Route("/model_info", model_info, methods=["GET"]),
        Route("/get_model_info", model_info, methods=["GET"]),
        Route("/server_info", server_info, methods=["GET"]),
        Route("/get_server_info", server_info, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
        Route("/generate", generate, methods=["POST", "PUT"]),
        Route("/v1/completions", completions, methods=["POST"]),
    ]
    if state.metrics is not None:
        routes.append(Route("/metrics", metrics, methods=["GET"]))
    return Starlette(routes=routes)


def _logprob_options(body: dict) -> dict[str, Any] | Response:
    """GenerateReqInput's logprob fields (managers/io_struct.py): return_logprob, logprob_start_len (-1:
    the output tokens only), top_logprobs_num, return_text_in_logprobs; one prompt, so no lists."""
    start = body.get("logprob_start_len")
    top = body.get("top_logprobs_num")
    if start is not None and (not isinstance(start, int) or start < -1):
        return _error(f"logprob_start_len must be an integer >= -1, but got {start!r}")
    if top is not None and (not isinstance(top, int) or top < 0):
        return _error(f"top_logprobs_num must be an integer >= 0, but got {top!r}")
    return {
        "return_logprob": bool(body.get("return_logprob")),
        "logprob_start_len": -1 if start is None else start,
        "top_logprobs_num": top or 0,
        "return_text_in_logprobs": bool(body.get("return_text_in_logprobs")),
    }


async def _until_finished(req: Request) -> None:
    while not req.finished:
        await req.wake.wait()
        req.wake.clear()


def _usage(req: Request) -> dict:
    return {
        "prompt_tokens": len(req.input_ids),
        "completion_tokens": len(req.output_ids),
        "total_tokens": len(req.input_ids) + len(req.output_ids),
        "prompt_tokens_details": None,
    }


def model_info_for(
    args: dict[str, Any], architectures: tuple[str, ...], model_type: str, context_length: int
) -> dict[str, Any]:
    """/model_info's fields (reference INTERFACE.md section 3) for a resolved launch."""
    path = args.get("model_path")
    return {
        "model_path": path,
        "served_model_name": args.get("served_model_name") or path,
        "tokenizer_path": args.get("tokenizer_path") or path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "load_format": args.get("load_format"),
        "reasoning_parser": args.get("reasoning_parser"),
        "tool_call_parser": args.get("tool_call_parser"),
        "disaggregation_mode": "null",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": model_type,
        "architectures": list(architectures),
        "context_length": context_length,
    }
