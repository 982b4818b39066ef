"""Hardware and model profiles: YAML/JSON data files -> the model's frozen dataclasses.

A profile is named (a file `profiles/<name>.yaml` shipped in this package) or given as a path to a
YAML or JSON file, for example one a probe wrote on a real host. Each file says what it is with
`kind: hardware` or `kind: model`; unknown or missing keys are errors that name the file and key,
so a typo in a hand-written profile cannot silently fall back to a default.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from orchestrator.simulator.model import (
    BackendTiming,
    CustomAllReduce,
    Drafter,
    HardwareProfile,
    ModelProfile,
    NcclProfile,
)

DEFAULT_HARDWARE = "pcie-rtxpro6000-x8"
DEFAULT_MODEL = "kimi-k2.5"


class ProfileError(ValueError):
    """A profile that cannot be found or read; the message names the file and the key."""


def builtin_names() -> list[str]:
    folder = resources.files("orchestrator.simulator").joinpath("profiles")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def _read(name_or_path: str) -> tuple[str, dict[str, Any]]:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml", ".json") or path.exists():
        if not path.is_file():
            raise ProfileError(f"profile file {name_or_path} does not exist")
        text, source = path.read_text(encoding="utf-8"), str(path)
    else:
        res = resources.files("orchestrator.simulator").joinpath("profiles").joinpath(f"{name_or_path}.yaml")
        if not res.is_file():
            raise ProfileError(
                f"no built-in profile {name_or_path!r} (built-in: {', '.join(builtin_names())}); "
                f"give a name or a path to a .yaml/.json file"
            )
        text, source = res.read_text(encoding="utf-8"), f"built-in profile {name_or_path}"
    try:
        data = (
            json.loads(text)
            if source.endswith(".json")
            else yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        )
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ProfileError(f"{source}: not valid YAML/JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: a profile is a mapping of keys, got {type(data).__name__}")
    return source, data


class _Reader:
    """Takes keys out of a mapping and complains about missing and left-over ones."""

    def __init__(self, source: str, data: Mapping[str, Any], where: str = ""):
        self.source, self.data, self.where = source, data, where
        self.used: set[str] = set()

    def __call__(self, key: str, default: Any = ...) -> Any:
        self.used.add(key)
        if key not in self.data:
            if default is ...:
                raise ProfileError(f"{self.source}: missing key {self.where}{key}")
            return default
        return self.data[key]

    def sub(self, key: str) -> _Reader:
        value = self(key)
        if not isinstance(value, Mapping):
            raise ProfileError(f"{self.source}: {self.where}{key} must be a mapping")
        return _Reader(self.source, value, f"{self.where}{key}.")

    def done(self) -> None:
        extra = sorted(set(self.data) - self.used)
        if extra:
            raise ProfileError(f"{self.source}: unknown key(s) {', '.join(self.where + e for e in extra)}")


def _kind(source: str, r: _Reader, wanted: str) -> None:
    kind = r("kind")
    if kind != wanted:
        raise ProfileError(f"{source}: kind is {kind!r}, but a {wanted} profile was asked for")


@functools.lru_cache(maxsize=32)
def load_hardware(name_or_path: str = DEFAULT_HARDWARE) -> HardwareProfile:
    """The hardware profile `name_or_path` (built-in name, or path to a YAML/JSON file)."""
    source, data = _read(name_or_path)
    r = _Reader(source, data)
    _kind(source, r, "hardware")
    nccl = _nccl(r.sub("nccl"))
    car = _custom_all_reduce(source, r("custom_all_reduce", None))
    cc = _compute_capability(source, r)
    hw = HardwareProfile(
        name=str(r("name")),
        description=str(r("description", "")),
        gpus=int(r("gpus")),
        gpu_name=str(r("gpu_name")),
        gpu_memory_gib=float(r("gpu_memory_gib")),
        interconnect=str(r("interconnect")),
        compute_speed=float(r("compute_speed")),
        launch_us_graph=float(r("launch_us_graph")),
        launch_us_eager=float(r("launch_us_eager")),
        eager_us_per_layer=float(r("eager_us_per_layer")),
        default_cuda_graph_max_bs=int(r("default_cuda_graph_max_bs")),
        kv_cache_tokens=int(r("kv_cache_tokens")),
        nccl=nccl,
        custom_all_reduce=car,
        custom_all_reduce_unavailable=str(r("custom_all_reduce_unavailable", "")),
        per_unique_expert_factor=_factor(source, r, "per_unique_expert_factor", 1.0),
        per_token_factor=_factor(source, r, "per_token_factor", 1.0),
        verify_overhead_gpu_share=_factor(source, r, "verify_overhead_gpu_share", 0.0, at_most=1.0),
        compute_capability=cc,
        nodes=int(r("nodes", 1)),
        nvlink_multicast=bool(r("nvlink_multicast", False)),
        flashinfer_fusion=_timing(source, r, "flashinfer_fusion"),
        pcie_ipc=_timing(source, r, "pcie_ipc"),
        pcie_ipc_unavailable=str(r("pcie_ipc_unavailable", "")),
        torch_symm_mem=_timing(source, r, "torch_symm_mem"),
        mscclpp=_timing(source, r, "mscclpp"),
    )
    _calibration(source, r, data)
    r.done()
    return hw


def _calibration(source: str, r: _Reader, data: Mapping[str, Any]) -> None:
    """`calibration`: free-form notes on where the numbers come from, required with re-weighed model terms."""
    calibration = r("calibration", None)
    weighted = [k for k in ("per_unique_expert_factor", "per_token_factor", "verify_overhead_gpu_share") if k in data]
    if weighted and not str(calibration or "").strip():
        raise ProfileError(
            f"{source}: {', '.join(weighted)} re-weigh the model's fitted terms; "
            f"calibration must say what they are fitted to"
        )


def _nccl(n: _Reader) -> NcclProfile:
    """The hardware profile's `nccl` section."""
    nccl = NcclProfile(
        version=str(n("version")),
        ring_hops={int(tp): {str(k): int(v) for k, v in hops.items()} for tp, hops in n("ring_hops").items()},
        p2p_default_level=str(n("p2p_default_level")),
        p2p_gbps={str(k): float(v) for k, v in n("p2p_gbps").items()},
        shm_gbps=float(n("shm_gbps")),
        net_gbps=float(n("net_gbps")),
        hop_us={str(t): {str(p): float(v) for p, v in row.items()} for t, row in n("hop_us").items()},
        efficiency={str(k): float(v) for k, v in n("efficiency").items()},
        per_thread_gbps={str(k): float(v) for k, v in n("per_thread_gbps").items()},
        thread_threshold_bytes={str(k): int(v) for k, v in n("thread_threshold_bytes").items()},
        thread_sync_us=float(n("thread_sync_us")),
        channel_us=float(n("channel_us")),
        default_channels=int(n("default_channels")),
        max_channels=int(n("max_channels")),
        default_nthreads=int(n("default_nthreads")),
        default_buffsize=int(n("default_buffsize")),
        auto_protocol=tuple((None if b is None else int(b), str(p)) for b, p in n("auto_protocol")),
        tree_latency_factor=float(n("tree_latency_factor")),
        tree_bandwidth_factor=float(n("tree_bandwidth_factor")),
        shm_staging_penalty=float(n("shm_staging_penalty")),
    )
    n.done()
    return nccl


