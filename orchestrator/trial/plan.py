"""Trial parameters + the experiment's server spec -> LaunchPlan: the flags and environment as data,
and the exact argv list rendered from them.

Both engines get the same SGLang argv (`engine: simulator` only swaps the module and appends the
simulator's own --hardware-profile/--model-profile/--sim-* flags), so the simulator exercises the
flags a GPU host would receive. Flag spellings follow the experiment's SGLang version (config.render).
"""

from __future__ import annotations

import datetime as _dt
import shlex
import sys
from collections.abc import Mapping

from orchestrator.config import render
from orchestrator.config.experiment import SweepSpec
from orchestrator.records import LaunchPlan, ParamValue, ServingConfig
from orchestrator.trial.allreduce import plan_warnings


def _simulator_args(
    spec: SweepSpec, params: Mapping[str, ParamValue], *, seed: int, drift_epoch: float | None
) -> list[str]:
    sim = spec.simulator
    args = [
        "--hardware-profile",
        sim.hardware_profile,
        "--model-profile",
        sim.model_profile,
        "--sim-seed",
        str(seed),
        "--sim-noise",
        str(sim.noise),
    ]
    if sim.noise_prefill_correlation != 1:
        args += ["--sim-noise-prefill-correlation", str(sim.noise_prefill_correlation)]
    if sim.time_scale:
        args += ["--sim-time-scale", str(sim.time_scale)]
    if sim.drift_per_hour:
        args += ["--sim-drift", str(sim.drift_per_hour), "--sim-drift-epoch", f"{drift_epoch or 0:.3f}"]
    for fault in sim.faults:
        if isinstance(fault, str):
            args += ["--sim-fault", fault]
        elif all(params.get(k) in (v if isinstance(v, list) else [v]) for k, v in fault.when.items()):
            args += ["--sim-fault", fault.fault]
    return args


def make(
    spec: SweepSpec,
    params: Mapping[str, ParamValue],
    *,
    port: int,
    seed: int = 0,
    drift_epoch: float | None = None,
) -> LaunchPlan:
    """The launch plan for one trial. Pure: starts nothing, reads no environment."""
    python = spec.server.python or sys.executable
    module = "sglang.launch_server" if spec.engine == "sglang" else "orchestrator.simulator"
    flags = render.launch_flags(spec, params, port=port)
    argv = [python, "-m", module, *render.flag_args(flags)]
    if spec.engine == "simulator":
        argv += _simulator_args(spec, params, seed=seed, drift_epoch=drift_epoch)
    env = render.tuned_env(spec, params)
    # Only the variables this trial varies; fixed ones (NCCL_DEBUG, server.env) are not "swept".
    warnings = plan_warnings(env, flags, hardware(spec), swept=list(render.env_knobs(params)))
    warnings += prompt_warnings(spec, params)
    return LaunchPlan(
        argv=tuple(argv),
        flags=flags,
        env=env,
        host=spec.server.host,
        port=port,
        engine=spec.engine,
        warnings=tuple(warnings),
    )


SYNTHETIC_ACCEPTANCE = (
    "synthetic acceptance: benchmark.dataset_path is not set, so the {what} and the accept length it measures is "
    "inflated against real text (random prompts gave 74.6% acceptance against 48.5% on chat for Kimi-K3, "
    "lightseekorg/tokenspeed#1305); set benchmark.dataset_path to a prompt set of your traffic (ShareGPT JSON, "
    "MT-Bench question.jsonl, JSON lines with a prompt field)"
)


def prompt_warnings(spec: SweepSpec, params: Mapping[str, ParamValue]) -> list[str]:
    """The warning that a speculating trial's acceptance comes from synthetic prompts (none on real text)."""
    if params.get("speculative_algorithm") is None or spec.benchmark.dataset_path:
        return []
    what = (
        "builtin client draws its prompts from a 25-word list"
        if spec.benchmark.engine == "builtin"
        else "bench_serving sends random token ids (--dataset-name random-ids)"
    )
    return [SYNTHETIC_ACCEPTANCE.format(what=what)]


def hardware(spec: SweepSpec) -> str | None:
    """The interconnect the plan runs on, when the experiment says (the simulator's profile)."""
    return spec.simulator.hardware_profile if spec.engine == "simulator" else None


def launch_command(plan: LaunchPlan) -> str:
    """A human-readable rendering (for `sweep plan` output only; never executed through a shell)."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(plan.env.items()))
    return (env + " " if env else "") + shlex.join(plan.argv)


def serving_config(
    spec: SweepSpec,
    params: Mapping[str, ParamValue],
    *,
    trial_number: int,
    run_id: str,
    metrics: Mapping[str, float],
    fingerprint_hash: str,
    allreduce_backend: str = "",
) -> ServingConfig:
    """What a deployment needs to reproduce a trial: its environment and the SGLang flags it tuned, and the
    all-reduce backend its server recorded (`allreduce_backend`, TrialOutcome.allreduce_path; "" when none)."""
    return ServingConfig(
        experiment=spec.name,
        trial_number=trial_number,
        run_id=run_id,
        model_version=None,
        engine=spec.engine,
        sglang_version=spec.sglang_version,
        params=dict(params),
        env=render.tuned_env(spec, params),
        sglang_args=tuple(render.serving_args(spec, params)),
        metrics={k: float(v) for k, v in metrics.items()},
        fingerprint_hash=fingerprint_hash,
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        allreduce_backend=allreduce_backend,
    )
