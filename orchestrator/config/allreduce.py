"""Which all-reduce backend carries each tensor-parallel message class, as SGLang 0.5.23 decides it, and
what the all_reduce_backend knob renders to. Pure: a model, a host description, tp, flags and environment
in, a CommPath out (trial/allreduce.py reads SGLang's log lines against it; eagle.py's rules refuse a
backend the host cannot take).

SGLang 0.5.23's order, read from its code (never run on a GPU here):

- `arg_groups/overrides.py` `_flashinfer_allreduce_fusion_auto_enable`: for the architectures of
  `_FLASHINFER_ALLREDUCE_FUSION_ARCHS` (KimiK25ForConditionalGeneration, DeepseekV3ForCausalLM, ...) on
  SM90/SM100, TP > 1, no attention DP, one node (or SM100), `--moe-a2a-backend none`, it sets
  `flashinfer_allreduce_fusion_backend=auto` and logs `Auto-enabling FlashInfer AllReduce Fusion (auto)
  for <arch>`; `_enforce_disable_allreduce_fusion` (`--enforce-disable-flashinfer-allreduce-fusion`)
  wins over it, `--disable-custom-all-reduce` does not touch it.
- `layers/layer_boundary/residual/add_norm.py` `flashinfer_ar_fusion_applies`: the fused all-reduce +
  RMSNorm carries the layers' reductions of up to `FUSE_ALLREDUCE_MAX_BATCH_SIZE` (2048) tokens, before
  `GroupCoordinator.all_reduce` is reached at all.
- `distributed/parallel_state.py` `GroupCoordinator.all_reduce` and `_resolve_outplace_all_reduce_method`
  for the rest: MSCCL++ (`--enable-mscclpp`), custom all-reduce (V2 up to
  `SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB`, 16 MiB; full NVLink, or 2 GPUs), NCCL symmetric memory
  (`--enable-symm-mem`), FlashInfer all-reduce (the fusion's workspace), PCIe-IPC
  (`SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1`, `device_communicators/pcie_ipc_ar.py`, up to a decode-sized
  workspace), quick all-reduce (ROCm only), torch symmetric memory (`--enable-torch-symm-mem`,
  `device_communicators/torch_symm_mem.py`), and NCCL for what none of them takes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator.config.allreduce_facts import (  # noqa: F401 - the resolution's facts, reachable here
    BACKEND_CHOICES,
    CUSTOM_AR_WORLD_SIZES,
    CUSTOM_V2_MAX_BYTES,
    DEFAULT_CHUNKED_PREFILL,
    FUSE_ALLREDUCE_MAX_BATCH_SIZE,
    FUSION_ARCHS,
    MSCCLPP_WORLD_SIZES,
    PCIE_IPC_FALLBACK_ROWS,
    PCIE_IPC_WORLD_SIZES,
    SPECULATIVE_MAX_RUNNING_REQUESTS,
    TORCH_SYMM_MEM_MAX_BYTES,
    Backend,
    Band,
    CommPath,
    Host,
    ModelFacts,
    Refusal,
    flag_on,
    normalize_flags,
)

_flags = normalize_flags
_on = flag_on


def _env_on(env: Mapping[str, Any], name: str) -> bool:
    return str(env.get(name, "")).strip().lower() in ("1", "true", "yes", "on")


def _env_int(env: Mapping[str, Any], name: str, default: int) -> int:
    try:
        return int(str(env[name]).strip()) if str(env.get(name, "")).strip() else default
    except ValueError:
        return default


def _custom(host: Host, tp: int, flags: Mapping[str, Any], env: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether custom all-reduce is built, else SGLang's warning (custom_all_reduce_utils.py
    `can_use_custom_all_reduce_with_nvlink`, custom_all_reduce.py `dispatch_custom_allreduce`)."""
    if _on(flags, "disable_custom_all_reduce"):
        return False, "--disable-custom-all-reduce"
    if _on(flags, "enable_deterministic_inference") or _env_on(env, "SGLANG_ENABLE_DETERMINISTIC_INFERENCE"):
        return False, "deterministic inference disables custom all-reduce"
    if host.nodes > 1:
        return False, "CustomAllreduce is disabled because this process group spans across nodes."
    if tp not in CUSTOM_AR_WORLD_SIZES:
        return False, (
            f"CustomAllreduce is disabled due to an unsupported world size: {tp}. Supported world sizes: "
            f"{list(CUSTOM_AR_WORLD_SIZES)}. To silence this warning, specify disable_custom_all_reduce=True "
            f"explicitly."
        )
    if tp > 2 and host.interconnect != "nvlink":
        return False, (
            "Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs. "
            "To silence this warning, specify disable_custom_all_reduce=True explicitly."
        )
    return True, ""


