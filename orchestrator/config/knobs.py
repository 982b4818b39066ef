"""The typed catalogue of every tunable: NCCL variables, SGLang environment variables, SGLang flags.

One table, validated against once at the edge (spec.py), read by the planner (plan.py) and the
space (space.py). A knob is either an environment variable (`target="env"`) or a SGLang server
setting that becomes flags (`target="flag"`); which flag spelling depends on the SGLang version
(`FLAG_NAMES`), because 0.5.20 renamed some (reference INTERFACE.md section 1.3).

Values: None always means "not set" (the variable or flag is left out, the engine's default runs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from orchestrator import redact
from orchestrator.config import adaptive, speculation

Value = str | int | float | bool | None


@dataclass(frozen=True)
class Knob:
    name: str
    target: Literal["env", "flag"]
    kind: Literal["enum", "int", "power_of_two", "bool", "adaptive_config", "path"]
    doc: str
    choices: tuple[Value, ...] = ()
    low: int | None = None
    high: int | None = None

    def check(self, value: Value) -> str | None:
        """Why `value` is not allowed for this knob, or None when it is."""
        if value is None:
            return None
        return _CHECKS[self.kind](self, value)


def _check_enum(knob: Knob, value: Value) -> str | None:
    # Environment values are strings in the end: NCCL_NTHREADS: 512 and "512" are one value.
    if value in knob.choices or knob.target == "env" and str(value) in {str(c) for c in knob.choices}:
        return None
    return f"must be one of {{{', '.join(str(c) for c in knob.choices)}}}, but got {value!r}"


def _check_bool(knob: Knob, value: Value) -> str | None:
    return None if isinstance(value, bool) else f"must be true or false, but got {value!r}"


def _check_adaptive_config(knob: Knob, value: Value) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return f"must be the path of an adaptive config JSON file, but got {value!r}"
    try:
        adaptive.load(value)
    except ValueError as exc:
        return f"{exc} (SGLang 0.5.23 adaptive_spec_params.py _load_adaptive_config)"
    return None


def _check_path(knob: Knob, value: Value) -> str | None:
    if not isinstance(value, str) or not value.strip() or value.startswith("-"):
        return f"must be a path (a directory on the GPU hosts, or a Hugging Face repo id), but got {value!r}"
    return None


def _check_int(knob: Knob, value: Value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be an integer, but got {value!r}"
    if knob.kind == "power_of_two" and (value <= 0 or value & (value - 1)):
        near = f" (nearest: {1 << (value.bit_length() - 1)}, {1 << value.bit_length()})" if value > 0 else ""
        return f"must be a positive power of two, but got {value}{near}"
    if knob.low is not None and value < knob.low or knob.high is not None and value > knob.high:
        return f"must be in [{knob.low}, {knob.high}], but got {value}"
    return None


_CHECKS = {
    "enum": _check_enum,
    "bool": _check_bool,
    "adaptive_config": _check_adaptive_config,
    "path": _check_path,
    "int": _check_int,
    "power_of_two": _check_int,
}


def _env_enum(name: str, choices: tuple[str, ...], doc: str) -> Knob:
    return Knob(name, "env", "enum", doc, choices=choices)


def _env_int(name: str, low: int, high: int, doc: str) -> Knob:
    return Knob(name, "env", "int", doc, low=low, high=high)


_KNOBS: tuple[Knob, ...] = (
    # NCCL: what the field report tuned, plus neighbours that matter for small all-reduces.
    _env_enum("NCCL_PROTO", ("LL", "LL128", "Simple"), "NCCL protocol; LL wins for small messages"),
    _env_enum(
        "NCCL_ALGO",
        ("Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT"),
        "NCCL all-reduce algorithm",
    ),
    _env_int(
        "NCCL_MAX_CTAS",
        1,
        64,
        "upper bound on the CTAs (channels, i.e. SMs) an NCCL collective uses; "
        "NCCL 2.28+'s name for NCCL_MAX_NCHANNELS",
    ),
    _env_int("NCCL_MIN_CTAS", 1, 64, "lower bound on NCCL's CTAs (channels); NCCL 2.28+'s name for NCCL_MIN_NCHANNELS"),
    _env_int(
        "NCCL_CTA_POLICY", 0, 2, "NCCL's CTA policy (ncclConfig_t.CTAPolicy): 0 default, 1 efficiency, 2 zero-CTA"
    ),
    _env_int(
        "NCCL_MAX_NCHANNELS", 1, 64, "deprecated since NCCL 2.28 (use NCCL_MAX_CTAS): upper bound on NCCL channels"
    ),
    _env_int(
        "NCCL_MIN_NCHANNELS", 1, 64, "deprecated since NCCL 2.28 (use NCCL_MIN_CTAS): lower bound on NCCL channels"
    ),
    Knob(
        "NCCL_BUFFSIZE",
        "env",
        "power_of_two",
        "NCCL per-channel buffer in bytes, default 4 MiB",
        low=1 << 12,
        high=1 << 30,
    ),
    Knob("NCCL_NTHREADS", "env", "enum", "threads per NCCL block", choices=(64, 128, 256, 512)),
    _env_enum(
        "NCCL_P2P_LEVEL",
        ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS"),
        "farthest topology distance at which NCCL uses peer-to-peer",
    ),
    _env_enum("NCCL_P2P_DISABLE", ("0", "1"), "1 disables peer-to-peer transport"),
    _env_enum("NCCL_SHM_DISABLE", ("0", "1"), "1 disables shared-memory transport"),
    _env_enum("NCCL_IB_DISABLE", ("0", "1"), "1 disables InfiniBand"),
    _env_enum("NCCL_CUMEM_ENABLE", ("0", "1"), "cuMem allocations; SGLang may set it itself"),
    _env_enum("NCCL_NVLS_ENABLE", ("0", "1"), "NVLink SHARP; SGLang's --enable-symm-mem forces 1"),
    _env_enum("NCCL_GRAPH_REGISTER", ("0", "1"), "buffer registration in CUDA graphs; SGLang sets 0"),
    _env_enum("NCCL_DEBUG", ("VERSION", "WARN", "INFO", "TRACE"), "NCCL logging; INFO proves what ran"),
    Knob(
        "NCCL_DEBUG_SUBSYS",
        "env",
        "enum",
        "NCCL log subsystems",
        choices=("INIT", "ENV", "TUNING", "INIT,ENV", "INIT,ENV,TUNING", "ALL"),
    ),
    # SGLang environment variables we know the meaning of.
    _env_enum(
        "SGLANG_ENABLE_METRICS_DEVICE_TIMER",
        ("0", "1"),
        "feeds sglang:forward_execution_seconds_total, the direct verify-latency source",
    ),
    _env_enum("SGLANG_RECORD_STEP_TIME", ("0", "1"), "adds step_time_dict to /server_info"),
    _env_enum("SGLANG_LOG_MS", ("0", "1"), "milliseconds in SGLang's log timestamps"),
    _env_enum("SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2", ("0", "1"), "custom all-reduce v2 (default 1)"),
    _env_int("SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB", 0, 1 << 20, "custom all-reduce workspace cap"),
    _env_int("SGLANG_FORCE_CUSTOM_ALL_REDUCE_V2_PULL_SIZE_KB", 0, 1 << 20, "force the 1-shot pull threshold"),
    _env_int("SGLANG_FORCE_CUSTOM_ALL_REDUCE_V2_PUSH_SIZE_KB", 0, 1 << 20, "force the 1-shot push threshold"),
    _env_int("SGLANG_HEALTH_CHECK_TIMEOUT", 1, 3600, "seconds /health waits for a generation"),
    _env_enum(
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE",
        ("0", "1"),
        "1: FlashInfer's PCIe-IPC all-reduce for decode-sized TP reductions (0.5.23 pcie_ipc_ar.py)",
    ),
    _env_int("SGLANG_PCIE_IPC_MAX_NUMEL", 0, 1 << 31, "PCIe-IPC workspace in elements; 0: decode-sized (0.5.23)"),
    # SGLang server settings (flags).
    Knob(
        "speculative_algorithm",
        "flag",
        "enum",
        "speculative decoding algorithm (config/speculation.py: each one's draft model, rules and knobs); "
        "None = no speculation",
        choices=tuple(speculation.ALGORITHMS),
    ),
    Knob(
        "speculative_draft_model_path",
        "flag",
        "path",
        "--speculative-draft-model-path for this trial, overriding server.draft_model: give each algorithm its "
        "drafter with `when: {speculative_algorithm: DFLASH}` (an EAGLE-3 drafter cannot serve DFLASH); "
        "never read by NGRAM",
    ),
    Knob(
        "speculative_dflash_block_size",
        "flag",
        "int",
        "DFLASH only: the block (verify window) a drafter proposes in one pass, draft tokens = block; unset: "
        "the drafter's config (0.5.23 _handle_dflash, 16 when it names none)",
        low=2,
        high=64,
    ),
    Knob(
        "speculative_ngram_min_bfs_breadth",
        "flag",
        "int",
        "NGRAM only: least BFS breadth (0.5.23 default 1)",
        low=1,
        high=64,
    ),
    Knob(
        "speculative_ngram_max_bfs_breadth",
        "flag",
        "int",
        "NGRAM only: most BFS breadth, which SGLang also takes as top-k (0.5.23 default 10)",
        low=1,
        high=64,
    ),
    Knob(
        "speculative_ngram_match_type",
        "flag",
        "enum",
        "NGRAM only: how the cache trie is matched (0.5.23 default BFS)",
        choices=("BFS", "PROB"),
    ),
    Knob(
        "speculative_ngram_max_trie_depth",
        "flag",
        "int",
        "NGRAM only: longest n-gram the trie keeps (0.5.23 default 18)",
        low=1,
        high=64,
    ),
    Knob(
        "speculative_ngram_capacity",
        "flag",
        "int",
        "NGRAM only: trie cache capacity in nodes (0.5.23 default 10,000,000)",
        low=1000,
        high=1_000_000_000,
    ),
    Knob(
        "speculative_num_steps",
        "flag",
        "int",
        "draft steps per cycle (0 only as the initial steps of speculative_adaptive, whose slots may stop drafting)",
        low=0,
        high=16,
    ),
    Knob("speculative_eagle_topk", "flag", "int", "branching factor of the draft tree", low=1, high=16),
    Knob("speculative_num_draft_tokens", "flag", "int", "tokens verified per cycle", low=2, high=128),
    Knob(
        "speculative_adaptive",
        "flag",
        "bool",
        "true: SGLang adapts the draft steps at run time, one EMA of the acceptance length per batch-size "
        "slot (0.5.23 default {1: [1,3,5,7], 8: [0,1,3], 32: [0,1], 64: [0]}; 0 = no drafting), starting at "
        "speculative_num_steps (one of the slots' union 0, 1, 3, 5, 7; unset: 3), as a chain (top-k 1); "
        "false = not set",
    ),
    Knob(
        "speculative_adaptive_config",
        "flag",
        "adaptive_config",
        "--speculative-adaptive-config: the path of a JSON file of batch-size slots "
        '({"1": {"candidate_steps": [1,3,7]}, ...}), checked at load as 0.5.23 checks it; '
        "speculative_num_steps must then be in its slots' union; unset = 0.5.23's default slots",
    ),
    Knob(
        "speculative_attention_mode",
        "flag",
        "enum",
        "attention backend for verify/draft-extend",
        choices=("prefill", "decode"),
    ),
    Knob(
        "all_reduce_backend",
        "flag",
        "enum",
        "which backend carries decode/verify all-reduces (SGLang 0.5.23, trial/allreduce.py): auto = SGLang's "
        "own choice; nccl = every other backend off; custom, flashinfer_fusion, pcie_ipc, torch_symm_mem, "
        "mscclpp = that backend on and those 0.5.23 tries before it off",
        choices=("auto", "nccl", "custom", "flashinfer_fusion", "pcie_ipc", "torch_symm_mem", "mscclpp"),
    ),
    Knob(
        "all_reduce_path",
        "flag",
        "enum",
        "deprecated, use all_reduce_backend: custom = auto (SGLang's default), nccl = "
        "--disable-custom-all-reduce only (FlashInfer fusion, where 0.5.23 auto-enables it, stays on)",
        choices=("custom", "nccl"),
    ),
    Knob("cuda_graph", "flag", "bool", "false runs decode eagerly (no CUDA graph)"),
    Knob("cuda_graph_max_bs", "flag", "int", "largest decode batch captured in a CUDA graph", low=1, high=1024),
    Knob("max_running_requests", "flag", "int", "scheduler concurrency cap", low=1, high=4096),
)

KNOBS: Mapping[str, Knob] = {k.name: k for k in _KNOBS}

# Environment variables an experiment may set that are not tunables but are harmless and useful; the NCCL
# tuner plugin's library and rule file (sweep export --format nccl-tuner) are paths, proven by NCCL's
# TUNER/Plugin lines on every rank (trial.observe.check_env_applied).
# SGLang's own settings a user needs to run a server at all on some hosts (read by SGLang 0.5.23 in
# sglang/srt/environ.py and sglang/srt/utils/common.py): the CPU engine and its thread binding, the
# PCIe-IPC all-reduce of PCIe hosts and its size cap, and the NCCL library SGLang loads.
SGLANG_SETTINGS_ENV = frozenset(
    {
        "SGLANG_USE_CPU_ENGINE",
        "SGLANG_CPU_OMP_THREADS_BIND",
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE",
        "SGLANG_PCIE_IPC_MAX_NUMEL",
        "SGLANG_NCCL_SO_PATH",
    }
)
PASSTHROUGH_ENV = (
    frozenset(
        {
            "HF_HUB_OFFLINE",
            "TRANSFORMERS_OFFLINE",
            "PYTHONUNBUFFERED",
            "OMP_NUM_THREADS",
            "NCCL_TUNER_PLUGIN",
            "NCCL_TUNER_CONFIG_FILE",
        }
    )
    | SGLANG_SETTINGS_ENV
)

# Variables an experiment must not set, with the reason (the value would not be what runs).
_SET_ELSEWHERE = {
    "CUDA_VISIBLE_DEVICES": "set per trial from the GPUs Ray assigns; a fixed value would put "
    "concurrent trials on the same GPUs",
    "CUDA_DEVICE_MAX_CONNECTIONS": "overwritten with 8 by SGLang itself, so a value here never reaches the server",
}

# The SGLang versions whose flag spelling we know; 0.5.23's --help dump ships in orchestrator/reference.
SGLANG_VERSIONS = ("0.5.9", "0.5.16", "0.5.23")
DEFAULT_SGLANG_VERSION = "0.5.23"


@dataclass(frozen=True)
class FlagNames:
    cuda_graph_max_bs: str
    disable_cuda_graph: tuple[str, ...]
    extra: dict[str, str] = field(default_factory=dict)


FLAG_NAMES: Mapping[str, FlagNames] = {
    "0.5.9": FlagNames("--cuda-graph-max-bs", ("--disable-cuda-graph",)),
    "0.5.16": FlagNames("--cuda-graph-max-bs-decode", ("--disable-cuda-graph",)),
    "0.5.23": FlagNames("--cuda-graph-max-bs-decode", ("--cuda-graph-backend-decode", "disabled")),
}

ADAPTIVE_VERSIONS = ("0.5.23",)
"""The SGLang versions known to have --speculative-adaptive (the 0.5.23 --help dump declares it)."""

ADAPTIVE_CANDIDATE_STEPS = adaptive.DEFAULT.candidate_steps
"""(0, 1, 3, 5, 7): the union of SGLang 0.5.23's default adaptive slots' candidate_steps
(adaptive_spec_params.py DEFAULT_ADAPTIVE_CONFIG, resolve_candidate_steps_from_config), the only values
--speculative-num-steps may take with --speculative-adaptive and no --speculative-adaptive-config."""
ADAPTIVE_INITIAL_STEPS = adaptive.DEFAULT.initial_steps
"""3: where 0.5.23 starts adaptive steps when --speculative-num-steps is unset (the union's middle)."""


DEPRECATED_KNOBS: Mapping[str, str] = {
    "NCCL_MAX_NCHANNELS": "NCCL_MAX_NCHANNELS is deprecated since NCCL 2.28 in favour of NCCL_MAX_CTAS (when both are "
    "set the more restrictive wins); it still works",
    "NCCL_MIN_NCHANNELS": "NCCL_MIN_NCHANNELS is deprecated since NCCL 2.28 in favour of NCCL_MIN_CTAS (when both are "
    "set the more restrictive wins); it still works",
    "all_reduce_path": "all_reduce_path is deprecated: use all_reduce_backend (custom -> auto, nccl -> nccl, which "
    "also turns off the FlashInfer fusion SGLang 0.5.23 auto-enables on SM90/SM100)",
}
"""Knobs still accepted under an old name, with the warning `sweep validate/plan` prints."""


def deprecation_warnings(names: Iterable[str]) -> list[str]:
    """The deprecation warning of every name in `names` that has one, in order, once each."""
    return [DEPRECATED_KNOBS[n] for n in dict.fromkeys(names) if n in DEPRECATED_KNOBS]


def env_rule(name: str) -> str | None:
    """Why an experiment may not set environment variable `name` (what is wrong and the fix), or None."""
    if name in KNOBS and KNOBS[name].target == "env" or name in PASSTHROUGH_ENV:
        return None
    if name in _SET_ELSEWHERE:
        return f"{_SET_ELSEWHERE[name]}; remove it"
    if redact.is_secret_name(name):
        return (
            "looks like a secret, and secrets are never written into experiments, plans or MLflow; "
            "remove it and export it in the shell that starts the sweep (the server inherits it)"
        )
    if name.startswith("NCCL_"):
        return "not an NCCL variable this tool knows; remove it, or add it to orchestrator/config/knobs.py"
    if name.startswith("SGLANG_"):
        return "not an SGLang variable this tool knows; remove it, or add it to orchestrator/config/knobs.py"
    return (
        f"not on the allow-list (the NCCL_* and SGLANG_* variables of orchestrator/config/knobs.py, "
        f"{', '.join(sorted(n for n in PASSTHROUGH_ENV if not n.startswith(('NCCL_', 'SGLANG_'))))}); remove it"
    )
