"""The search space and speculation chain stage two's refinement tests share (test_refine.py,
test_refine_order.py): two NCCL knobs and EAGLE-3 with a chain (top-k 1) or a tree (top-k 2) shape."""

from __future__ import annotations

from orchestrator.config.experiment import ParamSpec, SearchSpace

SPACE = SearchSpace(
    name="two-stage",
    params={
        "NCCL_PROTO": ParamSpec(choices=(None, "LL", "Simple")),
        "NCCL_MAX_NCHANNELS": ParamSpec(choices=(None, 2, 4)),
        "speculative_algorithm": ParamSpec(choices=(None, "EAGLE3")),
        "speculative_num_steps": ParamSpec(low=1, high=4, when={"speculative_algorithm": "EAGLE3"}),
        "speculative_eagle_topk": ParamSpec(choices=(1, 2), when={"speculative_algorithm": "EAGLE3"}),
        "speculative_num_draft_tokens": ParamSpec(choices=(2, 4, 6), when={"speculative_eagle_topk": 2}),
    },
)
CHAIN = {
    "speculative_algorithm": "EAGLE3",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": None,
}
