"""Scale-out: a real two-node Ray cluster on loopback (head 127.0.0.2, worker 127.0.0.3, 8 logical
GPUs each), `sweep run --ray-address` with tp=8 and two trials at a time: the two trials run at the
same time on different nodes. And concurrent proposals differ: TPE's constant liar sees the trial in
flight."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from e2e_helpers import (
    REPO,
    LoopbackCluster,
    demo_experiment,
    ended_cleanly,
    marked_processes,
    new_workdir,
    served_experiment,
    sweep,
    trial_files,
    write_experiment,
)
from mlflow_fixtures import sqlite_store_template  # noqa: F401 (fixture)

from orchestrator.config.experiment import ParamSpec, SamplerSpec, SearchSpace
from orchestrator.search import space as sp
from orchestrator.search.study import Study

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[LoopbackCluster]:
    # The head as docs/cluster.md starts a node (RAY_worker_niceness=0), the worker with Ray's default (15).
    c = LoopbackCluster(tmp_path_factory.mktemp("cluster"), niceness=(0, None))
    try:
        c.start()
        yield c
    finally:
        c.stop()
        assert marked_processes(c.marker) == {}


def test_two_trials_run_at_the_same_time_on_two_nodes(cluster, tmp_path, sqlite_store_template):
    data = served_experiment(
        name="twonode", server={"tp": 8}, budget={"trials": 4, "concurrent_trials": 2}, promotion={"max_rounds": 0}
    )
    exp, wd = write_experiment(tmp_path, data), new_workdir(tmp_path, sqlite_store_template)
    env = {"RAY_AUTH_MODE": "token"}  # the cluster uses Ray's token authentication (its default)
    proc = sweep("run", str(exp), "--workdir", str(wd), "--ray-address", cluster.address, env=env)
    out = proc.stdout + proc.stderr
    assert ended_cleanly(proc), out
    assert "Traceback" not in out
    assert "16 GPUs, 2 trial(s) at a time" in out

    outcomes = {n: o for n, o in trial_files(wd)[0].items()}
    assert len(outcomes) == 4
    assert {o["node"].split("/")[0] for o in outcomes.values()} == {"127.0.0.2", "127.0.0.3"}
    overlapping = [
        (a, b)
        for a in outcomes.values()
        for b in outcomes.values()
        if a["number"] < b["number"] and a["started_at"] < b["finished_at"] and b["started_at"] < a["finished_at"]
    ]
    assert overlapping
    for a, b in overlapping:  # two trials at once: on different nodes, with different parameters
        assert a["node"] != b["node"]
        assert a["params"] != b["params"]
    for o in outcomes.values():  # each trial had a whole node's 8 GPUs
        spec_json = json.loads((wd / "trials" / f"{o['number']:04d}" / "spec.json").read_text())
        assert len(spec_json["gpu_ids"]) == 8
    ours = os.nice(0)  # the sweep's, and the nodes' (this process started them): whatever the runner chose
    raised = min(ours + 15, 19)  # Ray raises its workers' nice value by 15 above the raylet's, at most to 19
    for o in outcomes.values():  # the servers ran at their node's worker niceness, and one above ours is named
        nice = {p["nice"] for p in o["effective_env"]["processes"]}
        warned = [w for w in o["warnings"] if "niceness" in w]
        assert nice == ({ours} if o["node"].startswith("127.0.0.2") else {raised}), (o["node"], nice)
        if nice == {ours}:
            assert not warned, o["warnings"]
        else:
            assert len(warned) == 1 and "RAY_worker_niceness=0" in warned[0], o["warnings"]


def test_sweep_without_the_clusters_token_gets_one_clear_message(cluster, tmp_path):
    exp = write_experiment(tmp_path, demo_experiment(name="notoken"))
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "run",
            str(exp),
            "--workdir",
            str(tmp_path / "wd"),
            "--ray-address",
            cluster.address,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        # Ray retries a refused connection ~20 s by default; 2 s are enough here.
        env={**env, "COLUMNS": "200", "RAY_gcs_server_port_wait_time_s": "2"},
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "token authentication" in proc.stderr and "RAY_AUTH_MODE=token" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_concurrent_proposals_differ_constant_liar(tmp_path):
    """Two trials asked while the first is still running get different points. Measured on this space:
    0 of 40 pairs were equal with the constant liar, 19 of 40 without it."""
    space = SearchSpace(
        name="tiny",
        params={
            "NCCL_PROTO": ParamSpec(choices=(None, "LL", "LL128", "Simple")),
            "NCCL_ALGO": ParamSpec(choices=(None, "Ring", "Tree")),
            "NCCL_MAX_NCHANNELS": ParamSpec(choices=(None, 2, 4, 8)),
        },
    )

    def value(p):  # one clear optimum, so a sampler without the liar proposes it twice
        return (
            {"LL": 30, "LL128": 20, "Simple": 10, None: 0}[p["NCCL_PROTO"]]
            + {"Ring": 6, "Tree": 3, None: 0}[p["NCCL_ALGO"]]
            + (p["NCCL_MAX_NCHANNELS"] or 0)
        )

    pairs = []
    for seed in range(5):
        study = Study(
            f"sqlite:///{tmp_path / f'{seed}.db'}",
            "liar",
            space,
            SamplerSpec(kind="tpe", seed=seed, startup_trials=6),
            ["maximize"],
        )
        study.open()
        for _ in range(6):
            number, params, _ = study.ask()
            study.tell_complete(number, [value(params)], {})
        for _ in range(8):
            first, second = study.ask(), study.ask()  # the first is RUNNING while the second is asked
            pairs.append((first[1], second[1]))
            for number, params, _ in (first, second):
                study.tell_complete(number, [value(params)], {})
    assert [p for p in pairs if sp.key(p[0]) == sp.key(p[1])] == []
