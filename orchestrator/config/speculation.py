"""The speculative algorithms as one dimension: a registry with a small class per algorithm that SGLang
0.5.23 offers and a model can take (`--speculative-algorithm`, sglang/srt/speculative/spec_info.py
`SpeculativeAlgorithm`), None being "no speculation".

Each algorithm says
  - its flags: which knobs it reads (`own`, beside steps/top-k/draft tokens where it reads those) and the
    flags they become (`flags`);
  - its draft model (`draft_model`): a drafter directory trained for the target (EAGLE, EAGLE3, DFLASH), a
    small model of the target's family (STANDALONE), or none (NGRAM drafts from the text itself);
  - its rules before launch (`refusal`, from 0.5.23's `arg_groups/speculative_hook.py`; the functions in
    `speculation_rules.py`);
  - its simulator model (`sim_drafter`: the model profile's `drafters.<key>`, where the acceptance per
    position, draft cost and verify window are stated with their sources);
  - how its acceptance is read (`acceptance`).

Adding an algorithm: a class and a registry entry here, its knobs in `knobs.py` (when it has its own),
its drafter in the simulator's model profile and its resolution in `simulator/algorithms.py`.
DSPARK, UNO and FROZEN_KV_MTP are left out: they need a checkpoint format (a DSpark drafter, an UNO LoRA, a
Gemma-4 assistant draft) no model in this tool ships, and NEXTN is 0.5.23's alias of EAGLE.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping
from typing import ClassVar

from orchestrator.config import speculation_rules as rules
from orchestrator.config.speculation_rules import EAGLE_KNOBS, Infeasible
from orchestrator.records import ParamValue


class DraftModel(str, enum.Enum):
    """What an algorithm drafts with; the value is the sentence `sweep plan` shows."""

    drafter = "a drafter directory trained for the target model (server.draft_model or speculative_draft_model_path)"
    small_model = "a small model of the target's family, run whole as the draft (server.draft_model or knob)"
    none = "none: drafts are n-grams matched in the prompt and the text generated so far"


ACCEPT_LENGTH = "accept length: tokens per verify cycle, the bonus token included (sglang:spec_accept_length)"


class Algorithm:
    """One speculative algorithm of SGLang 0.5.23 (the base reads steps, top-k and draft tokens)."""

    name: ClassVar[str]
    label: ClassVar[str] = ""
    """The algorithm in a user's words ("EAGLE-3"); the name where empty."""
    doc: ClassVar[str]
    draft_model: ClassVar[DraftModel] = DraftModel.drafter
    own: ClassVar[tuple[str, ...]] = ("speculative_draft_model_path",)
    """The knobs of `speculation_rules.ALGORITHM_KNOBS` this algorithm reads."""
    sim_drafter: ClassVar[str]
    """The simulator model profile's drafters.<key> that models it."""
    acceptance: ClassVar[str] = ACCEPT_LENGTH
    source: ClassVar[str] = "speculative_hook.py _handle_eagle_family"
    adaptive: ClassVar[bool] = False
    """--speculative-adaptive applies (adaptive_spec_params.py adaptive_unsupported_reason)."""
    auto_params: ClassVar[bool] = True
    """Given only the algorithm, SGLang chooses steps, top-k and draft tokens for the model
    (speculative_hook.py _auto_choose_speculative_params: the model profile's default_spec)."""

    def refusal(self, params: Mapping[str, ParamValue]) -> Infeasible | None:
        """Why SGLang 0.5.23 would not run the point with this algorithm as asked, or None."""
        return (
            rules.foreign(self.name, params, self.own)
            or rules.adaptive_config_alone(params)
            or (None if self.adaptive else rules.adaptive_unsupported(self.name, params))
            or self.own_refusal(params)
        )

    def own_refusal(self, params: Mapping[str, ParamValue]) -> Infeasible | None:
        return rules.eagle_chain(params)

    def effective(self, params: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
        """The point as SGLang runs it: at top-k 1 draft tokens is not a free knob (SGLang forces steps + 1),
        so a space may leave it out there and the value is filled in, for the launch plan and the model."""
        out = dict(params)
        steps = out.get("speculative_num_steps")
        if (
            out.get("speculative_eagle_topk") == 1
            and steps is not None
            and out.get("speculative_num_draft_tokens") is None
        ):
            out["speculative_num_draft_tokens"] = int(steps) + 1
        return out

    def flags(self, params: Mapping[str, ParamValue], draft_model: str | None) -> dict[str, ParamValue]:
        """--flag -> value of this algorithm's knobs (None: left out), the drafter's path first."""
        out: dict[str, ParamValue] = {"--speculative-algorithm": self.name}
        if self.draft_model is not DraftModel.none:
            out["--speculative-draft-model-path"] = params.get("speculative_draft_model_path") or draft_model
        for knob in (*EAGLE_KNOBS, *(k for k in self.own if k != "speculative_draft_model_path")):
            out["--" + knob.replace("_", "-")] = params.get(knob)
        return out


class Eagle3(Algorithm):
    name = "EAGLE3"
    label = "EAGLE-3"
    doc = "EAGLE-3: a one-layer drafter fed the target's hidden states from three layers; a draft tree per cycle"
    sim_drafter = "eagle3"
    adaptive = True

    def own_refusal(self, params: Mapping[str, ParamValue]) -> Infeasible | None:
        if params.get("speculative_adaptive"):
            return rules.adaptive_eagle(params)
        return rules.eagle_chain(params)


class Eagle(Eagle3):
    name = "EAGLE"
    doc = "EAGLE(-2) or a model's MTP head (NEXTN is 0.5.23's alias): a draft tree per cycle"
    sim_drafter = "eagle"


class Standalone(Algorithm):
    name = "STANDALONE"
    doc = "a small model of the target's family drafts a chain or tree (0.5.23 defaults: 3 steps, top-k 1, 4 tokens)"
    draft_model = DraftModel.small_model
    sim_drafter = "standalone"


class DFlash(Algorithm):
    name = "DFLASH"
    doc = "DFlash: a block-diffusion drafter proposes a whole block in one pass; the block is verified as a chain"
    own = ("speculative_draft_model_path", "speculative_dflash_block_size")
    sim_drafter = "dflash"
    source = "speculative_hook.py _handle_dflash"
    auto_params = False

    def own_refusal(self, params: Mapping[str, ParamValue]) -> Infeasible | None:
        return rules.dflash(params)

    def effective(self, params: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
        return dict(params)


class Ngram(Algorithm):
    name = "NGRAM"
    doc = "n-gram lookup: drafts from a trie of the prompt and generated text, no draft model (CPU, a tree)"
    draft_model = DraftModel.none
    own = (
        "speculative_ngram_min_bfs_breadth",
        "speculative_ngram_max_bfs_breadth",
        "speculative_ngram_match_type",
        "speculative_ngram_max_trie_depth",
        "speculative_ngram_capacity",
    )
    sim_drafter = "ngram"
    source = "speculative_hook.py _handle_ngram"
    auto_params = False

    def own_refusal(self, params: Mapping[str, ParamValue]) -> Infeasible | None:
        return rules.ngram(params)

    def effective(self, params: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
        return dict(params)


ALGORITHMS: Mapping[str, Algorithm] = {a.name: a for a in (Eagle3(), Eagle(), Standalone(), DFlash(), Ngram())}
"""Every algorithm the speculative_algorithm knob takes (None: no speculation), by SGLang's name."""


def get(name: ParamValue) -> Algorithm | None:
    """The algorithm of a speculative_algorithm value (None: no speculation); KeyError names the choices."""
    if name is None:
        return None
    if str(name) not in ALGORITHMS:
        raise KeyError(f"speculative_algorithm {name!r} is not one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[str(name)]


def model_default(drafters: Collection[str]) -> Algorithm | None:
    """The algorithm of a model's default speculation (SGLang's own steps, top-k and draft tokens for it: the
    model profile's default_spec): the first in the registry's order whose steps SGLang chooses itself and
    whose drafter the model profile models (`drafters`, its keys); None when there is none."""
    return next((a for a in ALGORITHMS.values() if a.auto_params and a.sim_drafter in drafters), None)


def needs_draft_model(name: ParamValue) -> bool:
    """Whether a speculative_algorithm value launches with --speculative-draft-model-path."""
    algo = get(name)
    return algo is not None and algo.draft_model is not DraftModel.none


def drafter_missing(values: Iterable[ParamValue], drafter: bool) -> bool:
    """Whether speculative_algorithm `values` launch an algorithm that needs a draft model while none is
    given (`drafter`: server.draft_model or the speculative_draft_model_path knob)."""
    return not drafter and any(needs_draft_model(v) for v in values)


def effective(params: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
    """The point as SGLang will run it (the algorithm's own completion; unchanged without one)."""
    algo = get(params.get("speculative_algorithm"))
    return dict(params) if algo is None else algo.effective(params)


def refusal(params: Mapping[str, ParamValue]) -> Infeasible | None:
    """The speculative rule a point breaks, or None when SGLang 0.5.23 would run it as asked."""
    algo = get(params.get("speculative_algorithm"))
    if algo is None:
        return rules.without_algorithm(params)
    return algo.refusal(algo.effective(params))