def _custom_all_reduce(source: str, data: Any) -> CustomAllReduce | None:
    """The `custom_all_reduce` section (None: the host has none)."""
    if data is None:
        return None
    c = _Reader(source, data, "custom_all_reduce.")
    car = CustomAllReduce(
        world_sizes=tuple(int(w) for w in c("world_sizes")),
        max_bytes=int(c("max_bytes")),
        base_us=float(c("base_us")),
        gbps=float(c("gbps")),
    )
    c.done()
    return car


def _compute_capability(source: str, r: _Reader) -> tuple[int, int]:
    cc = str(r("compute_capability", "0.0")).split(".")
    if len(cc) != 2 or not all(part.isdigit() for part in cc):
        raise ProfileError(f"{source}: compute_capability must be 'major.minor' such as 9.0, got {'.'.join(cc)!r}")
    return int(cc[0]), int(cc[1])


def _timing(source: str, r: _Reader, key: str) -> BackendTiming | None:
    """An all-reduce backend's timing: {base_us, gbps} or {points: [[bytes, us], ...]}, and a `source`
    saying where the figures come from; absent or null: the host has no such backend."""
    data = r(key, None)
    if data is None:
        return None
    t = _Reader(source, data, f"{key}.")
    if not str(t("source", "")).strip():
        raise ProfileError(f"{source}: {key}.source must say where the figures come from")
    points = tuple((int(b), float(us)) for b, us in t("points", ()))
    timing = BackendTiming(base_us=float(t("base_us", 0.0)), gbps=float(t("gbps", 0.0)), points=points)
    t.done()
    if not points and timing.gbps <= 0:
        raise ProfileError(f"{source}: {key} needs points or gbps > 0")
    return timing


