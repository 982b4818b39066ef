"""SGLang 0.5.23's rules before launch for speculative decoding, as pure functions over a point: which
rule it breaks (`Rule`) and the sentence with its numbers (`Infeasible`), or None.

Read from 0.5.23's source (`sglang/srt/arg_groups/speculative_hook.py`, dispatched per algorithm by
`speculative/spec_info.py` `SpeculativeAlgorithm.handle_server_args`): a point SGLang refuses, or runs
other than asked (a value it overrides with a warning, a knob it never reads), is refused here, so it
costs no server start and no trial is the same server counted under two names. `speculation.py` says
which rules each algorithm obeys.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.config import adaptive as adaptive_config
from orchestrator.records import ParamValue

EAGLE_KNOBS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")


class Rule(str, enum.Enum):
    """Which rule a point breaks; the value is the rule in words (what `sweep plan` counts by)."""

    without_algorithm = "EAGLE knobs set without speculative_algorithm"
    all_or_none = "EAGLE needs steps, top-k and draft tokens all together or none"
    topk_one = "top-k 1 forces draft tokens = steps + 1"
    tree_capacity = "draft tokens - 1 <= topk + (steps - 1) * topk^2"
    adaptive_chain = "speculative_adaptive runs a chain: top-k 1"
    adaptive_steps = "speculative_adaptive needs steps in the adaptive slots' union (0, 1, 3, 5, 7 by default)"
    zero_steps = "speculative_num_steps 0 only with speculative_adaptive"
    adaptive_config_alone = "speculative_adaptive_config without speculative_adaptive (SGLang never reads it)"
    backend_unavailable = "all_reduce_backend this host or model cannot take (SGLang 0.5.23)"
    adaptive_algorithm = "speculative_adaptive only with EAGLE or EAGLE3 (SGLang 0.5.23 turns it off otherwise)"
    foreign_knob = "a knob the speculative algorithm never reads"
    dflash_single_pass = "DFLASH drafts in one pass: steps and top-k are 1 (SGLang 0.5.23 overrides others)"
    dflash_block = "DFLASH: draft tokens and block size must match"
    ngram_topk = "NGRAM sets top-k from speculative_ngram_max_bfs_breadth"


@dataclass(frozen=True)
class Infeasible:
    """Why SGLang would not run a point as asked: the rule and the sentence with the point's numbers."""

    rule: Rule
    detail: str

    def __str__(self) -> str:
        return self.detail


def _int(params: Mapping[str, ParamValue], name: str) -> int | None:
    value = params.get(name)
    return None if value is None else int(value)


def foreign(algorithm: str, params: Mapping[str, ParamValue], own: tuple[str, ...]) -> Infeasible | None:
    """A knob of another algorithm set beside `algorithm` (SGLang reads it only for its own algorithm:
    the trial would be the same server as without it)."""
    from_others = [k for k in ALGORITHM_KNOBS if k not in own and params.get(k) is not None]
    if not from_others:
        return None
    return Infeasible(
        Rule.foreign_knob,
        f"{', '.join(from_others)} set with speculative_algorithm {algorithm}, which never reads "
        f"{'it' if len(from_others) == 1 else 'them'} (SGLang 0.5.23 speculative_hook.py), so the trial would "
        f"run the same server as without; add `when:` to the knob",
    )


ALGORITHM_KNOBS = (
    "speculative_draft_model_path",
    "speculative_dflash_block_size",
    "speculative_ngram_min_bfs_breadth",
    "speculative_ngram_max_bfs_breadth",
    "speculative_ngram_match_type",
    "speculative_ngram_max_trie_depth",
    "speculative_ngram_capacity",
)
"""The knobs one algorithm reads and others ignore (each algorithm's `own` says which are its)."""


def without_algorithm(params: Mapping[str, ParamValue]) -> Infeasible | None:
    """Speculative knobs set while speculative_algorithm is not (SGLang reads none of them then)."""
    given = [k for k in (*EAGLE_KNOBS, *ALGORITHM_KNOBS) if params.get(k) is not None]
    given += ["speculative_adaptive"] * bool(params.get("speculative_adaptive"))
    given += ["speculative_adaptive_config"] * (params.get("speculative_adaptive_config") is not None)
    if not given:
        return None
    return Infeasible(Rule.without_algorithm, f"{', '.join(given)} set without speculative_algorithm")


def adaptive_config_alone(params: Mapping[str, ParamValue]) -> Infeasible | None:
    if params.get("speculative_adaptive_config") is None or params.get("speculative_adaptive"):
        return None
    return Infeasible(
        Rule.adaptive_config_alone,
        "speculative_adaptive_config set without speculative_adaptive: "
        "SGLang 0.5.23 reads the file only with --speculative-adaptive",
    )


def adaptive_unsupported(algorithm: str, params: Mapping[str, ParamValue]) -> Infeasible | None:
    """adaptive_spec_params.py `adaptive_unsupported_reason`: only EAGLE/EAGLE3; any other algorithm gets a
    warning and static steps (`_maybe_disable_adaptive`), so the point would not run as asked."""
    if not params.get("speculative_adaptive"):
        return None
    return Infeasible(
        Rule.adaptive_algorithm,
        f"speculative_adaptive with speculative_algorithm {algorithm}: SGLang 0.5.23 supports it only for "
        f"EAGLE/EAGLE3 and falls back to static steps with a warning (adaptive_spec_params.py "
        f"adaptive_unsupported_reason); add `when: {{speculative_algorithm: EAGLE3}}` to speculative_adaptive",
    )


