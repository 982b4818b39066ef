"""An Executor that answers trials from the simulator's model, on a virtual clock.

No server process starts. Each trial goes through the tool's own launch plan (trial.plan.make: the
argv and environment a real trial would start), the simulated server's own parser and resolution
(simulator.cli.parse / resolve / params_from_args: what that launch runs, SGLang's refusals and the
`--sim-fault` injections included), then:

- the noise-free model (simulator.model.evaluate) at the benchmark's concurrency,
- times the simulated server's run factors for that seed (simulator.engine.run_factors: the same
  run-to-run noise a real simulator process draws, on decode and on the prefill TTFT times) and the host drift at the virtual time the
  benchmark ends (`--sim-drift` since the sweep's epoch); repeats of one trial differ by a per-repeat
  jitter of an eighth of the noise (one server run, averaged over many cycles),
- the faults the simulated server would show, as the outcome the trial runner would classify them:
  never_ready -> startup_timeout, oom_above_draft_tokens -> oom, nccl_hang / nccl_hang_when /
  hang_after_tokens -> nccl_hang, crash_after_tokens -> server_crash, env_drop -> env_not_applied
  (through trial.observe's own rule on simulated rank processes), a launch SGLang refuses -> server_crash
  with the refusal,
- and the seconds the simulated server would take: its start-up (the profile's load and graph capture
  times `simulator.time_scale`, as `--sim-time-scale` sleeps them, at least a process start), then the
  warm-up and the benchmark's repeats at the model's rate (simulator.cost.trial_cost); the virtual
  clock advances by them when the trial ends; several slots run side by side. With time_scale 1 these
  are the real-scale seconds of a GPU host (bench/overnight.py).

The files a trial writes (spec.json, launch.json, outcome.json) are written as the trial runner
writes them, before the outcome is returned, so resume and reports read them as usual; server.log
says that no server ran.

It runs the real driver (sweep.Sweep) in milliseconds per trial: the in-process sweep tests and
bench/overnight.py use it. It is not a stand-in for the engine path (the inline and Ray executors
with real simulator servers are; tests/execute/test_executor_contract.py runs one contract on all).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator import redact
from orchestrator.clock import VirtualClock
from orchestrator.config.experiment import SweepSpec
from orchestrator.execute.base import ExecutorInfo, Finished
from orchestrator.fsio import write_json
from orchestrator.records import FailureKind, TrialOutcome, TrialSpec, TrialStatus
from orchestrator.simulator.model import HardwareProfile, ModelProfile
from orchestrator.simulator.profiles import load_hardware, load_model
from orchestrator.testing.model_trial import HOST, Answer, ExtraFailure, ModelTrial, model_outputs
from orchestrator.trial import plan as planner

__all__ = ["ModelExecutor", "Answer", "HOST", "model_outputs"]
"""Answer, HOST and model_outputs are model_trial.py's, re-exported."""


@dataclass(order=True)
class _Running:
    ends_at: float
    handle: int
    spec: TrialSpec = field(compare=False)
    answer: Answer = field(compare=False)


