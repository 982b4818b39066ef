#!/usr/bin/env python3
"""Fit the simulator's forward(t) terms to a bench/verify_cost.py measurement (issue 35, item 5).

    python bench/verify_cost_fit.py docs/measurements/verify-cost-h100.json [LAYERS]

The simulator (orchestrator/simulator/model.py, forward_ms) prices one rank's target forward as
a + b*U(t) + c*t (ms, collectives excluded), U(t) the distinct experts a batch of t tokens touches per MoE
layer. This fits a, b, c by least squares to LAYERS (default 61) x the measured per-layer time, per dtype
series, pooling the routings (their different U at the same t separate b from c), and sets the result beside
the h200-nvlink-x8 profile's terms and the profile keys that would reproduce it. Standard library only.
"""

from __future__ import annotations

import json
import sys

# The simulator's forward(t) for kimi-k2.5 on h200-nvlink-x8 at TP 8, collectives excluded (ms), as the
# profiles stood before this measurement: (fixed + w_e * per_unique_expert * U + w_t * per_token * t) / speed.
SIM_H200_X8 = {"fixed": 6.313, "per_unique_expert": 0.1087, "per_token": 0.05, "w_e": 0.2, "w_t": 2.5, "speed": 2.68}


def lstsq3(rows: list[tuple[float, float, float]], ys: list[float]) -> tuple[float, float, float]:
    """Least squares for y = a*r0 + b*r1 + c*r2 (normal equations, Cramer's rule; no numpy needed)."""
    m = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    v = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(3)]

    def det(a: list[list[float]]) -> float:
        return (
            a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1])
            - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
            + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0])
        )

    d = det(m)
    out = []
    for k in range(3):
        mk = [[v[i] if j == k else m[i][j] for j in range(3)] for i in range(3)]
        out.append(det(mk) / d)
    return out[0], out[1], out[2]


def fit(path: str, layers: int = 61, max_t: int = 256) -> dict:
    """Fit forward(t) = a + b*U(t) + c*t (ms, one rank, `layers` x the measured MoE layer) per dtype, pooling the
    routings, and set it beside the simulator's h200-nvlink-x8 terms."""
    res = json.load(open(path))
    sim = SIM_H200_X8
    old = {
        "a_fixed_ms": sim["fixed"] / sim["speed"],
        "b_per_unique_expert_ms": sim["w_e"] * sim["per_unique_expert"] / sim["speed"],
        "c_per_token_ms": sim["w_t"] * sim["per_token"] / sim["speed"],
    }
    out: dict = {"source": path, "device": res["device"], "layers": layers, "simulator_h200_x8": old, "fits": {}}
    for dtype in sorted({k.split("/")[0] for k in res["series"]}):
        pts = [
            p for k, s in res["series"].items() if k.split("/")[0] == dtype for p in s["points"] if p["tokens"] <= max_t
        ]
        rows = [(1.0, p["unique_experts"], float(p["tokens"])) for p in pts]
        ys = [layers * p["median_ms"] for p in pts]
        a, b, c = lstsq3(rows, ys)
        resid = [y - (a + b * r[1] + c * r[2]) for r, y in zip(rows, ys, strict=True)]
        speed = sim["fixed"] / a  # the compute_speed that puts the model's fixed term at the measured one
        out["fits"][dtype] = {
            "a_fixed_ms": a,
            "b_per_unique_expert_ms": b,
            "c_per_token_ms": c,
            "points": len(pts),
            "max_abs_residual_ms": max(abs(r) for r in resid),
            "max_rel_residual": max(abs(r) / y for r, y in zip(resid, ys, strict=True)),
            "as_profile_keys_at_speed_2.68": {
                "per_unique_expert_factor": b * sim["speed"] / sim["per_unique_expert"],
                "per_token_factor": c * sim["speed"] / sim["per_token"],
            },
            "as_profile_keys_with_fixed_matched": {
                "compute_speed": speed,
                "per_unique_expert_factor": b * speed / sim["per_unique_expert"],
                "per_token_factor": c * speed / sim["per_token"],
            },
        }
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    print(json.dumps(fit(argv[0], *(int(a) for a in argv[1:2])), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
