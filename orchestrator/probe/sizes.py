"""The all-reduce message sizes a probe measures, from the model's shape and the experiment.

A tensor-parallel all-reduce moves `tokens x hidden_size x dtype_bytes` bytes. Decode moves one
token per running request; a verify pass moves `draft tokens` per request (one size per draft-token
value the space can choose, 1..16); a prefill moves a chunk of the prompt. A few large sizes show
each setting's bandwidth, which a latency-only ranking would miss.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from orchestrator.config.experiment import SweepSpec
from orchestrator.records import Frozen

SizeKind = Literal["decode", "verify", "prefill", "large"]
MAX_VERIFY_TOKENS = 16
"""Verify sizes beyond 16 draft tokens are left out: they cost probe time and trials rarely win there."""
LARGE_BYTES = (1 << 20, 16 << 20, 32 << 20)
DEFAULT_PREFILL_CHUNK = 8192
"""SGLang's default --chunked-prefill-size on large GPUs (tokens)."""


class ProbeSize(Frozen):
    """One message size: what it stands for and its bytes."""

    label: str
    """decode, verify-<n>, prefill-<tokens>, large-<MiB>MiB."""
    kind: SizeKind
    tokens: int | None
    """Tokens in the message (all concurrent requests together); None for the large sizes."""
    nbytes: int


def message_sizes(
    hidden_size: int,
    dtype_bytes: int,
    *,
    draft_tokens: Iterable[int] = (),
    concurrency: int = 1,
    prefill_tokens: int = 0,
    large: Iterable[int] = LARGE_BYTES,
) -> tuple[ProbeSize, ...]:
    """Decode, verify, prefill and large sizes, smallest first within each kind, without duplicates.

    `concurrency` requests decode together, so decode and verify messages carry that many times the
    tokens. Draft-token values outside 1..16 are left out.
    """
    if hidden_size < 1 or dtype_bytes < 1 or concurrency < 1:
        raise ValueError(
            f"hidden_size, dtype_bytes and concurrency must be >= 1, but got "
            f"({hidden_size}, {dtype_bytes}, {concurrency})"
        )
    token_bytes = hidden_size * dtype_bytes
    sizes = [ProbeSize(label="decode", kind="decode", tokens=concurrency, nbytes=concurrency * token_bytes)]
    for n in sorted({int(n) for n in draft_tokens if 1 <= int(n) <= MAX_VERIFY_TOKENS}):
        tokens = n * concurrency
        sizes.append(ProbeSize(label=f"verify-{n}", kind="verify", tokens=tokens, nbytes=tokens * token_bytes))
    if prefill_tokens > 0:
        sizes.append(
            ProbeSize(
                label=f"prefill-{prefill_tokens}",
                kind="prefill",
                tokens=prefill_tokens,
                nbytes=prefill_tokens * token_bytes,
            )
        )
    for nbytes in sorted(set(large)):
        sizes.append(ProbeSize(label=f"large-{nbytes / (1 << 20):g}MiB", kind="large", tokens=None, nbytes=nbytes))
    return tuple(sizes)


def draft_token_values(spec: SweepSpec, default: int) -> tuple[int, ...]:
    """The draft-token values the experiment's space can choose (the model's default when it has none)."""
    param = spec.space.params.get("speculative_num_draft_tokens")
    if param is None:
        return (default,)
    return tuple(sorted({int(v) for v in param.values() if isinstance(v, int) and not isinstance(v, bool)}))


def sizes_for(spec: SweepSpec, hidden_size: int, dtype_bytes: int, default_draft_tokens: int) -> tuple[ProbeSize, ...]:
    """The sizes to probe for an experiment: its draft-token values, its benchmark's concurrency, a
    prefill chunk of its prompt length (at most the chunked-prefill size)."""
    chunk = spec.server.flags.get("chunked-prefill-size")
    chunk_tokens = (
        int(chunk) if isinstance(chunk, int) and not isinstance(chunk, bool) and chunk > 0 else DEFAULT_PREFILL_CHUNK
    )
    return message_sizes(
        hidden_size,
        dtype_bytes,
        draft_tokens=draft_token_values(spec, default_draft_tokens),
        concurrency=spec.benchmark.concurrency,
        prefill_tokens=min(spec.benchmark.input_len, chunk_tokens),
    )
