"""The facts SGLang 0.5.23's all-reduce resolution works on (allreduce.py resolves with them): the backends,
a host and a model as the resolution sees them, 0.5.23's limits and world sizes, the bands of a message class
and the path they make, and flag spellings normalized."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal


def _flag_key(name: str) -> str:
    return name.lstrip("-").replace("-", "_").lower()


def normalize_flags(flags: Mapping[str, Any]) -> dict[str, Any]:
    """Flags in any spelling (`--tp-size`, `tp-size`, `tp_size`) keyed as `tp_size`."""
    return {_flag_key(k): v for k, v in flags.items()}


def flag_on(flags: Mapping[str, Any], name: str) -> bool:
    """Whether switch `name` (normalized) is on: True, or a true-ish string."""
    value = flags.get(name, False)
    if isinstance(value, str):
        return value.strip().lower() in ("", "1", "true", "yes", "on")
    return bool(value)


CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8)
"""0.5.23 custom all-reduce's supported world sizes."""

# ---------------------------------------------------------------------------------------------
# SGLang 0.5.23's resolution of the communication path


class Backend(str, enum.Enum):
    """An implementation that carries tensor-parallel all-reduces in SGLang 0.5.23."""

    nccl = "nccl"
    custom = "custom"
    flashinfer_fusion = "flashinfer_fusion"
    pcie_ipc = "pcie_ipc"
    torch_symm_mem = "torch_symm_mem"
    mscclpp = "mscclpp"


BACKEND_CHOICES = ("auto", *(b.value for b in Backend))
"""The values of the all_reduce_backend knob: auto is SGLang's own choice."""

FUSION_ARCHS = frozenset(
    {
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "DeepseekV4ForCausalLM",
        "GptOssForCausalLM",
        "GlmMoeDsaForCausalLM",
        "Glm4MoeForCausalLM",
        "Glm4MoeLiteForCausalLM",
        "MistralLarge3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "Qwen3VLMoeForConditionalGeneration",
        "Qwen3NextForCausalLM",
        "Qwen4ExpForConditionalGeneration",
        "KimiK25ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "InternS2PreviewForConditionalGeneration",
        "Qwen3_5ForConditionalGeneration",
        "NemotronHForCausalLM",
        "NemotronHPuzzleForCausalLM",
        "NemotronH_Omni_Reasoning_V3",
    }
)
"""0.5.23 `arg_groups/overrides.py` `_FLASHINFER_ALLREDUCE_FUSION_ARCHS` (MiMo's cutedsl case left out)."""

FUSE_ALLREDUCE_MAX_BATCH_SIZE = 2048
"""0.5.23 `layers/layer_boundary/residual/add_norm.py`: the largest batch (tokens) the fusion runs on."""
CUSTOM_V2_MAX_BYTES = 16 * 1024 * 1024
"""0.5.23 `environ.py` SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB default (16 * 1024 KiB)."""
PCIE_IPC_WORLD_SIZES = (2, 4, 8)
"""0.5.23 `pcie_ipc_ar.py` `_SUPPORTED_WORLD_SIZES`."""
PCIE_IPC_FALLBACK_ROWS = 64
"""0.5.23 `pcie_ipc_ar.py` `_FALLBACK_DECODE_WIDTH`: the workspace's rows without CUDA graphs."""
TORCH_SYMM_MEM_MAX_BYTES = {
    9: {2: 64 << 20, 4: 64 << 20, 6: 128 << 20, 8: 128 << 20},
    10: {2: 64 << 20, 4: 64 << 20, 6: 128 << 20, 8: 128 << 20},
}
"""0.5.23 `device_communicators/all_reduce_utils.py` TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES (cc major -> world size)."""
MSCCLPP_WORLD_SIZES = (4, 8, 16, 32, 64)
"""0.5.23 `device_communicators/pymscclpp.py` `_SUPPORTED_WORLD_SIZES`."""
SPECULATIVE_MAX_RUNNING_REQUESTS = 48
"""0.5.23 resets an unset --max-running-requests to 48 with speculative decoding; the captured decode
batches (and so PCIe-IPC's workspace) stop there."""
DEFAULT_CHUNKED_PREFILL = 8192
"""0.5.23 `arg_groups/memory_hook.py`: --chunked-prefill-size for 90-160 GiB GPUs (H200, RTX PRO 6000)."""


