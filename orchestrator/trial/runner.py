"""One trial: plan -> server -> observe -> bench (r times) -> metrics -> TrialOutcome.

Inputs are written to the trial folder before anything starts (spec.json, launch.json). Every
expected failure (never ready, crash, OOM, hang, environment not applied, benchmark errors) becomes
a FAILED outcome with a failure kind, the reason and the log tail; exceptions mean bugs. The
server is always stopped, whatever happened.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator import redact
from orchestrator.config.experiment import SweepSpec, from_dict
from orchestrator.records import (
    BenchRecord,
    FailureKind,
    LaunchPlan,
    Metrics,
    TrialOutcome,
    TrialSpec,
    TrialStatus,
)
from orchestrator.search.space import infeasible_reason
from orchestrator.trial import bench, metrics, observe
from orchestrator.trial import plan as planner
from orchestrator.trial import server as srv

_OOM_MARKERS = ("out of memory", "outofmemoryerror", "not enough memory")
_PORT_MARKERS = ("address already in use", "errno 98")


class _Failed(Exception):
    """Internal control flow: a failure the outcome reports (never leaves this module)."""

    def __init__(self, kind: FailureKind, reason: str):
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


def write_json(path: Path, data: Any) -> None:
    """Atomic JSON write (temp file, then os.replace) for what users and resume rely on."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str), encoding="utf-8")
    os.replace(tmp, path)


def classify_exit(log_text: str, returncode: int | None) -> tuple[FailureKind, str]:
    """Why a server process ended, from its log and exit status."""
    low = log_text.lower()
    how = srv.describe_returncode(returncode)
    if any(m in low for m in _OOM_MARKERS):
        return FailureKind.oom, f"server ran out of GPU memory ({how})"
    if any(m in low for m in _PORT_MARKERS):
        return FailureKind.port_in_use, f"server could not bind its port ({how})"
    return FailureKind.server_crash, f"server died ({how})"


def _launch_record(plan: LaunchPlan, extra_env: dict[str, str]) -> dict:
    env = {**plan.env, **extra_env}
    return {
        "argv": list(plan.argv),
        "env": redact.redact_env(env),
        "command": redact.redact_text(planner.launch_command(plan.model_copy(update={"env": env}))),
        "host": plan.host,
        "port": plan.port,
        "engine": plan.engine,
        "warnings": list(plan.warnings),
    }


def run_trial(spec: TrialSpec, *, gpu_ids: list[str] | None = None, node: str = "") -> TrialOutcome:
    """Run one trial end to end and return its outcome (also written to outcome.json)."""
    sweep = from_dict(spec.experiment)
    trial_dir = Path(spec.trial_dir)
    trial_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    write_json(trial_dir / "spec.json", {
        "number": spec.number, "role": spec.role.value, "params": spec.params, "repeats": spec.repeats,
        "seed": spec.seed, "node": node or socket.gethostname(), "gpu_ids": gpu_ids or [],
    })
    base = dict(number=spec.number, params=spec.params, role=spec.role, trial_dir=str(trial_dir),
                node=node or socket.gethostname(), started_at=started)

    why = infeasible_reason(spec.params)
    if why is not None:
        outcome = TrialOutcome(**base, status=TrialStatus.INFEASIBLE, failure_kind=FailureKind.infeasible,
                               reason=why, finished_at=time.time())
        write_json(trial_dir / "outcome.json", outcome.model_dump(mode="json"))
        return outcome

    runner = _Runner(sweep, spec, trial_dir, gpu_ids or [])
    try:
        result = runner.run()
        outcome = TrialOutcome(**base, status=TrialStatus.COMPLETE, **result)
    except _Failed as failure:
        outcome = TrialOutcome(
            **base, status=TrialStatus.FAILED, failure_kind=failure.kind, reason=failure.reason,
            log_tail=redact.redact_text(runner.log_tail()), **runner.partial(),
        )
    outcome = outcome.model_copy(update={"finished_at": time.time(), "timings": runner.timings})
    write_json(trial_dir / "outcome.json", outcome.model_dump(mode="json"))
    return outcome


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


