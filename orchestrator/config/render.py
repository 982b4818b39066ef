"""Knob values -> what SGLang receives: the flags (as data, `--flag` -> value or True for a switch)
and the environment. Rendered once per trial; argv lists are made from these dicts, never parsed back.

Flag spellings follow the experiment's SGLang version (knobs.FLAG_NAMES). None means "not set":
the flag or variable is left out and the engine's default runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from orchestrator.config import allreduce, knobs, speculation
from orchestrator.config.eagle import effective
from orchestrator.config.experiment import SweepSpec
from orchestrator.config.space import Scalar
from orchestrator.records import ParamValue

Flags = dict[str, str | bool]
"""`--flag` -> its value, or True for a switch; in the order they go on the command line."""


def _put(flags: Flags, name: str, value: Scalar) -> None:
    if value is None or value is False:
        return
    flags["--" + name.lstrip("-")] = True if value is True else str(value)


def flag_args(flags: Mapping[str, str | bool]) -> list[str]:
    """The argv words of `flags`: `--flag value`, or `--flag` alone for a switch."""
    args: list[str] = []
    for flag, value in flags.items():
        args += [flag] if value is True else [flag, str(value)]
    return args


def tuned_flags(spec: SweepSpec, params: Mapping[str, ParamValue]) -> Flags:
    """The SGLang flags that the trial's knobs turn into (what a deployment must pass too)."""
    names = knobs.FLAG_NAMES[spec.sglang_version]
    params = effective(params)
    flags: Flags = {}
    algo = speculation.get(params.get("speculative_algorithm"))
    if algo is not None:
        for flag, setting in algo.flags(params, spec.server.draft_model).items():
            _put(flags, flag, setting)
        _put(flags, "speculative-adaptive", params.get("speculative_adaptive"))
        if params.get("speculative_adaptive"):
            _put(flags, "speculative-adaptive-config", params.get("speculative_adaptive_config"))
        _put(flags, "speculative-attention-mode", params.get("speculative_attention_mode"))
    if params.get("all_reduce_path") == "nccl":  # deprecated spelling: only custom all-reduce off
        flags["--disable-custom-all-reduce"] = True
    backend_flags, _ = allreduce.backend_flags(_backend(params))
    flags.update(backend_flags)
    if params.get("cuda_graph") is False:
        flag, *value = names.disable_cuda_graph
        flags[flag] = value[0] if value else True
    _put(flags, names.cuda_graph_max_bs, params.get("cuda_graph_max_bs"))
    _put(flags, "max-running-requests", params.get("max_running_requests"))
    return flags


def fixed_flags(spec: SweepSpec) -> Flags:
    """The experiment's server.flags, plus --enable-metrics (/metrics is a measurement source)."""
    flags: Flags = {}
    for name, value in spec.server.flags.items():
        _put(flags, name, value)
    flags.setdefault("--enable-metrics", True)
    if spec.server.device == "cpu":
        flags["--device"] = "cpu"  # server.device: SGLang's CPU engine
    return flags


def launch_flags(spec: SweepSpec, params: Mapping[str, ParamValue], *, port: int) -> Flags:
    """Every SGLang flag of one launch: model, parallelism and address, the fixed flags, the tuned ones."""
    return {
        "--model-path": spec.server.model,
        "--tp-size": str(spec.server.tp),
        "--host": spec.server.host,
        "--port": str(port),
        **fixed_flags(spec),
        **tuned_flags(spec, params),
    }


def serving_args(spec: SweepSpec, params: Mapping[str, ParamValue]) -> list[str]:
    """The flags a deployment passes beyond model path, host and port: --tp-size, fixed, tuned."""
    return flag_args({"--tp-size": str(spec.server.tp), **fixed_flags(spec), **tuned_flags(spec, params)})


def _backend(params: Mapping[str, ParamValue]) -> str | None:
    value = params.get("all_reduce_backend")
    return None if value is None else str(value)


def env_knobs(params: Mapping[str, ParamValue]) -> Iterable[str]:
    """The environment-variable knobs this point sets (not None)."""
    return (n for n, v in params.items() if v is not None and n in knobs.KNOBS and knobs.KNOBS[n].target == "env")


def tuned_env(spec: SweepSpec, params: Mapping[str, ParamValue]) -> dict[str, str]:
    """The experiment's fixed environment plus the trial's environment knobs (None = not set)."""
    env = {name: str(value) for name, value in spec.server.env.items()}
    env.update({name: str(params[name]) for name in env_knobs(params)})
    env.update(allreduce.backend_flags(_backend(params))[1])  # pcie_ipc: SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1
    return env
