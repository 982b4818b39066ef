"""Two-node scaling: trials per hour of the same sweep on a one-node and a two-node Ray cluster.

Both clusters are real (`ray start`) and live on loopback addresses (127.0.0.2 head, 127.0.0.3
worker), each node with 8 logical GPUs, so one TP-8 trial fits per node. The sweep is the demo
experiment on the simulator with `budget.concurrent_trials: 2` and `--ray-address`; with one node
the second slot never gets GPUs, with two nodes both run. Trials per hour counts the sweep phase
only (first launch to last finish, from the trials' own timestamps), not Ray or MLflow start-up.

    .venv/bin/python bench/two_node_scaling.py [--trials 12] [-o FILE]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _result  # bench/_result.py: the result file and what made it
from demo_sweep import write_demo_experiment

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def experiment(tmp: Path, trials: int) -> Path:
    return write_demo_experiment(tmp / "scaling.yaml", "scaling", trials)


def trials_per_hour(workdir: Path) -> tuple[float, int, list[str]]:
    spans, nodes = [], set()
    for d in (workdir / "trials").iterdir():
        o = json.loads((d / "outcome.json").read_text())
        spans.append((o["started_at"], o["finished_at"]))
        nodes.add(o["node"])
    first, last = min(s for s, _ in spans), max(e for _, e in spans)
    return len(spans) / (last - first) * 3600, len(spans), sorted(nodes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=12)
    _result.add_output(ap)
    args = ap.parse_args()
    run = _result.start()
    sys.path.insert(0, str(REPO / "tests"))
    from e2e_helpers import LoopbackCluster  # the tests' real `ray start` cluster on loopback

    results = {}
    for nodes in (1, 2):
        tmp = Path(tempfile.mkdtemp(prefix=f"scaling{nodes}-"))
        cluster = LoopbackCluster(tmp, worker=nodes == 2)
        cluster.start()
        env, address = cluster.env, cluster.address
        try:
            exp = experiment(tmp, args.trials)
            t0 = time.time()
            proc = subprocess.run(
                [str(BIN / "sweep"), "run", str(exp), "--workdir", str(tmp / "wd"), "--ray-address", address],
                env=env,
                capture_output=True,
                text=True,
                timeout=1800,
            )
            wall = time.time() - t0
            if proc.returncode != 0:
                raise SystemExit(f"sweep failed on {nodes} node(s):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
            tph, n, node_ids = trials_per_hour(tmp / "wd")
            results[nodes] = {"trials_per_hour": tph, "trials": n, "nodes_used": node_ids, "wall_s": wall}
            print(
                f"{nodes} node(s): {n} trials, {tph:.0f} trials/hour (sweep wall {wall:.0f}s), "
                f"ran on {len(node_ids)} node(s)"
            )
        finally:
            cluster.stop()
            shutil.rmtree(tmp, ignore_errors=True)
    ratio = results[2]["trials_per_hour"] / results[1]["trials_per_hour"]
    print(f"scaling 1 -> 2 nodes: {ratio:.2f}x")
    _result.write(args.out, {"results": results, "ratio": ratio}, run, indent=2)


if __name__ == "__main__":
    main()
