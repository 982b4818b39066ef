"""`python -m orchestrator.simulator`: start-up, serving and shutdown of one simulated SGLang server.

The life of a server, as with `sglang serve`: parse and resolve the arguments (bad flags exit 2,
SGLang's resolution assertion exits 1), start one rank worker per TP rank, "load the model" (log
lines, optional slow start, start-up faults: more ranks than GPUs, an NCCL_ALGO the host cannot
run, CUDA OOM, a draft tree torch.topk cannot fill), bind the HTTP port (uvicorn's error and exit
1 when taken), warm up with one 8-token generation, print "The server is fired up and ready to
roll!". SIGTERM/SIGINT stop uvicorn, the engine and every rank worker, and exit 0. A fatal error
while serving writes the traceback, kills the workers and exits 1 at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import NoReturn

import uvicorn
from prometheus_client import disable_created_metrics

from orchestrator.simulator import api, cli, engine, failures, ranks, tokens
from orchestrator.simulator import model as perf
from orchestrator.simulator.logs import Log
from orchestrator.simulator.profiles import ProfileError, load_hardware, load_model
from orchestrator.simulator.telemetry import Metrics

_WARMUP_PROMPT = "The capital city of France is"


def _tuning_lines(hw: perf.HardwareProfile, model: perf.ModelProfile, cfg: perf.Config) -> list[str]:
    """NCCL's tuning decisions for the decode/verify message sizes that NCCL (not custom AR) carries."""
    token_bytes = model.hidden_size * model.dtype_bytes
    sizes = {token_bytes}
    if cfg.speculative:
        sizes |= {token_bytes * cfg.topk, token_bytes * cfg.draft_tokens}
    out = []
    for nbytes in sorted(sizes):
        ar = perf.carried_all_reduce(hw, cfg.nccl, cfg.comm, cfg.tp, nbytes // token_bytes, token_bytes, cfg.cuda_graph)
        if ar.path == "nccl":
            out.append(f"{nbytes} {ar.algorithm.upper()} {ar.protocol.upper()} {ar.channels}")
    return out


async def _stopped_within(stopping: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds` (a slow start, a scaled model load) unless SIGTERM comes first: True if it did."""
    if seconds <= 0:
        return False
    try:
        await asyncio.wait_for(stopping.wait(), seconds)
        return True
    except asyncio.TimeoutError:
        return False


# uvicorn's own logging config with SGLang's `[%Y-%m-%d %H:%M:%S] ` prefix, as a real 0.5.23 server writes
# its access lines: `[2026-12-01 22:26:26] INFO:     127.0.0.1:55998 - "GET /health HTTP/1.1" 503 Service
# Unavailable` (503 until the warm-up request has finished, then 200).
_UVICORN_LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "default": {
            "()": "uvicorn.logging.DefaultFormatter",
            "fmt": "[%(asctime)s] %(levelprefix)s %(message)s",
            "datefmt": "%Y-%m-%d %H:%M:%S",
            "use_colors": False,
        },
        "access": {
            "()": "uvicorn.logging.AccessFormatter",
            "datefmt": "%Y-%m-%d %H:%M:%S",
            "use_colors": False,
            "fmt": '[%(asctime)s] %(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s',
        },
    },
    "handlers": {
        "default": {"formatter": "default", "class": "logging.StreamHandler", "stream": "ext://sys.stderr"},
        "access": {"formatter": "access", "class": "logging.StreamHandler", "stream": "ext://sys.stderr"},
    },
    "loggers": {
        "uvicorn": {"handlers": ["default"], "level": "INFO", "propagate": False},
        "uvicorn.error": {"level": "INFO"},
        "uvicorn.access": {"handlers": ["access"], "level": "INFO", "propagate": False},
    },
}


class _Process:
    """The server's own resources that every exit path must release."""

    def __init__(self, log: Log):
        self.log = log
        self.workers: list[subprocess.Popen] = []

    def fatal(self, traceback_text: str, launcher_line: str) -> NoReturn:
        """A scheduler died: print what SGLang prints, then end as SGLang 0.5.23 does. The failing child
        SIGQUITs the launcher, whose handler (sglang/srt/entrypoints/engine.py::launch_phase_sigquit_handler)
        calls srt/utils/common.py::kill_process_tree(os.getpid()): SIGKILL to every descendant, then to
        itself, so the server's exit status is -9 whatever the cause and only the log tells why."""
        first, _, rest = traceback_text.partition("\n")
        self.log.scheduler(first, level=40)
        if rest:
            self.log.raw(rest)
        self.log.main(launcher_line, level=40)
        self.log.main(f"kill_process_tree called: parent_pid={os.getpid()}, include_parent=True, pid={os.getpid()}")
        for worker in self.workers:
            with contextlib.suppress(OSError):
                worker.kill()
        for worker in self.workers:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                worker.wait(timeout=2.0)
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        os._exit(1)  # not reached: SIGKILL cannot be caught


