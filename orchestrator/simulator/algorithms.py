"""What each speculative algorithm is to the performance model: its drafter (acceptance per position, draft
cost, verify window, from the model profile's `drafters.<key>` with their sources) and how SGLang 0.5.23
resolves its steps, top-k and draft tokens (`arg_groups/speculative_hook.py`).

Three shapes of a decode cycle of `c` running requests:

  tree  (EAGLE, EAGLE3, STANDALONE): s draft steps over c*k tokens, a verify of c*n, a draft-extend of c*n;
        depth d accepted with a(c_d) = 1 - (1 - p) * c_d^-w, c_d the tree's width at d (model.py);
  block (DFLASH): one draft pass over the block (c*n tokens) proposes n-1 tokens at once, a verify of c*n as
        a chain (top-k 1), and a draft-extend that feeds the verified hidden states back; position d is
        accepted with p_d (`position_acceptance`, else p each);
  lookup (NGRAM): no draft model: a trie lookup on the host per request (draft_step_ms + per request), a verify
        of c*n tokens as a tree of up to max-BFS-breadth branches (SGLang takes it as top-k), depth up to n-1;
        no draft-extend and no draft collectives.

Nothing here does I/O; the simulator room imports nothing of the orchestrator.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

Shape = Literal["tree", "block", "lookup"]

DFLASH_DEFAULT_BLOCK = 16
"""0.5.23 `_handle_dflash`: the block size when neither flag nor the drafter's config gives one."""
NGRAM_DEFAULTS = {"max_bfs_breadth": 10, "draft_tokens": 12}
"""0.5.23 `_handle_ngram` and `arg_groups/fields/spec.py`: top-k = --speculative-ngram-max-bfs-breadth (default
10), --speculative-num-draft-tokens default 12, steps = draft tokens // top-k."""


@dataclass(frozen=True, eq=False)
class Drafter:
    acceptance: float
    """Probability that a single draft token at a position is accepted (top-k 1)."""
    width_exponent: float
    """How fast more candidates per depth raise acceptance: a(c) = 1 - (1 - p) * c^-width_exponent."""
    shape: Shape = "tree"
    position_acceptance: tuple[float, ...] = ()
    """block: the acceptance of each position given the one before (empty: `acceptance` at every position)."""
    block_size: int | None = None
    """block: the drafter config's block size (what SGLang infers when --speculative-dflash-block-size is unset)."""
    draft_step_ms: float | None = None
    """The drafter's own costs (None: the model profile's EAGLE drafter costs)."""
    draft_extend_ms: float | None = None
    draft_per_token_ms: float | None = None
    draft_collectives: int | None = None


@dataclass(frozen=True)
class Speculation:
    """Steps, top-k and draft tokens as SGLang 0.5.23 resolves them for one algorithm."""

    drafter: str
    steps: int
    topk: int
    draft_tokens: int


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _tree(params: Mapping[str, Any], default: tuple[int, int, int]) -> tuple[int, int, int] | str:
    """`_handle_eagle_family`: all or none (else SGLang asserts), top-k 1 forces steps + 1, the tree holds them."""
    steps, topk, ndt = (
        _int(params.get(k)) for k in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
    )
    if steps is None:
        if topk is not None or ndt is not None:
            return "AssertionError: speculative_eagle_topk/num_draft_tokens given without speculative_num_steps"
        return default
    if topk is None or (ndt is None and topk != 1):  # SGLang completes only top-k 1 (spec_resolve._partial_eagle)
        return "speculative_num_steps, speculative_eagle_topk and speculative_num_draft_tokens go together"
    ndt = steps + 1 if topk == 1 else int(ndt or 0)
    if ndt - 1 > topk + (steps - 1) * topk * topk:
        return (
            f"RuntimeError: selected index k out of range (torch.topk of {ndt - 1} draft tokens over "
            f"{topk + (steps - 1) * topk * topk} candidates at cuda graph capture)"
        )
    return steps, topk, ndt


