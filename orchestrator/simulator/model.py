"""The simulator's performance model: pure functions from a configuration to decode speed.

Nothing here does I/O; profiles are plain frozen dataclasses (`profiles.py` loads them from YAML).
The server uses `evaluate` to time its decode cycles, and a caller can evaluate thousands of
points of a search space to find the true optimum (`truth`). Every number in the equations comes
from a profile, so the model can be read and recalibrated without touching code.

One speculative decode cycle (EAGLE / EAGLE-3, SGLang's draft -> verify -> draft-extend loop) of a
batch of `c` requests, `s` draft steps, top-k `k`, `n` draft tokens:

    cycle  = s * draft_step(c*k) + verify(c*n) + draft_extend(c*n)
    decode = forward(c) + L*A * allreduce(c * hidden * 2 bytes)        (no speculation)
    verify = forward(t) + verify_overhead + L*A * allreduce(t * hidden * 2 bytes),  t = c*n
    draft_step(t)   = draft_step_compute + per_token * t + draft_collectives * allreduce(t*hidden*2)
    draft_extend(t) = draft_extend_compute + per_token * t + draft_collectives * allreduce(t*hidden*2)
    forward(t)      = (fixed + w_e * per_unique_expert * U(t) + w_t * per_token * t) * scale
    U(t)            = E * (1 - (1 - e/E)^t)       expected distinct experts hit per MoE layer
    verify_overhead = overhead * ((1 - g) + g * scale),   scale = tp_ref / tp / speed

L layers with A tensor-parallel all-reduces each (Kimi-K2.5: 61 x 2 = 122). MoE weights dominate
memory traffic at small batch, so target-forward time grows with the distinct experts the tokens
touch; that is what makes verify cost rise with draft tokens and batch size. Once a batch touches
nearly all E experts (a verify batch of c*n tokens does so long before a decode batch of c), only
the per-token term still grows. Without CUDA graphs each forward also pays host launch time per
layer, and each collective an eager launch cost.

The hardware profile weighs the model's terms for its GPU: w_e (`per_unique_expert_factor`) and w_t
(`per_token_factor`) where the balance of expert-weight reads and per-token work differs from the
reference GPU's beyond `compute_speed`, and g (`verify_overhead_gpu_share`), the share of the
verify overhead that is GPU work and so scales like the forward (the rest is host synchronisation,
in absolute milliseconds). Their defaults (1, 1, 0) are the reference GPU's terms as fitted.

Running requests: `evaluate` decodes min(concurrency, max_running_requests) requests together; the
rest wait. With speculation SGLang resets an unset --max-running-requests to
SPECULATIVE_MAX_RUNNING_REQUESTS (48); without it the cap applies only when given.

All-reduce latency (microseconds), NCCL path, ring over the TP ranks (the ring's hops are typed by
PCIe/NVLink path, e.g. PXB/PHB/SYS, from the hardware profile):

    T = launch(graph|eager) + channels_used * channel_us
        + steps * (hop_us[proto][transport] + thread_sync_us * nthreads/512)
        + (chunks - 1) * hop_us / 4                    (Simple/LL128: chunk = NCCL_BUFFSIZE / 8)
        + wire_bytes / min(channels_used * nthreads * per_thread_gbps[proto],
                           min_hop_bandwidth[transport] * efficiency[proto])

    steps = 2(n-1) for Ring (Tree: x latency_factor, bandwidth x bandwidth_factor), wire = 2(n-1)/n*B.

A hop uses peer-to-peer when its path is within NCCL_P2P_LEVEL (profile default otherwise) and
NCCL_P2P_DISABLE is not 1, else shared memory through the host (NET when NCCL_SHM_DISABLE=1); the
slowest hop paces the ring. Unset NCCL_PROTO/NCCL_ALGO follow NCCL's size table from the profile
(LL128 is off by default on PCIe); a restricted set picks the fastest allowed. NCCL_MAX_NCHANNELS
caps and NCCL_MIN_NCHANNELS raises the channel count, then NCCL's own small-message reduction
applies (fewer channels, then fewer threads, while bytes < channels*threads*threshold).
NCCL_BUFFSIZE sets the Simple/LL128 chunk (BUFFSIZE/8 per step): small buffers add pipeline steps
to large messages, and buffers above 4 MiB slow shared-memory hops (host staging). The terms pull
in different directions (P2P latency vs host-bounce bandwidth, channels' bandwidth vs their sync
cost, threads' bandwidth vs their step cost), so the best setting depends on the message size and
thus on draft tokens and batch size.

A loaded NCCL tuner plugin (NCCL_TUNER_PLUGIN naming ext-tuner/example, its CSV rules in
NcclSettings.tuner_rules, read by tuner_plugin.py, the same code that writes the ranks' TUNING lines)
then picks: the first rule matching the all-reduce's size and nRanks whose algorithm/protocol NCCL_ALGO /
NCCL_PROTO allow sets them and the channel count (-1: one channel; 0: NCCL's own), with no small-message
channel reduction (NCCL's threads stay as it sized them); no matching rule leaves NCCL's own algorithm and
protocol on one channel, as the example plugin does.

SGLang's custom all-reduce (NVLink hosts, `--disable-custom-all-reduce` not given, message within
its workspace) replaces NCCL for decode/verify messages: T = launch + base_us + B / bandwidth; the
NCCL variables then do not touch those messages.

Adaptive speculation (SGLang 0.5.23 `--speculative-adaptive`, read from
`speculative/adaptive_spec_params.py`: one AdaptiveStepSlot per batch size of the adaptive config,
default DEFAULT_ADAPTIVE_CONFIG {1: [1, 3, 5, 7], 8: [0, 1, 3], 32: [0, 1], 64: [0]}, step 0 = no
drafting; `AdaptiveSpeculativeParams._route` pads the running batch to the next captured CUDA-graph
batch size and picks the slot of the largest batch size at or below it; each slot moves its steps
among its own candidates from its own EMA of the acceptance length; always a chain, top-k 1 and
steps + 1 draft tokens). ASSUMPTION, not a measurement: at each batch size it runs as the best fixed
chain among that slot's candidates (0: a plain decode step), with every cycle ADAPTIVE_SWITCH_COST
(3%) slower: the EMA's lag behind the load (it decides on past batches, and holds back by its
hysteresis), warm-up batches at the initial count, and one CUDA graph set per candidate step count
competing for memory and capture. So adaptive can beat one fixed count across loads but never the best
of its slot's candidates at a load; and from 8 running requests on, where the default slots offer 0,
it may stop drafting altogether.

Acceptance (per drafter, from the model profile): a draft at depth d is accepted with probability
a(c_d) = 1 - (1 - p) * c_d^(-width_exponent), where c_d is how many of the n-1 draft tokens the
tree spends on depth d (at most top-k). Tokens go one per depth first, then to whichever depth
gains most. Expected tokens per cycle = 1 + sum_d prod_{j<=d} a(c_j) (the bonus token included),
accept rate = (accept_length - 1) / (n - 1), SGLang's 0.5.23 definition.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.simulator.algorithms import (  # noqa: F401 - the model's public names since before the split
    Drafter,
    Speculation,
    depth_acceptance,
    expected_accept_length,
    speculation,
    tree_widths,
)
from orchestrator.simulator.tuner_plugin import Rule, get_coll_info
from orchestrator.simulator.tuner_plugin import select as _plugin_select

PROTOCOLS = ("LL", "LL128", "Simple")
ALGORITHMS = ("Ring", "Tree")
# NCCL's topology path types, nearest first (NCCL's PATH_* order). P2P is allowed up to a level.
PATH_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
NCCL_PARAM_NAMES = (
    "NCCL_PROTO",
    "NCCL_ALGO",
    "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_NCHANNELS",
    "NCCL_BUFFSIZE",
    "NCCL_NTHREADS",
    "NCCL_P2P_LEVEL",
    "NCCL_P2P_DISABLE",
    "NCCL_SHM_DISABLE",
    "NCCL_MAX_CTAS",
    "NCCL_MIN_CTAS",
)
TUNER_RULES = "nccl_tuner_rules"
"""The params key of a loaded tuner plugin's rules (`tuner_plugin.rules_for`: None when none loaded)."""
_NCCL_STEPS = 8  # NCCL splits a channel's buffer into 8 pipeline slots
_SHM_STAGING_BYTES = 4 << 20
_PIPELINE_OVERLAP = 0.25  # each further chunk of a pipelined message adds a quarter of a ring step
ADAPTIVE_SWITCH_COST = 0.03
"""Fraction by which adaptive speculation's cycle is slower than the best fixed candidate's (an
assumption, see the module docstring: EMA lag, warm-up at the initial count, a graph set per count)."""
ADAPTIVE_SLOTS: tuple[tuple[int, tuple[int, ...]], ...] = ((1, (1, 3, 5, 7)), (8, (0, 1, 3)), (32, (0, 1)), (64, (0,)))
"""SGLang 0.5.23 DEFAULT_ADAPTIVE_CONFIG: batch-size slot -> candidate_steps (adaptive_spec_params.py)."""
ADAPTIVE_CANDIDATE_STEPS = tuple(sorted({s for _, steps in ADAPTIVE_SLOTS for s in steps}))
"""(0, 1, 3, 5, 7): the union --speculative-num-steps must be in (resolve_candidate_steps_from_config)."""
SPECULATIVE_MAX_RUNNING_REQUESTS = 48
"""SGLang 0.5.23's max_running_requests with speculative decoding when --max-running-requests is not given."""