def _fusion(model: ModelFacts, host: Host, tp: int, flags: Mapping[str, Any]) -> tuple[bool, str, list[str]]:
    """(on, why not, SGLang's lines): overrides.py `_flashinfer_allreduce_fusion_auto_enable` then
    `_enforce_disable_allreduce_fusion`; add_norm.py `flashinfer_ar_fusion_applies` needs SM90 or SM100."""
    lines: list[str] = []
    explicit = flags.get("flashinfer_allreduce_fusion_backend") or (
        "auto" if _on(flags, "enable_flashinfer_allreduce_fusion") else None
    )
    sm_ok = host.sm in (9, 10)
    single = host.nodes == 1 or host.sm == 10
    attn_dp = _on(flags, "enable_dp_attention")
    a2a = str(flags.get("moe_a2a_backend") or "none") != "none"
    on = explicit is not None
    auto = model.arch in FUSION_ARCHS and sm_ok and tp > 1 and not attn_dp and single and not a2a
    if not on and auto:
        on = True
        lines.append(f"Auto-enabling FlashInfer AllReduce Fusion (auto) for {model.arch}")
    if _on(flags, "enforce_disable_flashinfer_allreduce_fusion"):
        if on:
            lines.append(
                "FlashInfer allreduce fusion is forcibly disabled via --enforce-disable-flashinfer-allreduce-fusion."
            )
        return False, "--enforce-disable-flashinfer-allreduce-fusion", lines
    if not on:
        return False, _not_auto(model, sm_ok, tp, attn_dp, single), lines
    why = _never_applies(host, sm_ok, attn_dp)
    return not why, why, lines


def _never_applies(host: Host, sm_ok: bool, attn_dp: bool) -> str:
    """Why the fusion, on, never carries a reduction (add_norm.py `flashinfer_ar_fusion_applies`), or ""."""
    if not sm_ok:
        sm = f"SM{host.sm}x" if host.sm is not None else "an unknown compute capability"
        return (
            f"--flashinfer-allreduce-fusion-backend requires SM90 or SM10X NVIDIA GPUs, this host is {sm} "
            f"(flashinfer_ar_fusion_applies never applies)"
        )
    if attn_dp:
        return "FlashInfer all-reduce fusion does not apply with attention DP (flashinfer_ar_fusion_applies)"
    return ""


def _not_auto(model: ModelFacts, sm_ok: bool, tp: int, attn_dp: bool, single: bool) -> str:
    """Why 0.5.23 did not auto-enable the fusion (`_flashinfer_allreduce_fusion_auto_enable`'s conditions)."""
    if model.arch not in FUSION_ARCHS:
        return f"{model.arch} is not among 0.5.23's fusion architectures"
    if not sm_ok:
        return "it needs SM90 or SM100 GPUs"
    if tp <= 1:
        return "TP 1"
    if attn_dp:
        return "attention DP is on"
    return "multi-node needs SM100" if not single else "--moe-a2a-backend is not none"


def _decode_rows(flags: Mapping[str, Any], host: Host, draft_tokens: int) -> int:
    """pcie_ipc_ar.py `_decode_width` / base_runner.py `_widest_decode_rows`: the largest captured decode
    batch times the tokens per request; without CUDA graphs the fixed fallback width."""
    if str(flags.get("cuda_graph_backend_decode") or "") == "disabled" or _on(flags, "disable_cuda_graph"):
        return PCIE_IPC_FALLBACK_ROWS
    max_bs = flags.get("cuda_graph_max_bs_decode") or flags.get("cuda_graph_max_bs") or host.default_cuda_graph_max_bs
    running = flags.get("max_running_requests") or (SPECULATIVE_MAX_RUNNING_REQUESTS if draft_tokens > 1 else None)
    bs = min(int(max_bs), int(running)) if running else int(max_bs)
    return bs * max(1, draft_tokens)