def eagle_chain(params: Mapping[str, ParamValue]) -> Infeasible | None:
    """The EAGLE family's steps, top-k and draft tokens (speculative_hook.py `_handle_eagle_family`):
    all or none; top-k 1 forces draft tokens = steps + 1; the tree must hold the draft tokens."""
    eagle = {k: params.get(k) for k in EAGLE_KNOBS}
    given = [k for k, v in eagle.items() if v is not None]
    if not given:
        return None  # SGLang chooses steps, top-k and draft tokens for the model itself
    if len(given) != 3:
        missing = [k for k in EAGLE_KNOBS if eagle[k] is None]
        return Infeasible(
            Rule.all_or_none,
            f"EAGLE needs steps, top-k and draft tokens all together or none "
            f"(SGLang asserts); missing {', '.join(missing)}",
        )
    steps, topk, ndt = (int(v) for v in eagle.values() if v is not None)
    if steps == 0:  # the tool's rule: a fixed chain of no draft steps is not speculation
        return Infeasible(
            Rule.zero_steps,
            "speculative_num_steps 0 drafts nothing: it exists only as a slot's "
            "step of speculative_adaptive (SGLang 0.5.23 DEFAULT_ADAPTIVE_CONFIG); "
            "for no drafting leave speculative_algorithm unset",
        )
    return _tree(steps, topk, ndt)


def _tree(steps: int, topk: int, ndt: int) -> Infeasible | None:
    if topk == 1 and ndt != steps + 1:
        return Infeasible(
            Rule.topk_one,
            f"top-k 1 forces draft tokens = steps + 1 = {steps + 1}, but got {ndt} "
            f"(SGLang would silently run {steps + 1})",
        )
    capacity = topk + (steps - 1) * topk * topk
    if ndt - 1 > capacity:
        return Infeasible(
            Rule.tree_capacity,
            f"draft tokens - 1 <= topk + (steps - 1) * topk^2 must hold, but got "
            f"{ndt} - 1 > {topk} + {steps - 1}*{topk}^2 = {capacity}",
        )
    return None


def adaptive_eagle(params: Mapping[str, ParamValue]) -> Infeasible | None:
    """Why SGLang 0.5.23 refuses --speculative-adaptive with these EAGLE settings and adaptive config (a
    path, None: the default slots), or None (`_init_adaptive_speculative_params`, `adaptive_unsupported_reason`)."""
    steps, topk, ndt = (params.get(k) for k in EAGLE_KNOBS)
    config = params.get("speculative_adaptive_config")
    try:
        union = adaptive_config.load(None if config is None else str(config)).candidate_steps
    except ValueError as exc:
        return Infeasible(Rule.adaptive_steps, f"speculative_adaptive_config: {exc}")
    if topk is not None and int(topk) != 1:
        return Infeasible(
            Rule.adaptive_chain,
            f"speculative_adaptive runs a chain (top-k 1, draft tokens = steps + 1), "
            f"but got speculative_eagle_topk {topk}",
        )
    if steps is not None and int(steps) not in union:
        return Infeasible(
            Rule.adaptive_steps,
            f"--speculative-num-steps={steps} is not in the adaptive config "
            f"candidate_steps [{', '.join(map(str, union))}] (SGLang 0.5.23 raises ValueError)",
        )
    if steps is not None and ndt is not None and int(ndt) != int(steps) + 1:
        return Infeasible(
            Rule.topk_one,
            f"top-k 1 forces draft tokens = steps + 1 = {int(steps) + 1}, but got {ndt} "
            f"(SGLang would silently run {int(steps) + 1})",
        )
    return None


def dflash(params: Mapping[str, ParamValue]) -> Infeasible | None:
    """speculative_hook.py `_handle_dflash`: steps and top-k other than 1 are overridden to 1 with a warning;
    --speculative-num-draft-tokens and --speculative-dflash-block-size both set and different is a ValueError."""
    bent = [k for k in EAGLE_KNOBS[:2] if (v := _int(params, k)) is not None and v != 1]
    if bent:
        return Infeasible(
            Rule.dflash_single_pass,
            f"DFLASH drafts a whole block in one pass: SGLang 0.5.23 overrides {', '.join(bent)} to 1 with a "
            f"warning (_handle_dflash), so the trial would not run as named; leave "
            f"{'it' if len(bent) == 1 else 'them'} out for DFLASH (the block size is the knob)",
        )
    block, ndt = _int(params, "speculative_dflash_block_size"), _int(params, "speculative_num_draft_tokens")
    if block is not None and ndt is not None and block != ndt:
        return Infeasible(
            Rule.dflash_block,
            f"Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set but they differ "
            f"({ndt} vs {block}); SGLang 0.5.23 raises ValueError (_handle_dflash); set only the block size",
        )
    return None


def ngram(params: Mapping[str, ParamValue]) -> Infeasible | None:
    """speculative_hook.py `_handle_ngram`: top-k is overwritten with --speculative-ngram-max-bfs-breadth."""
    topk = params.get("speculative_eagle_topk")
    if topk is None:
        return None
    return Infeasible(
        Rule.ngram_topk,
        f"speculative_eagle_topk {topk} with NGRAM: SGLang 0.5.23 overwrites it with "
        f"speculative_ngram_max_bfs_breadth (_handle_ngram); tune that knob instead",
    )