# --------------------------------------------------------------------------------------- profiles


@dataclass(frozen=True, eq=False)
class NcclProfile:
    """How NCCL behaves on a host: per-hop latency and bandwidth by transport, and its defaults."""

    version: str
    ring_hops: Mapping[int, Mapping[str, int]]
    """Per TP size, how many ring hops cross each path type (PIX/PXB/PHB/SYS/NVL)."""
    p2p_default_level: str
    p2p_gbps: Mapping[str, float]
    shm_gbps: float
    net_gbps: float
    hop_us: Mapping[str, Mapping[str, float]]
    """transport (p2p/shm/net) -> protocol -> latency of one ring step."""
    efficiency: Mapping[str, float]
    per_thread_gbps: Mapping[str, float]
    thread_threshold_bytes: Mapping[str, int]
    thread_sync_us: float
    channel_us: float
    default_channels: int
    max_channels: int
    default_nthreads: int
    default_buffsize: int
    auto_protocol: tuple[tuple[int | None, str], ...]
    """NCCL's default choice by message size: (upper bound in bytes or None, protocol)."""
    tree_latency_factor: float
    tree_bandwidth_factor: float
    shm_staging_penalty: float
    """Bandwidth lost on shared-memory hops per doubling of NCCL_BUFFSIZE above 4 MiB."""


@dataclass(frozen=True, eq=False)
class CustomAllReduce:
    """SGLang's own all-reduce kernel where the host supports it."""

    world_sizes: tuple[int, ...]
    max_bytes: int
    base_us: float
    gbps: float


@dataclass(frozen=True, eq=False)
class BackendTiming:
    """One all-reduce backend's latency on a host: launch + base_us + bytes / bandwidth, or, where measured
    points exist, straight lines through them (bytes, microseconds, kernel time as published; the last
    segment's slope beyond the last point)."""

    base_us: float = 0.0
    gbps: float = 0.0
    points: tuple[tuple[int, float], ...] = ()

    def us(self, nbytes: int, launch_us: float) -> float:
        pts = self.points
        if not pts:
            return launch_us + self.base_us + nbytes / (self.gbps * 1e3)
        if len(pts) == 1 or nbytes <= pts[0][0]:
            return pts[0][1]
        for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
            if nbytes <= b1 or (b1, t1) == pts[-1]:
                return t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0)
        return pts[-1][1]


@dataclass(frozen=True, eq=False)
class HardwareProfile:
    name: str
    description: str
    gpus: int
    gpu_name: str
    gpu_memory_gib: float
    interconnect: str
    compute_speed: float
    """Speed of one GPU relative to the model profile's reference GPU (memory-bandwidth bound)."""
    launch_us_graph: float
    launch_us_eager: float
    eager_us_per_layer: float
    default_cuda_graph_max_bs: int
    kv_cache_tokens: int
    nccl: NcclProfile
    custom_all_reduce: CustomAllReduce | None
    custom_all_reduce_unavailable: str = ""
    """Why SGLang disables its custom all-reduce here (the warning it logs), when it does."""
    per_unique_expert_factor: float = 1.0
    """Factor on the model profile's forward_per_unique_expert_ms on this GPU, beyond compute_speed."""
    per_token_factor: float = 1.0
    """Factor on the model profile's forward_per_token_ms on this GPU, beyond compute_speed."""
    verify_overhead_gpu_share: float = 0.0
    """Share (0-1) of the model profile's verify_overhead_ms that is GPU work and scales like the forward;
    the rest is host synchronisation in absolute ms. 0: all of it absolute, as the reference fit has it."""
    compute_capability: tuple[int, int] = (0, 0)
    """(major, minor) of the GPUs: SGLang 0.5.23's backends depend on it (SM90/SM100 fusion, SM90+ symm mem)."""
    nodes: int = 1
    nvlink_multicast: bool = False
    """NVSwitch multicast (torch symmetric memory needs it)."""
    flashinfer_fusion: BackendTiming | None = None
    """FlashInfer's fused all-reduce + RMSNorm, where 0.5.23 can run it (SM90/SM100)."""
    pcie_ipc: BackendTiming | None = None
    """FlashInfer's PCIe-IPC all-reduce (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1)."""
    pcie_ipc_unavailable: str = ""
    """SGLang's warning when it falls back from PCIe-IPC to NCCL on this host (e.g. no pcie_ipc_comm)."""
    torch_symm_mem: BackendTiming | None = None
    mscclpp: BackendTiming | None = None


@dataclass(frozen=True, eq=False)
class ModelProfile:
    name: str
    description: str
    architectures: tuple[str, ...]
    model_type: str
    layers: int
    hidden_size: int
    dtype_bytes: int
    allreduces_per_layer: int
    experts: int
    experts_per_token: int
    context_length: int
    reference_tp: int
    forward_fixed_ms: float
    forward_per_unique_expert_ms: float
    forward_per_token_ms: float
    verify_overhead_ms: float
    verify_overhead_decode_attention: Mapping[str, float]
    """Factor on verify_overhead with --speculative-attention-mode decode: 'chain' (top-k 1), 'tree'."""
    draft_step_ms: float
    draft_extend_ms: float
    draft_per_token_ms: float
    draft_collectives: int
    prefill_fixed_ms: float
    prefill_per_token_ms: float
    drafters: Mapping[str, Drafter] = field(default_factory=dict)
    default_spec: tuple[int, int, int] = (3, 1, 4)
    """SGLang's automatic (steps, topk, draft tokens) for this architecture."""
    load_weights_s: float = 0.0
    """Real seconds from process start to weights in GPU memory (the profile's `load.source` says why)."""
    graph_capture_s: float = 0.0
    """Real seconds of CUDA-graph capture after loading (decode batch sizes, target and drafter)."""


