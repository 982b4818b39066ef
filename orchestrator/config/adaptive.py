"""SGLang 0.5.23's adaptive speculation config (`--speculative-adaptive-config`), read and checked as 0.5.23
reads and checks it, from its source (`sglang/srt/speculative/adaptive_spec_params.py`; never run on a GPU
here):

- `DEFAULT_ADAPTIVE_CONFIG`: one slot per batch size, {1: [1, 3, 5, 7], 8: [0, 1, 3], 32: [0, 1], 64: [0]}
  (step 0: no drafting); every other key of the JSON object is a tuning knob shared by the slots
  (ema_alpha, update_interval, warmup_batches, up/down_hysteresis, ceiling_coeff), which a slot's own entry
  overrides (`AdaptiveSpeculativeParams.__init__`: `{**cfg, **entry}`).
- `_load_adaptive_config`: keys that are not all digits are skipped as slots; a slot's `candidate_steps`
  must be a non-empty list of non-negative ints; at least one slot must exist.
- `resolve_candidate_steps_from_config`: the union of the slots' steps; `--speculative-num-steps` must be
  one of it (`arg_groups/speculative_hook.py` `_init_adaptive_speculative_params`, which also sets a missing
  steps to the union's middle element and a missing top-k to 1).
- `AdaptiveSpeculativeParams._route`: a running batch is padded up to the next captured CUDA-graph batch
  size, then served by the slot of the largest batch size at or below it (the smallest slot when below all);
  each slot keeps its own EMA of the acceptance length (`AdaptiveStepSlot`).
"""

from __future__ import annotations

import bisect
import functools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_SLOTS: Mapping[int, tuple[int, ...]] = {1: (1, 3, 5, 7), 8: (0, 1, 3), 32: (0, 1), 64: (0,)}
"""0.5.23 `DEFAULT_ADAPTIVE_CONFIG`: batch size -> candidate_steps."""

SLOT_DEFAULTS: Mapping[str, float] = {
    "ema_alpha": 0.2,
    "update_interval": 5,
    "warmup_batches": 10,
    "down_hysteresis": -0.25,
    "up_hysteresis": 0.0,
    "ceiling_coeff": 0,
}
"""0.5.23 `AdaptiveStepSlot.__init__`'s defaults for the knobs a config leaves out."""


@dataclass(frozen=True)
class Slot:
    """One batch size's adaptive state machine, as configured."""

    batch_size: int
    candidate_steps: tuple[int, ...]
    """Sorted, distinct (0.5.23 sorts and deduplicates them)."""
    ema_alpha: float = 0.2
    update_interval: int = 5
    warmup_batches: int = 10
    down_hysteresis: float = -0.25
    up_hysteresis: float = 0.0


@dataclass(frozen=True)
class AdaptiveConfig:
    """The slots of one adaptive config, smallest batch size first."""

    slots: tuple[Slot, ...]

    @property
    def candidate_steps(self) -> tuple[int, ...]:
        """The union of every slot's steps: what --speculative-num-steps must be one of."""
        return tuple(sorted({s for slot in self.slots for s in slot.candidate_steps}))

    @property
    def initial_steps(self) -> int:
        """The steps 0.5.23 starts at when --speculative-num-steps is not given (the union's middle)."""
        steps = self.candidate_steps
        return steps[len(steps) // 2]

    def slot_for(self, batch: int, cuda_graph_bs: Sequence[int] | None = None) -> Slot:
        """The slot that serves a running batch of `batch` requests (`_route`: padded to the next captured
        CUDA-graph batch size when graphs are on, then the closest slot at or below it)."""
        if cuda_graph_bs:
            graphs = sorted(cuda_graph_bs)
            i = bisect.bisect_left(graphs, batch)
            batch = graphs[i] if i < len(graphs) else batch
        sizes = [s.batch_size for s in self.slots]
        return self.slots[max(0, bisect.bisect_right(sizes, batch) - 1)]


DEFAULT = AdaptiveConfig(tuple(Slot(bs, steps) for bs, steps in sorted(DEFAULT_SLOTS.items())))


def _slot(key: str, entry: Any, shared: Mapping[str, Any]) -> Slot:
    steps = entry.get("candidate_steps") if isinstance(entry, Mapping) else None
    if not isinstance(steps, list) or not steps or not all(isinstance(s, int) and s >= 0 for s in steps):
        raise ValueError(f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
    knobs = {**SLOT_DEFAULTS, **{k: v for k, v in {**shared, **entry}.items() if k in SLOT_DEFAULTS}}
    return Slot(
        int(key),
        tuple(sorted({int(s) for s in steps})),
        float(knobs["ema_alpha"]),
        int(knobs["update_interval"]),
        int(knobs["warmup_batches"]),
        float(knobs["down_hysteresis"]),
        float(knobs["up_hysteresis"]),
    )


def parse(data: Any) -> AdaptiveConfig:
    """An adaptive config from its JSON value; ValueError with 0.5.23's message where it refuses it."""
    if not isinstance(data, Mapping):
        # 0.5.23 calls cfg.items() and fails with AttributeError; said here as what to write instead.
        raise ValueError(
            f"the adaptive config must be a JSON object of batch-size slots, e.g. "
            f'{{"1": {{"candidate_steps": [1,3,7]}}}}, got {type(data).__name__}'
        )
    shared = {k: v for k, v in data.items() if not str(k).isdigit()}
    slots = [_slot(key, entry, shared) for key, entry in data.items() if str(key).isdigit()]
    if not slots:
        raise ValueError(
            "speculative_adaptive_config must contain at least one integer-string BS key, e.g. "
            f'{{"1": {{"candidate_steps": [1,3,7]}}}}. Got keys: {list(data.keys())}'
        )
    return AdaptiveConfig(tuple(sorted(slots, key=lambda s: s.batch_size)))


@functools.lru_cache(maxsize=64)
def _load(path: str, mtime_ns: int) -> AdaptiveConfig:
    with open(path, encoding="utf-8") as f:
        return parse(json.load(f))


def load(path: str | None) -> AdaptiveConfig:
    """The adaptive config at `path` (None: 0.5.23's default). ValueError saying what is wrong with the
    file: unreadable, not JSON, or refused by 0.5.23's checks (cached per path and modification time)."""
    if path is None:
        return DEFAULT
    try:
        return _load(os.path.abspath(path), os.stat(path).st_mtime_ns)
    except OSError as exc:
        raise ValueError(f"cannot read the adaptive config {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"the adaptive config {path} is not JSON: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"the adaptive config {path}: {exc}") from None
