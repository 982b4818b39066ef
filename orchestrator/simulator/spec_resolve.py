"""SGLang 0.5.23's resolution of the speculative flags, per algorithm, on parsed server args (`cli.parse`):
what `sglang serve` would run, the warnings it logs, or the error it stops at.

Read from `sglang/srt/arg_groups/speculative_hook.py`, dispatched per algorithm as
`speculative/spec_info.py` `SpeculativeAlgorithm.handle_server_args` does: `_handle_eagle_family` (EAGLE,
EAGLE3, STANDALONE; NEXTN is EAGLE), `_handle_dflash`, `_handle_ngram`; `--speculative-adaptive` as
`_init_adaptive_speculative_params` and `adaptive_spec_params.py` (`adaptive_unsupported_reason`: only EAGLE
and EAGLE3, otherwise a warning and static steps).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.simulator.algorithms import NGRAM_DEFAULTS


@dataclass(frozen=True)
class Resolved:
    """SGLang's resolved server args, or the error resolution stops at."""

    args: dict[str, Any]
    log_warnings: tuple[str, ...] = ()
    error: str | None = None
    """A traceback's last line (`AssertionError`, `ValueError: ...`), printed with a traceback, exit code 1."""
    unsupported: str | None = None
    """What the simulator cannot model (not an SGLang error), exit code 1."""


_MAX_RUNNING_WARNING = (
    "Max running requests is reset to 48 for speculative decoding. You can override "
    "this by explicitly setting --max-running-requests."
)


def resolve(ns: argparse.Namespace) -> Resolved:
    """Apply SGLang's 0.5.23 resolution rules for speculative decoding to parsed args."""
    args = dict(vars(ns))
    algo = args.get("speculative_algorithm")
    if algo is not None:
        algo = algo.upper()
        args["speculative_algorithm"] = None if algo == "NONE" else "EAGLE" if algo == "NEXTN" else algo
    algo = args["speculative_algorithm"]
    if algo is None:
        return Resolved(args)
    handler = _HANDLERS.get(algo)
    if handler is None:
        return Resolved(
            args,
            unsupported=f"speculative algorithm {algo} is not modelled by the simulator ({', '.join(_HANDLERS)} are)",
        )
    warnings: list[str] = []
    if args.get("speculative_adaptive") and algo not in ("EAGLE", "EAGLE3"):
        args["speculative_adaptive"] = False  # _maybe_disable_adaptive
        warnings.append(
            f"speculative_adaptive disabled: speculative_algorithm={algo} (only EAGLE/EAGLE3 are supported). "
            "Falling back to static speculative params."
        )
    resolved = handler(args, warnings)
    if resolved.error or resolved.unsupported:
        return resolved
    if args.get("max_running_requests") is None:
        args["max_running_requests"] = 48
        warnings.append(_MAX_RUNNING_WARNING)
    return Resolved(args, tuple(warnings))


