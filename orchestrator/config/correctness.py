"""promotion.correctness: the correctness gate's settings (verdict/correctness_gate.py applies them).

Kept beside experiment.py, whose PromotionSpec takes the field from `Gated`.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from orchestrator.config.fields import Int
from orchestrator.config.space import Strict

__all__ = ["CorrectnessSpec", "Gated", "MAX_PROMPTS"]

MAX_PROMPTS = 16
"""The fixed prompt set's size (orchestrator/trial/outputs.py PROMPTS)."""


class CorrectnessSpec(Strict):
    """The correctness gate: before promotion, the configuration's greedy outputs (temperature 0) of a
    fixed prompt set are compared with the baseline's, both captured in the first confirmation round."""

    enabled: bool = True
    """Refuse to promote a configuration whose outputs changed; false: promote on speed alone."""
    prompts: Annotated[int, Int(1, MAX_PROMPTS)] = 8
    """How many of the fixed prompts (orchestrator/trial/outputs.py PROMPTS) each side decodes."""
    max_new_tokens: Annotated[int, Int(8, 2048)] = 256
    """Greedy tokens per prompt."""
    tolerance_nats: Annotated[float, Field(strict=False, gt=0, le=20)] = 0.5
    """Where the token streams differ (SGLang is not bit-deterministic across batch shapes and
    all-reduce settings), the baseline's server scores the other output: no token of it may lie more
    than this many nats (natural-log probability) below the baseline's own top choice at its position."""

    screen: bool = True
    """The search's trials capture their greedy outputs too (the first baseline's with its 5 best tokens at
    each position), and a trial whose first token that leaves the baseline's output the baseline puts more
    than tolerance_nats below its own top choice is measured but never a candidate, and the sampler
    learns to avoid it (sweep/_screen.py); the confirmation's gate still checks what it promotes in full.
    false: only the confirmation checks outputs."""
    top_logprobs: ClassVar[int] = 5
    """The baseline capture's best tokens per position (SGLang's top_logprobs_num) the screen reads."""


class Gated(Strict):
    """The promotion's correctness field (PromotionSpec's base)."""

    correctness: CorrectnessSpec = Field(default_factory=CorrectnessSpec)
    """The correctness gate: a configuration whose greedy outputs differ from the baseline's (equal token
    streams, else the baseline's logprob score within tolerance_nats) is never promoted."""
