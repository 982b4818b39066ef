"""Failure classification: what a user reads as the kind and reason of a failed trial, from the
server's exit status, its log and the benchmark's records."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from orchestrator.records import BenchRecord, FailureKind
from orchestrator.trial.failures import Failure, classify_exit, classify_records, describe_returncode


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (None, "still running"),
        (0, "exit code 0"),
        (1, "exit code 1"),
        (-9, "killed by signal 9 (SIGKILL)"),
        (-15, "killed by signal 15 (SIGTERM)"),
        (-200, "killed by signal 200"),
    ],
)
def test_describe_returncode(code: int | None, words: str) -> None:
    assert describe_returncode(code) == words


# SGLang 0.5.23 prints a failing scheduler's traceback, then its launcher logs the SIGQUIT and kills its
# own process tree with SIGKILL (sglang/srt/entrypoints/engine.py::launch_phase_sigquit_handler,
# srt/utils/common.py::kill_process_tree): the exception is the cause, the signal only how it ended.
_SCHEDULER = (
    "[2026-12-01 21:14:03 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "/v/sglang/srt/managers/scheduler.py", line 3361, in run_scheduler_process\n'
    "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank)\n{exc}\n\n"
    "[2026-12-01 21:14:03] Received sigquit from a child process. It usually means the child failed."
)


@pytest.mark.parametrize(
    ("log", "code", "kind", "reason"),
    [
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            1,
            FailureKind.oom,
            "server ran out of memory: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
            "2.00 GiB (exit code 1)",
        ),
        (
            "RuntimeError: Not enough memory to capture CUDA graphs",
            -6,
            FailureKind.oom,
            "server ran out of memory: RuntimeError: Not enough memory to capture CUDA graphs "
            "(killed by signal 6 (SIGABRT))",
        ),
        (
            "the kernel's OOM killer: not enough memory",
            -9,
            FailureKind.oom,
            "server ran out of GPU memory (killed by signal 9 (SIGKILL))",
        ),
        (
            "OSError: [Errno 98] Address already in use",
            1,
            FailureKind.port_in_use,
            "server could not bind its port: OSError: [Errno 98] Address already in use (exit code 1)",
        ),
        (
            "ERROR: [Errno 98] error while attempting to bind on address",
            1,
            FailureKind.port_in_use,
            "server could not bind its port (exit code 1)",
        ),
        (
            "Traceback (most recent call last):\nAssertionError",
            1,
            FailureKind.server_crash,
            "server refused its arguments: AssertionError (exit code 1)",
        ),
        ("", -9, FailureKind.server_crash, "server died (killed by signal 9 (SIGKILL))"),
        (
            _SCHEDULER.format(exc="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB"),
            -9,
            FailureKind.oom,
            "server ran out of memory: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
            "1.50 GiB (killed by signal 9 (SIGKILL))",
        ),
        (
            _SCHEDULER.format(exc="ValueError: speculative_eagle_topk must be 1 with --speculative-adaptive"),
            -9,
            FailureKind.server_crash,
            "server refused its arguments: ValueError: speculative_eagle_topk must be 1 with "
            "--speculative-adaptive (killed by signal 9 (SIGKILL))",
        ),
        (
            _SCHEDULER.format(exc="ModuleNotFoundError: No module named 'sgl_kernel'"),
            -9,
            FailureKind.server_crash,
            "server could not import a module: ModuleNotFoundError: No module named "
            "'sgl_kernel' (killed by signal 9 (SIGKILL))",
        ),
        (
            _SCHEDULER.format(
                exc="torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
                "unhandled system error"
            ),
            -9,
            FailureKind.server_crash,
            "server hit an NCCL error: torch.distributed.DistBackendError: NCCL error in: "
            "ProcessGroupNCCL.cpp:1970, unhandled system error (killed by signal 9 (SIGKILL))",
        ),
        (
            "usage: launch_server.py [-h] [--model-path MODEL_PATH]\n"
            "launch_server.py: error: argument --device: invalid choice: 'tpu'",
            2,
            FailureKind.server_crash,
            "server refused its arguments: launch_server.py: error: argument --device: invalid choice: 'tpu' "
            "(exit code 2)",
        ),
    ],
)
def test_classify_exit(log: str, code: int, kind: FailureKind, reason: str) -> None:
    assert classify_exit(log, code) == Failure(kind, reason)


# SGLang 0.5.23's own start-up refusals, in its words.
# sglang/srt/server_args.py::prepare_server_args parses with argparse.ArgumentParser(prog="sglang serve"):
# the program's name is two words, and argparse exits with 2 after its usage block.
_SGLANG_USAGE = (
    "usage: sglang serve [-h] --model-path MODEL_PATH\n"
    "                    [--tokenizer-path TOKENIZER_PATH]\n"
    "                    [--tokenizer-mode {auto,slow}]\n"
)
# sglang/srt/mem_cache/kv_cache_configurator.py::KVCacheConfigurator._profile_available_bytes raises this
# ValueError when the target and draft weights take the whole static budget.
_NO_KV_MEMORY = (
    "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.88. "
    "Raise --mem-fraction-static above 0.912 (minimum viable = 1 - available/pre = 0.9113). If using "
    "speculative decoding, draft weights are now counted."
)


@pytest.mark.parametrize(
    ("log", "code", "kind", "reason"),
    [
        (
            _SGLANG_USAGE
            + "sglang serve: error: argument --tokenizer-mode: invalid choice: 'fast' (choose from 'auto', 'slow')",
            2,
            FailureKind.server_crash,
            "server refused its arguments: sglang serve: error: argument --tokenizer-mode: invalid choice: "
            "'fast' (choose from 'auto', 'slow') (exit code 2)",
        ),
        (
            _SGLANG_USAGE + "sglang serve: error: argument --speculative-num-steps: invalid int value: 'three'",
            2,
            FailureKind.server_crash,
            "server refused its arguments: sglang serve: error: argument --speculative-num-steps: invalid int "
            "value: 'three' (exit code 2)",
        ),
        (
            _SCHEDULER.format(exc=_NO_KV_MEMORY),
            -9,
            FailureKind.oom,
            f"server ran out of memory: {_NO_KV_MEMORY} (killed by signal 9 (SIGKILL))",
        ),
        (
            # sglang/srt/model_executor/pool_configurator.py, the pool sizes' __post_init__
            _SCHEDULER.format(
                exc="RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
                "Current value: mem_fraction_static=0.88"
            ),
            -9,
            FailureKind.oom,
            "server ran out of memory: RuntimeError: Not enough memory. Please try to increase "
            "--mem-fraction-static. Current value: mem_fraction_static=0.88 (killed by signal 9 (SIGKILL))",
        ),
    ],
)
def test_sglang_0_5_23_start_up_refusals_in_its_own_words(log: str, code: int, kind: FailureKind, reason: str) -> None:
    assert classify_exit(log, code) == Failure(kind, reason)


def test_what_argparse_prints_for_sglang_serve_is_a_refused_flag() -> None:
    """The text argparse itself writes for a parser named as SGLang 0.5.23 names it (this Python's argparse,
    so a change in its wording shows here), read by the classifier as SGLang's refusal, not a death."""
    parser = argparse.ArgumentParser(prog="sglang serve")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--tokenizer-mode", choices=["auto", "slow"])
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exited:
        parser.parse_args(["--model-path", "m", "--tokenizer-mode", "fast"])
    failure = classify_exit("[2026-12-01 21:00:00] starting\n" + err.getvalue(), exited.value.code)
    assert failure.kind is FailureKind.server_crash
    assert failure.reason.startswith("server refused its arguments: sglang serve: error: argument --tokenizer-mode: ")
    assert failure.reason.endswith("(exit code 2)")


