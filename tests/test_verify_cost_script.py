"""bench/verify_cost.py runs end to end on a CPU at a tiny scale and writes the JSON the docs read.

The real measurement runs on a GPU (docs/measurements/verify-cost.md); this only proves the script's
plumbing: shard shapes, the grouped-GEMM MoE path agreeing with the per-expert loop, the JSON layout;
and that bench/verify_cost_fit.py recovers known forward(t) terms.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "verify_cost.py"


def _module():
    spec = importlib.util.spec_from_file_location("verify_cost", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tp8_shard_shapes_are_kimi_k25_split_eight_ways():
    sh = _module().shard_shapes(8, 1)
    assert (sh["hidden"], sh["heads"], sh["q_lora"], sh["kv_lora"]) == (7168, 8, 1536, 512)
    assert (sh["nope"], sh["rope"], sh["v"]) == (128, 64, 128)
    assert (sh["experts"], sh["topk"], sh["moe_inter"], sh["shared_inter"]) == (384, 8, 256, 256)
    assert (sh["dense_inter"], sh["vocab"]) == (2304, 20480)


def test_cpu_smoke_run_writes_every_point(tmp_path):
    out = tmp_path / "vc.json"
    argv = ["--device", "cpu", "--scale", "32", "--tokens", "1,4", "--reps", "1", "--layers", "1"]
    argv += ["--context", "16", "--series", "bf16", "-o", str(out)]
    assert _module().main(argv) == 0
    res = json.loads(out.read_text())
    assert res["shard"]["tp"] == 8 and res["args"]["scale"] == 32
    assert res["check_grouped_vs_loop_bf16_rel_err"] < 1e-2
    for key in ("bf16/uniform", "bf16/skewed"):
        points = res["series"][key]["points"]
        assert [p["tokens"] for p in points] == [1, 4]
        assert all(p["median_ms"] > 0 and p["unique_experts"] >= 1 for p in points)
    assert set(res["components"]) == {"attention", "dense_layer", "lm_head"}
    assert not res["errors"]


def test_fit_recovers_known_terms(tmp_path):
    spec = importlib.util.spec_from_file_location("verify_cost_fit", SCRIPT.with_name("verify_cost_fit.py"))
    assert spec is not None and spec.loader is not None
    fitmod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fitmod)
    a, b, c, layers = 12.0, 0.25, 0.15, 61
    pts = {
        mode: [
            {"tokens": t, "unique_experts": u, "median_ms": (a + b * u + c * t) / layers}
            for t, u in zip((1, 8, 64, 256), uniq, strict=True)
        ]
        for mode, uniq in (("uniform", (8, 61, 286, 382)), ("skewed", (8, 54, 216, 334)))
    }
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"device": "x", "series": {f"bf16/{m}": {"points": p} for m, p in pts.items()}}))
    got = fitmod.fit(str(path))["fits"]["bf16"]
    assert got["a_fixed_ms"] == pytest.approx(a) and got["b_per_unique_expert_ms"] == pytest.approx(b)
    assert got["c_per_token_ms"] == pytest.approx(c) and got["max_abs_residual_ms"] < 1e-6