class ModelExecutor:
    """Runs `slots` trials at a time on the simulator's model; `clock` is the virtual time they take.

    `failures` adds a failure rule of the caller's (a benchmark's hidden OOM region, say) on top of the
    experiment's own `simulator.faults`.
    """

    def __init__(self, slots: int = 1, *, clock: VirtualClock | None = None, failures: ExtraFailure | None = None):
        if slots < 1:
            raise ValueError(f"slots must be >= 1, but got {slots}")
        self.slots = slots
        self.clock: VirtualClock = clock or VirtualClock()
        self.failures = failures
        self.launched = 0
        """Trials submitted so far (server launches a real executor would have made)."""
        self.busy_s = 0.0
        """Real-scale seconds of every trial submitted (GPU-time / tp)."""
        self._running: list[_Running] = []
        self._next = 0
        self._profiles: dict[tuple[str, str], tuple[HardwareProfile, ModelProfile]] = {}

    # ------------------------------------------------------------------ the Executor interface

    def start(self) -> ExecutorInfo:
        return ExecutorInfo(address=None, gpus=0.0, slots=self.slots)

    def idle(self) -> int:
        return self.slots - len(self._running)

    def submit(self, spec: TrialSpec) -> int:
        if not self.idle():
            raise RuntimeError(f"submit() with all {self.slots} slots busy")
        self._next += 1
        started = self.clock.time()
        answer = self.answer(spec, started_at=started)
        self.launched += 1
        self.busy_s += answer.seconds
        heapq.heappush(self._running, _Running(self.clock.monotonic() + answer.seconds, self._next, spec, answer))
        return self._next

    def wait(self, timeout_s: float) -> list[Finished]:
        """The trials that end first: the clock moves to their end (a wait on a virtual clock lasts
        until something happens); with nothing running, `timeout_s` passes."""
        if not self._running:
            self.clock.advance(max(timeout_s, 0.0))
            return []
        first = self._running[0].ends_at
        self.clock.advance_to(first)
        done: list[Finished] = []
        while self._running and self._running[0].ends_at <= first:
            r = heapq.heappop(self._running)
            done.append(Finished(r.handle, r.spec, self._written(r.spec, r.answer.outcome)))
        return done

    def abort(self, handle: int) -> None:
        """The trial's server is killed now: it ends at once, FAILED (the sweep names it interrupted)."""
        for i, r in enumerate(self._running):
            if r.handle == handle:
                killed = r.answer.outcome.model_copy(
                    update={
                        "status": TrialStatus.FAILED,
                        "failure_kind": FailureKind.server_crash,
                        "metrics": None,
                        "repeats": (),
                        "summary": None,
                        "finished_at": self.clock.time(),
                        "reason": "server died (killed by signal 9 (SIGKILL)): aborted",
                    }
                )
                self._running[i] = _Running(self.clock.monotonic(), handle, r.spec, Answer(killed, 0.0))
                heapq.heapify(self._running)
                return

    def close(self) -> None:
        """Nothing to release."""

    # ------------------------------------------------------------------ the model's answer

    def answer(self, spec: TrialSpec, *, started_at: float) -> Answer:
        """The outcome of `spec` started at `started_at` (epoch seconds on the clock), and its cost.
        Writes spec.json and launch.json to the trial folder, as the runner does before a launch."""
        sweep = spec.experiment
        if not isinstance(sweep, SweepSpec):
            raise TypeError(f"TrialSpec.experiment must be the validated SweepSpec, but got {type(sweep).__name__}")
        trial_dir = Path(spec.trial_dir)
        trial_dir.mkdir(parents=True, exist_ok=True)
        write_json(
            trial_dir / "spec.json",
            {
                "number": spec.number,
                "role": spec.role.value,
                "params": spec.params,
                "repeats": spec.repeats,
                "seed": spec.seed,
                "node": HOST,
                "gpu_ids": [],
            },
        )
        plan = planner.make(
            sweep, spec.params, port=30_000 + spec.number % 10_000, seed=spec.seed, drift_epoch=spec.sweep_started_at
        )
        write_json(
            trial_dir / "launch.json",
            {
                "argv": list(plan.argv),
                "env": redact.redact_env(plan.env),
                "host": plan.host,
                "port": plan.port,
                "engine": plan.engine,
                "warnings": list(plan.warnings),
                "executor": "model",
            },
        )
        (trial_dir / "server.log").write_text(
            "model-backed executor (orchestrator/testing/model_executor.py): no server process was started; "
            "the outcome is the simulator's model of this launch\n",
            encoding="utf-8",
        )
        base = TrialOutcome(
            number=spec.number,
            params=spec.params,
            effective_params=spec.effective_params,
            role=spec.role,
            status=TrialStatus.FAILED,
            trial_dir=str(trial_dir),
            node=HOST,
            started_at=started_at,
            launch=plan,
            finished_at=started_at,
        )
        return ModelTrial(sweep, spec, plan, base, profiles=self.profiles, failures=self.failures).answer()

    def profiles(self, hardware: str, model: str) -> tuple[HardwareProfile, ModelProfile]:
        key = (hardware, model)
        if key not in self._profiles:
            self._profiles[key] = (load_hardware(hardware), load_model(model))
        return self._profiles[key]

    def _written(self, spec: TrialSpec, outcome: TrialOutcome) -> TrialOutcome:
        write_json(Path(spec.trial_dir) / "outcome.json", outcome.model_dump(mode="json"))
        return outcome
