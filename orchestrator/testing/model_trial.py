"""One trial as the simulator's model answers it (the model-backed executor's work, model_executor.py): the
simulated server's parse and resolution of the launch, the faults it would show as the outcome the trial
runner would classify, the observation it would record, the benchmark's repeats with the run's noise and
the host's drift, the output capture, and the real-scale seconds all of it takes."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import redact
from orchestrator.config.experiment import SweepSpec
from orchestrator.records import (
    FailureKind,
    LaunchPlan,
    Metrics,
    OutputsRecord,
    OutputsRequest,
    ParamValue,
    PromptOutput,
    ScoredOutput,
    TrialOutcome,
    TrialSpec,
    TrialStatus,
)
from orchestrator.simulator import cli as sim_cli
from orchestrator.simulator import tokens
from orchestrator.simulator.cost import SIMULATED_START_S, trial_cost
from orchestrator.simulator.engine import run_factors
from orchestrator.simulator.faults import Faults
from orchestrator.simulator.model import (
    Config,
    HardwareProfile,
    ModelProfile,
    Prediction,
    evaluate,
    prefill_ms,
    resolve,
)
from orchestrator.trial import metrics as metrics_mod
from orchestrator.trial import observe, outputs

__all__ = ["HOST", "Answer", "ExtraFailure", "ModelTrial", "model_outputs"]

HOST = "model-executor"
"""The node name every trial of this executor reports."""

Failure = tuple[FailureKind, str]
ExtraFailure = Callable[[Mapping[str, ParamValue]], Failure | None]
"""A test's or benchmark's own failure rule: params -> (kind, reason), or None."""


@dataclass(frozen=True)
class Answer:
    """What the model says one trial does: its outcome and the real-scale seconds it takes."""

    outcome: TrialOutcome
    seconds: float


def model_outputs(request: OutputsRequest, *, model_path: str, numerics: tokens.Numerics) -> OutputsRecord:
    """What a simulated server of this launch answers to the trial's output capture (trial.outputs):
    the simulator's own token function (simulator.tokens), so both give the same outputs.json."""
    key = tokens.model_key(model_path)
    prompts = []
    for i, text in enumerate(outputs.PROMPTS[: request.prompts]):
        ids = tokens.tokenize(text) or [0]
        stream = tokens.Stream(key, ids, numerics)
        out, tops = [], []
        for _ in range(request.max_new_tokens):
            if request.top_logprobs:
                tops.append(tuple(tokens.top_k(stream.state, request.top_logprobs)))
            out.append(stream.next()[:2])
        prompts.append(
            PromptOutput(
                prompt=i,
                prompt_ids=tuple(ids),
                output_ids=tuple(t for t, _ in out),
                output_logprobs=tuple(lp for _, lp in out),
                output_top=tuple(tops),
            )
        )
    scored = []
    for s in request.score:
        rated = tokens.score(key, s.input_ids, len(s.input_ids) - s.continuation - 1)[1:]  # as trial.outputs asks
        scored.append(
            ScoredOutput(
                arm=s.arm,
                prompt=s.prompt,
                logprobs=tuple(float(lp or 0.0) for lp, *_ in rated),
                top_logprobs=tuple(max(float(top or 0.0), float(lp or 0.0)) for lp, _, top, _ in rated),
            )
        )
    return OutputsRecord(prompts=tuple(prompts), scored=tuple(scored))