def _pcie_ipc(
    model: ModelFacts,
    host: Host,
    tp: int,
    f: Mapping[str, Any],
    env: Mapping[str, Any],
    draft_tokens: int,
    bands: list[Band],
    refusals: list[Refusal],
    lines: list[str],
) -> None:
    """pcie_ipc_ar.py `eligible_group`, `PcieIpcCommunicator.__init__` and `_ensure_workspace`."""
    deterministic = _on(f, "enable_deterministic_inference") or _env_on(env, "SGLANG_ENABLE_DETERMINISTIC_INFERENCE")
    if deterministic:
        refusals.append(
            Refusal(
                Backend.pcie_ipc,
                (
                    "Deterministic inference is on; leaving PCIe-IPC all-reduce off. Its kernels pick a tactic per "
                    "shape, so the reduction order would follow the batch shape."
                ),
            )
        )
    elif tp not in PCIE_IPC_WORLD_SIZES:
        refusals.append(
            Refusal(
                Backend.pcie_ipc,
                (
                    f"FlashInfer PCIe-IPC all-reduce skipped: unsupported world size {tp} "
                    f"(pcie_ipc_ar.py supports {', '.join(map(str, PCIE_IPC_WORLD_SIZES))})"
                ),
            )
        )
    elif not host.flashinfer_pcie_ipc:
        refusals.append(
            Refusal(
                Backend.pcie_ipc,
                (
                    "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is set but this FlashInfer build has no pcie_ipc_comm; "
                    "falling back to NCCL all-reduce."
                ),
                at_launch=False,
            )
        )
    else:
        override = _env_int(env, "SGLANG_PCIE_IPC_MAX_NUMEL", 0)
        rows = override // model.hidden_size if override else _decode_rows(f, host, draft_tokens)
        bands.append(
            Band(
                Backend.pcie_ipc,
                rows,
                "SGLANG_PCIE_IPC_MAX_NUMEL"
                if override
                else "the decode-sized workspace (largest captured batch x draft tokens)",
            )
        )
        lines += [
            f"FlashInfer PCIe-IPC all-reduce enabled (world={tp}, workspace sized on first reduction)",
            f"FlashInfer PCIe-IPC workspace built (world={tp}, max_numel={rows * model.hidden_size}, "
            f"hidden={model.hidden_size})",
        ]


def _torch_symm_mem(model: ModelFacts, host: Host, tp: int, bands: list[Band], refusals: list[Refusal]) -> None:
    """torch_symm_mem.py `TorchSymmMemCommunicator.__init__`."""
    sizes = TORCH_SYMM_MEM_MAX_BYTES.get(host.sm or 0)
    if sizes is None:
        refusals.append(
            Refusal(
                Backend.torch_symm_mem,
                (
                    f"TorchSymmMemCommunicator: Device capability {host.sm} not supported, communicator is not "
                    f"available."
                ),
            )
        )
    elif tp not in sizes:
        refusals.append(
            Refusal(
                Backend.torch_symm_mem,
                (f"TorchSymmMemCommunicator: World size {tp} not supported, communicator is not available."),
            )
        )
    elif not host.nvlink_multicast:
        refusals.append(
            Refusal(
                Backend.torch_symm_mem,
                ("TorchSymmMemCommunicator: torch symmetric memory multicast operations are not supported."),
                at_launch=False,
            )
        )
    else:
        bands.append(
            Band(
                Backend.torch_symm_mem,
                (sizes[tp] - 1) // model.token_bytes,
                f"TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES ({sizes[tp] >> 20} MiB)",
            )
        )