@dataclasses.dataclass(frozen=True)
class _Launch:
    """What the launch resolved to before anything loads: the model's config and the environments."""

    cfg: perf.Config
    topk_crash: bool
    """Too many draft tokens for the tree: SGLang fails at CUDA-graph capture (or the first verify)."""
    server_env: dict[str, str]
    rank_env: dict[str, str]
    tp: int
    graph: bool


def _launch(
    args: dict, sim: cli.SimOptions, hw: perf.HardwareProfile, md: perf.ModelProfile, proc: _Process
) -> _Launch:
    tp = int(args["tp_size"] or 1)
    graph, _ = cli.cuda_graph_decode(args)
    server_env = dict(os.environ)
    if tp > 1 and graph:
        server_env.setdefault("NCCL_GRAPH_REGISTER", "0")  # SGLang's parallel_hook does this
    rank_env = ranks.worker_env(server_env, drop_nccl=sim.faults.env_drop)
    params = cli.params_from_args(args, rank_env)  # NCCL runs in the ranks: their environment decides
    cfg = perf.resolve(params, hw, md)
    # SGLang does not check the draft tree at resolution: too many draft tokens for the tree fail in
    # torch.topk at CUDA-graph capture, or at the first verify without CUDA graphs. Time the server
    # with a feasible tree until then.
    topk_crash = isinstance(cfg, str) and "selected index k out of range" in cfg
    if topk_crash:
        feasible = perf.resolve({**params, "speculative_num_draft_tokens": 2}, hw, md)
        if not isinstance(feasible, str):
            cfg = dataclasses.replace(feasible, draft_tokens=args["speculative_num_draft_tokens"])
    if isinstance(cfg, str):
        if tp > hw.gpus:
            proc.fatal(*failures.invalid_device_ordinal(tp, hw.gpus))
        # The only other refusal left after cli.resolve: an NCCL_ALGO this host cannot run.
        proc.workers = ranks.start(tp, rank_env, nccl_version=hw.nccl.version, tuning=[])
        proc.fatal(*failures.nccl_no_algorithm(str(rank_env.get("NCCL_ALGO")), hw.nccl.version))
    return _Launch(cfg, topk_crash, server_env, rank_env, tp, graph)


async def _start_up(
    launch: _Launch,
    args: dict,
    sim: cli.SimOptions,
    hw: perf.HardwareProfile,
    md: perf.ModelProfile,
    proc: _Process,
    stopping: asyncio.Event,
) -> int | None:
    """SGLang's start-up: distributed init, weights, KV cache, CUDA graphs, with their log lines and the
    faults that end it; the KV cache's tokens, or None when stopped meanwhile."""
    log, cfg = proc.log, launch.cfg
    log.scheduler("Init torch distributed begin.")
    tuning = _tuning_lines(hw, md, cfg)
    proc.workers = ranks.start(launch.tp, launch.rank_env, nccl_version=hw.nccl.version, tuning=tuning)
    for where, level, line in cfg.comm.lines:  # SGLang 0.5.23's own lines about its all-reduce backends
        (log.main if where == "main" else log.scheduler)(line, level=level)
    mem = hw.gpu_memory_gib
    log.scheduler("Init torch distributed ends. elapsed=0.21 s, mem usage=0.56 GB")
    log.scheduler(f"Load weight begin. avail mem={mem - 0.6:.2f} GB")
    load_s = md.load_weights_s * sim.time_scale
    if await _stopped_within(stopping, sim.faults.slow_start_s + load_s):
        return None
    weights = mem * 0.62
    log.scheduler(
        f"Load weight end. elapsed={0.42 + load_s:.2f} s, type={md.architectures[0]}, dtype=torch.bfloat16, "
        f"avail mem={mem - 0.6 - weights:.2f} GB, mem usage={weights:.2f} GB."
    )
    max_total = int(args.get("max_total_tokens") or hw.kv_cache_tokens)
    log.scheduler(f"KV Cache is allocated. #tokens: {max_total}, KV size: {mem * 0.25:.2f} GB")
    if cfg.speculative and sim.faults.ooms(cfg.draft_tokens, cfg.topk):
        proc.fatal(*failures.cuda_oom(tried_gib=0.0625 * cfg.draft_tokens * cfg.topk, total_gib=mem, free_gib=0.41))
    if launch.graph and not await _capture(launch, sim, md, mem, proc, stopping):
        return None
    return max_total


