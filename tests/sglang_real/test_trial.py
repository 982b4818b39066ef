"""One trial of the tool's `engine: sglang` path against a real SGLang 0.5.23 server on CPU, run as a Ray
actor runs it (trial.runner.run_trial): TP=2 measured by SGLang's own bench_serving, and a launch that
SGLang refuses at start-up."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest
from e2e_helpers import MARKER, wait_until_gone, write_experiment
from real_helpers import cpu_experiment, write_space

from orchestrator.config import experiment as spec_mod
from orchestrator.records import TrialSpec, TrialStatus
from orchestrator.search import space as sp
from orchestrator.trial.runner import run_trial

REFERENCE = Path(__file__).resolve().parents[2] / "orchestrator" / "reference" / "sglang_0_5_23"
_FAMILY = re.compile(r"^# TYPE (\S+) ", re.M)


def test_a_tp2_trial_measured_by_bench_serving(tmp_path: Path, sglang_python: str, tiny_model: Path) -> None:
    data = cpu_experiment(
        "real-tp2",
        tiny_model,
        sglang_python,
        write_space(tmp_path),
        server={"tp": 2},
        benchmark={"engine": "bench_serving", "repeats": 2},
    )
    # SGLang's CPU engine at TP>1 asserts that each rank's cores are named (sglang/srt/utils/common.py,
    # get_cpu_ids_by_node): one core per rank on the 2-core CI machine.
    data["server"]["env"]["SGLANG_CPU_OMP_THREADS_BIND"] = "0|1"
    # torch's CUDA build brings libnccl, so SGLang would start PyNccl on the CPU group and fail in
    # torch.cuda.device("cpu"); a library path that does not load is SGLang's own way to run without it
    # (sglang/srt/distributed/device_communicators/pynccl.py, PyNcclCommunicator.__init__: "disable because
    # of missing NCCL library, e.g. in a non-GPU environment"; the path is read in pynccl_wrapper.py).
    data["server"]["env"]["SGLANG_NCCL_SO_PATH"] = "/nonexistent/libnccl.so.2"
    spec = spec_mod.load(write_experiment(tmp_path, data))
    params = {**sp.baseline_params(spec.space), "NCCL_PROTO": "LL"}
    folder = tmp_path / "0001"
    outcome = run_trial(TrialSpec(number=1, params=params, trial_dir=str(folder), experiment=spec, repeats=2))
    assert outcome.status is TrialStatus.COMPLETE, (outcome.reason, outcome.log_tail)

    # two ranks found by SGLang's process titles, the requested variables on each
    env = outcome.effective_env
    assert env["ok"] and sorted(env["workers"].values()) == [0, 1], env
    titles = {p["rank"]: p["cmdline"].split()[0] for p in env["processes"] if p["rank"] is not None}
    assert titles == {0: "sglang::scheduler_TP0", 1: "sglang::scheduler_TP1"}
    for p in env["processes"]:
        if p["rank"] is not None:
            assert {"NCCL_PROTO", "SGLANG_USE_CPU_ENGINE", "SGLANG_CPU_OMP_THREADS_BIND"} <= set(p["present"]), p
            # setproctitle may overwrite a retitled rank's /proc environ; then what spawned it is read, and said
            assert p["environ_source"] == "own" or p["environ_source"].startswith("sibling "), p
    # torch.distributed on gloo: the stand-in registers no sgl_kernel shm all-reduce, and NCCL takes no part
    assert outcome.allreduce_path == "gloo"

    # bench_serving's rows are the measurement: both repeats from one process (one SGLang import)
    assert len(outcome.repeats) == 2
    for r, m in enumerate(outcome.repeats):
        row = json.loads((folder / f"bench_serving-{r}.jsonl").read_text().splitlines()[-1])
        assert row["completed"] == 3 and m.requests_ok == 3
        assert m.output_tok_s == row["output_throughput"] > 0
        assert m.decode_tok_s == pytest.approx(1000.0 / row["median_tpot_ms"])
        assert m.sources["decode_tok_s"] == "bench_serving:1000/median_tpot_ms"
        # the server's /metrics around each repeat: families the reference knows, counters that moved
        before = (folder / f"bench_serving-{r}.metrics-before.txt").read_text()
        after = (folder / f"bench_serving-{r}.metrics-after.txt").read_text()
        known = set((REFERENCE / "metric_names.txt").read_text().split())
        families = set(_FAMILY.findall(after))
        assert "sglang:prompt_tokens_total" in families or "sglang:prompt_tokens" in families, sorted(families)[:20]
        assert families <= known | {f.removesuffix("_total") for f in known}, sorted(families - known)
        assert _counter(after, "sglang:generation_tokens_total") > _counter(before, "sglang:generation_tokens_total")
    server_log = (folder / "server.log").read_text()
    assert "Found nccl from environment variable SGLANG_NCCL_SO_PATH=/nonexistent/libnccl.so.2" in server_log
    log = (folder / "bench_serving.log").read_text()
    assert log.count("=== repeat ") == 2 and log.count("Serving Benchmark Result") == 2
    assert outcome.fingerprint["sglang"] == "0.5.23"


def _counter(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_launch_sglang_refuses_at_start_up_is_reported_with_its_own_exception(
    tmp_path: Path, sglang_python: str, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A context length above the model's: the tool's checks let it through (the model is not read before
    launch), SGLang refuses it at start-up in ModelConfig (sglang/srt/configs/model_config.py,
    _derive_context_length: a ValueError naming SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN)."""
    data = cpu_experiment(
        "real-refused",
        tiny_model,
        sglang_python,
        write_space(tmp_path),
        server={"flags": {"disable-overlap-schedule": True, "max-total-tokens": 8192, "context-length": 100000}},
    )
    spec = spec_mod.load(write_experiment(tmp_path, data))
    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARKER, marker)  # every process of this server inherits it
    folder = tmp_path / "0002"
    outcome = run_trial(
        TrialSpec(number=2, params=sp.baseline_params(spec.space), trial_dir=str(folder), experiment=spec)
    )
    assert outcome.status is TrialStatus.FAILED and outcome.failure_kind == "server_crash", outcome.reason
    assert outcome.reason.startswith(
        "server refused its arguments: ValueError: Warning: User-specified "
        "context_length (100000) is greater than the derived context_length (2048)"
    ), outcome.reason
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" in outcome.reason
    assert re.search(r"\((exit code \d+|killed by signal \d+ \(\w+\))\)$", outcome.reason), outcome.reason
    assert "Traceback (most recent call last)" in outcome.log_tail
    assert not (folder / "server.pid").exists()  # stopped: the pid file goes with the server
    assert wait_until_gone(marker, timeout_s=30) == {}  # launcher, scheduler, detokenizer: all gone