class _Runner:
    """The effectful steps of one trial, with what was learned so far kept for a failure outcome."""

    def __init__(self, sweep: SweepSpec, spec: TrialSpec, trial_dir: Path, gpu_ids: list[str]):
        self.sweep = sweep
        self.spec = spec
        self.dir = trial_dir
        self.gpu_ids = gpu_ids
        self.deadline = time.monotonic() + sweep.budget.trial_timeout_s
        self.server: srv.ServerProcess | None = None
        self.plan: LaunchPlan | None = None
        self.timings: dict[str, float] = {}
        self.found: dict[str, Any] = {}

    def partial(self) -> dict[str, Any]:
        return {"launch": self.plan, **self.found}

    def log_tail(self) -> str:
        return srv.tail(self.dir / "server.log", 80)

    def _timed(self, phase: str, t0: float) -> None:
        self.timings[phase] = self.timings.get(phase, 0.0) + time.monotonic() - t0

    def run(self) -> dict[str, Any]:
        try:
            self._start()
            self._observe()
            repeats = [self._measure(r) for r in range(self.spec.repeats)]
        finally:
            if self.server is not None:
                t0 = time.monotonic()
                problems = self.server.stop()
                self._timed("shutdown", t0)
                if problems:
                    self.found["warnings"] = (*self.found.get("warnings", ()), *problems)
        median, summary = metrics.summarize(repeats, seed=self.spec.seed)
        return {"metrics": median, "repeats": tuple(repeats), "summary": summary, "launch": self.plan,
                **self.found}

    def _start(self) -> None:
        srv_spec = self.sweep.server
        extra = {"CUDA_VISIBLE_DEVICES": ",".join(self.gpu_ids)} if self.gpu_ids else {}
        for attempt in range(3):  # another process may take the port between the check and the bind
            port = srv.pick_port(srv_spec.host, *srv_spec.port_range, start=self.spec.number * 7 + attempt * 101)
            self.plan = planner.make(self.sweep, self.spec.params, port=port, seed=self.spec.seed,
                                     drift_epoch=self.spec.sweep_started_at)
            write_json(self.dir / "launch.json", _launch_record(self.plan, extra))
            env = srv.child_env(self.plan, dict(os.environ), extra)
            self.server = srv.ServerProcess(self.plan, self.dir / "server.log", env)
            log_start = self._log_size()
            t0 = time.monotonic()
            self.server.start()
            remaining = self.deadline - time.monotonic()
            ready = self.server.wait_ready(min(srv_spec.startup_timeout_s, max(remaining, 1.0)))
            self._timed("server_start", t0)
            if ready.ready:
                return
            if ready.exited:
                # Only this attempt's lines: an earlier attempt's "address already in use" is not this exit's cause.
                kind, reason = classify_exit(self._log_since(log_start), ready.returncode)
                if kind is FailureKind.port_in_use and attempt < 2:
                    self.server.stop()
                    continue
                raise _Failed(kind, reason)
            self.server.stop()
            raise _Failed(FailureKind.startup_timeout,
                          f"server not ready after {ready.waited_s:.0f}s (server.startup_timeout_s="
                          f"{srv_spec.startup_timeout_s:g}); see the log tail")
        raise AssertionError("unreachable")

    def _log_size(self) -> int:
        try:
            return (self.dir / "server.log").stat().st_size
        except OSError:
            return 0

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.dir / "server.log", "rb") as f:
                f.seek(offset)
                return f.read()[-200_000:].decode(errors="replace")
        except OSError:
            return ""

    def _observe(self) -> None:
        assert self.server is not None and self.plan is not None and self.server.pid is not None
        t0 = time.monotonic()
        # Rank workers may still be forking right after /health; give them a moment to appear.
        requested = dict(self.plan.env)
        observation = None
        for _ in range(20):
            observation = observe.observe_env(self.server.pid, requested, self.sweep.server.tp)
            if observation.ok:
                break
            time.sleep(0.1)
        log_text = srv.tail(self.dir / "server.log", 5000, max_bytes=2_000_000)
        nccl = observe.parse_nccl_log(log_text)
        info = self.server.get("/server_info")
        simulated = None
        if self.sweep.engine == "simulator":
            simulated = {"hardware_profile": self.sweep.simulator.hardware_profile,
                         "model_profile": self.sweep.simulator.model_profile}
        fp = observe.fingerprint(simulated=simulated, nccl_log=log_text)
        # The simulator names its interconnect; on a real host the topology matrix tells NVLink from PCIe.
        hardware = planner.hardware(self.sweep) or fp.get("topology")
        path = observe.allreduce_path(observe.flags_from_argv(self.plan.argv), log_text, hardware)
        self.found.update(
            fingerprint=fp,
            fingerprint_hash=observe.fingerprint_hash(fp),
            effective_env=redact.redact_env_tree(observation.model_dump(mode="json") if observation else {}),
            allreduce_path=path,
        )
        write_json(self.dir / "fingerprint.json", fp)
        if info is not None and info.status_code == 200:
            write_json(self.dir / "server_info.json", redact.redact_env_tree(info.json()))
        ok, reason = observe.check_env_applied(requested, observation, nccl)
        self._timed("observe", t0)
        if not ok:
            raise _Failed(FailureKind.env_not_applied, reason)

    def _measure(self, repeat: int) -> Metrics:
        assert self.server is not None
        b = self.sweep.benchmark
        remaining = self.deadline - time.monotonic()
        if remaining <= 1:
            raise _Failed(FailureKind.trial_timeout,
                          f"trial deadline (budget.trial_timeout_s={self.sweep.budget.trial_timeout_s:g}) passed")
        if b.engine == "bench_serving":
            return self._measure_bench_serving(repeat, remaining)
        t0 = time.monotonic()
        common = dict(input_len=b.input_len, output_len=b.output_len, seed=self.spec.seed * 1000 + repeat,
                      timeout_s=min(b.timeout_s, remaining), request_timeout_s=b.stall_timeout_s)
        # Warm-up first and on its own, so the /metrics window below holds the measured requests only.
        records = bench.run(self.server.base_url, requests=0, concurrency=1,
                            warmup_requests=b.warmup_requests, **common) if b.warmup_requests else []
        before = self._metrics_text()
        if all(r.ok for r in records):
            # Clocks, power, temperature and PCIe link are read under load, once, a second into the run.
            sample = _UnderLoad(delay_s=1.0) if repeat == 0 and self.sweep.engine == "sglang" else None
            records += bench.run(self.server.base_url, requests=b.requests, concurrency=b.concurrency,
                                 warmup_requests=0, **common)
            if sample is not None and (gpus := sample.result()):
                self.found["fingerprint"] = {**self.found.get("fingerprint", {}), "gpus_under_load": gpus}
                write_json(self.dir / "fingerprint.json", self.found["fingerprint"])
        self._timed("bench", t0)
        records = [r.model_copy(update={"repeat": repeat}) for r in records]
        with open(self.dir / "bench.jsonl", "a", encoding="utf-8") as f:
            for r in records:
                f.write(r.model_dump_json() + "\n")
        after = self._metrics_text()
        self._check_records(records)
        ndt = self.spec.params.get("speculative_num_draft_tokens")
        log_text = srv.tail(self.dir / "server.log", 5000, max_bytes=2_000_000)
        try:
            return metrics.compute(records, num_draft_tokens=int(ndt) if ndt is not None else None,
                                   metrics_before=before, metrics_after=after, log_text=log_text)
        except metrics.MetricMissing as exc:
            raise _Failed(FailureKind.metric_missing, str(exc)) from None

    def _measure_bench_serving(self, repeat: int, remaining: float) -> Metrics:
        """One run of `python -m sglang.bench_serving` against the server; its JSONL row is the measurement."""
        assert self.server is not None
        b, srv_spec = self.sweep.benchmark, self.sweep.server
        out_file = self.dir / f"bench_serving-{repeat}.jsonl"
        argv = bench.bench_serving_argv(
            srv_spec.python or sys.executable, self.server.base_url, model=srv_spec.model, tokenizer=b.tokenizer,
            dataset_path=b.dataset_path, requests=b.requests, concurrency=b.concurrency, input_len=b.input_len,
            output_len=b.output_len, warmup_requests=b.warmup_requests, seed=self.spec.seed * 1000 + repeat,
            output_file=str(out_file))
        before = self._metrics_text()
        t0 = time.monotonic()
        with open(self.dir / f"bench_serving-{repeat}.log", "wb") as log:
            try:
                rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    timeout=min(b.timeout_s, remaining), env=srv.child_env(self.plan, dict(os.environ))
                                    if self.plan else None).returncode
            except subprocess.TimeoutExpired:
                rc = None
        self._timed("bench", t0)
        after = self._metrics_text()
        if self.server.returncode() is not None:
            kind, reason = classify_exit(srv.tail(self.dir / "server.log", 200), self.server.returncode())
            raise _Failed(kind, f"{reason} during sglang.bench_serving")
        if rc != 0 or not out_file.exists():
            why = "timed out" if rc is None else f"exited with {srv.describe_returncode(rc)}"
            raise _Failed(FailureKind.bench_error, f"sglang.bench_serving {why}; see bench_serving-{repeat}.log")
        rows = metrics.read_bench_serving_jsonl(out_file.read_text())
        try:
            m = metrics.metrics_from_bench_serving(rows[-1])
        except (metrics.MetricMissing, IndexError) as exc:
            raise _Failed(FailureKind.metric_missing, f"sglang.bench_serving output: {exc}") from None
        verify = metrics.verify_ms_from_metrics(before, after) if before and after else None
        if verify is not None:
            m = m.model_copy(update={"verify_ms": verify, "sources": {**m.sources, "verify_ms": "device_timer"}})
        return m

    def _metrics_text(self) -> str | None:
        assert self.server is not None
        resp = self.server.get("/metrics")
        return resp.text if resp is not None and resp.status_code == 200 else None

    def _check_records(self, records: list[BenchRecord]) -> None:
        assert self.server is not None
        measured = [r for r in records if not r.warmup]
        failed = [r for r in records if not r.ok]
        if not failed:
            return
        rc = self.server.returncode()
        if rc is not None:
            kind, reason = classify_exit(srv.tail(self.dir / "server.log", 200), rc)
            raise _Failed(kind, f"{reason} during the benchmark after "
                                f"{sum(r.completion_tokens for r in records)} tokens")
        stalled = [r for r in failed if r.error and "timeout" in r.error.lower()]
        if stalled:
            # A live server that stops producing tokens is hung, however many requests worked before.
            raise _Failed(FailureKind.nccl_hang,
                          f"server alive but no token for {self.sweep.benchmark.stall_timeout_s:g}s "
                          f"(benchmark.stall_timeout_s) after {sum(r.ok for r in measured)} good request(s): "
                          f"a collective is hung")
        warm_failed = [r for r in failed if r.warmup]
        if warm_failed:
            raise _Failed(FailureKind.bench_error, f"the warm-up request failed: {warm_failed[0].error}")
        if not any(r.ok for r in measured):
            raise _Failed(FailureKind.bench_error, f"all {len(measured)} requests failed; first error: {failed[0].error}")
        # Some requests failed while others worked: keep the measurement, say so.
        self.found["warnings"] = (*self.found.get("warnings", ()),
                                  f"{len(failed)} of {len(records)} requests failed: {failed[0].error}")