def resolve_path(
    model: ModelFacts, host: Host, tp: int, flags: Mapping[str, Any], env: Mapping[str, Any], *, draft_tokens: int = 1
) -> CommPath:
    """The communication path SGLang 0.5.23 takes for one launch (`flags` in any spelling, `env` the
    server's environment; `draft_tokens` the verify width per request, 1 without speculation)."""
    f = _flags(flags)
    if tp <= 1:
        return CommPath(tp=tp, bands=())
    bands: list[Band] = []
    refusals: list[Refusal] = []
    lines: list[str] = []
    token = model.token_bytes
    fusion, fusion_why, fusion_lines = _fusion(model, host, tp, f)
    lines += fusion_lines
    if fusion:
        bands.append(
            Band(
                Backend.flashinfer_fusion, FUSE_ALLREDUCE_MAX_BATCH_SIZE, "FUSE_ALLREDUCE_MAX_BATCH_SIZE (2048 tokens)"
            )
        )
        lines.append(
            f"FlashInfer AllReduce Fusion enabled and workspace initialized: "
            f"backend={'mnnvl' if host.sm == 10 else 'trtllm'}, rank=0, world_size={tp}, "
            f"max_token_num={FUSE_ALLREDUCE_MAX_BATCH_SIZE}, hidden_dim={model.hidden_size}"
        )
    elif f.get("flashinfer_allreduce_fusion_backend") or _on(f, "enable_flashinfer_allreduce_fusion"):
        refusals.append(Refusal(Backend.flashinfer_fusion, fusion_why))
    if _on(f, "enable_mscclpp"):
        if tp in MSCCLPP_WORLD_SIZES:
            bands.append(Band(Backend.mscclpp, (4 << 30) // token, "MSCCL++'s tuned configs (up to 4 GiB)"))
        else:
            refusals.append(
                Refusal(
                    Backend.mscclpp,
                    (
                        f"PyMscclpp is disabled due to an unsupported world size: {tp}. Supported world sizes: "
                        f"{list(MSCCLPP_WORLD_SIZES)}. To silence this warning, specify disable_mscclpp=True explicitly."
                    ),
                )
            )
    custom, custom_why = _custom(host, tp, f, env)
    if custom:
        cap = _env_int(env, "SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB", CUSTOM_V2_MAX_BYTES // 1024) * 1024
        bands.append(Band(Backend.custom, cap // token, f"the custom all-reduce workspace ({cap >> 20} MiB)"))
    elif custom_why.startswith("Custom") or custom_why.startswith("CustomAllreduce"):
        lines.append(custom_why)
    if _env_on(env, "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"):
        _pcie_ipc(model, host, tp, f, env, draft_tokens, bands, refusals, lines)
    if _on(f, "enable_torch_symm_mem"):
        _torch_symm_mem(model, host, tp, bands, refusals)
    bands.append(Band(Backend.nccl, None, "everything the others leave"))
    return CommPath(
        tp=tp,
        bands=tuple(bands),
        refusals=tuple(refusals),
        log_lines=tuple(lines),
        enabled=frozenset(b.backend for b in bands),
    )


def backend_flags(backend: str | None) -> tuple[dict[str, str | bool], dict[str, str]]:
    """(flags, env) that put `backend` on the decode/verify path in SGLang 0.5.23 (all_reduce_backend knob).

    Each backend but auto switches off what 0.5.23 tries before it (the fusion, custom all-reduce), so the
    asked-for one carries the messages it can take: nccl turns every other backend off.
    """
    fusion_off = {"--enforce-disable-flashinfer-allreduce-fusion": True}
    custom_off = {"--disable-custom-all-reduce": True}
    table: dict[str, tuple[dict[str, str | bool], dict[str, str]]] = {
        "auto": ({}, {}),
        "nccl": ({**custom_off, **fusion_off}, {}),
        "custom": (dict(fusion_off), {}),
        "flashinfer_fusion": ({"--flashinfer-allreduce-fusion-backend": "auto"}, {}),
        "pcie_ipc": ({**custom_off, **fusion_off}, {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}),
        "torch_symm_mem": ({"--enable-torch-symm-mem": True, **custom_off, **fusion_off}, {}),
        "mscclpp": ({"--enable-mscclpp": True, **fusion_off}, {}),
    }
    flags, env = table.get(backend or "auto", ({}, {}))
    return dict(flags), dict(env)


def backend_refusal(
    backend: str | None,
    model: ModelFacts | None,
    host: Host | None,
    tp: int,
    flags: Mapping[str, Any],
    env: Mapping[str, Any],
) -> Refusal | None:
    """Why SGLang 0.5.23 would not carry decode messages on `backend` on this host (known before launch),
    or None. Without a model or host description nothing can be said (None)."""
    if backend in (None, "auto", "nccl") or model is None or host is None:
        return None
    want = Backend(backend)
    if tp <= 1:
        return Refusal(want, "TP 1 has no all-reduce")
    path = resolve_path(model, host, tp, flags, env)
    for refusal in path.refusals:
        if refusal.backend is want and refusal.at_launch:
            return refusal
    if want is Backend.custom and want not in path.enabled:
        return Refusal(want, _custom(host, tp, _flags(flags), env)[1])
    if want is Backend.mscclpp and host.interconnect != "nvlink":
        return Refusal(want, "this tool models MSCCL++ on NVLink hosts only (no measurement on PCIe)")
    return None


MessageClassName = Literal["decode", "verify", "prefill"]


@dataclass(frozen=True)
class Carried:
    """Which backend carries one message class, over the token counts it takes in the sweep."""

    message: MessageClassName
    tokens: tuple[int, int]
    """(fewest, most) rows of one all-reduce of this class."""
    backends: tuple[tuple[Backend, int, int], ...]
    """(backend, from tokens, to tokens), in order of size."""

    def describe(self, token_bytes: int) -> str:
        def kib(t: int) -> str:
            b = t * token_bytes
            return f"{b / (1 << 20):.1f} MiB" if b >= 1 << 20 else f"{b / 1024:.0f} KiB"

        parts = [
            f"{b.value} ({lo}-{hi} tokens, {kib(lo)}-{kib(hi)})" if lo != hi else f"{b.value} ({lo} tokens, {kib(lo)})"
            for b, lo, hi in self.backends
        ]
        return f"{self.message}: " + ", ".join(parts)


def carried(path: CommPath, message: MessageClassName, lo: int, hi: int) -> Carried:
    """The backends that carry `message` all-reduces of `lo`..`hi` rows on `path`."""
    spans: list[tuple[Backend, int, int]] = []
    t = lo
    while t <= hi:
        backend = path.carrier(t)
        end = t
        for band in path.bands:
            if band.backend is backend:
                end = hi if band.max_tokens is None else min(hi, band.max_tokens)
                break
        spans.append((backend, t, end))
        t = end + 1
    return Carried(message, (lo, hi), tuple(spans))


OBJECTIVE_CLASSES: Mapping[str, tuple[MessageClassName, ...]] = {
    "decode_tok_s": ("decode", "verify"),
    "tpot_ms_p50": ("decode", "verify"),
    "itl_ms_p50": ("decode", "verify"),
    "itl_ms_p99": ("decode", "verify"),
    "verify_ms": ("verify",),
    "cycle_ms": ("decode", "verify"),
    "accept_length": (),
    "accept_rate": (),
    "ttft_ms_p50": ("prefill",),
    "ttft_ms_p99": ("prefill",),
    "output_tok_s": ("decode", "verify", "prefill"),
}
"""The message classes each metric depends on (the draft's collectives ride with decode/verify)."""


def nccl_matters(classes: Iterable[Carried], depends_on: Iterable[str]) -> bool:
    """Whether NCCL carries some message of a class the objective (and its constraints) depend on."""
    wanted = set(depends_on)
    return any(c.message in wanted and any(b is Backend.nccl for b, _, _ in c.backends) for c in classes)


@dataclass(frozen=True)
class CommContext:
    """Everything but the trial's own knobs that the path depends on: the model, the host, tp and the
    experiment's fixed flags and environment (what `sweep plan` and the rules before launch know)."""

    model: ModelFacts
    host: Host
    tp: int
    flags: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, Any] = field(default_factory=dict)

    def path(self, params: Mapping[str, Any], *, draft_tokens: int = 1) -> CommPath:
        """The path of one point: the fixed flags and env plus what its all_reduce_backend renders to."""
        backend = params.get("all_reduce_backend")
        flags, env = backend_flags(None if backend is None else str(backend))
        if params.get("all_reduce_path") == "nccl":
            flags["--disable-custom-all-reduce"] = True
        for name, value in params.items():
            if name.startswith("SGLANG_") and value is not None:
                env[name] = str(value)
        return resolve_path(
            self.model, self.host, self.tp, {**self.flags, **flags}, {**self.env, **env}, draft_tokens=draft_tokens
        )

    def refusal(self, params: Mapping[str, Any]) -> Refusal | None:
        """Why SGLang 0.5.23 would not run the point's all_reduce_backend here (known before launch)."""
        backend = params.get("all_reduce_backend")
        if backend is None:
            return None
        flags, env = backend_flags(str(backend))
        return backend_refusal(
            str(backend), self.model, self.host, self.tp, {**self.flags, **flags}, {**self.env, **env}
        )