def _eagle_family(args: dict[str, Any], warnings: list[str]) -> Resolved:
    """`_handle_eagle_family` (and `_init_adaptive_speculative_params` with --speculative-adaptive)."""
    steps, topk, ndt = (
        args["speculative_num_steps"],
        args["speculative_eagle_topk"],
        args["speculative_num_draft_tokens"],
    )
    if args.get("speculative_adaptive"):
        # SGLang skips its automatic choice when adaptive: the initial steps must be a candidate, and
        # the draft is a chain (draft tokens forced to steps + 1).
        problem = _adaptive_problem(args, steps, topk)
        if problem is not None:
            return Resolved(args, tuple(warnings), **problem)
        if steps is None:  # _init_adaptive_speculative_params: the union's middle element
            union = adaptive_config(args.get("speculative_adaptive_config"))
            steps = union.candidate_steps[len(union.candidate_steps) // 2] if isinstance(union, AdaptiveConfig) else 3
        topk, ndt = 1, int(steps) + 1
    if steps is None:
        if topk is not None or ndt is not None:
            return Resolved(args, tuple(warnings), error="AssertionError")
        steps, topk, ndt = 3, 1, 4  # _auto_choose_speculative_params for DeepSeek-style models and STANDALONE
    partial = _partial_eagle(steps, topk, ndt)
    if partial:
        return Resolved(args, tuple(warnings), unsupported=partial)
    # Given steps and top-k 1, a missing draft-token count is completed by the rule below (None != steps + 1).
    if topk == 1 and ndt != steps + 1:
        warnings.append(
            "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1"
        )
        ndt = steps + 1
    args.update(speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=ndt)
    return Resolved(args)


def _dflash(args: dict[str, Any], warnings: list[str]) -> Resolved:
    """`_handle_dflash`: steps and top-k forced to 1 (a warning when given otherwise); the block size is the
    draft-token count (a ValueError when both are given and differ); unset, the drafter's config gives it
    (the model profile's drafters.dflash.block_size, applied by the performance model)."""
    if not args.get("speculative_draft_model_path"):
        return Resolved(
            args, error="ValueError: DFLASH speculative decoding requires setting --speculative-draft-model-path."
        )
    for name in ("speculative_num_steps", "speculative_eagle_topk"):
        if args.get(name) is not None and int(args[name]) != 1:
            warnings.append(f"DFLASH only supports {name} == 1; overriding {name}={args[name]} to 1.")
        args[name] = 1
    block, ndt = args.get("speculative_dflash_block_size"), args.get("speculative_num_draft_tokens")
    if block is not None and block <= 0:
        return Resolved(
            args, error=f"ValueError: DFLASH requires --speculative-dflash-block-size to be positive, got {block}."
        )
    if block is not None and ndt is not None and int(ndt) != int(block):
        return Resolved(
            args,
            error="ValueError: Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set but "
            f"they differ. For DFLASH they must match. speculative_num_draft_tokens={ndt}, "
            f"speculative_dflash_block_size={block}.",
        )
    if block is not None:
        args["speculative_num_draft_tokens"] = int(block)
    return Resolved(args)


def _ngram(args: dict[str, Any], warnings: list[str]) -> Resolved:
    """`_handle_ngram`: top-k = --speculative-ngram-max-bfs-breadth, draft tokens default 12 (a warning),
    steps = draft tokens // top-k; mixed chunked prefill off."""
    topk = args.get("speculative_ngram_max_bfs_breadth") or NGRAM_DEFAULTS["max_bfs_breadth"]
    args["speculative_eagle_topk"] = int(topk)
    if args.get("speculative_num_draft_tokens") is None:
        args["speculative_num_draft_tokens"] = NGRAM_DEFAULTS["draft_tokens"]
        warnings.append(
            "speculative_num_draft_tokens is set to 12 by default for ngram speculative decoding. "
            "You can override this by explicitly setting --speculative-num-draft-tokens."
        )
    if args.get("speculative_num_steps") is None:
        args["speculative_num_steps"] = int(args["speculative_num_draft_tokens"]) // int(topk)
    args["enable_mixed_chunk"] = False
    warnings.append("The mixed chunked prefill are disabled because of using ngram speculative decoding.")
    return Resolved(args)


_HANDLERS: Mapping[str, Callable[[dict[str, Any], list[str]], Resolved]] = {
    "EAGLE": _eagle_family,
    "EAGLE3": _eagle_family,
    "STANDALONE": _eagle_family,
    "DFLASH": _dflash,
    "NGRAM": _ngram,
}
"""SpeculativeAlgorithm.handle_server_args's dispatch, for the algorithms the simulator models."""


ADAPTIVE_SLOTS: tuple[tuple[int, tuple[int, ...]], ...] = ((1, (1, 3, 5, 7)), (8, (0, 1, 3)), (32, (0, 1)), (64, (0,)))
"""SGLang 0.5.23 `speculative/adaptive_spec_params.py` DEFAULT_ADAPTIVE_CONFIG: batch-size slot -> candidate_steps."""


@dataclass(frozen=True)
class AdaptiveConfig:
    """--speculative-adaptive-config's JSON as 0.5.23 reads it (`_load_adaptive_config`): one slot per
    integer-string key with its candidate_steps, the other keys shared knobs (AdaptiveStepSlot's defaults)."""

    slots: tuple[tuple[int, tuple[int, ...]], ...] = ADAPTIVE_SLOTS
    ema_alpha: float = 0.2
    update_interval: int = 5
    warmup_batches: int = 10
    down_hysteresis: float = -0.25
    up_hysteresis: float = 0.0

    @property
    def candidate_steps(self) -> tuple[int, ...]:
        """`resolve_candidate_steps_from_config`: the union of the slots' steps."""
        return tuple(sorted({s for _, steps in self.slots for s in steps}))


def adaptive_config(path: str | None) -> AdaptiveConfig | str:
    """The adaptive config at `path` (None: the defaults), or the error SGLang stops at reading it."""
    if not path:
        return AdaptiveConfig()
    data = _read_json(path)
    if isinstance(data, str):
        return data
    slots = []
    for key, entry in data.items():
        if key.isdigit():
            steps = _candidate_steps(key, entry)
            if isinstance(steps, str):
                return steps
            slots.append((int(key), steps))
    if not slots:
        return (
            "ValueError: speculative_adaptive_config must contain at least one integer-string BS key, e.g. "
            f'{{"1": {{"candidate_steps": [1,3,7]}}}}. Got keys: {list(data.keys())}'
        )
    shared = {f.name: data[f.name] for f in dataclasses.fields(AdaptiveConfig) if f.name != "slots" and f.name in data}
    return dataclasses.replace(AdaptiveConfig(), slots=tuple(sorted(slots)), **shared)


def _candidate_steps(key: str, entry: Any) -> tuple[int, ...] | str:
    """One slot's candidate_steps, sorted and distinct, or the ValueError `_load_adaptive_config` raises."""
    steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
    if not isinstance(steps, list) or not steps or not all(isinstance(x, int) and x >= 0 for x in steps):
        return f"ValueError: BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}"
    return tuple(sorted({int(x) for x in steps}))


def _read_json(path: str) -> dict[str, Any] | str:
    """The JSON object at `path`, or the error `_load_adaptive_config` stops at (open, json.load, .items())."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        return f"{type(exc).__name__}: [Errno {exc.errno}] {exc.strerror}: {path!r}"
    except ValueError as exc:
        return f"json.decoder.JSONDecodeError: {exc}"
    if not isinstance(data, dict):
        return f"AttributeError: '{type(data).__name__}' object has no attribute 'items'"
    return data


def _adaptive_problem(args: Mapping[str, Any], steps: int | None, topk: int | None) -> dict[str, str] | None:
    """Why SGLang 0.5.23 refuses --speculative-adaptive with these settings, as Resolved's error or
    unsupported field, or None (speculative_hook.py `_init_adaptive_speculative_params`; the topk case is
    `adaptive_unsupported_reason`, which SGLang answers by turning adaptive off: not modelled here)."""
    config = adaptive_config(args.get("speculative_adaptive_config"))
    if isinstance(config, str):
        return {"error": config}
    if steps is not None and steps not in config.candidate_steps:
        return {
            "error": f"ValueError: --speculative-num-steps={steps} is not in the adaptive config candidate_steps "
            f"{list(config.candidate_steps)}. Pass one of those values."
        }
    if topk is not None and topk != 1:
        return {
            "unsupported": f"--speculative-adaptive with speculative_eagle_topk {topk}: adaptive speculation "
            f"runs a chain (top-k 1); the simulator models nothing else"
        }
    return None


def _partial_eagle(steps: int, topk: int | None, ndt: int | None) -> str | None:
    """Why SGLang 0.5.23 cannot complete EAGLE settings given with steps, or None when it can.

    `_handle_eagle_family` (sgl-project/sglang python/sglang/srt/arg_groups/speculative_hook.py, the 0.5.x
    series) fills in nothing but the top-k 1 rule: with steps and top-k 1, a missing
    speculative_num_draft_tokens becomes steps + 1 (with its warning). With top-k > 1 it stays None, and
    with no top-k its `speculative_eagle_topk > 1` page-size check raises TypeError.
    """
    if topk is None:
        return (
            "speculative_num_steps without speculative_eagle_topk: SGLang 0.5.23 fails resolving it "
            "(TypeError: '>' not supported between instances of 'NoneType' and 'int'); "
            "set --speculative-eagle-topk"
        )
    if ndt is None and topk != 1:
        return (
            f"speculative_eagle_topk {topk} without speculative_num_draft_tokens: SGLang 0.5.23 leaves the "
            f"draft-token count unset (only top-k 1 completes it to steps + 1), which the simulator does "
            f"not model; set --speculative-num-draft-tokens"
        )
    return None