def _factor(source: str, r: _Reader, key: str, default: float, at_most: float | None = None) -> float:
    """A non-negative number (at most `at_most` when given), `default` when the key is absent."""
    value = r(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or value < 0
        or (at_most is not None and value > at_most)
    ):
        bound = f"0 <= {key} <= {at_most}" if at_most is not None else f"{key} >= 0"
        raise ProfileError(f"{source}: {bound} must hold, but got {key}={value!r}")
    return float(value)


def _seconds(source: str, r: _Reader, key: str) -> float:
    value = r(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ProfileError(f"{source}: {r.where}{key} must be a number of seconds >= 0, got {value!r}")
    return float(value)


def _spec_triple(source: str, value: Any) -> tuple[int, int, int]:
    """`default_spec`: (steps, topk, draft tokens), three integers."""
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise ProfileError(f"{source}: default_spec must be [steps, topk, draft_tokens], got {value!r}")
    return int(value[0]), int(value[1]), int(value[2])


_DRAFTER_COSTS = ("draft_step_ms", "draft_extend_ms", "draft_per_token_ms")


def _drafter(source: str, name: str, d: Any) -> Drafter:
    """One `drafters.<name>` entry: acceptance and width, its shape (tree, block, lookup), the block's
    per-position acceptance, and its own draft costs where they differ from the model's EAGLE drafter."""
    dr = _Reader(source, d, f"drafters.{name}.")
    shape = str(dr("shape", "tree"))
    if shape not in ("tree", "block", "lookup"):
        raise ProfileError(f"{source}: drafters.{name}.shape must be tree, block or lookup, got {shape!r}")
    costs = {k: (None if (v := dr(k, None)) is None else float(v)) for k in _DRAFTER_COSTS}
    collectives, block = dr("draft_collectives", None), dr("block_size", None)
    drafter = Drafter(
        acceptance=float(dr("acceptance")),
        width_exponent=float(dr("width_exponent", 0.5)),
        shape=shape,  # type: ignore[arg-type]  # checked above
        position_acceptance=tuple(float(a) for a in dr("position_acceptance", ())),
        block_size=None if block is None else int(block),
        draft_collectives=None if collectives is None else int(collectives),
        **costs,
    )
    dr("doc", None)
    dr("source", None)
    dr.done()
    return drafter


@functools.lru_cache(maxsize=32)
def load_model(name_or_path: str = DEFAULT_MODEL) -> ModelProfile:
    """The model profile `name_or_path` (built-in name, or path to a YAML/JSON file)."""
    source, data = _read(name_or_path)
    r = _Reader(source, data)
    _kind(source, r, "model")
    drafters = {str(name).lower(): _drafter(source, str(name), d) for name, d in r("drafters").items()}
    ld = r.sub("load")
    load_weights_s, graph_capture_s = _seconds(source, ld, "weights_s"), _seconds(source, ld, "graph_capture_s")
    if not str(ld("source", "")).strip():
        raise ProfileError(f"{source}: load.source must say where the load-time figures come from")
    ld.done()
    model = ModelProfile(
        name=str(r("name")),
        description=str(r("description", "")),
        architectures=tuple(r("architectures")),
        model_type=str(r("model_type")),
        layers=int(r("layers")),
        hidden_size=int(r("hidden_size")),
        dtype_bytes=int(r("dtype_bytes")),
        allreduces_per_layer=int(r("allreduces_per_layer")),
        experts=int(r("experts")),
        experts_per_token=int(r("experts_per_token")),
        context_length=int(r("context_length")),
        reference_tp=int(r("reference_tp")),
        forward_fixed_ms=float(r("forward_fixed_ms")),
        forward_per_unique_expert_ms=float(r("forward_per_unique_expert_ms")),
        forward_per_token_ms=float(r("forward_per_token_ms")),
        verify_overhead_ms=float(r("verify_overhead_ms")),
        verify_overhead_decode_attention={str(k): float(v) for k, v in r("verify_overhead_decode_attention").items()},
        draft_step_ms=float(r("draft_step_ms")),
        draft_extend_ms=float(r("draft_extend_ms")),
        draft_per_token_ms=float(r("draft_per_token_ms")),
        draft_collectives=int(r("draft_collectives")),
        prefill_fixed_ms=float(r("prefill_fixed_ms")),
        prefill_per_token_ms=float(r("prefill_per_token_ms")),
        drafters=drafters,
        default_spec=_spec_triple(source, r("default_spec")),
        load_weights_s=load_weights_s,
        graph_capture_s=graph_capture_s,
    )
    r("calibration", None)
    r.done()
    return model