async def _capture(
    launch: _Launch, sim: cli.SimOptions, md: perf.ModelProfile, mem: float, proc: _Process, stopping: asyncio.Event
) -> bool:
    """CUDA-graph capture (where too many draft tokens for the tree fail); False when stopped meanwhile."""
    log = proc.log
    log.scheduler(f"Capture cuda graph begin. This can take up to several minutes. avail mem={mem * 0.1:.2f} GB")
    if launch.topk_crash:
        proc.fatal(*failures.draft_topk_out_of_range(at_capture=True))
    capture_s = md.graph_capture_s * sim.time_scale
    if await _stopped_within(stopping, capture_s):
        return False
    log.scheduler(
        f"Capture cuda graph end. Time elapsed: {0.31 + capture_s:.2f} s. mem usage=1.21 GB. avail mem={mem * 0.087:.2f} GB."
    )
    return True


def _engine(
    launch: _Launch,
    args: dict,
    sim: cli.SimOptions,
    hw: perf.HardwareProfile,
    md: perf.ModelProfile,
    proc: _Process,
    metrics: Metrics | None,
    max_total: int,
) -> engine.Engine:
    """The scheduler loop of this server run, with its timing, faults and numerics."""
    cfg = launch.cfg
    numerics = tokens.launch_numerics(
        hw,
        md,
        cfg,
        deterministic=bool(args.get("enable_deterministic_inference")),
        draft_wiring_broken=sim.faults.draft_wiring_broken,
    )
    decode_factor, prefill_factor = engine.run_factors(sim.seed, sim.noise, sim.prefill_correlation)
    timing = engine.Timing(
        run_factor=decode_factor,
        prefill_factor=prefill_factor,
        jitter=engine.per_cycle_jitter(sim.noise),
        drift_per_hour=sim.drift_per_hour,
        drift_epoch=sim.drift_epoch if sim.drift_epoch is not None else time.time(),
    )
    adaptive = cli.adaptive_config(args.get("speculative_adaptive_config"))
    return engine.Engine(
        hw=hw,
        model=md,
        cfg=cfg,
        log=proc.log,
        metrics=metrics,
        timing=timing,
        seed=None if sim.seed is None else sim.seed * 104729 + 17,
        max_running=int(args.get("max_running_requests") or 1024),
        decode_log_interval=int(args.get("decode_log_interval") or 40),
        max_total_tokens=max_total,
        record_step_time=os.environ.get("SGLANG_RECORD_STEP_TIME") == "1",
        hang=sim.faults.hangs(launch.server_env),
        crash_after_tokens=sim.faults.crash_after_tokens,
        hang_after_tokens=sim.faults.hang_after_tokens,
        topk_crash=launch.topk_crash,
        on_fatal=proc.fatal,
        watchdog_timeout_s=float(args.get("watchdog_timeout") or 300),
        ema_alpha=adaptive.ema_alpha if isinstance(adaptive, cli.AdaptiveConfig) else 0.2,
        model_key=tokens.model_key(str(args.get("model_path"))),
        numerics=numerics,
    )


def _metrics(args: dict, cfg: perf.Config, max_total: int) -> Metrics | None:
    """/metrics with --enable-metrics (SGLang runs prometheus_client in multiprocess mode: no *_created)."""
    disable_created_metrics()
    if not args.get("enable_metrics"):
        return None
    metrics = Metrics(
        str(args.get("served_model_name") or args.get("model_path")),
        speculative=cfg.speculative,
        device_timer=os.environ.get("SGLANG_ENABLE_METRICS_DEVICE_TIMER") == "1",
    )
    metrics.set_static(spec_steps=cfg.steps, spec_draft_tokens=cfg.draft_tokens, max_total_tokens=max_total)
    return metrics


async def _serve(
    argv: Sequence[str],
    resolved: cli.Resolved,
    sim: cli.SimOptions,
    hw: perf.HardwareProfile,
    md: perf.ModelProfile,
    proc: _Process,
) -> int:
    log, args = proc.log, resolved.args
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    launch = _launch(args, sim, hw, md, proc)
    max_total = await _start_up(launch, args, sim, hw, md, proc, stopping)
    if max_total is None:
        return 0
    cfg, mem = launch.cfg, hw.gpu_memory_gib
    max_running = int(args.get("max_running_requests") or 1024)
    log.scheduler(
        f"max_total_num_tokens={max_total}, chunked_prefill_size={args.get('chunked_prefill_size') or 8192}, "
        f"max_prefill_tokens=16384, max_running_requests={max_running}, context_len={md.context_length}, "
        f"available_gpu_mem={mem * 0.087:.2f} GB"
    )
    metrics = _metrics(args, cfg, max_total)
    eng = _engine(launch, args, sim, hw, md, proc, metrics, max_total)
    state = api.ServerState(
        args=args,
        served_model_name=str(args.get("served_model_name") or args.get("model_path")),
        draft_tokens=cfg.draft_tokens,
        log=log,
        metrics=metrics,
        env=launch.server_env,
        engine=eng,
        launch_command=shlex.join([sys.executable, "-m", "orchestrator.simulator", *argv]),
        model_info=api.model_info_for(args, md.architectures, md.model_type, md.context_length),
        memory_usage={
            "weight": round(mem * 0.62, 2),
            "kvcache": round(mem * 0.25, 2),
            "graph": 1.21 if launch.graph else 0.0,
        },
    )
    return await _http(state, eng, args, sim, stopping)