# ------------------------------------------------------------------------------------- all-reduce


@dataclass(frozen=True)
class NcclSettings:
    """The NCCL variables that matter, parsed once (None = unset, NCCL's default)."""

    protocols: tuple[str, ...] | None = None
    algorithms: tuple[str, ...] | None = None
    unsupported_algorithm: str | None = None
    max_channels: int | None = None
    min_channels: int | None = None
    buffsize: int | None = None
    nthreads: int | None = None
    p2p_level: str | None = None
    p2p_disable: bool = False
    shm_disable: bool = False
    tuner_rules: tuple[Rule, ...] | None = None
    """The loaded ext-tuner/example plugin's rules (None: no plugin, NCCL tunes alone; (): a plugin without
    rules, which gives every all-reduce one channel)."""

    @classmethod
    def from_env(cls, env: Mapping[str, Any]) -> NcclSettings:
        """Read NCCL_* values as NCCL would (lists, '^' exclusions, case-insensitive names), and the tuner
        rules under TUNER_RULES when present (cli.params_from_args puts them there)."""
        settings = _nccl_settings(
            tuple(None if env.get(n) is None else str(env.get(n)).strip() for n in NCCL_PARAM_NAMES)
        )
        rules = env.get(TUNER_RULES)
        return settings if rules is None else dataclasses.replace(settings, tuner_rules=tuple(rules))


@functools.lru_cache(maxsize=1 << 14)
def _nccl_settings(values: tuple[str | None, ...]) -> NcclSettings:
    raw = {n: v for n, v in zip(NCCL_PARAM_NAMES, values) if v}

    def as_int(name: str) -> int | None:
        try:
            return int(raw[name]) if name in raw else None
        except ValueError:
            return None  # NCCL ignores a value it cannot parse and keeps its default

    algorithms, unsupported = None, None
    if "NCCL_ALGO" in raw:
        algorithms = _select(raw["NCCL_ALGO"], ALGORITHMS)
        if not algorithms:
            unsupported = raw["NCCL_ALGO"]
    level = raw.get("NCCL_P2P_LEVEL", "").upper()
    nthreads = as_int("NCCL_NTHREADS")
    if nthreads is not None and (nthreads < 64 or nthreads > 512 or nthreads % 64):
        nthreads = None  # NCCL warns and keeps its default for invalid thread counts
    return NcclSettings(
        protocols=_select(raw.get("NCCL_PROTO"), PROTOCOLS),
        algorithms=algorithms,
        unsupported_algorithm=unsupported,
        max_channels=_restrictive(min, as_int("NCCL_MAX_NCHANNELS"), as_int("NCCL_MAX_CTAS")),
        min_channels=_restrictive(max, as_int("NCCL_MIN_NCHANNELS"), as_int("NCCL_MIN_CTAS")),
        buffsize=as_int("NCCL_BUFFSIZE"),
        nthreads=nthreads,
        p2p_level=level if level in PATH_LEVELS else None,
        p2p_disable=raw.get("NCCL_P2P_DISABLE") == "1",
        shm_disable=raw.get("NCCL_SHM_DISABLE") == "1",
    )


def _restrictive(pick: Any, old: int | None, new: int | None) -> int | None:
    """NCCL 2.28+: NCCL_MAX_CTAS / NCCL_MIN_CTAS replace the *_NCHANNELS names; with both set the more
    restrictive one wins (the smaller maximum, the larger minimum)."""
    given = [v for v in (old, new) if v is not None]
    return pick(given) if given else None


_select = _plugin_select  # NCCL's list syntax, one reading for the model and the ranks' plugin


@dataclass(frozen=True)
class AllReduceChoice:
    """What one all-reduce of a given size does: path, NCCL algorithm/protocol/channels, latency."""

    path: str
    us: float
    algorithm: str = ""
    protocol: str = ""
    channels: int = 0


@functools.lru_cache(maxsize=4096)
def _ring(nccl: NcclProfile, s: NcclSettings, tp: int) -> tuple[dict[str, float], float, bool]:
    """The TP ring as NCCL sees it: per-protocol step latency of its slowest hop, its narrowest
    bandwidth, and whether any hop bounces through host shared memory."""
    sizes = [k for k in nccl.ring_hops if k <= tp]
    hops = nccl.ring_hops.get(tp) or nccl.ring_hops[max(sizes) if sizes else min(nccl.ring_hops)]
    level = PATH_LEVELS.index(s.p2p_level or nccl.p2p_default_level)
    transports = []
    for path, count in hops.items():
        if count <= 0:
            continue
        if not s.p2p_disable and PATH_LEVELS.index(path) <= level:
            transports.append(("p2p", nccl.p2p_gbps[path]))
        elif s.shm_disable:
            transports.append(("net", nccl.net_gbps))
        else:
            transports.append(("shm", nccl.shm_gbps))
    step_us = {p: max(nccl.hop_us[t][p] for t, _ in transports) for p in PROTOCOLS}
    return step_us, min(bw for _, bw in transports), any(t == "shm" for t, _ in transports)


