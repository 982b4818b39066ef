"""Trial parameters + the experiment's server spec -> LaunchPlan: the exact argv list and environment.

Both engines get the same SGLang argv (`engine: simulator` only swaps the module and appends the
simulator's own --hardware-profile/--model-profile/--sim-* flags), so the simulator exercises the
flags a GPU host would receive. Flag spellings follow the experiment's SGLang version.
"""

from __future__ import annotations

import datetime as _dt
import functools
import re
import sys
from collections.abc import Mapping
from importlib import resources

from orchestrator.config import knobs
from orchestrator.config.experiment import SweepSpec
from orchestrator.records import LaunchPlan, ParamValue
from orchestrator.search import space as sp

# Flags the sweep sets itself; an experiment may not fix them in server.flags.
MANAGED_FLAGS = {
    "--model-path": "server.model",
    "--tp-size": "server.tp",
    "--host": "server.host",
    "--port": "server.port_range",
    "--speculative-algorithm": "the speculative_algorithm knob",
    "--speculative-draft-model-path": "server.draft_model",
    "--speculative-num-steps": "the speculative_num_steps knob",
    "--speculative-eagle-topk": "the speculative_eagle_topk knob",
    "--speculative-num-draft-tokens": "the speculative_num_draft_tokens knob",
}

_HELP_FILES = {"0.5.23": "sglang_0_5_23/launch_server_help.txt"}


@functools.cache
def known_flags(version: str) -> frozenset[str] | None:
    """Every option string `sglang.launch_server --help` of `version` declares (aliases included),
    or None when no dump of that version ships."""
    rel = _HELP_FILES.get(version)
    if rel is None:
        return None
    text = resources.files("orchestrator.reference").joinpath(rel).read_text(encoding="utf-8")
    usage, _, options = text.partition("\n\n")
    # The usage block lists each option once; the option lines ("  --tp-size TP_SIZE, --tensor-parallel-size
    # TP_SIZE") add the aliases. Flags merely mentioned in help prose are not options.
    flags = set(re.findall(r"(?<=[\[ |])(--[a-z0-9][a-z0-9-]*[a-z0-9])", usage))
    for line in options.splitlines():
        if m := re.match(r"^  (--?\w.*?)(?:\s{2,}|$)", line):
            flags.update(tok for part in m.group(1).split(", ") if (tok := part.split(" ")[0]).startswith("--"))
    flags.discard("--help")
    return frozenset(flags)


def knob_flags(version: str) -> dict[str, str]:
    """Flags that a tuned knob emits (or that would fight it), flag -> knob, for `version`'s spelling."""
    names = knobs.FLAG_NAMES[version]
    table = {
        "--speculative-attention-mode": "speculative_attention_mode",
        "--disable-custom-all-reduce": "all_reduce_path",
        "--disable-cuda-graph": "cuda_graph",
        names.disable_cuda_graph[0]: "cuda_graph",
        names.cuda_graph_max_bs: "cuda_graph_max_bs",
        "--max-running-requests": "max_running_requests",
    }
    if version not in ("0.5.9",):
        table["--disable-decode-cuda-graph"] = "cuda_graph"
    return table


def _flag_args(name: str, value: ParamValue | list) -> list[str]:
    flag = "--" + name.lstrip("-")
    if value is None or value is False:
        return []
    if value is True:
        return [flag]
    if isinstance(value, list):
        return [flag, *map(str, value)]
    return [flag, str(value)]


def tuned_flags(spec: SweepSpec, params: Mapping[str, ParamValue]) -> list[str]:
    """The SGLang flags that the trial's knobs turn into (what a deployment must pass too)."""
    names = knobs.FLAG_NAMES[spec.sglang_version]
    params = sp.effective(params)
    args: list[str] = []
    algo = params.get("speculative_algorithm")
    if algo is not None:
        args += ["--speculative-algorithm", str(algo)]
        if spec.server.draft_model:
            args += ["--speculative-draft-model-path", spec.server.draft_model]
        for knob in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"):
            if params.get(knob) is not None:
                args += ["--" + knob.replace("_", "-"), str(params[knob])]
        if params.get("speculative_attention_mode") is not None:
            args += ["--speculative-attention-mode", str(params["speculative_attention_mode"])]
    if params.get("all_reduce_path") == "nccl":
        args.append("--disable-custom-all-reduce")
    if params.get("cuda_graph") is False:
        args += list(names.disable_cuda_graph)
    if params.get("cuda_graph_max_bs") is not None:
        args += [names.cuda_graph_max_bs, str(params["cuda_graph_max_bs"])]
    if params.get("max_running_requests") is not None:
        args += ["--max-running-requests", str(params["max_running_requests"])]
    return args