@dataclass(frozen=True)
class Host:
    """The facts of a host SGLang's choice depends on (an experiment's host description, a hardware
    profile, or the fingerprint of a real host)."""

    name: str
    gpu_name: str = ""
    compute_capability: tuple[int, int] | None = None
    """(major, minor): 9.0 H100/H200 (SM90), 10.0 B200 (SM100), 12.0 RTX PRO 6000 (SM120); None: unknown."""
    interconnect: Literal["nvlink", "pcie"] | None = None
    gpus: int = 8
    nodes: int = 1
    nvlink_multicast: bool = False
    """NVSwitch multicast (torch symmetric memory needs it; NVLS)."""
    flashinfer_pcie_ipc: bool = True
    """The FlashInfer build ships `pcie_ipc_comm` (0.5.23 falls back to NCCL with a warning when not)."""
    default_cuda_graph_max_bs: int = 160

    @property
    def sm(self) -> int | None:
        return None if self.compute_capability is None else self.compute_capability[0]

    def describe(self) -> str:
        cc = f", SM{self.compute_capability[0]}{self.compute_capability[1]}" if self.compute_capability else ""
        link = {"nvlink": "NVLink", "pcie": "PCIe"}.get(self.interconnect or "", "unknown interconnect")
        nodes = f", {self.nodes} nodes" if self.nodes > 1 else ""
        return f"{self.gpus}x {self.gpu_name or 'GPU'} ({link}{cc}{nodes})"


@dataclass(frozen=True)
class ModelFacts:
    """What of the model the path depends on: its architecture (config.json `architectures[0]`) and the
    width of one token's all-reduce."""

    arch: str
    hidden_size: int
    dtype_bytes: int = 2

    @property
    def token_bytes(self) -> int:
        return self.hidden_size * self.dtype_bytes


@dataclass(frozen=True)
class Band:
    """One backend in SGLang's order: it takes a message of up to `max_tokens` rows (None: any) that no
    backend before it took."""

    backend: Backend
    max_tokens: int | None
    why: str
    """Where the bound comes from, in SGLang's terms."""


@dataclass(frozen=True)
class Refusal:
    """A backend that was asked for and that SGLang 0.5.23 would not run, with its reason."""

    backend: Backend
    reason: str
    at_launch: bool = True
    """True: known before launch (infeasible, free); False: SGLang falls back at run time."""


@dataclass(frozen=True)
class CommPath:
    """The resolved communication path of one launch: which backend carries a message of t tokens."""

    tp: int
    bands: tuple[Band, ...]
    """The layer reductions' order (the fused all-reduce + RMSNorm first); NCCL last."""
    refusals: tuple[Refusal, ...] = ()
    log_lines: tuple[str, ...] = ()
    """What SGLang logs about it at start-up (its own sentences)."""
    enabled: frozenset[Backend] = field(default_factory=frozenset)

    def carrier(self, tokens: int) -> Backend:
        """The backend that carries a layer all-reduce of `tokens` rows."""
        for band in self.bands:
            if band.max_tokens is None or tokens <= band.max_tokens:
                return band.backend
        return Backend.nccl

    def nccl_from(self) -> int | None:
        """The fewest tokens NCCL carries (None: never, 1: always)."""
        limit = 0
        for band in self.bands:
            if band.backend is Backend.nccl:
                return limit + 1
            if band.max_tokens is None:
                return None
            limit = max(limit, band.max_tokens)
        return limit + 1