def _nccl_time(
    hw: HardwareProfile,
    s: NcclSettings,
    tp: int,
    nbytes: int,
    graph: bool,
    algorithm: str,
    protocol: str,
    plugin_channels: int = 0,
) -> tuple[float, int]:
    """Latency and channels of one NCCL all-reduce; `plugin_channels` (0: none) is a tuner plugin's count,
    which replaces NCCL's own after NCCL sized its threads (enqueue.cc: nMaxChannels from the plugin wins)."""
    nccl = hw.nccl
    channels = nccl.default_channels
    if s.max_channels is not None:
        channels = min(channels, max(1, s.max_channels))
    if s.min_channels is not None:
        channels = max(channels, s.min_channels)
    channels = max(1, min(channels, nccl.max_channels))
    nthreads = s.nthreads or nccl.default_nthreads
    # NCCL's small-message rule: drop channels, then halve threads, while bytes < channels*threads*threshold.
    threshold = nccl.thread_threshold_bytes[protocol]
    channels = max(1, min(channels, nbytes // (nthreads * threshold)))
    while channels == 1 and nbytes < nthreads * threshold and nthreads % 128 == 0:
        nthreads //= 2
    channels = plugin_channels or channels
    step_by_proto, link_gbps, via_shm = _ring(nccl, s, tp)
    step_us = step_by_proto[protocol]
    buffsize = s.buffsize or nccl.default_buffsize
    if via_shm and buffsize > _SHM_STAGING_BYTES:
        link_gbps *= (1.0 - nccl.shm_staging_penalty) ** math.log2(buffsize / _SHM_STAGING_BYTES)
    wire = nbytes * 2 * (tp - 1) / tp
    bandwidth = min(channels * nthreads * nccl.per_thread_gbps[protocol], link_gbps * nccl.efficiency[protocol])
    latency = 2 * (tp - 1) * (step_us + nccl.thread_sync_us * nthreads / 512)
    if protocol != "LL":
        chunk = max(buffsize // _NCCL_STEPS, 1)
        latency += (math.ceil(nbytes / (tp * channels) / chunk) - 1) * step_us * _PIPELINE_OVERLAP
    if algorithm == "Tree":
        latency *= nccl.tree_latency_factor
        bandwidth *= nccl.tree_bandwidth_factor
    launch = hw.launch_us_graph if graph else hw.launch_us_eager
    # bytes / (GB/s * 1e3) = microseconds
    return launch + channels * nccl.channel_us + latency + wire / (bandwidth * 1e3), channels


def _auto_protocol(nccl: NcclProfile, nbytes: int) -> str:
    for bound, proto in nccl.auto_protocol:
        if bound is None or nbytes <= bound:
            return proto
    return nccl.auto_protocol[-1][1]


def nccl_all_reduce(hw: HardwareProfile, s: NcclSettings, tp: int, nbytes: int, graph: bool) -> AllReduceChoice:
    """One NCCL all-reduce of `nbytes` over `tp` ranks, with the algorithm/protocol NCCL picks."""
    if tp <= 1:
        return AllReduceChoice("none", 0.0)
    algorithms = s.algorithms if s.algorithms else ("Ring",)
    if s.protocols is None:
        protocols: tuple[str, ...] = (_auto_protocol(hw.nccl, nbytes),)
    else:
        protocols = s.protocols or PROTOCOLS  # an empty selection: NCCL falls back to all
    best: AllReduceChoice | None = None
    for algo in algorithms:
        for proto in protocols:
            us, channels = _nccl_time(hw, s, tp, nbytes, graph, algo, proto)
            if best is None or us < best.us:
                best = AllReduceChoice("nccl", us, algo, proto, channels)
    assert best is not None
    return best if s.tuner_rules is None else _plugin_choice(hw, s, tp, nbytes, graph, best)


def _plugin_choice(
    hw: HardwareProfile, s: NcclSettings, tp: int, nbytes: int, graph: bool, best: AllReduceChoice
) -> AllReduceChoice:
    """A loaded tuner plugin's algorithm, protocol and channels for this all-reduce, timed."""
    assert s.tuner_rules is not None
    # The plugin's choice, from what NCCL allows and would pick itself (tuner_plugin.get_coll_info).
    choice, _ = get_coll_info(
        s.tuner_rules,
        nbytes,
        tp,
        tuple(a.lower() for a in s.algorithms or ALGORITHMS),
        tuple(p.lower() for p in s.protocols or PROTOCOLS),
        (best.algorithm.lower(), best.protocol.lower()),
    )
    algo = next(a for a in ALGORITHMS if a.lower() == choice.algorithm)
    proto = next(p for p in PROTOCOLS if p.lower() == choice.protocol)
    us, channels = _nccl_time(hw, s, tp, nbytes, graph, algo, proto, choice.channels)
    return AllReduceChoice("nccl", us, algo, proto, channels)


@functools.lru_cache(maxsize=1 << 16)
def all_reduce(
    hw: HardwareProfile, s: NcclSettings, tp: int, nbytes: int, graph: bool, custom_allowed: bool
) -> AllReduceChoice:
    """One tensor-parallel all-reduce: SGLang's custom kernel when usable, else NCCL."""
    car = hw.custom_all_reduce
    if custom_allowed and car is not None and tp in car.world_sizes and nbytes <= car.max_bytes:
        launch = hw.launch_us_graph if graph else hw.launch_us_eager
        return AllReduceChoice("custom", launch + car.base_us + nbytes / (car.gbps * 1e3))
    return nccl_all_reduce(hw, s, tp, nbytes, graph)


def custom_all_reduce_usable(hw: HardwareProfile, tp: int, disabled: bool) -> bool:
    return not disabled and hw.custom_all_reduce is not None and tp in hw.custom_all_reduce.world_sizes


# SGLang 0.5.23's choice among its all-reduce backends, as read from its code (the twin of the
# orchestrator's config/allreduce.py; tests/simulator/test_sim_backends.py holds the two to one answer).
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
"""0.5.23 arg_groups/overrides.py _FLASHINFER_ALLREDUCE_FUSION_ARCHS."""
FUSE_ALLREDUCE_MAX_BATCH_SIZE = 2048
"""0.5.23 layers/layer_boundary/residual/add_norm.py: tokens the fused all-reduce + RMSNorm runs on."""
PCIE_IPC_WORLD_SIZES = (2, 4, 8)
PCIE_IPC_FALLBACK_ROWS = 64
TORCH_SYMM_MEM_MAX_MIB = {9: {2: 64, 4: 64, 6: 128, 8: 128}, 10: {2: 64, 4: 64, 6: 128, 8: 128}}
MSCCLPP_WORLD_SIZES = (4, 8, 16, 32, 64)
COMM_KEYS = (
    "all_reduce_backend",
    "disable_custom_all_reduce",
    "flashinfer_allreduce_fusion_backend",
    "enforce_disable_flashinfer_allreduce_fusion",
    "enable_torch_symm_mem",
    "enable_mscclpp",
    "enable_dp_attention",
    "moe_a2a_backend",
    "enable_deterministic_inference",
    "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE",
    "SGLANG_PCIE_IPC_MAX_NUMEL",
    "SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB",
)
"""The params keys (server args and environment) the communication path depends on."""
_BACKEND_PARAMS: Mapping[str, Mapping[str, Any]] = {
    "auto": {},
    "nccl": {"disable_custom_all_reduce": True, "enforce_disable_flashinfer_allreduce_fusion": True},
    "custom": {"enforce_disable_flashinfer_allreduce_fusion": True},
    "flashinfer_fusion": {"flashinfer_allreduce_fusion_backend": "auto"},
    "pcie_ipc": {
        "disable_custom_all_reduce": True,
        "enforce_disable_flashinfer_allreduce_fusion": True,
        "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1",
    },
    "torch_symm_mem": {
        "enable_torch_symm_mem": True,
        "disable_custom_all_reduce": True,
        "enforce_disable_flashinfer_allreduce_fusion": True,
    },
    "mscclpp": {"enable_mscclpp": True, "enforce_disable_flashinfer_allreduce_fusion": True},
}
"""The all_reduce_backend knob's values as server args and environment (what the orchestrator renders)."""


@dataclass(frozen=True)
class Comm:
    """The backends one server runs, in SGLang 0.5.23's order, and what it logs about them."""

    fusion: bool = False
    mscclpp: bool = False
    custom: bool = False
    """Custom all-reduce built (flags allow it and the host supports it)."""
    custom_max_bytes: int = 0
    pcie_ipc_rows: int = 0
    torch_symm_mem_bytes: int = 0
    lines: tuple[tuple[str, int, str], ...] = ()
    """SGLang's start-up lines: (where: 'main' | 'scheduler', level, text)."""


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on") if isinstance(value, str) else bool(value)


def resolve_comm(
    params: Mapping[str, Any], hw: HardwareProfile, model: ModelProfile, tp: int, *, decode_rows: int | None
) -> Comm:
    """Which backends SGLang 0.5.23 builds for this launch (`decode_rows`: the widest captured decode
    reduction, None without CUDA graphs), and its lines about them."""
    p = {**params, **_BACKEND_PARAMS.get(str(params.get("all_reduce_backend") or "auto"), {})}
    if params.get("all_reduce_path") == "nccl":
        p["disable_custom_all_reduce"] = True
    if tp <= 1:
        return Comm()
    lines: list[tuple[str, int, str]] = []
    fusion = _fusion(p, hw, model, lines)
    deterministic = _truthy(p.get("enable_deterministic_inference"))
    custom, car_max = _custom(p, hw, tp, deterministic, lines)
    if fusion:
        sm = hw.compute_capability[0]
        lines.append(
            (
                "scheduler",
                20,
                f"FlashInfer AllReduce Fusion enabled and workspace initialized: "
                f"backend={'mnnvl' if sm == 10 else 'trtllm'}, rank=0, world_size={tp}, "
                f"max_token_num={FUSE_ALLREDUCE_MAX_BATCH_SIZE}, hidden_dim={model.hidden_size}",
            )
        )
    mscclpp = _mscclpp(p, hw, tp, lines)
    rows = _pcie_ipc_rows(p, hw, model, tp, decode_rows, deterministic, lines)
    tsm = _torch_symm_mem_bytes(p, hw, tp, lines)
    return Comm(
        fusion=fusion,
        mscclpp=mscclpp,
        custom=custom,
        custom_max_bytes=car_max,
        pcie_ipc_rows=rows,
        torch_symm_mem_bytes=tsm,
        lines=tuple(lines),
    )


def _fusion(p: Mapping[str, Any], hw: HardwareProfile, model: ModelProfile, lines: list[tuple[str, int, str]]) -> bool:
    """FlashInfer's all-reduce fusion: asked for, or auto-enabled (0.5.23 on SM90/SM100 for FUSION_ARCHS, one
    node or SM100, no DP attention, no MoE all-to-all); --enforce-disable-flashinfer-allreduce-fusion wins."""
    sm = hw.compute_capability[0]
    arch = model.architectures[0] if model.architectures else ""
    fusion = p.get("flashinfer_allreduce_fusion_backend") is not None
    if (
        not fusion
        and arch in FUSION_ARCHS
        and sm in (9, 10)
        and not _truthy(p.get("enable_dp_attention"))
        and (hw.nodes == 1 or sm == 10)
        and str(p.get("moe_a2a_backend") or "none") == "none"
    ):
        fusion = True
        lines.append(("main", 20, f"Auto-enabling FlashInfer AllReduce Fusion (auto) for {arch}"))
    if _truthy(p.get("enforce_disable_flashinfer_allreduce_fusion")):
        if fusion:
            lines.append(
                (
                    "main",
                    20,
                    "FlashInfer allreduce fusion is forcibly disabled via "
                    "--enforce-disable-flashinfer-allreduce-fusion.",
                )
            )
        fusion = False
    return fusion and sm in (9, 10) and hw.flashinfer_fusion is not None


def _custom(
    p: Mapping[str, Any], hw: HardwareProfile, tp: int, deterministic: bool, lines: list[tuple[str, int, str]]
) -> tuple[bool, int]:
    """SGLang's custom all-reduce: whether it is built here and its largest message in bytes."""
    custom = not _truthy(p.get("disable_custom_all_reduce")) and not deterministic
    if custom and not custom_all_reduce_usable(hw, tp, False) and hw.custom_all_reduce_unavailable:
        for cls in ("CustomAllReduceV2", "CustomAllreduce"):
            lines.append(("scheduler", 30, hw.custom_all_reduce_unavailable.replace("CustomAllreduce", cls)))
    custom = custom and custom_all_reduce_usable(hw, tp, False)
    cap_kb = p.get("SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB")
    car_max = int(cap_kb) * 1024 if cap_kb else (hw.custom_all_reduce.max_bytes if hw.custom_all_reduce else 0)
    if custom:
        lines.append(
            (
                "scheduler",
                20,
                f"All Reduce config: symmetric_memory = {car_max / (1 << 20) * 2:.2f} MB, "
                f"local_buffer = 0.06 MB, multicast = False, pull = True",
            )
        )
    return custom, car_max


def _mscclpp(p: Mapping[str, Any], hw: HardwareProfile, tp: int, lines: list[tuple[str, int, str]]) -> bool:
    """MSCCL++ (--enable-mscclpp): built only at its world sizes, with a warning otherwise."""
    if _truthy(p.get("enable_mscclpp")) and tp not in MSCCLPP_WORLD_SIZES:
        lines.append(
            (
                "scheduler",
                30,
                f"PyMscclpp is disabled due to an unsupported world size: {tp}. Supported "
                f"world sizes: {list(MSCCLPP_WORLD_SIZES)}. To silence this warning, specify "
                f"disable_mscclpp=True explicitly.",
            )
        )
    return _truthy(p.get("enable_mscclpp")) and tp in MSCCLPP_WORLD_SIZES and hw.mscclpp is not None


def _pcie_ipc_rows(
    p: Mapping[str, Any],
    hw: HardwareProfile,
    model: ModelProfile,
    tp: int,
    decode_rows: int | None,
    deterministic: bool,
    lines: list[tuple[str, int, str]],
) -> int:
    """0.5.23 pcie_ipc_ar.py: eligible_group, PcieIpcCommunicator.__init__, _ensure_workspace."""
    if not _truthy(p.get("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE")):
        return 0
    if deterministic:
        lines.append(
            (
                "scheduler",
                30,
                "Deterministic inference is on; leaving PCIe-IPC all-reduce off. Its kernels "
                "pick a tactic per shape, so the reduction order would follow the batch shape.",
            )
        )
        return 0
    if tp not in PCIE_IPC_WORLD_SIZES:
        return 0  # a debug line only in 0.5.23
    if hw.pcie_ipc is None:
        lines.append(
            (
                "scheduler",
                30,
                hw.pcie_ipc_unavailable
                or (
                    "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE is set but this FlashInfer build has no pcie_ipc_comm; "
                    "falling back to NCCL all-reduce."
                ),
            )
        )
        return 0
    lines.append(
        ("scheduler", 20, f"FlashInfer PCIe-IPC all-reduce enabled (world={tp}, workspace sized on first reduction)")
    )
    override = int(p.get("SGLANG_PCIE_IPC_MAX_NUMEL") or 0)
    rows = override // model.hidden_size if override else (decode_rows or PCIE_IPC_FALLBACK_ROWS)
    lines.append(
        (
            "scheduler",
            20,
            f"FlashInfer PCIe-IPC workspace built (world={tp}, "
            f"max_numel={rows * model.hidden_size}, hidden={model.hidden_size})",
        )
    )
    return rows


def _torch_symm_mem_bytes(p: Mapping[str, Any], hw: HardwareProfile, tp: int, lines: list[tuple[str, int, str]]) -> int:
    """0.5.23 torch_symm_mem.py TorchSymmMemCommunicator.__init__."""
    if not _truthy(p.get("enable_torch_symm_mem")):
        return 0
    sm = hw.compute_capability[0]
    sizes = TORCH_SYMM_MEM_MAX_MIB.get(sm)
    if sizes is None:
        lines.append(
            (
                "scheduler",
                30,
                f"TorchSymmMemCommunicator: Device capability {sm} not supported, communicator is not available.",
            )
        )
        return 0
    if tp not in sizes:
        lines.append(
            (
                "scheduler",
                30,
                f"TorchSymmMemCommunicator: World size {tp} not supported, communicator is not available.",
            )
        )
        return 0
    if not hw.nvlink_multicast or hw.torch_symm_mem is None:
        lines.append(
            (
                "scheduler",
                30,
                "TorchSymmMemCommunicator: torch symmetric memory multicast operations are not supported.",
            )
        )
        return 0
    return sizes[tp] << 20


@functools.lru_cache(maxsize=1 << 16)
def carried_all_reduce(
    hw: HardwareProfile,
    s: NcclSettings,
    comm: Comm,
    tp: int,
    tokens: int,
    token_bytes: int,
    graph: bool,
    fused: bool = True,
) -> AllReduceChoice:
    """One tensor-parallel all-reduce of `tokens` rows on the backend 0.5.23 picks: a layer's reduction
    (`fused`: the fused all-reduce + RMSNorm first, add_norm.py flashinfer_ar_fusion_applies) or another one
    through GroupCoordinator.all_reduce (MSCCL++, custom, FlashInfer's workspace, PCIe-IPC, torch symm mem)."""
    nbytes = tokens * token_bytes
    launch = hw.launch_us_graph if graph else hw.launch_us_eager
    fusion = hw.flashinfer_fusion if comm.fusion and tokens <= FUSE_ALLREDUCE_MAX_BATCH_SIZE else None
    if fusion is not None and fused:
        return AllReduceChoice("flashinfer_fusion", fusion.us(nbytes, launch))
    if comm.mscclpp and hw.mscclpp is not None:
        return AllReduceChoice("mscclpp", hw.mscclpp.us(nbytes, launch))
    car = hw.custom_all_reduce
    if comm.custom and car is not None and nbytes <= comm.custom_max_bytes:
        return AllReduceChoice("custom", launch + car.base_us + nbytes / (car.gbps * 1e3))
    if fusion is not None:
        return AllReduceChoice("flashinfer_fusion", fusion.us(nbytes, launch))
    return _after_custom(hw, s, comm, tp, tokens, nbytes, graph)


def _after_custom(
    hw: HardwareProfile, s: NcclSettings, comm: Comm, tp: int, tokens: int, nbytes: int, graph: bool
) -> AllReduceChoice:
    """GroupCoordinator.all_reduce past custom all-reduce and FlashInfer: PCIe-IPC, torch symm mem, NCCL."""
    launch = hw.launch_us_graph if graph else hw.launch_us_eager
    if comm.pcie_ipc_rows and tokens <= comm.pcie_ipc_rows and hw.pcie_ipc is not None:
        return AllReduceChoice("pcie_ipc", hw.pcie_ipc.us(nbytes, launch))
    if comm.torch_symm_mem_bytes and nbytes < comm.torch_symm_mem_bytes and hw.torch_symm_mem is not None:
        return AllReduceChoice("torch_symm_mem", hw.torch_symm_mem.us(nbytes, launch))
    return nccl_all_reduce(hw, s, tp, nbytes, graph)


# ------------------------------------------------------------------------------------- acceptance


# ----------------------------------------------------------------------------------------- params


@dataclass(frozen=True)
class Config:
    """A fully resolved configuration, what a server of this config runs (see `resolve`)."""

    tp: int
    speculative: bool
    drafter: str
    steps: int
    topk: int
    draft_tokens: int
    custom_all_reduce_disabled: bool
    cuda_graph: bool
    cuda_graph_max_bs: int | None
    attention_mode: str
    nccl: NcclSettings
    adaptive: bool = False
    """--speculative-adaptive: `steps` is the initial count, each batch runs the best of `candidate_steps`."""
    candidate_steps: tuple[int, ...] = ()
    adaptive_slots: tuple[tuple[int, tuple[int, ...]], ...] = ()
    """(batch size, candidate_steps) per slot of the adaptive config, smallest batch first."""
    max_running_requests: int | None = None
    """Most requests decoding together (None: no cap); the others wait in the queue."""
    comm: Comm = Comm()
    """The all-reduce backends SGLang 0.5.23 builds for this launch (resolve_comm)."""


def _adaptive_start(steps: Any, topk: Any, candidates: tuple[int, ...]) -> int | str:
    """The initial steps of --speculative-adaptive, or why SGLang 0.5.23 refuses them
    (speculative_hook.py _init_adaptive_speculative_params: unset -> the union's middle; else in the union)."""
    if topk is not None and int(topk) != 1:
        return f"speculative_adaptive runs a chain (top-k 1), but got speculative_eagle_topk {topk}"
    if steps is None:
        return candidates[len(candidates) // 2]
    if int(steps) not in candidates:
        return (
            f"ValueError: --speculative-num-steps={steps} is not in the adaptive config candidate_steps "
            f"{list(candidates)}. Pass one of those values."
        )
    return int(steps)


def resolve(
    params: Mapping[str, Any], hw: HardwareProfile, model: ModelProfile, *, tp: int | None = None
) -> Config | str:
    """Apply SGLang's resolution rules to orchestrator knob values; a string says why it fails.

    `params` uses the orchestrator's knob names: NCCL_* variables, speculative_algorithm (EAGLE, EAGLE3,
    NEXTN, STANDALONE, DFLASH, NGRAM: algorithms.py `speculation`), speculative_num_steps, speculative_eagle_topk,
    speculative_num_draft_tokens, speculative_dflash_block_size, speculative_ngram_max_bfs_breadth,
    speculative_attention_mode, all_reduce_path ('custom'|'nccl'), cuda_graph (default True),
    cuda_graph_max_bs, speculative_adaptive (with speculative_adaptive_slots, default 0.5.23's),
    max_running_requests (default SPECULATIVE_MAX_RUNNING_REQUESTS with speculation, else
    no cap), and optionally tp (default: every GPU of the hardware profile).
    """
    tp = int(tp or params.get("tp") or hw.gpus)
    if tp > hw.gpus:
        return f"tp {tp} needs more GPUs than the hardware profile has ({hw.gpus})"
    algo = params.get("speculative_algorithm")
    algo = None if algo is None or str(algo).upper() == "NONE" else str(algo).upper()
    if algo == "NEXTN":
        algo = "EAGLE"
    slots = tuple((int(b), tuple(c)) for b, c in params.get("speculative_adaptive_slots") or ADAPTIVE_SLOTS)
    adaptive = algo in ("EAGLE", "EAGLE3") and bool(params.get("speculative_adaptive"))
    spec = None if algo is None else _speculate(algo, params, model, slots if adaptive else ())
    if isinstance(spec, str):
        return spec
    nccl = NcclSettings.from_env(params)
    if nccl.unsupported_algorithm is not None:
        return (
            f"NCCL error: no algorithm/protocol available for AllReduce "
            f"(NCCL_ALGO={params.get('NCCL_ALGO')} is not supported on {hw.name})"
        )
    return _config(params, hw, model, tp, nccl, spec, slots if adaptive else ())


def _custom_all_reduce_off(params: Mapping[str, Any]) -> bool:
    """--disable-custom-all-reduce, given or rendered from all_reduce_path / all_reduce_backend."""
    backend = _BACKEND_PARAMS.get(str(params.get("all_reduce_backend") or "auto"), {})
    return (
        params.get("all_reduce_path") == "nccl"
        or bool(backend.get("disable_custom_all_reduce"))
        or _truthy(params.get("disable_custom_all_reduce"))
    )


def _speculate(
    algo: str, params: Mapping[str, Any], model: ModelProfile, slots: tuple[tuple[int, tuple[int, ...]], ...]
) -> Speculation | str:
    """The algorithm's steps, top-k and draft tokens; with adaptive `slots`, the initial chain."""
    if slots:
        candidates = tuple(sorted({s for _, steps in slots for s in steps}))
        start = _adaptive_start(params.get("speculative_num_steps"), params.get("speculative_eagle_topk"), candidates)
        if isinstance(start, str):
            return start
        params = {**params, "speculative_num_steps": start, "speculative_eagle_topk": 1}
    return speculation(algo, params, model.drafters, model.default_spec)


def _config(
    params: Mapping[str, Any],
    hw: HardwareProfile,
    model: ModelProfile,
    tp: int,
    nccl: NcclSettings,
    spec: Speculation | None,
    slots: tuple[tuple[int, tuple[int, ...]], ...],
) -> Config:
    graph, max_bs = params.get("cuda_graph"), params.get("cuda_graph_max_bs")
    max_running = params.get("max_running_requests")
    if max_running is None and spec is not None:
        max_running = SPECULATIVE_MAX_RUNNING_REQUESTS
    graph_on = True if graph is None else bool(graph)
    widest = int(max_bs or hw.default_cuda_graph_max_bs)
    if max_running is not None:
        widest = min(widest, int(max_running))
    drafting = spec or Speculation("", 0, 0, 0)
    rows = widest * max(drafting.draft_tokens, 1) if graph_on else None
    return Config(
        tp=tp,
        speculative=spec is not None,
        drafter=drafting.drafter,
        steps=drafting.steps,
        topk=drafting.topk,
        draft_tokens=drafting.draft_tokens,
        custom_all_reduce_disabled=_custom_all_reduce_off(params),
        cuda_graph=graph_on,
        cuda_graph_max_bs=None if max_bs is None else int(max_bs),
        attention_mode=str(params.get("speculative_attention_mode") or "prefill"),
        nccl=nccl,
        adaptive=bool(slots),
        candidate_steps=tuple(sorted({s for _, steps in slots for s in steps})),
        adaptive_slots=slots,
        max_running_requests=None if max_running is None else max(1, int(max_running)),
        comm=resolve_comm(params, hw, model, tp, decode_rows=rows),
    )


# ------------------------------------------------------------------------------------- prediction


@dataclass(frozen=True)
class Prediction:
    """The noise-free model of one configuration at a given number of concurrent streams."""

    decode_tok_s: float
    """Tokens per second of one stream while decoding (what the benchmark's decode rate measures)."""
    output_tok_s: float
    """All streams together."""
    cycle_ms: float
    """One decode iteration: draft + verify + draft-extend, or one plain decode step."""
    accept_length: float
    accept_rate: float | None
    verify_ms: float | None
    draft_ms: float
    """All draft steps of one cycle."""
    draft_step_ms: float
    draft_extend_ms: float
    allreduce_us: float
    """One all-reduce of the target forward (verify or decode sized)."""
    ar_path: str
    """custom (SGLang's kernel) or nccl, for the decode/verify all-reduces."""
    nccl_algorithm: str = ""
    nccl_protocol: str = ""
    nccl_channels: int = 0
    cuda_graph: bool = True
    per_depth_acceptance: tuple[float, ...] = ()
    failure: str | None = None
    steps: int = 0
    """Draft steps this cycle runs (with adaptive speculation: the candidate chosen for this batch)."""
    draft_tokens: int = 0
    adaptive_slot: int = 0
    """With adaptive speculation: the batch size of the slot that served this cycle (0 otherwise)."""
    running: int = 0
    """Requests decoding together in this cycle (from `evaluate`: the concurrency, capped at
    max_running_requests; the rest wait, so output_tok_s is this batch's and decode_tok_s one of its streams')."""

    @property
    def ok(self) -> bool:
        return self.failure is None


def _failed(reason: str) -> Prediction:
    return Prediction(0.0, 0.0, 0.0, 0.0, None, None, 0.0, 0.0, 0.0, 0.0, "", failure=reason)


def unique_experts(model: ModelProfile, tokens: int) -> float:
    e, k = model.experts, model.experts_per_token
    if e <= 0 or k <= 0:
        return 0.0
    return e * (1.0 - (1.0 - k / e) ** tokens)


def _scale(hw: HardwareProfile, model: ModelProfile, tp: int) -> float:
    return model.reference_tp / tp / hw.compute_speed


def forward_ms(hw: HardwareProfile, model: ModelProfile, tp: int, tokens: int) -> float:
    """Target-model compute for one forward over `tokens` tokens, collectives excluded."""
    experts = hw.per_unique_expert_factor * model.forward_per_unique_expert_ms * unique_experts(model, tokens)
    per_token = hw.per_token_factor * model.forward_per_token_ms * tokens
    return (model.forward_fixed_ms + experts + per_token) * _scale(hw, model, tp)


def verify_overhead_ms(hw: HardwareProfile, model: ModelProfile, cfg: Config) -> float:
    """What TARGET_VERIFY costs beyond a forward of as many tokens: its GPU share scales with the
    hardware like the forward, the host-synchronisation rest does not."""
    share = hw.verify_overhead_gpu_share
    overhead = model.verify_overhead_ms * ((1.0 - share) + share * _scale(hw, model, cfg.tp))
    if cfg.attention_mode == "decode":
        overhead *= model.verify_overhead_decode_attention["chain" if cfg.topk == 1 else "tree"]
    return overhead


def prefill_ms(hw: HardwareProfile, model: ModelProfile, cfg: Config, new_tokens: int) -> float:
    """Time of a prefill (extend) forward over `new_tokens` uncached prompt tokens."""
    tokens = max(new_tokens, 1)
    ar = carried_all_reduce(hw, cfg.nccl, cfg.comm, cfg.tp, tokens, model.hidden_size * model.dtype_bytes, False)
    compute = (model.prefill_fixed_ms + model.prefill_per_token_ms * tokens) * _scale(hw, model, cfg.tp)
    return compute + model.layers * model.allreduces_per_layer * ar.us / 1e3


def cycle(hw: HardwareProfile, model: ModelProfile, cfg: Config, batch: int) -> Prediction:
    """Timing and acceptance of one decode iteration of `batch` running requests."""
    batch = max(1, batch)
    if cfg.adaptive:
        return _adaptive_cycle(hw, model, cfg, batch)
    graph = cfg.cuda_graph and batch <= (cfg.cuda_graph_max_bs or hw.default_cuda_graph_max_bs)
    token_bytes = model.hidden_size * model.dtype_bytes
    n_ar = model.layers * model.allreduces_per_layer
    eager_ms = 0.0 if graph else hw.eager_us_per_layer * model.layers / 1e3
    if not cfg.speculative:
        ar = carried_all_reduce(hw, cfg.nccl, cfg.comm, cfg.tp, batch, token_bytes, graph)
        step = forward_ms(hw, model, cfg.tp, batch) + eager_ms + n_ar * ar.us / 1e3
        return Prediction(
            decode_tok_s=1e3 / step,
            output_tok_s=batch * 1e3 / step,
            cycle_ms=step,
            accept_length=1.0,
            accept_rate=None,
            verify_ms=None,
            draft_ms=0.0,
            draft_step_ms=0.0,
            draft_extend_ms=0.0,
            allreduce_us=ar.us,
            ar_path=ar.path,
            nccl_algorithm=ar.algorithm,
            nccl_protocol=ar.protocol,
            nccl_channels=ar.channels,
            cuda_graph=graph,
            running=batch,
        )
    drafter = model.drafters[cfg.drafter]
    per_depth = depth_acceptance(drafter, cfg.steps, cfg.topk, cfg.draft_tokens)
    accept = expected_accept_length(per_depth)
    verify_tokens = batch * cfg.draft_tokens
    ar_v = carried_all_reduce(hw, cfg.nccl, cfg.comm, cfg.tp, verify_tokens, token_bytes, graph)
    verify = (
        forward_ms(hw, model, cfg.tp, verify_tokens)
        + verify_overhead_ms(hw, model, cfg)
        + eager_ms
        + n_ar * ar_v.us / 1e3
    )
    passes, draft_step, draft_extend = _drafting(hw, model, drafter, cfg, batch, graph)
    total = passes * draft_step + verify + draft_extend
    return Prediction(
        decode_tok_s=accept * 1e3 / total,
        output_tok_s=batch * accept * 1e3 / total,
        cycle_ms=total,
        accept_length=accept,
        accept_rate=(accept - 1.0) / (cfg.draft_tokens - 1),
        verify_ms=verify,
        draft_ms=passes * draft_step,
        draft_step_ms=draft_step,
        draft_extend_ms=draft_extend,
        allreduce_us=ar_v.us,
        ar_path=ar_v.path,
        nccl_algorithm=ar_v.algorithm,
        nccl_protocol=ar_v.protocol,
        nccl_channels=ar_v.channels,
        cuda_graph=graph,
        per_depth_acceptance=per_depth,
        steps=cfg.steps,
        draft_tokens=cfg.draft_tokens,
        running=batch,
    )


def _drafting(
    hw: HardwareProfile, model: ModelProfile, drafter: Drafter, cfg: Config, batch: int, graph: bool
) -> tuple[int, float, float]:
    """(draft passes per cycle, one pass's ms, the draft-extend's ms) of `drafter`'s shape (algorithms.py):
    a tree drafts `steps` passes over batch * top-k tokens; a block one pass over the whole window; a lookup
    one host-side trie match per request, no draft model (no collectives, no draft-extend)."""
    step_ms = model.draft_step_ms if drafter.draft_step_ms is None else drafter.draft_step_ms
    extend_ms = model.draft_extend_ms if drafter.draft_extend_ms is None else drafter.draft_extend_ms
    per_token = model.draft_per_token_ms if drafter.draft_per_token_ms is None else drafter.draft_per_token_ms
    collectives = model.draft_collectives if drafter.draft_collectives is None else drafter.draft_collectives
    if drafter.shape == "lookup":
        return 1, step_ms + per_token * batch, 0.0
    token_bytes = model.hidden_size * model.dtype_bytes
    scale = _scale(hw, model, cfg.tp)
    verify_tokens = batch * cfg.draft_tokens
    step_tokens = verify_tokens if drafter.shape == "block" else batch * cfg.topk
    # The draft model's collectives go through GroupCoordinator.all_reduce, not the target's fused layers.
    ar_d = carried_all_reduce(hw, cfg.nccl, cfg.comm, cfg.tp, step_tokens, token_bytes, graph, fused=False)
    ar_dx = carried_all_reduce(hw, cfg.nccl, cfg.comm, cfg.tp, verify_tokens, token_bytes, graph, fused=False)
    eager = 0.0 if graph else hw.eager_us_per_layer / 1e3
    step = (step_ms + per_token * step_tokens) * scale + eager + collectives * ar_d.us / 1e3
    extend = (extend_ms + per_token * verify_tokens) * scale + eager + collectives * ar_dx.us / 1e3
    return (1 if drafter.shape == "block" else cfg.steps), step, extend


def speculative_capture_bs(max_bs: int) -> tuple[int, ...]:
    """The decode batch sizes 0.5.23 captures with speculation (arg_groups/cuda_graph_hook.py
    generate_decode_cuda_graph_batch_sizes, the spec branch): 1-8, 10-32 by 2, 40-64 by 4, 72-256 by 8, then by 16."""
    sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8), *range(272, max_bs + 1, 16)]
    sizes = [b for b in sizes if b <= max_bs]
    return tuple(sizes if max_bs in sizes else [*sizes, max_bs])


def adaptive_slot(cfg: Config, batch: int, graph_bs: Iterable[int] | None) -> tuple[int, tuple[int, ...]]:
    """The slot that serves `batch` running requests (AdaptiveSpeculativeParams._route): padded to the next
    captured batch size (`graph_bs`, None: no CUDA graphs), then the largest slot at or below it."""
    if graph_bs is not None:
        padded = [b for b in graph_bs if b >= batch]
        batch = min(padded) if padded else batch
    chosen = cfg.adaptive_slots[0]
    for slot in cfg.adaptive_slots:
        if slot[0] <= batch:
            chosen = slot
    return chosen


def _adaptive_cycle(hw: HardwareProfile, model: ModelProfile, cfg: Config, batch: int) -> Prediction:
    """Adaptive speculation at `batch`: the best fixed chain among its slot's candidates (0: a plain decode
    step), ADAPTIVE_SWITCH_COST slower."""
    max_bs = cfg.cuda_graph_max_bs or hw.default_cuda_graph_max_bs
    if cfg.max_running_requests is not None:
        max_bs = min(max_bs, cfg.max_running_requests)
    graphs = speculative_capture_bs(max_bs) if cfg.cuda_graph else None
    size, steps = adaptive_slot(cfg, batch, graphs)
    plain = dataclasses.replace(cfg, adaptive=False, speculative=False, steps=0, topk=0, draft_tokens=0)
    # A 0-step cycle drafts nothing: one token per request, no draft offered (draft tokens 1, the bonus only).
    fixed = [
        dataclasses.replace(cycle(hw, model, plain, batch), steps=0, draft_tokens=1)
        if s == 0
        else cycle(hw, model, dataclasses.replace(cfg, adaptive=False, steps=s, topk=1, draft_tokens=s + 1), batch)
        for s in steps
    ]
    best = max(fixed, key=lambda p: p.output_tok_s)
    slower = 1.0 + ADAPTIVE_SWITCH_COST
    return dataclasses.replace(
        best,
        cycle_ms=best.cycle_ms * slower,
        decode_tok_s=best.decode_tok_s / slower,
        output_tok_s=best.output_tok_s / slower,
        adaptive_slot=size,
    )


_RESOLVE_KEYS = (
    "tp",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_attention_mode",
    "all_reduce_path",
    "cuda_graph",
    "cuda_graph_max_bs",
    "speculative_adaptive",
    "speculative_adaptive_candidate_steps",
    "speculative_adaptive_slots",
    "max_running_requests",
    "speculative_dflash_block_size",
    "speculative_ngram_max_bfs_breadth",
    *NCCL_PARAM_NAMES,
    TUNER_RULES,
    *COMM_KEYS,
)


@functools.lru_cache(maxsize=1 << 16)
def _evaluate(hw: HardwareProfile, model: ModelProfile, key: tuple, concurrency: int) -> Prediction:
    cfg = resolve(dict(zip(_RESOLVE_KEYS, key)), hw, model)
    if isinstance(cfg, str):
        return _failed(cfg)
    return cycle(hw, model, cfg, running_requests(cfg, concurrency))


def running_requests(cfg: Config, concurrency: int) -> int:
    """How many of `concurrency` streams decode together: SGLang admits at most max_running_requests."""
    concurrency = max(1, concurrency)
    return concurrency if cfg.max_running_requests is None else min(concurrency, cfg.max_running_requests)


def evaluate(
    params: Mapping[str, Any], hardware: HardwareProfile, model: ModelProfile, *, concurrency: int = 1
) -> Prediction:
    """Noise-free decode speed of `params` with `concurrency` streams, at most max_running_requests
    of them decoding together (`Prediction.running`).

    A configuration SGLang or NCCL would refuse comes back with `failure` set and zero speed.
    Keys other than the knobs `resolve` reads are ignored.
    """
    key = tuple(tuple(v) if isinstance(v := params.get(k), list) else v for k in _RESOLVE_KEYS)
    return _evaluate(hardware, model, key, concurrency)


@dataclass(frozen=True)
class Ranked:
    rank: int
    params: Mapping[str, Any]
    prediction: Prediction


def truth(
    points: Iterable[Mapping[str, Any]], hardware: HardwareProfile, model: ModelProfile, *, concurrency: int = 1
) -> list[Ranked]:
    """Every point evaluated, fastest first (rank 1 = the true optimum); failures last."""
    evaluated = [(dict(p), evaluate(p, hardware, model, concurrency=concurrency)) for p in points]
    evaluated.sort(key=lambda pe: -pe[1].decode_tok_s)
    return [Ranked(i + 1, p, pred) for i, (p, pred) in enumerate(evaluated)]