def test_a_flag_value_sglang_serve_refuses_is_reported_in_its_parser_words(
    tmp_path: Path, sglang_python: str, tiny_model: Path
) -> None:
    """A fixed flag value the tool passes on (it checks the flag's name, not every value) and SGLang's
    argparse refuses before anything starts: 0.5.23 names its parser `sglang serve`
    (sglang/srt/server_args.py::prepare_server_args), so the refusal reads "sglang serve: error: ..."."""
    data = cpu_experiment(
        "real-refused-flag",
        tiny_model,
        sglang_python,
        write_space(tmp_path),
        server={"flags": {"disable-overlap-schedule": True, "max-total-tokens": 8192, "tokenizer-mode": "fast"}},
    )
    spec = spec_mod.load(write_experiment(tmp_path, data))
    folder = tmp_path / "0003"
    outcome = run_trial(
        TrialSpec(number=3, params=sp.baseline_params(spec.space), trial_dir=str(folder), experiment=spec)
    )
    assert outcome.status is TrialStatus.FAILED and outcome.failure_kind == "server_crash", outcome.reason
    assert outcome.reason.startswith(
        "server refused its arguments: sglang serve: error: argument --tokenizer-mode: invalid choice: 'fast'"
    ), outcome.reason
    assert outcome.reason.endswith("(exit code 2)"), outcome.reason