def _block(params: Mapping[str, Any], drafter: Drafter) -> tuple[int, int, int] | str:
    """`_handle_dflash`: steps and top-k 1; draft tokens = the block (flag, else the drafter's config, else 16)."""
    block, ndt = _int(params.get("speculative_dflash_block_size")), _int(params.get("speculative_num_draft_tokens"))
    if block is not None and ndt is not None and block != ndt:
        return (
            "ValueError: Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set but they "
            f"differ. For DFLASH they must match. speculative_num_draft_tokens={ndt}, speculative_dflash_block_size={block}."
        )
    return 1, 1, block or ndt or drafter.block_size or DFLASH_DEFAULT_BLOCK


def _lookup(params: Mapping[str, Any]) -> tuple[int, int, int]:
    """`_handle_ngram`: top-k = max BFS breadth, draft tokens default 12, steps = draft tokens // top-k."""
    topk = _int(params.get("speculative_ngram_max_bfs_breadth")) or NGRAM_DEFAULTS["max_bfs_breadth"]
    ndt = _int(params.get("speculative_num_draft_tokens")) or NGRAM_DEFAULTS["draft_tokens"]
    steps = _int(params.get("speculative_num_steps"))
    return (ndt // topk if steps is None else steps), topk, ndt


def speculation(
    algorithm: str, params: Mapping[str, Any], drafters: Mapping[str, Drafter], default: tuple[int, int, int]
) -> Speculation | str:
    """The resolved speculation of `algorithm` (upper case, NEXTN already EAGLE), or why it fails."""
    key = algorithm.lower()
    drafter = drafters.get(key)
    if drafter is None:
        return f"speculative algorithm {algorithm} is not modelled for this model (its profile has no drafters.{key})"
    if drafter.shape == "block":
        resolved = _block(params, drafter)
    elif drafter.shape == "lookup":
        resolved = _lookup(params)
    else:
        resolved = _tree(params, default)
    if isinstance(resolved, str):
        return resolved
    return Speculation(key, *resolved)


def verify_is_chain(drafter: Drafter, topk: int) -> bool:
    """Whether the verify window is a chain (the decode-attention factor 'chain') or a tree."""
    return drafter.shape == "block" or topk == 1


@functools.lru_cache(maxsize=4096)
def tree_widths(acceptance: float, width_exponent: float, steps: int, topk: int, draft_tokens: int) -> tuple[int, ...]:
    """How many draft tokens the verified tree spends on each depth (greedy, shallow first)."""
    budget = max(draft_tokens - 1, 0)
    depth = min(steps, budget)
    widths = [1] * depth
    budget -= depth

    def expected(w: list[int]) -> float:
        total, prod = 1.0, 1.0
        for c in w:
            prod *= 1.0 - (1.0 - acceptance) * c**-width_exponent
            total += prod
        return total

    while budget > 0:
        base = expected(widths)
        gains = []
        for d in range(depth):
            if widths[d] < topk:
                widths[d] += 1
                gains.append((expected(widths) - base, -d))
                widths[d] -= 1
        if not gains:
            break
        _, neg_d = max(gains)
        widths[-neg_d] += 1
        budget -= 1
    return tuple(widths)


@functools.lru_cache(maxsize=4096)
def depth_acceptance(drafter: Drafter, steps: int, topk: int, draft_tokens: int) -> tuple[float, ...]:
    """Probability that the draft at each depth is accepted, given the one before it was."""
    if drafter.shape == "block":
        positions = max(draft_tokens - 1, 0)
        given = drafter.position_acceptance
        return tuple(given[d] if d < len(given) else drafter.acceptance for d in range(positions))
    if drafter.shape == "lookup":  # a trie match may run as deep as the window
        steps = max(draft_tokens - 1, 0)
    widths = tree_widths(drafter.acceptance, drafter.width_exponent, steps, topk, draft_tokens)
    return tuple(1.0 - (1.0 - drafter.acceptance) * c**-drafter.width_exponent for c in widths)


def expected_accept_length(per_depth: Iterable[float]) -> float:
    total, prod = 1.0, 1.0
    for a in per_depth:
        prod *= a
        total += prod
    return total
