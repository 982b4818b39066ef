"""The benchmark clients behind one interface: the builtin load generator (bench.py) and SGLang's own
`python -m sglang.bench_serving`. A client measures one repeat against a ready server and returns a
Measurement, or raises failures.TrialFailed with the kind and reason."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from orchestrator.config.experiment import SweepSpec
from orchestrator.records import BenchRecord, FailureKind, Metrics
from orchestrator.trial import bench, metrics, observe
from orchestrator.trial import server as srv
from orchestrator.trial.failures import Failure, TrialFailed, classify_exit, classify_records, describe_returncode

EXIT_GRACE_S = 5.0
"""How long a benchmark whose requests failed waits for the server's process to exit before it reads the
failure as the requests' own (a crash closes the connections a moment before the process is gone)."""


@dataclass(frozen=True)
class Target:
    """What a client measures: the ready server, the experiment, and where the trial keeps its files."""

    server: srv.ServerProcess
    sweep: SweepSpec
    trial_dir: Path
    seed: int
    num_draft_tokens: int | None


@dataclass(frozen=True)
class Measurement:
    """One repeat's metrics, with what the client noticed on the way."""

    metrics: Metrics
    bench_s: float
    """Seconds the load itself took (the trial's `bench` phase)."""
    warnings: tuple[str, ...] = ()
    gpus_under_load: list[dict[str, Any]] | None = None


Remaining = Callable[[], float]
"""Seconds left of the trial's deadline; raises failures.TrialFailed (trial_timeout) once it has passed."""


class BenchmarkClient(Protocol):
    def run_repeats(self, target: Target, repeats: int, remaining: Remaining) -> list[Measurement]:
        """Measure `repeats` repeats, one Measurement each, within the trial's deadline."""
        ...


def _metrics_text(server: srv.ServerProcess) -> str | None:
    resp = server.get("/metrics")
    return resp.text if resp is not None and resp.status_code == 200 else None


def _server_log(target: Target) -> str:
    return srv.tail(target.trial_dir / "server.log", 5000, max_bytes=2_000_000)


class _UnderLoad:
    """nvidia-smi's per-GPU readings taken on a timer while the benchmark runs (the field report's
    engineers checked clocks, power, temperature and PCIe link width under load by hand)."""

    def __init__(self, delay_s: float):
        self._gpus: list[dict[str, Any]] | None = None
        self._timer = threading.Timer(delay_s, self._read)
        self._timer.daemon = True
        self._timer.start()

    def _read(self) -> None:
        fp = observe.fingerprint()
        self._gpus = fp.get("gpus") if fp.get("nvidia_smi") == "ok" else None

    def result(self) -> list[dict[str, Any]] | None:
        self._timer.cancel()
        self._timer.join(timeout=15)
        return self._gpus


class Builtin:
    """bench.py's streaming /generate client; records go to bench.jsonl, metrics.compute turns them into numbers."""

    def run_repeats(self, target: Target, repeats: int, remaining: Remaining) -> list[Measurement]:
        prompts = None
        if target.sweep.benchmark.dataset_path:  # real text: acceptance as users' prompts give it
            try:
                prompts = bench.load_prompts(target.sweep.benchmark.dataset_path)
            except ValueError as exc:
                raise TrialFailed(Failure(FailureKind.bench_error, str(exc))) from None
        return [self.run(target, r, remaining(), prompts) for r in range(repeats)]

    def run(self, target: Target, repeat: int, remaining_s: float, prompts: list[str] | None = None) -> Measurement:
        b, server = target.sweep.benchmark, target.server
        t0 = time.monotonic()
        common: dict[str, Any] = dict(
            input_len=b.input_len,
            output_len=b.output_len,
            seed=target.seed * 1000 + repeat,
            timeout_s=min(b.timeout_s, remaining_s),
            request_timeout_s=b.stall_timeout_s,
            prompts=prompts,
        )
        # Warm-up first and on its own, so the /metrics window below holds the measured requests only.
        records = (
            bench.run(server.base_url, requests=0, concurrency=1, warmup_requests=b.warmup_requests, **common)
            if b.warmup_requests
            else []
        )
        before = _metrics_text(server)
        gpus = None
        if all(r.ok for r in records):
            # Clocks, power, temperature and PCIe link are read under load, once, a second into the run.
            sample = _UnderLoad(delay_s=1.0) if repeat == 0 and target.sweep.engine == "sglang" else None
            records += bench.run(
                server.base_url, requests=b.requests, concurrency=b.concurrency, warmup_requests=0, **common
            )
            gpus = sample.result() if sample is not None else None
        bench_s = time.monotonic() - t0
        records = [r.model_copy(update={"repeat": repeat}) for r in records]
        with open(target.trial_dir / "bench.jsonl", "a", encoding="utf-8") as f:
            for r in records:
                f.write(r.model_dump_json() + "\n")
        after = _metrics_text(server)
        warnings = _failed_requests(target, records)
        try:
            m = metrics.compute(
                records,
                num_draft_tokens=target.num_draft_tokens,
                metrics_before=before,
                metrics_after=after,
                log_text=_server_log(target),
            )
        except metrics.MetricMissing as exc:
            raise TrialFailed(Failure(FailureKind.metric_missing, str(exc))) from None
        return Measurement(with_prompt_source(m, records, b.dataset_path), bench_s, warnings, gpus)


