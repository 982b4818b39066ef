"""TEST-ONLY STAND-IN for the nine `*_cpu` helpers that SGLang 0.5.23's CPU engine imports from
`sgl_kernel` at import time. It is not sgl_kernel and must never reach a serving host.

No CPU build of sgl_kernel installs on the CI machine (no sdist on the index), yet
`SGLANG_USE_CPU_ENGINE=1` makes these modules import them unconditionally:

    sglang/srt/mem_cache/allocation.py            assign_req_to_token_pool_cpu
    sglang/kernels/ops/kvcache/cache_move.py      copy_all_layer_kv_cache_cpu
    sglang/kernels/ops/speculative/cache_locs.py  assign_draft_cache_locs_contiguous_cpu, assign_extend_cache_locs_cpu
    sglang/kernels/ops/speculative/eagle.py       fill_accept_out_cache_loc_cpu, fill_bonus_tokens_cpu
    sglang/kernels/ops/speculative/multi_layer_eagle.py  rotate_input_ids_cpu
    sglang/kernels/ops/speculative/spec_tree.py   build_tree_kernel_efficient_cpu, verify_tree_greedy_cpu

Plain torch, and it registers no `torch.ops.sgl_kernel` op, so SGLang finds no AMX kernels, logs
"The current platform does not support Intel AMX, will fallback to torch_native backend" and runs
its own native attention. The two helpers the non-speculative path calls (request-to-token pool
writes, KV copies) are written out in torch after the Triton kernels beside their call sites; the
seven speculative ones raise: EAGLE-3 on CPU needs the real AMX kernels, which this tier cannot test.
"""

from __future__ import annotations

import torch

STANDIN = True
"""Marks this module as the test stand-in (tests assert the server imported it, not a real build)."""


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """req_to_token[req, start:end] = the request's slice of out_cache_loc, requests packed in order
    (sglang/srt/mem_cache/allocation.py::assign_req_to_token_pool, the Triton kernel)."""
    del pool_len  # the row length is req_to_token's own
    out = 0
    for i in range(int(req_pool_indices.shape[0])):
        start, end = int(start_offset[i]), int(end_offset[i])
        n = end - start
        if n > 0:
            row = int(req_pool_indices[i])
            req_to_token[row, start:end] = out_cache_loc[out : out + n].to(req_to_token.dtype)
        out += max(n, 0)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """Copy each layer buffer's rows src_loc -> tgt_loc (sglang/kernels/ops/kvcache/cache_move.py).
    The buffers arrive as raw data pointers with their row strides in bytes; torch views them as uint8."""
    if tgt_loc.numel() == 0:
        return
    src = src_loc.to(torch.long)
    tgt = tgt_loc.to(torch.long)
    rows = int(torch.maximum(src.max(), tgt.max()).item()) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        buf = _uint8_view(int(ptr), rows * int(stride)).view(rows, int(stride))
        buf[tgt] = buf[src].clone()


def _uint8_view(ptr: int, nbytes: int) -> torch.Tensor:
    import ctypes

    array = (ctypes.c_uint8 * nbytes).from_address(ptr)
    return torch.frombuffer(array, dtype=torch.uint8, count=nbytes)


def _speculative(name: str):
    def helper(*args: object, **kwargs: object) -> None:
        raise NotImplementedError(
            f"sgl_kernel.{name} is a test stand-in (tests/sglang_real/standin): speculative decoding on CPU "
            f"needs SGLang's real AMX kernels, which the CI machine cannot install"
        )

    helper.__name__ = name
    return helper


assign_draft_cache_locs_contiguous_cpu = _speculative("assign_draft_cache_locs_contiguous_cpu")
assign_extend_cache_locs_cpu = _speculative("assign_extend_cache_locs_cpu")
fill_accept_out_cache_loc_cpu = _speculative("fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = _speculative("fill_bonus_tokens_cpu")
rotate_input_ids_cpu = _speculative("rotate_input_ids_cpu")
build_tree_kernel_efficient_cpu = _speculative("build_tree_kernel_efficient_cpu")
verify_tree_greedy_cpu = _speculative("verify_tree_greedy_cpu")
