"""The text SGLang, torch and NCCL print when a server fails, so log classifiers see the real thing.

Each function returns the lines a real 0.5.23 server writes for one failure (a scheduler traceback
ending in the error torch/NCCL raises, then the launcher's "Received sigquit" line). Paths inside
the tracebacks are where those frames live in the SGLang wheel; line numbers are indicative.
"""

from __future__ import annotations

_PKG = "/usr/local/lib/python3.12/dist-packages"
_SCHED = f"{_PKG}/sglang/srt/managers/scheduler.py"
_SIGQUIT = "Received sigquit from a child process. It usually means the child failed."


def _scheduler_traceback(frames: list[tuple[str, int, str, str]], error: str) -> str:
    lines = ["Scheduler hit an exception: Traceback (most recent call last):"]
    for path, line, func, code in frames:
        lines.append(f'  File "{path}", line {line}, in {func}')
        lines.append(f"    {code}")
    lines.append(error)
    return "\n".join(lines)


def resolution_assertion() -> str:
    """`resolve_once()` asserting that the three EAGLE parameters come together (launcher process)."""
    return "\n".join(
        [
            "Traceback (most recent call last):",
            '  File "<frozen runpy>", line 198, in _run_module_as_main',
            '  File "<frozen runpy>", line 88, in _run_code',
            f'  File "{_PKG}/sglang/launch_server.py", line 32, in <module>',
            "    run_server(server_args)",
            f'  File "{_PKG}/sglang/srt/entrypoints/http_server.py", line 1801, in launch_server',
            "    tokenizer_manager, template_manager, scheduler_info, port_args = _launch_subprocesses(",
            f'  File "{_PKG}/sglang/srt/entrypoints/engine.py", line 842, in _launch_subprocesses',
            "    server_args.resolve_once()",
            f'  File "{_PKG}/sglang/srt/server_args.py", line 611, in resolve_once',
            "    hook(self)",
            f'  File "{_PKG}/sglang/srt/arg_groups/speculative_hook.py", line 97, in _handle_eagle_family',
            "    assert (",
            "AssertionError",
        ]
    )


def cuda_oom(*, tried_gib: float, total_gib: float, free_gib: float) -> tuple[str, str]:
    """torch's OutOfMemoryError while capturing the speculative CUDA graphs."""
    in_use = total_gib - free_gib
    tb = _scheduler_traceback(
        [
            (_SCHED, 3102, "run_scheduler_process", "scheduler = Scheduler("),
            (_SCHED, 412, "__init__", "self.init_model_worker()"),
            (f"{_PKG}/sglang/srt/speculative/eagle_worker.py", 164, "__init__", "self.init_cuda_graphs()"),
            (f"{_PKG}/sglang/srt/speculative/eagle_draft_cuda_graph_runner.py", 118, "__init__", "self.capture()"),
            (f"{_PKG}/torch/cuda/graphs.py", 241, "__exit__", "self.cuda_graph.capture_end()"),
        ],
        (
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried_gib:.2f} GiB. GPU 0 has a total "
            f"capacity of {total_gib:.2f} GiB of which {free_gib:.2f} GiB is free. Including non-PyTorch memory, this "
            f"process has {in_use:.2f} GiB memory in use. Of the allocated memory {in_use - 2.4:.2f} GiB is allocated "
            f"by PyTorch, and 1.63 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
            f"large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
            f"documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
        ),
    )
    return tb, _SIGQUIT


def draft_topk_out_of_range(*, at_capture: bool) -> tuple[str, str]:
    """torch.topk over fewer draft candidates than num_draft_tokens - 1 (organize_draft_results)."""
    head = (
        [
            (_SCHED, 3102, "run_scheduler_process", "scheduler = Scheduler("),
            (f"{_PKG}/sglang/srt/speculative/eagle_draft_cuda_graph_runner.py", 118, "__init__", "self.capture()"),
        ]
        if at_capture
        else [
            (_SCHED, 3120, "run_scheduler_process", "scheduler.event_loop_overlap()"),
            (_SCHED, 1090, "event_loop_overlap", "batch_result = self.run_batch(batch)"),
        ]
    )
    tb = _scheduler_traceback(
        head
        + [
            (
                f"{_PKG}/sglang/srt/speculative/eagle_worker.py",
                512,
                "draft",
                "parent_list, top_scores_index, draft_tokens = organize_draft_results(",
            ),
            (
                f"{_PKG}/sglang/srt/speculative/eagle_utils.py",
                208,
                "organize_draft_results",
                "top_scores = torch.topk(score_list, num_draft_token - 1, dim=-1)",
            ),
        ],
        "RuntimeError: selected index k out of range",
    )
    return tb, _SIGQUIT


def cuda_illegal_access() -> tuple[str, str]:
    """An asynchronous CUDA error in the middle of decoding (the crash_after_tokens fault)."""
    tb = _scheduler_traceback(
        [
            (_SCHED, 3120, "run_scheduler_process", "scheduler.event_loop_overlap()"),
            (f"{_PKG}/torch/utils/_contextlib.py", 120, "decorate_context", "return func(*args, **kwargs)"),
            (_SCHED, 1096, "event_loop_overlap", "self.process_batch_result(tmp_batch, tmp_result)"),
            (
                f"{_PKG}/sglang/srt/managers/scheduler_output_processor_mixin.py",
                287,
                "process_batch_result_decode",
                "next_token_ids = next_token_ids.tolist()",
            ),
        ],
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
        "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n",
    )
    return tb, _SIGQUIT


def invalid_device_ordinal(tp_size: int, gpus: int) -> tuple[str, str]:
    """More TP ranks than GPUs: the first rank without a GPU fails in set_device."""
    tb = _scheduler_traceback(
        [
            (_SCHED, 3102, "run_scheduler_process", "scheduler = Scheduler("),
            (
                f"{_PKG}/sglang/srt/model_executor/model_runner.py",
                402,
                "init_torch_distributed",
                "torch.get_device_module(self.device).set_device(self.gpu_id)",
            ),
        ],
        f"torch.AcceleratorError: CUDA error: invalid device ordinal (tp_size={tp_size}, {gpus} GPUs visible)",
    )
    return tb, _SIGQUIT


def nccl_no_algorithm(algo: str, version: str) -> tuple[str, str]:
    """NCCL_ALGO naming only algorithms this host cannot run: the first all-reduce fails."""
    tb = _scheduler_traceback(
        [
            (_SCHED, 3102, "run_scheduler_process", "scheduler = Scheduler("),
            (
                f"{_PKG}/sglang/srt/distributed/parallel_state.py",
                1532,
                "init_distributed_environment",
                "torch.distributed.all_reduce(data, group=_WORLD.cpu_group)",
            ),
        ],
        (
            f"torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp"
            f":3690, invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version {version.split('+')[0]}\n"
            f"ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\n"
            f"Error : no algorithm/protocol available for function AllReduce with datatype ncclBfloat16. "
            f"NCCL_ALGO was set to {algo}."
        ),
    )
    return tb, _SIGQUIT


def watchdog_timeout(timeout_s: float) -> str:
    """SGLang's scheduler watchdog after --watchdog-timeout seconds without forward progress."""
    return f"Scheduler watchdog timeout (self.watchdog_timeout={timeout_s:g}, self.soft=False)"