async def _http(
    state: api.ServerState, eng: engine.Engine, args: dict, sim: cli.SimOptions, stopping: asyncio.Event
) -> int:
    """Serve the HTTP surface until stopped (uvicorn), warming the server up first as SGLang does."""
    engine_task = asyncio.create_task(eng.run())

    class _Server(uvicorn.Server):
        def install_signal_handlers(self) -> None:  # uvicorn < 0.29
            pass

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # uvicorn >= 0.29: our loop handlers own SIGTERM/SIGINT
            yield

    http_level = (args.get("log_level_http") or args.get("log_level") or "info").lower()
    server = _Server(
        uvicorn.Config(
            api.build(state),
            host=args["host"],
            port=int(args["port"]),
            lifespan="off",
            log_level=http_level,
            access_log=True,
            timeout_graceful_shutdown=2,
            timeout_keep_alive=5,
            log_config=_UVICORN_LOGGING,
        )
    )

    async def run_uvicorn() -> int:
        try:
            await server.serve()
        except SystemExit:  # uvicorn could not start (it logged why, e.g. "[Errno 98] ... address already in use")
            return 1
        return 0

    serve_task = asyncio.create_task(run_uvicorn())
    stop_task = asyncio.create_task(stopping.wait())
    try:
        while not server.started:
            if serve_task.done() or stopping.is_set():
                break
            await asyncio.sleep(0.01)
        if server.started and not stopping.is_set():
            await _warm_up(state, eng, args, sim, stopping, stop_task)
        await asyncio.wait({serve_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        server.should_exit = True
        if not serve_task.done():
            await asyncio.wait({serve_task}, timeout=5)
        engine_task.cancel()
        stop_task.cancel()
    if serve_task.done() and not serve_task.cancelled():
        return serve_task.result()
    return 0


async def _warm_up(
    state: api.ServerState,
    eng: engine.Engine,
    args: dict,
    sim: cli.SimOptions,
    stopping: asyncio.Event,
    stop_task: asyncio.Task,
) -> None:
    """SGLang's warm-up request, then "fired up"; never with the never_ready fault (/health stays 503)."""
    if sim.faults.never_ready:
        return  # warmup never completes: status stays Starting, /health 503
    if not args.get("skip_server_warmup"):
        warm = engine.Request(input_ids=engine.tokenize(_WARMUP_PROMPT), max_new_tokens=8, internal="warmup")
        eng.submit(warm)
        while not warm.finished and not stopping.is_set():
            await asyncio.wait(
                {asyncio.ensure_future(warm.wake.wait()), stop_task}, return_when=asyncio.FIRST_COMPLETED
            )
            warm.wake.clear()
        if not warm.finished:
            return
    state.up = True
    state.log.main("The server is fired up and ready to roll!")


def _resolution_error(last_line: str) -> str:
    """A traceback of `resolve_once()` stopping at a speculative-decoding rule, ending in `last_line`."""
    return "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "sglang/launch_server.py", line 32, in <module>',
            "    run_server(server_args)",
            '  File "sglang/srt/entrypoints/engine.py", line 842, in _launch_subprocesses',
            "    server_args.resolve_once()",
            '  File "sglang/srt/arg_groups/speculative_hook.py", in _handle_eagle_family',
            last_line,
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns, sim = cli.parse(argv, os.environ)
    resolved = cli.resolve(ns)
    log = Log(int(resolved.args.get("tp_size") or 1), str(resolved.args.get("log_level") or "info"))
    shown = {k: ("***" if k in ("api_key", "admin_api_key") and v else v) for k, v in resolved.args.items()}
    log.main("server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")")
    if resolved.error:
        log.raw(
            failures.resolution_assertion() if resolved.error == "AssertionError" else _resolution_error(resolved.error)
        )
        return 1
    if resolved.unsupported:
        log.main(resolved.unsupported, level=40)
        return 1
    for line in resolved.log_warnings:
        log.warning(line)
    try:
        hw, md = load_hardware(sim.hardware_profile), sim.faults.model(load_model(sim.model_profile))
    except ProfileError as exc:
        cli.simulator_parser().error(str(exc))
    proc = _Process(log)
    try:
        return asyncio.run(_serve(argv, resolved, sim, hw, md, proc))
    finally:
        ranks.stop(proc.workers)
