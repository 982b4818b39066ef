#!/usr/bin/env python3
"""Target-forward cost of one Kimi-K2.5 TP=8 rank's layer shard on one GPU (issue 35, item 5).

Self-contained (torch only, no project imports), so it runs as is on the lent device machine:
    NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 python3 bench/verify_cost.py -o $OUT/verify-cost.json
and, to check that it runs at all, on a CPU at a fraction of the real widths:
    python bench/verify_cost.py --device cpu --scale 16 --tokens 1,2 --reps 2 -o /tmp/vc.json
bench/verify_cost_fit.py fits the simulator's forward(t) terms to what it writes.

What one TP=8 rank computes for one decoder layer of Kimi-K2.5 (KIMI_K25 below), sharded as SGLang shards
it at TP 8 without expert parallelism:
  - MLA attention: the replicated fused q_a / kv_a projection (7168 -> 1536 + 512 + 64), q_b column-parallel
    (64/8 = 8 heads x 192), the absorbed decode form (q_nope x W_UK, attention over the 576-wide latent KV
    cache of `--context` tokens per request, latent x W_UV), o_proj row-parallel (8 x 128 -> 7168);
  - MoE: the replicated router (7168 -> 384, sigmoid + correction bias, top-8, renormalised, x 2.827), the
    shared expert and every routed expert with its intermediate dimension split 8 ways (2048/8 = 256), run as
    one grouped GEMM over the experts the tokens touch (torch._grouped_mm, as a fused MoE kernel does) with a
    per-expert loop as fallback. t tokens are t decode requests, each with its own KV context.
The all-reduces after attention and MoE are not run: the simulator prices collectives separately.

Series: bf16 everywhere; and fp8-experts (routed experts in fp8 e4m3 with per-channel weight and per-token
activation scales, the rest bf16 -- Kimi-K2.5's checkpoint keeps attention, shared expert and LM head
unquantised and ships the routed experts in INT4, which plain torch cannot run). Routing: "uniform" draws
each token's 8 experts uniformly without replacement (the simulator's U(t) assumption); "skewed" draws them
from a log-normal expert popularity (sigma 1), touching fewer distinct experts, as trained routers do.
Components timed besides the MoE layer: its attention half, the dense first layer and the LM head shard.

Each timing is a CUDA graph of `--layers` distinct layer copies run back to back (so one layer's weights
are not in L2 when it runs), replayed after warm-up; the per-layer time is the replay time / layers,
median and spread over `--reps` replays timed with CUDA events.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

# Kimi-K2.5's text_config (a DeepSeek-V3 layout), the fields this script uses.
# fmt: off
KIMI_K25 = {
    "hidden_size": 7168, "num_attention_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 384,
    "moe_intermediate_size": 2048, "num_experts_per_tok": 8, "n_shared_experts": 1, "intermediate_size": 18432,
    "vocab_size": 163840, "num_hidden_layers": 61, "first_k_dense_replace": 1, "routed_scaling_factor": 2.827,
}
# fmt: on
FP8_MAX = 448.0


def shard_shapes(tp: int, scale: int) -> dict:
    """One TP rank's widths; `scale` > 1 shrinks every width (CPU smoke runs), heads stay per-rank."""
    c = KIMI_K25

    def s(v: int, floor: int = 8) -> int:
        return max(floor, v // scale)

    heads = c["num_attention_heads"] // tp
    experts = s(c["n_routed_experts"], 16)
    return {
        "tp": tp,
        "scale": scale,
        "hidden": s(c["hidden_size"]),
        "heads": heads,
        "q_lora": s(c["q_lora_rank"]),
        "kv_lora": s(c["kv_lora_rank"]),
        "nope": s(c["qk_nope_head_dim"]),
        "rope": s(c["qk_rope_head_dim"]),
        "v": s(c["v_head_dim"]),
        "experts": experts,
        "topk": min(c["num_experts_per_tok"], experts),
        "moe_inter": s(c["moe_intermediate_size"] // tp),
        "shared_inter": s(c["n_shared_experts"] * c["moe_intermediate_size"] // tp),
        "dense_inter": s(c["intermediate_size"] // tp),
        "vocab": s(c["vocab_size"] // tp),
    }


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def silu_mul(g: torch.Tensor) -> torch.Tensor:
    half = g.shape[-1] // 2
    return F.silu(g[..., :half]) * g[..., half:]


def attn_softmax(scores: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.softmax(scores.float() * scale, dim=-1).to(scores.dtype)


def router_weights(logits: torch.Tensor, bias: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Sigmoid scores, the biased top-k the router would pick (computed for its cost; dispatch follows the
    controlled `ids`), and the renormalised, scaled weights of the dispatched experts."""
    scores = torch.sigmoid(logits.float())
    _, chosen = torch.topk(scores + bias, ids.shape[1], dim=-1)
    wts = scores.gather(1, ids) + 0.0 * chosen.float()  # keep the top-k in a compiled graph
    return wts / wts.sum(-1, keepdim=True) * KIMI_K25["routed_scaling_factor"]


def combine(x: torch.Tensor, shared: torch.Tensor, ex: torch.Tensor, wts: torch.Tensor) -> torch.Tensor:
    routed = (ex.view(x.shape[0], wts.shape[1], -1).float() * wts[..., None]).sum(1)
    return (x.float() + shared.float() + routed).to(x.dtype)


def quant_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row fp8 e4m3 quantisation: (values, float32 scales of shape [rows])."""
    amax = x.abs().amax(dim=-1).float().clamp(min=1e-6)
    scale = amax / FP8_MAX
    q = (x.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def routing(n_tokens: int, experts: int, topk: int, mode: str, gen: torch.Generator) -> torch.Tensor:
    """Each token's `topk` distinct experts: uniform, or from a log-normal popularity (fewer distinct)."""
    if mode == "uniform":
        weights = torch.ones(experts)
    else:
        weights = torch.exp(torch.randn(experts, generator=gen))
    probs = weights.expand(n_tokens, experts).contiguous()
    return torch.multinomial(probs, topk, replacement=False, generator=gen)


class Layer:
    """One rank's weights for one decoder layer, plus its KV cache and fixed routing per token count."""

    def __init__(
        self, sh: dict, dev: str, dtype: torch.dtype, max_t: int, context: int, gen: torch.Generator, dense: bool
    ):
        H, nh, ql, kl, nope, rp, v = (sh[k] for k in ("hidden", "heads", "q_lora", "kv_lora", "nope", "rope", "v"))

        def w(*shape: int) -> torch.Tensor:  # drawn on the device, in the working dtype
            return torch.randn(*shape, generator=gen, device=dev, dtype=dtype).mul_(0.02)

        self.sh, self.dense = sh, dense
        self.ln1, self.ln2 = w(H) + 1, w(H) + 1
        self.w_qkv_a = w(ql + kl + rp, H)
        self.q_a_ln, self.kv_a_ln = w(ql) + 1, w(kl) + 1
        self.w_q_b = w(nh * (nope + rp), ql)
        self.w_uk = w(nh, nope, kl)
        self.w_uv = w(nh, kl, v)
        self.w_o = w(H, nh * v)
        self.kv = w(max_t, context, kl + rp)
        pos = torch.arange(rp // 2, dtype=torch.float32)
        self.cos = torch.cos(pos * 0.01).to(dtype).to(dev)
        self.sin = torch.sin(pos * 0.01).to(dtype).to(dev)
        self.sm_scale = 1.0 / math.sqrt(nope + rp)
        if dense:
            self.w13 = w(2 * sh["dense_inter"], H)
            self.w2 = w(H, sh["dense_inter"])
            return
        n_exp, inter = sh["experts"], sh["moe_inter"]
        self.gate = w(n_exp, H)
        self.e_bias = w(n_exp).float()
        self.s13, self.s2 = w(2 * sh["shared_inter"], H), w(H, sh["shared_inter"])
        # Routed experts laid out as nn.Linear weights ([out, in]); the grouped GEMM reads them transposed.
        self.e13, self.e2 = w(n_exp, 2 * inter, H), w(n_exp, H, inter)
        self.fp8: tuple | None = None
        self.routes: dict[tuple[str, int], torch.Tensor] = {}
        self.plans: dict[int, list] = {}  # per-expert rows of a fixed routing (the loop path)

    def to_fp8(self) -> None:
        """Routed experts in fp8 e4m3 with a float32 scale per output channel (then frees the bf16 copy)."""
        q13, s13, q2, s2 = [], [], [], []
        for e in range(self.e13.shape[0]):
            a, sa = quant_rows(self.e13[e])
            b, sb = quant_rows(self.e2[e])
            q13.append(a), s13.append(sa), q2.append(b), s2.append(sb)
        self.fp8 = (torch.stack(q13), torch.stack(s13), torch.stack(q2), torch.stack(s2))

    def route(self, mode: str, t: int, gen: torch.Generator, dev: str) -> torch.Tensor:
        key = (mode, t)
        if key not in self.routes:
            self.routes[key] = routing(t, self.sh["experts"], self.sh["topk"], mode, gen).to(dev)
        return self.routes[key]


def attention(L: Layer, x: torch.Tensor) -> torch.Tensor:
    """Residual stream after MLA attention for t decode tokens, each over its own latent KV cache."""
    sh = L.sh
    t, nh, ql, kl, nope, rp = x.shape[0], sh["heads"], sh["q_lora"], sh["kv_lora"], sh["nope"], sh["rope"]
    h = rms(x, L.ln1)
    qkv = F.linear(h, L.w_qkv_a)
    q_c, kv_c, k_pe = qkv.split([ql, kl, rp], dim=-1)
    q = F.linear(rms(q_c, L.q_a_ln), L.w_q_b).view(t, nh, nope + rp)
    q_nope, q_pe = q.split([nope, rp], dim=-1)
    kv_c = rms(kv_c, L.kv_a_ln)
    q_pe, k_pe = rope(q_pe, L.cos, L.sin), rope(k_pe, L.cos, L.sin)
    cache = L.kv[:t]
    cache[:, -1].copy_(torch.cat((kv_c, k_pe), dim=-1))  # this step's latent KV entry
    q_abs = torch.bmm(q_nope.transpose(0, 1), L.w_uk).transpose(0, 1)  # [t, nh, kv_lora]
    q_full = torch.cat((q_abs, q_pe), dim=-1)  # [t, nh, 576]
    p = attn_softmax(torch.bmm(q_full, cache.transpose(1, 2)), L.sm_scale)  # [t, nh, context]
    o_lat = torch.bmm(p, cache[..., :kl])  # [t, nh, kv_lora]
    o = torch.bmm(o_lat.transpose(0, 1), L.w_uv).transpose(0, 1).reshape(t, -1)  # [t, nh * v]
    return x + F.linear(o, L.w_o)


def experts_grouped(L: Layer, h: torch.Tensor, ids: torch.Tensor, fp8: bool) -> torch.Tensor:
    """Routed-expert outputs per (token, slot), sorted by expert: one grouped GEMM for gate/up, one for down."""
    E, k = L.sh["experts"], ids.shape[1]
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(E, dtype=torch.int64, device=h.device).scatter_add_(0, flat, torch.ones_like(flat))
    offs = torch.cumsum(counts, 0).to(torch.int32)
    xs = h[order // k]
    if not fp8:
        g = torch._grouped_mm(xs, L.e13.transpose(1, 2), offs=offs)
        y = torch._grouped_mm(silu_mul(g), L.e2.transpose(1, 2), offs=offs)
    else:
        q13, s13, q2, s2 = L.fp8
        xq, xsc = quant_rows(xs)
        g = torch._scaled_grouped_mm(xq, q13.transpose(1, 2), xsc, s13, offs=offs, out_dtype=torch.bfloat16)
        aq, asc = quant_rows(silu_mul(g))
        y = torch._scaled_grouped_mm(aq, q2.transpose(1, 2), asc, s2, offs=offs, out_dtype=torch.bfloat16)
    out = torch.empty_like(y)
    out[order] = y
    return out


def experts_loop(L: Layer, h: torch.Tensor, ids: torch.Tensor, fp8: bool) -> torch.Tensor:
    """Reference / fallback: one GEMM pair per touched expert (routing is fixed, so the loop is too)."""
    k = ids.shape[1]
    flat = ids.reshape(-1)
    if ids.data_ptr() not in L.plans:  # host work: done in the eager warm-up, never inside graph capture
        L.plans[ids.data_ptr()] = [(e, (flat == e).nonzero().squeeze(1)) for e in sorted(set(flat.tolist()))]
    out = torch.zeros(flat.shape[0], h.shape[1], dtype=h.dtype, device=h.device)
    for e, rows in L.plans[ids.data_ptr()]:
        xs = h[rows // k]
        if not fp8:
            a = silu_mul(F.linear(xs, L.e13[e]))
            out[rows] = F.linear(a, L.e2[e])
        else:
            q13, s13, q2, s2 = L.fp8
            xq, xsc = quant_rows(xs)
            g = torch._scaled_mm(xq, q13[e].t(), xsc[:, None], s13[e][None, :], out_dtype=torch.bfloat16)
            aq, asc = quant_rows(silu_mul(g))
            out[rows] = torch._scaled_mm(aq, q2[e].t(), asc[:, None], s2[e][None, :], out_dtype=torch.bfloat16)
    return out


def moe_layer(L: Layer, x: torch.Tensor, ids: torch.Tensor, fp8: bool, impl: str) -> torch.Tensor:
    x = attention(L, x)
    h = rms(x, L.ln2)
    wts = router_weights(F.linear(h, L.gate), L.e_bias, ids)
    shared = F.linear(silu_mul(F.linear(h, L.s13)), L.s2)
    ex = (experts_grouped if impl == "grouped" else experts_loop)(L, h, ids, fp8)
    return combine(x, shared, ex, wts)


def dense_layer(L: Layer, x: torch.Tensor) -> torch.Tensor:
    x = attention(L, x)
    return x + F.linear(silu_mul(F.linear(rms(x, L.ln2), L.w13)), L.w2)


def time_fn(fn, dev: str, reps: int, warmup: int, graph: bool) -> list[float]:
    """Milliseconds per call: CUDA-graph replays timed with events, or host-timed calls on the CPU."""
    if dev == "cpu":
        fn()
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    run = fn
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record()
        run()
        b.record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in ev]


def summary(ms: list[float], per: int) -> dict:
    v = sorted(m / per for m in ms)
    q = lambda f: v[min(len(v) - 1, int(f * (len(v) - 1) + 0.5))]  # noqa: E731
    return {"median_ms": statistics.median(v), "p10_ms": q(0.1), "p90_ms": q(0.9), "min_ms": v[0], "n": len(v)}


def ceilings(dev: str) -> dict:
    """The card's copy bandwidth and bf16 matrix rate, measured once (context for the numbers)."""
    if dev == "cpu":
        return {}
    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_ms = statistics.median(time_fn(lambda: dst.copy_(src), dev, 20, 3, False))
    mat = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    mm_ms = statistics.median(time_fn(lambda: mat @ mat, dev, 20, 3, False))
    return {"copy_gbps_read_plus_write": 2 * 2 * 1024**3 / copy_ms / 1e6, "bf16_8192_tflops": 2 * 8192**3 / mm_ms / 1e9}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("-o", "--out", required=True, help="JSON output path")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--scale", type=int, default=1, help="divide every width by this (CPU smoke runs)")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--tokens", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--context", type=int, default=2048, help="KV tokens per request")
    ap.add_argument("--layers", type=int, default=4, help="distinct layer copies per timed graph")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--series", default="bf16,fp8-experts")
    ap.add_argument("--routings", default="uniform,skewed")
    ap.add_argument("--moe-impl", default="auto", choices=["auto", "grouped", "loop"])
    ap.add_argument("--no-graph", action="store_true")
    # Fuse the elementwise steps (norms, rope, softmax, router, SiLU, fp8 quantisation, combine) with
    # torch.compile, as SGLang's fused kernels do; the GEMMs and attention products stay as they are.
    ap.add_argument("--compile", action="store_true", help="fuse the elementwise steps with torch.compile")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


class Bench:
    """The run's state: the layers, inputs, options and the result dict written after every point."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.dev, self.dtype = args, args.device, torch.bfloat16
        self.tokens = [int(t) for t in args.tokens.split(",")]
        self.graph = self.dev != "cpu" and not args.no_graph
        self.sh = sh = shard_shapes(args.tp, args.scale)
        self.gen = torch.Generator().manual_seed(args.seed)  # routing draws (host)
        self.dgen = torch.Generator(device=self.dev).manual_seed(args.seed)  # weights and inputs (device)
        self.started = time.time()
        cuda = self.dev.startswith("cuda")
        # fmt: off
        self.res: dict = {
            "what": "one Kimi-K2.5 TP rank's decoder-layer forward (collectives excluded), per layer",
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([os.path.basename(sys.executable)] + sys.argv), "host": platform.node(),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
            "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"), "args": vars(args), "model": KIMI_K25,
            "shard": sh, "cuda_graph": self.graph, "ceilings": ceilings(self.dev),
            "series": {}, "components": {}, "errors": [],
        }
        if cuda:
            p = torch.cuda.get_device_properties(0)
            self.res["gpu"] = {"sms": p.multi_processor_count, "memory_gib": p.total_memory / 2**30,
                               "cc": f"{p.major}.{p.minor}"}
        # fmt: on
        max_t, ctx = max(self.tokens), args.context
        self.layers = [Layer(sh, self.dev, self.dtype, max_t, ctx, self.dgen, dense=False) for _ in range(args.layers)]
        self.dense = Layer(sh, self.dev, self.dtype, max_t, ctx, self.dgen, dense=True)
        self.xs = {
            t: torch.randn(t, sh["hidden"], generator=self.dgen, device=self.dev, dtype=self.dtype) for t in self.tokens
        }
        took = time.time() - self.started
        print(f"built {args.layers} MoE layers + 1 dense on {self.res['device']} in {took:.0f}s", flush=True)

    def save(self) -> None:
        self.res["elapsed_s"] = round(time.time() - self.started, 1)
        os.makedirs(os.path.dirname(os.path.abspath(self.args.out)), exist_ok=True)
        with open(self.args.out, "w") as f:
            json.dump(self.res, f, indent=1)

    def time(self, fn, per: int) -> dict:
        return summary(time_fn(fn, self.dev, self.args.reps, self.args.warmup, self.graph), per)

    def check(self, fp8: bool) -> str:
        """The grouped path against the per-expert loop; the loop is used where grouped fails or disagrees."""
        tag = "fp8" if fp8 else "bf16"
        L = self.layers[0]
        x = self.xs[min(self.tokens, key=lambda t: abs(t - 8))]
        ids = L.route("uniform", x.shape[0], self.gen, self.dev)
        h = rms(x, L.ln2)
        ref = experts_loop(L, h, ids, fp8).float()
        try:
            got = experts_grouped(L, h, ids, fp8).float()
        except Exception as exc:  # noqa: BLE001 - any failure means: use the loop
            self.res["errors"].append(f"grouped {tag}: {type(exc).__name__}: {exc}"[:400])
            return "loop"
        rel = ((got - ref).norm() / ref.norm()).item()
        self.res[f"check_grouped_vs_loop_{tag}_rel_err"] = rel
        print(f"grouped vs loop ({tag}): rel err {rel:.2e}", flush=True)
        return "grouped" if rel < 2e-2 else "loop"

    def to_fp8(self) -> bool:
        try:
            for L in self.layers:
                L.to_fp8()
                L.e13, L.e2 = L.e13[:0], L.e2[:0]  # attention / shared stay bf16; free the bf16 experts
            if self.dev.startswith("cuda"):
                torch.cuda.empty_cache()
            return True
        except Exception as exc:  # noqa: BLE001
            self.res["errors"].append(f"fp8 series skipped: {type(exc).__name__}: {exc}"[:400])
            return False

    def series(self, name: str) -> None:
        fp8 = name == "fp8-experts"
        if fp8 and not self.to_fp8():
            return
        impl = self.check(fp8) if self.args.moe_impl == "auto" else self.args.moe_impl
        for mode in self.args.routings.split(","):
            key = f"{name}/{mode}"
            self.res["series"][key] = {"moe_impl": impl, "points": []}
            for t in self.tokens:
                ids = [L.route(mode, t, self.gen, self.dev) for L in self.layers]

                def fwd(
                    x: torch.Tensor = self.xs[t], ids: list = ids, fp8: bool = fp8, impl: str = impl
                ) -> torch.Tensor:
                    for L, r in zip(self.layers, ids, strict=True):
                        x = moe_layer(L, x, r, fp8, impl)
                    return x

                try:
                    point = self.time(fwd, len(self.layers))
                except Exception as exc:  # noqa: BLE001
                    self.res["errors"].append(f"{key} t={t}: {type(exc).__name__}: {exc}"[:400])
                    continue
                uniq = statistics.mean(len(set(r.reshape(-1).tolist())) for r in ids)
                self.res["series"][key]["points"].append({"tokens": t, "unique_experts": uniq, **point})
                print(f"{key:22s} t={t:4d} U={uniq:6.1f} {point['median_ms']:.4f} ms/layer", flush=True)
                self.save()

    def components(self) -> None:
        """bf16 only: the attention half of a layer, the dense first layer, the LM head shard."""
        sh, layers, dense = self.sh, self.layers, self.dense
        w_lm = torch.randn(sh["vocab"], sh["hidden"], generator=self.dgen, device=self.dev, dtype=self.dtype).mul_(0.02)
        makers = {
            "attention": (lambda x: lambda: [attention(L, x) for L in layers], len(layers)),
            "dense_layer": (lambda x: lambda: dense_layer(dense, x), 1),
            "lm_head": (lambda x: lambda: F.linear(rms(x, dense.ln1), w_lm), 1),
        }
        for comp, (make, per) in makers.items():
            pts = []
            for t in self.tokens:
                try:
                    pts.append({"tokens": t, **self.time(make(self.xs[t]), per)})
                except Exception as exc:  # noqa: BLE001
                    self.res["errors"].append(f"{comp} t={t}: {type(exc).__name__}: {exc}"[:400])
            self.res["components"][comp] = pts
            print(f"{comp:22s} " + " ".join(f"{p['tokens']}:{p['median_ms']:.4f}" for p in pts), flush=True)
        self.save()

    def table(self) -> None:
        print("\nms per layer (median over replays)")
        print("t      " + "  ".join(f"{k:>22s}" for k in self.res["series"]))
        for t in self.tokens:
            row = []
            for s in self.res["series"].values():
                pts = [p for p in s["points"] if p["tokens"] == t]
                row.append(f"{pts[0]['median_ms']:>22.4f}" if pts else f"{'-':>22s}")
            print(f"{t:<6d} " + "  ".join(row))
        if self.res["errors"]:
            print("errors:", *self.res["errors"], sep="\n  ")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.compile:
        for name in ("rms", "rope", "silu_mul", "quant_rows", "attn_softmax", "router_weights", "combine"):
            globals()[name] = torch.compile(globals()[name], dynamic=True)
    bench = Bench(args)
    for name in args.series.split(","):
        bench.series(name)
        if name == "bf16":
            bench.components()
    bench.save()
    bench.table()
    return 0


if __name__ == "__main__":
    sys.exit(main())