def fixed_flags(spec: SweepSpec) -> list[str]:
    args: list[str] = []
    for name, value in spec.server.flags.items():
        args += _flag_args(name, value)
    if "--enable-metrics" not in args:
        args.append("--enable-metrics")  # /metrics is a measurement source
    return args


def tuned_env(spec: SweepSpec, params: Mapping[str, ParamValue]) -> dict[str, str]:
    """The experiment's fixed environment plus the trial's environment knobs (None = not set)."""
    env = dict(spec.server.env)
    for name, value in params.items():
        knob = knobs.KNOBS.get(name)
        if knob is not None and knob.target == "env" and value is not None:
            env[name] = str(value)
    return env


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
    argv = [python, "-m", module,
            "--model-path", spec.server.model,
            "--tp-size", str(spec.server.tp),
            "--host", spec.server.host,
            "--port", str(port)]
    argv += fixed_flags(spec)
    argv += tuned_flags(spec, params)
    if spec.engine == "simulator":
        sim = spec.simulator
        argv += ["--hardware-profile", sim.hardware_profile, "--model-profile", sim.model_profile,
                 "--sim-seed", str(seed), "--sim-noise", str(sim.noise)]
        if sim.drift_per_hour:
            argv += ["--sim-drift", str(sim.drift_per_hour), "--sim-drift-epoch", f"{drift_epoch or 0:.3f}"]
        for fault in sim.faults:
            if isinstance(fault, str):
                argv += ["--sim-fault", fault]
            elif all(params.get(k) in (v if isinstance(v, list) else [v]) for k, v in fault.when.items()):
                argv += ["--sim-fault", fault.fault]
    return LaunchPlan(
        argv=tuple(argv),
        env=tuned_env(spec, params),
        host=spec.server.host,
        port=port,
        engine=spec.engine,
        warnings=tuple(warnings(spec, params)),
    )


def hardware(spec: SweepSpec) -> str | None:
    """The interconnect the plan runs on, when the experiment says (the simulator's profile)."""
    return spec.simulator.hardware_profile if spec.engine == "simulator" else None


def warnings(spec: SweepSpec, params: Mapping[str, ParamValue]) -> list[str]:
    """What would make this plan measure something other than what it says (see observe.plan_warnings)."""
    from orchestrator.trial import observe

    flags: dict[str, object] = {**spec.server.flags, "tp-size": spec.server.tp}
    flags.update(observe.flags_from_argv(tuned_flags(spec, params)))
    # Only the variables this trial varies; fixed ones (NCCL_DEBUG, server.env) are not "swept".
    swept = [n for n, v in params.items() if v is not None and n in knobs.KNOBS and knobs.KNOBS[n].target == "env"]
    return observe.plan_warnings(tuned_env(spec, params), flags, hardware(spec), swept=swept)


def launch_command(plan: LaunchPlan) -> str:
    """A human-readable rendering (for `sweep plan` output only; never executed through a shell)."""
    import shlex

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
) -> dict:
    """What a deployment needs to reproduce a trial: its environment and the SGLang flags it tuned."""
    return {
        "experiment": spec.name,
        "trial_number": trial_number,
        "run_id": run_id,
        "model_version": None,
        "engine": spec.engine,
        "sglang_version": spec.sglang_version,
        "params": dict(params),
        "env": tuned_env(spec, params),
        "sglang_args": ["--tp-size", str(spec.server.tp), *fixed_flags(spec), *tuned_flags(spec, params)],
        "metrics": {k: float(v) for k, v in metrics.items()},
        "fingerprint_hash": fingerprint_hash,
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
