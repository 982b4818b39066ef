"""One trial: plan -> server -> observe -> bench (r times) -> [greedy outputs] -> metrics -> TrialOutcome.

Inputs are written to the trial folder before anything starts (spec.json, launch.json). Every
expected failure (never ready, crash, OOM, hang, environment not applied, benchmark errors) becomes
a FAILED outcome with a failure kind, the reason and the log tail; exceptions mean bugs. The
server is always stopped, whatever happened. Feasibility is the proposer's to check: a trial that
arrives here is launched.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from orchestrator import redact
from orchestrator.config.experiment import SweepSpec
from orchestrator.fsio import write_json
from orchestrator.records import FailureKind, LaunchPlan, Metrics, OutputsRequest, TrialOutcome, TrialSpec, TrialStatus
from orchestrator.trial import clients, metrics, observe, outputs
from orchestrator.trial import plan as planner
from orchestrator.trial import server as srv
from orchestrator.trial.allreduce import allreduce_path
from orchestrator.trial.failures import Failure, TrialFailed, classify_exit

__all__ = ["run_trial"]


def _launch_record(plan: LaunchPlan, extra_env: dict[str, str]) -> dict[str, Any]:
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


def _cpu_allreduce_path(tp: int, fingerprint: dict[str, Any]) -> str:
    """What carries a CPU server's all-reduces: none at TP 1; sgl_kernel's shared-memory all-reduce where its
    CPU build is installed, else torch.distributed on gloo (sglang/srt/distributed/parallel_state.py,
    GroupCoordinator.all_reduce: `if input_.is_cpu`). Never NCCL: no GPU takes part."""
    if tp == 1:
        return "none"
    return "shm" if fingerprint.get("sgl_kernel") else "gloo"


def _experiment(spec: TrialSpec) -> SweepSpec:
    # Validated once, at the edge (config.load); the trial takes the model as it is.
    if not isinstance(spec.experiment, SweepSpec):
        raise TypeError(
            f"TrialSpec.experiment must be the validated SweepSpec, but got {type(spec.experiment).__name__}"
        )
    return spec.experiment


def run_trial(
    spec: TrialSpec, *, gpu_ids: list[str] | None = None, node: str = "", launcher_nice: int | None = None
) -> TrialOutcome:
    """Run one trial end to end and return its outcome (also written to outcome.json). `launcher_nice`: the
    nice value of the process that launched the sweep (None: this process's own, as for a trial run in the
    driver); a server that ran above it is named in the warnings (observe.niceness_warning)."""
    sweep = _experiment(spec)
    trial_dir = Path(spec.trial_dir)
    trial_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    node = node or socket.gethostname()
    write_json(
        trial_dir / "spec.json",
        {
            "number": spec.number,
            "role": spec.role.value,
            "params": spec.params,
            "repeats": spec.repeats,
            "seed": spec.seed,
            "node": node,
            "gpu_ids": gpu_ids or [],
        },
    )
    runner = _Runner(sweep, spec, trial_dir, gpu_ids or [], os.nice(0) if launcher_nice is None else launcher_nice)
    try:
        found = runner.run()
        status, failure = TrialStatus.COMPLETE, None
    except TrialFailed as failed:
        found = runner.found
        status, failure = TrialStatus.FAILED, failed.failure
    outcome = TrialOutcome(
        number=spec.number,
        params=spec.params,
        effective_params=spec.effective_params,
        role=spec.role,
        trial_dir=str(trial_dir),
        node=node,
        started_at=started,
        status=status,
        failure_kind=failure.kind if failure else None,
        reason=failure.reason if failure else "",
        log_tail=redact.redact_text(runner.log_tail()) if failure else "",
        launch=runner.plan,
        finished_at=time.time(),
        timings=runner.timings,
        **found,
    )
    write_json(trial_dir / "outcome.json", outcome.model_dump(mode="json"))
    return outcome


class _Runner:
    """The effectful steps of one trial, with what was learned so far kept for a failure outcome."""

    def __init__(self, sweep: SweepSpec, spec: TrialSpec, trial_dir: Path, gpu_ids: list[str], launcher_nice: int):
        self.sweep = sweep
        self.launcher_nice = launcher_nice
        self.spec = spec
        self.dir = trial_dir
        self.gpu_ids = gpu_ids
        self.deadline = time.monotonic() + sweep.budget.trial_timeout_s
        self.server: srv.ServerProcess | None = None
        self.plan: LaunchPlan | None = None
        self.timings: dict[str, float] = {}
        self.found: dict[str, Any] = {}
        """TrialOutcome fields learned so far (fingerprint, effective_env, allreduce_path, warnings, ...)."""

    def log_tail(self) -> str:
        return srv.tail(self.dir / "server.log", 80)

    def _timed(self, phase: str, seconds: float) -> None:
        self.timings[phase] = self.timings.get(phase, 0.0) + seconds

    def _warn(self, *warnings: str) -> None:
        self.found["warnings"] = (*self.found.get("warnings", ()), *warnings)

    def run(self) -> dict[str, Any]:
        """The outcome's fields of a complete trial; TrialFailed otherwise."""
        try:
            server, plan = self._start()
            self._observe(server, plan)
            client = clients.client_for(self.sweep, srv.child_env(plan, dict(os.environ)))
            repeats = self._measure(client, server)
            if self.spec.outputs is not None:
                self._outputs(server, self.spec.outputs)
        finally:
            if self.server is not None:
                t0 = time.monotonic()
                problems = self.server.stop()
                self._timed("shutdown", time.monotonic() - t0)
                self._warn(*problems)
        median, summary = metrics.summarize(repeats, seed=self.spec.seed)
        return {"metrics": median, "repeats": tuple(repeats), "summary": summary, **self.found}

    def _start(self) -> tuple[srv.ServerProcess, LaunchPlan]:
        srv_spec = self.sweep.server
        extra = {"CUDA_VISIBLE_DEVICES": ",".join(self.gpu_ids)} if self.gpu_ids else {}
        for attempt in range(3):  # another process may take the port between the check and the bind
            port = srv.pick_port(srv_spec.host, *srv_spec.port_range, start=self.spec.number * 7 + attempt * 101)
            plan = self.plan = planner.make(
                self.sweep, self.spec.params, port=port, seed=self.spec.seed, drift_epoch=self.spec.sweep_started_at
            )
            write_json(self.dir / "launch.json", _launch_record(plan, extra))
            env = srv.child_env(plan, dict(os.environ), extra)
            server = self.server = srv.ServerProcess(plan, self.dir / "server.log", env)
            log_start = self._log_size()
            t0 = time.monotonic()
            server.start()
            remaining = self.deadline - time.monotonic()
            ready = server.wait_ready(min(srv_spec.startup_timeout_s, max(remaining, 1.0)))
            self._timed("server_start", time.monotonic() - t0)
            if ready.ready:
                return server, plan
            if ready.exited:
                # Only this attempt's lines: an earlier attempt's "address already in use" is not this exit's cause.
                failure = classify_exit(self._log_since(log_start), ready.returncode)
                if failure.kind is FailureKind.port_in_use and attempt < 2:
                    server.stop()
                    continue
                raise TrialFailed(failure)
            server.stop()
            raise TrialFailed(
                Failure(
                    FailureKind.startup_timeout,
                    f"server not ready after {ready.waited_s:.0f}s (server.startup_timeout_s="
                    f"{srv_spec.startup_timeout_s:g}); see the log tail",
                )
            )
        raise AssertionError("unreachable: the last attempt returns or raises")

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

    def _observe(self, server: srv.ServerProcess, plan: LaunchPlan) -> None:
        t0 = time.monotonic()
        pid = server.pid
        if pid is None:
            raise AssertionError("a ready server has a pid")
        # Rank workers may still be forking right after /health; give them a moment to appear.
        requested = dict(plan.env)
        observation = observe.observe_env(pid, requested, self.sweep.server.tp)
        for _ in range(19):
            if observation.ok:
                break
            time.sleep(0.1)
            observation = observe.observe_env(pid, requested, self.sweep.server.tp)
        log_text = srv.tail(self.dir / "server.log", 5000, max_bytes=2_000_000)
        nccl = observe.parse_nccl_log(log_text)
        info = server.get("/server_info")
        simulated = None
        if self.sweep.engine == "simulator":
            simulated = {
                "hardware_profile": self.sweep.simulator.hardware_profile,
                "model_profile": self.sweep.simulator.model_profile,
            }
        # The versions are the server interpreter's (plan.argv[0]), not this worker's.
        fp = observe.fingerprint(simulated=simulated, nccl_log=log_text, python=plan.argv[0])
        # The simulator names its interconnect; on a real host the topology matrix tells NVLink from PCIe.
        hardware = planner.hardware(self.sweep) or fp.get("topology")
        self.found.update(
            fingerprint=fp,
            fingerprint_hash=observe.fingerprint_hash(fp),
            effective_env=redact.redact_env_tree(observation.model_dump(mode="json")),
            allreduce_path=_cpu_allreduce_path(self.sweep.server.tp, fp)
            if self.sweep.server.device == "cpu"
            else allreduce_path(plan.flags, log_text, hardware),
        )
        write_json(self.dir / "fingerprint.json", fp)
        if info is not None and info.status_code == 200:
            write_json(self.dir / "server_info.json", redact.redact_env_tree(info.json()))
        niced = observe.niceness_warning(observation, self.launcher_nice)
        if niced:
            self._warn(niced)
        ok, reason = observe.check_env_applied(requested, observation, nccl)
        if ok:  # an all_reduce_backend SGLang refused or fell back from, in its own words
            backend = self.spec.params.get("all_reduce_backend")
            ok, reason = observe.check_backend_applied(None if backend is None else str(backend), log_text)
        self._timed("observe", time.monotonic() - t0)
        if not ok:
            raise TrialFailed(Failure(FailureKind.env_not_applied, reason))

    def _remaining(self) -> float:
        remaining = self.deadline - time.monotonic()
        if remaining <= 1:
            raise TrialFailed(
                Failure(
                    FailureKind.trial_timeout,
                    f"trial deadline (budget.trial_timeout_s={self.sweep.budget.trial_timeout_s:g}) passed",
                )
            )
        return remaining

    def _outputs(self, server: srv.ServerProcess, request: OutputsRequest) -> None:
        """Greedy outputs of the fixed prompts (and scores of others'), to outputs.json; a failed capture
        is a warning, the benchmark stands (the correctness gate refuses what has no outputs)."""
        t0 = time.monotonic()
        record = outputs.capture(request, server.base_url, self.dir, lambda: max(self.deadline - time.monotonic(), 1.0))
        self._timed("outputs", time.monotonic() - t0)
        if record.error:
            self._warn(f"greedy outputs for the correctness gate incomplete: {record.error}")

    def _measure(self, client: clients.BenchmarkClient, server: srv.ServerProcess) -> list[Metrics]:
        ndt = self.spec.params.get("speculative_num_draft_tokens")
        target = clients.Target(
            server=server,
            sweep=self.sweep,
            trial_dir=self.dir,
            seed=self.spec.seed,
            num_draft_tokens=int(ndt) if ndt is not None else None,
        )
        self._remaining()
        found = []
        for measured in client.run_repeats(target, self.spec.repeats, self._remaining):
            self._timed("bench", measured.bench_s)
            self._warn(*measured.warnings)
            if measured.gpus_under_load:
                self.found["fingerprint"] = {
                    **self.found.get("fingerprint", {}),
                    "gpus_under_load": measured.gpus_under_load,
                }
                write_json(self.dir / "fingerprint.json", self.found["fingerprint"])
            found.append(measured.metrics)
        return found
