"""Two-node scaling: trials per hour of the same sweep on a one-node and a two-node Ray cluster.

Both clusters are real (`ray start`) and live on loopback addresses (127.0.0.2 head, 127.0.0.3
worker), each node with 8 logical GPUs, so one TP-8 trial fits per node. The sweep is the demo
experiment on the simulator with `budget.concurrent_trials: 2` and `--ray-address`; with one node
the second slot never gets GPUs, with two nodes both run. Trials per hour counts the sweep phase
only (first launch to last finish, from the trials' own timestamps), not Ray or MLflow start-up.

    .venv/bin/python bench/two_node_scaling.py [--trials 12]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RAY = str(BIN / "ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray(*args: str, env: dict) -> None:
    subprocess.run([RAY, *args], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=120)


def start_cluster(nodes: int, tmp: Path, env: dict) -> str:
    port = free_port()
    common = ["--num-gpus=8", "--num-cpus=2", "--object-store-memory=200000000", "--disable-usage-stats"]
    ray("start", "--head", "--node-ip-address=127.0.0.2", f"--port={port}", "--include-dashboard=false",
        f"--temp-dir={tmp / 'ray'}", *common, env=env)
    if nodes == 2:
        ray("start", f"--address=127.0.0.2:{port}", "--node-ip-address=127.0.0.3",
            f"--dashboard-agent-listen-port={free_port()}", *common, env=env)
    return f"127.0.0.2:{port}"


def stop_cluster(temp_dir: Path) -> None:
    """Kill this cluster's processes only (`ray stop` would stop every Ray instance on the machine)."""
    import signal

    needle = str(temp_dir).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmd:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except ProcessLookupError:
                pass


def experiment(tmp: Path, trials: int) -> Path:
    data = yaml.safe_load((REPO / "experiments" / "demo.yaml").read_text())
    data["name"] = "scaling"
    data["search_space"] = [str(REPO / "search_spaces" / "nccl.yaml"), str(REPO / "search_spaces" / "eagle3.yaml")]
    data["budget"].update(trials=trials, concurrent_trials=2)
    data["promotion"]["confirm_repeats"] = 0
    path = tmp / "scaling.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


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
    args = ap.parse_args()
    results = {}
    for nodes in (1, 2):
        tmp = Path(tempfile.mkdtemp(prefix=f"scaling{nodes}-"))
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        address = start_cluster(nodes, tmp, env)
        try:
            exp = experiment(tmp, args.trials)
            t0 = time.time()
            proc = subprocess.run([str(BIN / "sweep"), "run", str(exp), "--workdir", str(tmp / "wd"),
                                   "--ray-address", address], env=env, capture_output=True, text=True, timeout=1800)
            wall = time.time() - t0
            if proc.returncode != 0:
                raise SystemExit(f"sweep failed on {nodes} node(s):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
            tph, n, node_ids = trials_per_hour(tmp / "wd")
            results[nodes] = {"trials_per_hour": tph, "trials": n, "nodes_used": node_ids, "wall_s": wall}
            print(f"{nodes} node(s): {n} trials, {tph:.0f} trials/hour (sweep wall {wall:.0f}s), "
                  f"ran on {len(node_ids)} node(s)")
        finally:
            stop_cluster(tmp / "ray")
            shutil.rmtree(tmp, ignore_errors=True)
    ratio = results[2]["trials_per_hour"] / results[1]["trials_per_hour"]
    print(f"scaling 1 -> 2 nodes: {ratio:.2f}x")
    (REPO / "bench" / "results-two-node-scaling.json").write_text(json.dumps({"results": results, "ratio": ratio},
                                                                              indent=2))


if __name__ == "__main__":
    main()
