"""What one trial costs in real-scale seconds: server start-up, warm-up and the benchmark's repeats.

Pure arithmetic over the profiles (no I/O), for planning a night: `sweep plan` divides the wall
time by `TrialCost.total_s`. Start-up is the model profile's load figure (weights + CUDA-graph
capture, `load.source` says where it comes from); the benchmark sends `requests` requests in waves
of `concurrency`, each wave a prefill of `input_len` tokens and `output_len` tokens decoded at the
per-stream `decode_tok_s` the model predicts (or a trial measured). Scheduling gaps, health checks
and shutdown (a few seconds) are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.simulator.model import HardwareProfile, ModelProfile

SIMULATED_START_S = 2.5
"""Seconds from launch to ready of a simulated server that sleeps no load time (--sim-time-scale 0): its
imports and rank workers, about 2.6 s measured on the 2-core machine (issue 18)."""


@dataclass(frozen=True)
class TrialCost:
    """Real-scale seconds of one trial, by phase."""

    load_s: float
    """Server start-up: weights loaded and CUDA graphs captured."""
    warmup_s: float
    """The benchmark's warm-up requests, one after another."""
    benchmark_s: float
    """Every repeat of the measured benchmark together."""

    @property
    def total_s(self) -> float:
        return self.load_s + self.warmup_s + self.benchmark_s


def trial_cost(
    model: ModelProfile,
    hardware: HardwareProfile,
    *,
    decode_tok_s: float,
    requests: int,
    output_len: int,
    concurrency: int = 1,
    repeats: int = 1,
    warmup_requests: int = 0,
    input_len: int = 0,
    tp: int | None = None,
    cuda_graph: bool = True,
) -> TrialCost:
    """Expected real-scale seconds of one trial of `model` on `hardware` decoding at `decode_tok_s`.

    `decode_tok_s` is one stream's decode rate (`Prediction.decode_tok_s`); `tp` defaults to every
    GPU of the host. Raises ValueError for a non-positive rate or counts (a failed prediction has
    no cost to plan with).
    """
    if not decode_tok_s > 0:
        raise ValueError(f"decode_tok_s must be > 0, but got {decode_tok_s}")
    for name, value in (
        ("requests", requests),
        ("output_len", output_len),
        ("concurrency", concurrency),
        ("repeats", repeats),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, but got {value}")
    if warmup_requests < 0 or input_len < 0:
        raise ValueError(f"warmup_requests and input_len must be >= 0, but got ({warmup_requests}, {input_len})")
    ranks = tp or hardware.gpus
    scale = model.reference_tp / ranks / hardware.compute_speed
    prefill_s = (model.prefill_fixed_ms + model.prefill_per_token_ms * input_len) * scale / 1e3
    request_s = prefill_s + output_len / decode_tok_s
    waves = math.ceil(requests / concurrency)
    load = model.load_weights_s + (model.graph_capture_s if cuda_graph else 0.0)
    return TrialCost(load_s=load, warmup_s=warmup_requests * request_s, benchmark_s=repeats * waves * request_s)