class ModelTrial:
    """One trial's answer, step by step as the trial runner meets them. `profiles` loads (and may cache) a
    hardware and a model profile by name; `failures` is the caller's own failure rule, if any."""

    def __init__(
        self,
        sweep: SweepSpec,
        spec: TrialSpec,
        plan: LaunchPlan,
        base: TrialOutcome,
        *,
        profiles: Callable[[str, str], tuple[HardwareProfile, ModelProfile]],
        failures: ExtraFailure | None,
    ):
        self.sweep, self.spec, self.plan, self.base = sweep, spec, plan, base
        self.profiles, self.failures = profiles, failures

    def _failed(self, kind: FailureKind, reason: str, seconds: float, **found: Any) -> Answer:
        timings = {"server_start": round(min(seconds, self._load_s), 3)}
        log = Path(self.spec.trial_dir) / "server.log"
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"[model] the trial ends {kind.value}: {reason}\n")
        outcome = self.base.model_copy(
            update={
                "failure_kind": kind,
                "reason": reason,
                "finished_at": self.base.started_at + seconds,
                "timings": timings,
                "log_tail": log.read_text(encoding="utf-8"),
                **found,
            }
        )
        return Answer(outcome, seconds)

    def answer(self) -> Answer:
        sweep, bench = self.sweep, self.sweep.benchmark
        try:
            ns, options = sim_cli.parse(self.plan.argv[3:], {**self.plan.env})
        except SystemExit as exc:
            self._load_s = 0.0
            return self._failed(
                FailureKind.server_crash, f"sglang serve rejects these arguments (exit code {exc.code})", 1.0
            )
        hw, clean_model = self.profiles(options.hardware_profile, options.model_profile)
        model = options.faults.model(clean_model)  # a broken draft wiring accepts ~no draft, as the server's
        # As the simulated server: it sleeps time_scale x the profile's load and graph capture (0 in the
        # demo and the tests: a process start), real-scale at 1 (bench/overnight.py).
        self._load_s = (
            max(options.time_scale * (model.load_weights_s + model.graph_capture_s), SIMULATED_START_S)
            + options.faults.slow_start_s
        )
        resolved = sim_cli.resolve(ns)
        if resolved.error or resolved.unsupported:
            return self._failed(
                FailureKind.server_crash, f"server exited with code 1: {resolved.error or resolved.unsupported}", 5.0
            )
        faults = options.faults
        env = dict(self.plan.env)
        ranks_env = {k: v for k, v in env.items() if not (faults.env_drop and k.startswith("NCCL_"))}
        params = sim_cli.params_from_args(resolved.args, ranks_env)
        prediction = evaluate(params, hw, model, concurrency=bench.concurrency)
        early = self._start_failure(faults, params, prediction)
        if early is not None:
            return early
        found = self._observed(env, ranks_env, hw, model, prediction)
        if not found["effective_env"]["ok"]:
            problems = "; ".join(found["effective_env"]["problems"])
            return self._failed(FailureKind.env_not_applied, problems, self._load_s, **found)
        rate = prediction.decode_tok_s
        cost = trial_cost(
            model,
            hw,
            decode_tok_s=rate,
            requests=bench.requests,
            output_len=bench.output_len,
            concurrency=bench.concurrency,
            repeats=self.spec.repeats,
            warmup_requests=bench.warmup_requests,
            input_len=bench.input_len,
            tp=sweep.server.tp,
        )
        late = self._run_failure(faults, env, rate, self._load_s, found)
        if late is not None:
            return late
        capture_s = self._capture_s(params, hw, model)
        seconds = self._load_s + cost.warmup_s + cost.benchmark_s + capture_s
        if seconds > sweep.budget.trial_timeout_s:
            return self._failed(
                FailureKind.trial_timeout,
                f"trial deadline (budget.trial_timeout_s={sweep.budget.trial_timeout_s:g}) passed",
                sweep.budget.trial_timeout_s,
                **found,
            )
        cfg = resolve(params, hw, model)
        if isinstance(cfg, str):  # evaluate() resolves it too: its refusal ended the trial in _start_failure
            return self._failed(FailureKind.server_crash, f"server exited with code 1: {cfg}", 5.0)
        repeats = self._measurements(options, prediction, hw, model, cfg, cost.benchmark_s)
        median, summary = metrics_mod.summarize(repeats, seed=self.spec.seed)
        if self.spec.outputs is not None:
            outputs.write(
                Path(self.spec.trial_dir),
                model_outputs(
                    self.spec.outputs,
                    model_path=str(resolved.args.get("model_path")),
                    numerics=tokens.launch_numerics(
                        hw,
                        model,
                        cfg,
                        deterministic=bool(resolved.args.get("enable_deterministic_inference")),
                        draft_wiring_broken=faults.draft_wiring_broken,
                    ),
                ),
            )
        outcome = self.base.model_copy(
            update={
                "status": TrialStatus.COMPLETE,
                "metrics": median,
                "repeats": tuple(repeats),
                "summary": summary,
                "finished_at": self.base.started_at + seconds,
                **found,
                "timings": {
                    "server_start": round(self._load_s, 3),
                    "bench": round(cost.warmup_s + cost.benchmark_s, 3),
                    **({"outputs": round(capture_s, 3)} if self.spec.outputs is not None else {}),
                },
            }
        )
        return Answer(outcome, seconds)

    def _capture_s(self, params: Mapping[str, Any], hw: HardwareProfile, model: ModelProfile) -> float:
        """The output capture's seconds (trial.outputs): its prompts decoded together, one batch of
        max_new_tokens each, at the rate the model gives that many streams; scoring is prefill only."""
        request = self.spec.outputs
        if request is None or request.prompts < 1:
            return 0.0
        rate = evaluate(params, hw, model, concurrency=request.prompts).decode_tok_s
        if not rate > 0:
            return 0.0
        return trial_cost(
            model,
            hw,
            decode_tok_s=rate,
            requests=request.prompts,
            output_len=request.max_new_tokens,
            concurrency=request.prompts,
            tp=self.sweep.server.tp,
        ).benchmark_s

    def _start_failure(self, faults: Faults, params: Mapping[str, Any], prediction: Prediction) -> Answer | None:
        """What ends a trial before the server is ready."""
        if faults.never_ready:
            t = self.sweep.server.startup_timeout_s
            return self._failed(
                FailureKind.startup_timeout,
                f"server not ready after {t:.0f}s (server.startup_timeout_s={t:g}); see the log tail",
                t,
            )
        topk = int(params.get("speculative_eagle_topk") or 1)
        ndt = int(params.get("speculative_num_draft_tokens") or 0)
        if faults.ooms(ndt, topk):
            return self._failed(
                FailureKind.oom,
                "torch.OutOfMemoryError: CUDA out of memory (simulated "
                f"oom_above_draft_tokens={faults.oom_above_draft_tokens})",
                self._load_s,
            )
        extra = self.failures(self.spec.params) if self.failures else None
        if extra is not None:
            kind, reason = extra
            hang = kind is FailureKind.nccl_hang
            return self._failed(kind, reason, self._load_s + (self.sweep.benchmark.stall_timeout_s if hang else 0.0))
        if not prediction.ok:
            return self._failed(FailureKind.server_crash, f"server exited with code 1: {prediction.failure}", 5.0)
        return None

    def _run_failure(
        self, faults: Faults, env: Mapping[str, str], rate: float, load_s: float, found: dict[str, Any]
    ) -> Answer | None:
        """What ends a trial during the benchmark."""
        stall = self.sweep.benchmark.stall_timeout_s
        if faults.hangs(env):
            return self._failed(
                FailureKind.nccl_hang,
                f"no token for {stall:g}s while the server lived "
                "(benchmark.stall_timeout_s): a collective that never completes",
                load_s + stall,
                **found,
            )
        streams = max(1, self.sweep.benchmark.concurrency)
        for after, kind in (
            (faults.hang_after_tokens, FailureKind.nccl_hang),
            (faults.crash_after_tokens, FailureKind.server_crash),
        ):
            if after is not None:
                seconds = load_s + after / (rate * streams) + (stall if kind is FailureKind.nccl_hang else 0.0)
                reason = (
                    f"no token for {stall:g}s after {after} tokens (benchmark.stall_timeout_s)"
                    if kind is FailureKind.nccl_hang
                    else "server died: RuntimeError: CUDA error: an illegal memory access was encountered "
                    f"(after {after} tokens; SGLang killed its process tree, exit -9)"
                )
                return self._failed(kind, reason, seconds, **found)
        return None

    def _observed(
        self,
        env: Mapping[str, str],
        ranks_env: Mapping[str, str],
        hw: HardwareProfile,
        model: ModelProfile,
        prediction: Prediction,
    ) -> dict[str, Any]:
        """What the runner's observation would record: env per rank (trial.observe's rule on the
        simulated processes), fingerprint, all-reduce path."""
        tp = self.sweep.server.tp
        server = 100_000 + self.spec.number * 64
        snaps = [
            observe.ProcessSnapshot(pid=server, ppid=1, cmdline=tuple(self.plan.argv), exe=None, environ=dict(env))
        ]
        snaps += [
            observe.ProcessSnapshot(
                pid=server + 1 + r,
                ppid=server,
                cmdline=("python", f"orchestrator.simulator::scheduler_TP{r}"),
                exe=None,
                environ=dict(ranks_env),
            )
            for r in range(tp)
        ]
        observation = observe.evaluate_env(server, snaps, env, tp)
        fp = {
            "simulated": True,
            "host": HOST,
            "executor": "model",
            "hardware_profile": hw.name,
            "model_profile": model.name,
        }
        return {
            "effective_env": redact.redact_env_tree(observation.model_dump(mode="json")),
            "fingerprint": fp,
            "fingerprint_hash": observe.fingerprint_hash(fp),
            "allreduce_path": "none" if tp == 1 else prediction.ar_path,
        }

    def _measurements(
        self,
        options: sim_cli.SimOptions,
        p: Prediction,
        hw: HardwareProfile,
        model: ModelProfile,
        cfg: Config,
        bench_s: float,
    ) -> list[Metrics]:
        """The benchmark's repeats: the model's rates times the run's factors (engine.run_factors: decode's,
        and prefill's for TTFT, the prefill of one prompt as the simulated engine times it), the host's drift
        (shared: a host that slows, slows both) and each repeat's own jitter (drawn apart for decode and
        prefill, as the engine's Timing.factor draws one per call). Above one stream TTFT also holds the wait
        for the running batch's cycle."""
        seed, noise, correlation = options.seed, options.noise, options.prefill_correlation
        drift, epoch = options.drift_per_hour, options.drift_epoch
        bench = self.sweep.benchmark
        base_factor, prefill_factor = run_factors(seed, noise, correlation)
        rng = random.Random(json.dumps([seed, self.spec.number, "repeats"]))
        prefill_rng = random.Random(json.dumps([seed, self.spec.number, "prefill repeats"]))  # decode's draws as before
        ttft = prefill_ms(hw, model, cfg, bench.input_len)
        # Above one stream a new request arrives while the running batch decodes and is prefilled when that
        # cycle ends (simulator/engine.py's loop, SGLang's scheduler without mixed chunking): about one cycle.
        wait = p.cycle_ms if bench.concurrency > 1 else 0.0
        out = []
        for r in range(self.spec.repeats):
            at = self.base.started_at + self._load_s + bench_s * (r + 1) / self.spec.repeats
            hours = max(0.0, at - (epoch if epoch is not None else self.base.started_at)) / 3600.0
            jitter = max(0.5, 1.0 + (noise / 8.0) * rng.gauss(0.0, 1.0)) if noise > 0 else 1.0
            prefill_jitter = max(0.5, 1.0 + (noise / 8.0) * prefill_rng.gauss(0.0, 1.0)) if noise > 0 else 1.0
            f = base_factor * (1.0 + drift * hours) * jitter
            fp = prefill_factor * (1.0 + drift * hours) * prefill_jitter
            out.append(
                Metrics(
                    decode_tok_s=p.decode_tok_s / f,
                    output_tok_s=p.output_tok_s / f,
                    ttft_ms_p50=ttft * fp + wait * f,
                    ttft_ms_p99=ttft * fp + wait * f,
                    itl_ms_p50=p.cycle_ms * f,
                    itl_ms_p99=p.cycle_ms * f,
                    tpot_ms_p50=1000.0 / (p.decode_tok_s / f),
                    accept_length=p.accept_length,
                    accept_rate=p.accept_rate,
                    verify_ms=p.verify_ms * f if p.verify_ms is not None else None,
                    cycle_ms=p.cycle_ms * f,
                    requests_ok=bench.requests,
                    requests_failed=0,
                    sources={"decode_tok_s": "model", "verify_ms": "model", "accept_length": "model"},
                )
            )
        return out