def _failed_requests(target: Target, records: Sequence[BenchRecord]) -> tuple[str, ...]:
    """Nothing when every request worked; the warning when some failed while others worked; TrialFailed when
    the server died under the load or the failures are the trial's (failures.classify_records)."""
    if all(r.ok for r in records):
        return ()
    # A server that crashed mid-request closes its connections a moment before its process is
    # gone: give it EXIT_GRACE_S, or the crash reads as the benchmark's own error (bench_error).
    rc = target.server.exit_within(EXIT_GRACE_S)
    if rc is not None:
        died = classify_exit(srv.tail(target.trial_dir / "server.log", 200), rc, starting=False)
        raise TrialFailed(
            Failure(
                died.kind,
                f"{died.reason} during the benchmark after {sum(r.completion_tokens for r in records)} tokens",
            )
        )
    verdict = classify_records(records, stall_timeout_s=target.sweep.benchmark.stall_timeout_s)
    if isinstance(verdict, Failure):
        raise TrialFailed(verdict)
    return () if verdict is None else (verdict,)  # some failed while others worked: keep it, say so


def per_request_accept_length(records: Sequence[BenchRecord]) -> float | None:
    """The mean over measured requests of each request's accept length (its completion tokens / its verify
    cycles, meta_info's spec_verify_ct), as AIPerf and vLLM report it; None without speculation."""
    own = [
        float(r.meta_info.get("completion_tokens", r.completion_tokens)) / float(vct)
        for r in records
        if r.ok and not r.warmup and isinstance(vct := r.meta_info.get("spec_verify_ct"), (int, float)) and vct > 0
    ]
    return sum(own) / len(own) if own else None


def with_prompt_source(m: Metrics, records: Sequence[BenchRecord], dataset_path: str | None) -> Metrics:
    """`m` with where its prompts came from (sources["prompts"]; a synthetic source also marks accept_length's),
    and the per-request accept length beside the token-weighted one."""
    sources = {**m.sources, "prompts": bench.prompt_source(dataset_path)}
    if not dataset_path and "accept_length" in sources:
        sources["accept_length"] += " (synthetic prompts)"
    return m.model_copy(update={"sources": sources, "accept_length_per_request": per_request_accept_length(records)})