def test_a_logger_line_with_error_in_it_is_not_an_argparse_refusal() -> None:
    log = "[2026-12-01 21:00:00 TP0] scheduler: error: something odd\n"
    assert classify_exit(log, 1) == Failure(FailureKind.server_crash, "server died (exit code 1)")


def test_an_argument_error_after_start_up_is_a_crash_not_a_refused_argument() -> None:
    log = _SCHEDULER.format(exc="ValueError: bad token id")
    assert classify_exit(log, -9, starting=False) == Failure(
        FailureKind.server_crash, "server died: ValueError: bad token id (killed by signal 9 (SIGKILL))"
    )


def rec(index: int, ok: bool = True, error: str | None = None, warmup: bool = False) -> BenchRecord:
    return BenchRecord(index=index, ok=ok, error=error, warmup=warmup, completion_tokens=10 if ok else 0)


STALL = "ReadTimeout: timed out"
RECORD_CASES = [
    ("all requests worked", [rec(-1, warmup=True), rec(0), rec(1)], None),
    (
        "a stalled request after good ones is a hang",
        [rec(0), rec(1, False, STALL)],
        Failure(
            FailureKind.nccl_hang,
            "server alive but no token for 20s (benchmark.stall_timeout_s) after 1 good "
            "request(s): a collective is hung",
        ),
    ),
    (
        "a failed warm-up",
        [rec(-1, False, "HTTP 500: boom", warmup=True)],
        Failure(FailureKind.bench_error, "the warm-up request failed: HTTP 500: boom"),
    ),
    (
        "every measured request failed",
        [rec(0, False, "HTTP 500: a"), rec(1, False, "HTTP 500: b")],
        Failure(FailureKind.bench_error, "all 2 requests failed; first error: HTTP 500: a"),
    ),
    (
        "some failed: the measurement stands, with a warning",
        [rec(0), rec(1, False, "HTTP 503: busy"), rec(2)],
        "1 of 3 requests failed: HTTP 503: busy",
    ),
]


@pytest.mark.parametrize(("records", "verdict"), [c[1:] for c in RECORD_CASES], ids=[c[0] for c in RECORD_CASES])
def test_classify_records(records: list[BenchRecord], verdict: Failure | str | None) -> None:
    assert classify_records(records, stall_timeout_s=20) == verdict
