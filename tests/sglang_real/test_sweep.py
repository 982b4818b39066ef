"""A 3-trial sweep of the tool's `engine: sglang` path against real SGLang 0.5.23 servers on CPU, to a
verdict and an exported env file: each trial's numbers, ranks, environment, versions and log lines are
the real server's."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from e2e_helpers import MARKER, new_workdir, sweep, wait_until_gone, write_experiment
from mlflow_fixtures import sqlite_store_template  # noqa: F401 (fixture)
from real_helpers import DECISIVE_BENCHMARK, DECISIVE_OBJECTIVE, cpu_experiment, write_space

from orchestrator.results.export import parse_env


def test_a_sweep_on_real_sglang_reaches_a_verdict_and_exports_an_env_file(
    tmp_path: Path, sglang_python: str, tiny_model: Path, sqlite_store_template: Path
) -> None:
    data = cpu_experiment(
        "real-cpu",
        tiny_model,
        sglang_python,
        write_space(tmp_path),
        objective=DECISIVE_OBJECTIVE,
        benchmark=DECISIVE_BENCHMARK,
    )
    exp = write_experiment(tmp_path, data)
    wd = new_workdir(tmp_path, sqlite_store_template)
    marker = uuid.uuid4().hex
    proc = sweep("run", str(exp), "--workdir", str(wd), timeout=1400, env={MARKER: marker})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Traceback" not in out
    assert wait_until_gone(marker, timeout_s=30) == {}  # servers, schedulers, detokenizers, Ray: all gone

    outcomes = {int(d.name): json.loads((d / "outcome.json").read_text()) for d in (wd / "trials").iterdir()}
    assert len(outcomes) == 3 and all(o["status"] == "COMPLETE" for o in outcomes.values()), {
        n: (o["status"], o["reason"]) for n, o in outcomes.items()
    }
    for n, o in outcomes.items():
        folder = wd / "trials" / f"{n:04d}"
        m = o["metrics"]
        b = data["benchmark"]
        assert m["decode_tok_s"] > 0 and m["output_tok_s"] > 0, m
        assert m["requests_ok"] == b["requests"] * b["repeats"] and m["sources"]["summary"] == "median_of_2_repeats", m
        records = [json.loads(line) for line in (folder / "bench.jsonl").read_text().splitlines()]
        measured = [r for r in records if not r["warmup"]]
        assert len(measured) == 6 and all(r["ok"] and r["completion_tokens"] == b["output_len"] for r in measured)
        assert all(r["meta_info"]["finish_reason"] and r["meta_info"]["prompt_tokens"] for r in measured)
        assert m["ttft_ms_p50"] > 0 and m["itl_ms_p50"] > 0
        # one rank (the TP=1 scheduler titled plain `sglang::scheduler`), its detokenizer not counted
        env = o["effective_env"]
        assert env["ok"] and list(env["workers"].values()) == [0], env
        titles = {p["cmdline"].split()[0] for p in env["processes"] if p["cmdline"]}
        assert {"sglang::scheduler", "sglang::detokenizer"} <= titles, titles
        rank0 = next(p for p in env["processes"] if p["rank"] == 0)
        assert "SGLANG_USE_CPU_ENGINE" in rank0["present"]
        if o["params"].get("NCCL_PROTO"):
            assert "NCCL_PROTO" in rank0["present"]  # the swept variable reached the scheduler
        # the server interpreter's versions, not the sweep's own
        fp = o["fingerprint"]
        assert (fp["torch"], fp["sglang"], fp["server_python"]) == ("2.14.1", "0.5.23", sglang_python), fp
        info = json.loads((folder / "server_info.json").read_text())
        assert (info["version"], info["device"], info["tp_size"]) == ("0.5.23", "cpu", 1)
        log = (folder / "server.log").read_text()
        assert "The current platform does not support Intel AMX, will fallback to torch_native backend" in log
        assert "The server is fired up and ready to roll!" in log
        assert "Decode batch" in log and '"POST /generate HTTP/1.1" 200' in log
        launch = json.loads((folder / "launch.json").read_text())
        assert launch["argv"][:3] == [sglang_python, "-m", "sglang.launch_server"]
        assert launch["argv"][launch["argv"].index("--device") + 1] == "cpu"
        if o["params"].get("max_running_requests"):
            assert f"max_running_requests={o['params']['max_running_requests']}" in log

    # the verdict and the champion's env file
    summary = json.loads((wd / "summary.json").read_text())
    assert summary["promoted"] and summary["verdict"], summary
    assert "promoted" in out
    env_file = tmp_path / "champion.env"
    exported = sweep("export", "--workdir", str(wd), "--format", "env", "-o", str(env_file))
    assert exported.returncode == 0, exported.stdout + exported.stderr
    env = parse_env(env_file.read_text())
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"
    champion = summary["champion"]["params"]
    assert env.get("NCCL_PROTO") == champion.get("NCCL_PROTO")