class BenchServing:
    """`sglang.bench_serving` against the server, every repeat of the trial in one process
    (_bench_serving_repeats.py: SGLang's import is paid once per trial); each repeat's JSONL row is
    its measurement."""

    def __init__(self, env: dict[str, str] | None):
        self.env = env
        """The benchmark's environment (the server's), or None to inherit the worker's."""

    def run_repeats(self, target: Target, repeats: int, remaining: Remaining) -> list[Measurement]:
        b, srv_spec, server = target.sweep.benchmark, target.sweep.server, target.server
        d = target.trial_dir
        runs: list[dict[str, Any]] = []
        for repeat in range(repeats):
            argv = bench.bench_serving_argv(
                "",
                server.base_url,
                model=srv_spec.model,
                tokenizer=b.tokenizer,
                dataset_path=b.dataset_path,
                requests=b.requests,
                concurrency=b.concurrency,
                input_len=b.input_len,
                output_len=b.output_len,
                warmup_requests=b.warmup_requests,
                seed=target.seed * 1000 + repeat,
                output_file=str(d / f"bench_serving-{repeat}.jsonl"),
            )[3:]  # without "python -m sglang.bench_serving"
            runs.append(
                {
                    "argv": argv,
                    "metrics_before": str(d / f"bench_serving-{repeat}.metrics-before.txt"),
                    "metrics_after": str(d / f"bench_serving-{repeat}.metrics-after.txt"),
                    "status": str(d / f"bench_serving-{repeat}.status.json"),
                }
            )
        python = b.client_python or srv_spec.python or sys.executable
        job = {"module": "sglang.bench_serving", "metrics_url": server.base_url + "/metrics", "runs": runs}
        t0 = time.monotonic()
        rc: int | None
        with open(d / "bench_serving.log", "wb") as log:
            try:
                rc = subprocess.run(
                    [python, str(_REPEATS_SCRIPT), json.dumps(job)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    timeout=min(b.timeout_s * repeats, remaining()),
                    env=self.env,
                ).returncode
            except subprocess.TimeoutExpired:
                rc = None
        bench_s = time.monotonic() - t0
        if server.returncode() is not None:
            died = classify_exit(srv.tail(d / "server.log", 200), server.returncode(), starting=False)
            raise TrialFailed(Failure(died.kind, f"{died.reason} during sglang.bench_serving"))
        measured = []
        for repeat in range(repeats):
            status = _read_json(Path(runs[repeat]["status"]))
            out_file = d / f"bench_serving-{repeat}.jsonl"
            if not status.get("ok") or not out_file.exists():
                why = "timed out" if rc is None else status.get("error") or f"exited with {describe_returncode(rc)}"
                raise TrialFailed(
                    Failure(
                        FailureKind.bench_error, f"sglang.bench_serving repeat {repeat} {why}; see bench_serving.log"
                    )
                )
            before = _read_text(Path(runs[repeat]["metrics_before"]))
            after = _read_text(Path(runs[repeat]["metrics_after"]))
            measured.append(self._measurement(target, repeat, out_file, before, after, bench_s / repeats))
        return measured

    @staticmethod
    def _measurement(
        target: Target, repeat: int, out_file: Path, before: str | None, after: str | None, bench_s: float
    ) -> Measurement:
        b = target.sweep.benchmark
        rows = metrics.read_bench_serving_jsonl(out_file.read_text())
        completed = _completed(rows[-1]) if rows else None
        if completed is not None and completed <= 0:  # as the builtin client: none worked -> bench_error
            raise TrialFailed(
                Failure(
                    FailureKind.bench_error,
                    f"all {b.requests} requests failed: sglang.bench_serving completed none; see bench_serving.log",
                )
            )
        try:
            m = metrics.metrics_from_bench_serving(rows[-1], requested=b.requests)
        except (metrics.MetricMissing, IndexError) as exc:
            raise TrialFailed(Failure(FailureKind.metric_missing, f"sglang.bench_serving output: {exc}")) from None
        warnings: tuple[str, ...] = ()
        if m.requests_failed:  # some failed while others worked: keep the measurement, say so
            warnings = (
                f"{m.requests_failed} of {b.requests} requests failed: sglang.bench_serving completed "
                f"{m.requests_ok} in repeat {repeat}; see bench_serving.log",
            )
        verify = metrics.verify_ms_from_metrics(before, after) if before and after else None
        if verify is not None:
            m = m.model_copy(update={"verify_ms": verify, "sources": {**m.sources, "verify_ms": "device_timer"}})
        return Measurement(m, bench_s, warnings)


_REPEATS_SCRIPT = Path(__file__).with_name("_bench_serving_repeats.py")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text() or None
    except OSError:
        return None


def _completed(row: dict[str, Any]) -> int | None:
    """The row's `completed` count, or None where it is missing or not a number."""
    value = row.get("completed")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return int(value)


def client_for(sweep: SweepSpec, server_env: dict[str, str] | None) -> BenchmarkClient:
    """The client the experiment's `benchmark.engine` names."""
    clients: dict[str, BenchmarkClient] = {"builtin": Builtin(), "bench_serving": BenchServing(server_env)}
    return clients[sweep.benchmark.engine]
