"""Launch plans: the exact argv and environment SGLang receives, per SGLang version."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import experiment as spec_mod
from orchestrator.config import flags, knobs
from orchestrator.config.experiment import ParamSpec, SearchSpace, SweepSpec
from orchestrator.search import space as sp
from orchestrator.trial import plan as planner

ROOT = Path(__file__).resolve().parents[2]
HELP = ROOT / "orchestrator" / "reference" / "sglang_0_5_23" / "launch_server_help.txt"
USAGE = HELP.read_text().partition("\n\n")[0]


USAGE_FLAGS = frozenset(re.findall(r"(?<=[\[ ])(--[a-z0-9][a-z0-9-]*)(?=[\] \n])", USAGE))
"""Every option the usage block of `launch_server --help` (0.5.23) declares, one spelling each."""


def in_help_0_5_23(flag: str) -> bool:
    return flag in USAGE_FLAGS


def help_choices(flag: str) -> list[str]:
    m = re.search(rf"\[{re.escape(flag)} \{{([^}}]*)\}}\]", USAGE)
    assert m, flag
    return m.group(1).split(",")


def load(name: str) -> SweepSpec:
    return spec_mod.load(ROOT / "experiments" / name)


def with_knobs(s: SweepSpec, **params: ParamSpec) -> SweepSpec:
    """The experiment with more knobs in its space (flag knobs the shipped spaces leave out)."""
    return s.model_copy(update={"space": SearchSpace(params={**s.space.params, **params})})


EXTRA_KNOBS = dict(
    cuda_graph=ParamSpec(choices=(None, False, True)),
    cuda_graph_max_bs=ParamSpec(choices=(None, 8, 64)),
    speculative_attention_mode=ParamSpec(choices=(None, "prefill", "decode")),
    max_running_requests=ParamSpec(choices=(None, 16, 48)),
)


def sglang_specs() -> list[SweepSpec]:
    demo = load("demo.yaml").model_copy(update={"engine": "sglang"})
    kimi = load("kimi-k2.5-tp8.yaml")
    return [demo, kimi, with_knobs(kimi, **EXTRA_KNOBS)]


def feasible_points(s: SweepSpec, n: int = 150, seed: int = 0) -> Iterator[dict[str, Any]]:
    """The baseline, then random feasible points, then every feasible EAGLE combination."""
    yield sp.baseline_params(s.space)
    rng = random.Random(seed)
    shown = 0
    while shown < n:
        p = sp.random_point(s.space, rng)
        if sp.infeasible_reason(p) is None:
            shown += 1
            yield p
    eagle_names = [k for k in s.space.params if k.startswith("speculative_")]
    eagle_space = SearchSpace(params={k: s.space.params[k] for k in eagle_names})
    for e in sp.points(eagle_space):
        p = {**sp.random_point(s.space, rng), **e}
        if sp.infeasible_reason(p) is None:
            yield p


def make(s: SweepSpec, params: dict[str, Any], port: int = 30000):
    return planner.make(s, params, port=port)


def test_every_flag_of_every_plan_is_in_the_0_5_23_help() -> None:
    emitted: set[str] = set()
    for s in sglang_specs():
        for params in feasible_points(s):
            argv = list(make(s, params).argv)
            assert argv[1:3] == ["-m", "sglang.launch_server"]
            flags = {a for a in argv[3:] if a.startswith("-")}
            assert all(in_help_0_5_23(f) for f in flags), sorted(f for f in flags if not in_help_0_5_23(f))
            emitted |= flags
    # the sample reached every flag the knobs can produce
    assert {
        "--speculative-algorithm",
        "--speculative-draft-model-path",
        "--speculative-num-steps",
        "--speculative-eagle-topk",
        "--speculative-num-draft-tokens",
        "--speculative-attention-mode",
        "--disable-custom-all-reduce",
        "--cuda-graph-backend-decode",
        "--cuda-graph-max-bs-decode",
        "--max-running-requests",
        "--enable-metrics",
        "--tp-size",
        "--model-path",
        "--host",
        "--port",
    } <= emitted


def test_known_flags_are_the_declared_options_and_their_aliases() -> None:
    known = flags.known_flags("0.5.23")
    assert known is not None
    aliases = set(re.findall(r", (--[a-z0-9-]+)", "\n".join(re.findall(r"(?m)^  -.*$", HELP.read_text()))))
    assert USAGE_FLAGS - {"--help"} <= known <= USAGE_FLAGS | aliases
    assert {"--tp-size", "--tensor-parallel-size", "--cuda-graph-max-bs-decode"} <= known
    # argparse accepts --tp only as an abbreviation; 0.5.23 rejects --cuda-graph-max-bs as ambiguous
    assert "--tp" not in known and "--cuda-graph-max-bs" not in known
    # flags merely mentioned in help prose are not options
    assert "--sidecar-shutdown-timeout" not in known


def test_tp_size_not_the_abbreviation() -> None:
    s = load("kimi-k2.5-tp8.yaml")
    argv = list(make(s, sp.baseline_params(s.space)).argv)
    assert "--tp" not in argv
    assert argv[argv.index("--tp-size") + 1] == "8"


GRAPH_OFF = {"cuda_graph": False, "cuda_graph_max_bs": 64}


@pytest.mark.parametrize(
    ("version", "present", "absent"),
    [
        (
            "0.5.9",
            [["--disable-cuda-graph"], ["--cuda-graph-max-bs", "64"]],
            ["--cuda-graph-max-bs-decode", "--cuda-graph-backend-decode"],
        ),
        (
            "0.5.16",
            [["--disable-cuda-graph"], ["--cuda-graph-max-bs-decode", "64"]],
            ["--cuda-graph-max-bs", "--cuda-graph-backend-decode"],
        ),
        (
            "0.5.23",
            [["--cuda-graph-backend-decode", "disabled"], ["--cuda-graph-max-bs-decode", "64"]],
            ["--cuda-graph-max-bs", "--disable-cuda-graph"],
        ),
    ],
)
def test_flag_names_follow_the_sglang_version(version: str, present: list[list[str]], absent: list[str]) -> None:
    s = with_knobs(
        load("kimi-k2.5-tp8.yaml"),
        cuda_graph=EXTRA_KNOBS["cuda_graph"],
        cuda_graph_max_bs=EXTRA_KNOBS["cuda_graph_max_bs"],
    )
    s = s.model_copy(update={"sglang_version": version})
    argv = list(make(s, {**sp.baseline_params(s.space), **GRAPH_OFF}).argv)
    for seq in present:
        i = argv.index(seq[0])
        assert argv[i : i + len(seq)] == seq
    for flag in absent:
        assert flag not in argv


def test_0_5_23_graph_flags_are_valid_there() -> None:
    assert "disabled" in help_choices("--cuda-graph-backend-decode")
    assert in_help_0_5_23("--cuda-graph-max-bs-decode")
    assert not in_help_0_5_23("--cuda-graph-max-bs")


def test_argv_is_a_list_of_words_never_a_shell_string() -> None:
    s = load("kimi-k2.5-tp8.yaml")
    s = s.model_copy(
        update={
            "server": s.server.model_copy(
                update={"model": "/models/Kimi K2.5; rm -rf /", "draft_model": "/models/draft $(id)"}
            )
        }
    )
    params = {
        **sp.baseline_params(s.space),
        "speculative_algorithm": "EAGLE3",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
    }
    lp = make(s, params)
    argv = list(lp.argv)
    assert all(isinstance(a, str) for a in argv)
    assert argv[argv.index("--model-path") + 1] == "/models/Kimi K2.5; rm -rf /"
    assert argv[argv.index("--speculative-draft-model-path") + 1] == "/models/draft $(id)"
    assert not {"sh", "bash", "-c", "/bin/sh"} & set(argv)
    assert all(" --" not in a for a in argv)
    # the human-readable rendering quotes, so pasting it runs the same argv
    assert "'/models/Kimi K2.5; rm -rf /'" in planner.launch_command(lp)


def test_env_holds_only_allowed_names_and_the_trials_values_as_strings() -> None:
    for s in sglang_specs():
        for params in feasible_points(s, n=60):
            env = make(s, params).env
            assert all(isinstance(v, str) for v in env.values())
            assert all(knobs.env_rule(name) is None for name in env)
            for name, value in params.items():
                if knobs.KNOBS[name].target == "env":
                    if value is None:
                        assert env.get(name) == s.server.env.get(name)
                    else:
                        assert env[name] == str(value)
                else:
                    assert name not in env
            assert {k: v for k, v in env.items() if k not in params} == s.server.env


def test_none_knobs_produce_nothing() -> None:
    s = with_knobs(load("kimi-k2.5-tp8.yaml"), **EXTRA_KNOBS)
    lp = make(s, sp.baseline_params(s.space))
    assert list(lp.argv[3:]) == [
        "--model-path",
        "/models/Kimi-K2.5",
        "--tp-size",
        "8",
        "--host",
        "127.0.0.1",
        "--port",
        "30000",
        "--trust-remote-code",
        "--mem-fraction-static",
        "0.85",
        "--decode-log-interval",
        "40",
        "--enable-metrics",
    ]
    assert lp.env == s.server.env
    # cuda_graph true is the engine's default: nothing to pass either
    assert make(s, {**sp.baseline_params(s.space), "cuda_graph": True}).argv == lp.argv


def test_serving_config_has_env_and_tuned_args_but_no_per_host_args() -> None:
    s = load("kimi-k2.5-tp8.yaml")
    params = {
        **sp.baseline_params(s.space),
        "NCCL_PROTO": "LL",
        "NCCL_BUFFSIZE": 4194304,
        "speculative_algorithm": "EAGLE3",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 2,
        "speculative_num_draft_tokens": 6,
        "all_reduce_path": "nccl",
    }
    cfg = planner.serving_config(
        s, params, trial_number=7, run_id="r1", metrics={"decode_tok_s": 123}, fingerprint_hash="fp"
    )
    json.dumps(cfg.model_dump(mode="json"))  # what the registry stores must be plain JSON
    lp = make(s, params)
    assert cfg.env == lp.env and cfg.env["NCCL_PROTO"] == "LL" and cfg.env["NCCL_BUFFSIZE"] == "4194304"
    args = list(cfg.sglang_args)
    assert not {"--model-path", "--model", "--port", "--host"} & set(args)
    for flag, value in [
        ("--speculative-num-steps", "3"),
        ("--speculative-eagle-topk", "2"),
        ("--speculative-num-draft-tokens", "6"),
        ("--tp-size", "8"),
    ]:
        assert args[args.index(flag) + 1] == value
    assert "--disable-custom-all-reduce" in args
    tail = list(lp.argv[lp.argv.index("--port") + 2 :])
    assert args[2:] == tail  # the same flags the trial ran with, after --tp-size


def test_simulator_gets_the_same_sglang_argv() -> None:
    sim = load("demo.yaml")
    real = sim.model_copy(update={"engine": "sglang"})
    params = next(p for p in feasible_points(sim, n=5) if p["speculative_algorithm"])
    a, b = list(make(sim, params).argv), list(make(real, params).argv)
    assert a[2] == "orchestrator.simulator" and b[2] == "sglang.launch_server"
    assert a[3 : len(b)] == b[3:]
    assert a[len(b)] == "--hardware-profile"


# -------------------------------------------------------------------------- warnings


def test_warns_when_deterministic_inference_overwrites_nccl_algo() -> None:
    s = load("kimi-k2.5-tp8.yaml")
    s = s.model_copy(
        update={
            "server": s.server.model_copy(update={"flags": {**s.server.flags, "enable-deterministic-inference": True}})
        }
    )
    assert in_help_0_5_23("--enable-deterministic-inference")
    base = sp.baseline_params(s.space)
    hit = make(s, {**base, "NCCL_ALGO": "Ring"}).warnings
    assert any(w.startswith("--enable-deterministic-inference overwrites NCCL_ALGO") for w in hit), hit
    assert not any("deterministic" in w for w in make(s, base).warnings)


def nvlink(s: SweepSpec) -> SweepSpec:
    return s.model_copy(update={"simulator": s.simulator.model_copy(update={"hardware_profile": "h200-nvlink-x8"})})


def test_warns_when_nccl_is_swept_under_custom_all_reduce_on_nvlink() -> None:
    s = nvlink(load("demo.yaml"))
    base = sp.baseline_params(s.space)
    custom = make(s, {**base, "NCCL_PROTO": "LL"}).warnings
    assert any(
        w.startswith("NCCL_PROTO is swept, but on this NVLink host SGLang's custom all-reduce") for w in custom
    ), custom
    # issue 19: the warning knows 0.5.23's FlashInfer fusion (overrides.py _flashinfer_allreduce_fusion_auto_enable),
    # which --disable-custom-all-reduce leaves on; all_reduce_backend nccl turns both off, and then no warning
    (warning,) = [w for w in custom if "custom all-reduce carries" in w]
    assert (
        "NCCL_* are inert for decode and verify either way (--disable-custom-all-reduce leaves the fusion on)"
        in warning
    )
    assert "Sweep all_reduce_backend nccl" in warning
    assert not any(
        "custom all-reduce carries" in w
        for w in make(s, {**base, "NCCL_PROTO": "LL", "all_reduce_backend": "nccl"}).warnings
    )
    # NCCL carries the all-reduces: the variables matter, no warning
    assert not any(
        "custom all-reduce carries" in w
        for w in make(s, {**base, "NCCL_PROTO": "LL", "all_reduce_path": "nccl"}).warnings
    )
    # nothing swept, or the PCIe host of the demo: no warning
    assert not any("custom all-reduce carries" in w for w in make(s, base).warnings)
    assert not any(
        "custom all-reduce carries" in w for w in make(load("demo.yaml"), {**base, "NCCL_PROTO": "LL"}).warnings
    )


def test_fixed_nccl_debug_is_not_reported_as_swept() -> None:
    s = nvlink(load("demo.yaml"))
    assert "NCCL_DEBUG" in s.server.env
    assert make(s, sp.baseline_params(s.space)).warnings == ()


def test_bench_serving_argv_uses_only_flags_of_its_help_dump() -> None:
    from orchestrator.trial import bench

    help_text = (ROOT / "orchestrator" / "reference" / "sglang_0_5_23" / "bench_serving_help.txt").read_text()
    known = set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", help_text))
    for dataset in (None, "/data/sharegpt.json"):
        argv = bench.bench_serving_argv(
            "python",
            "http://127.0.0.1:30000",
            model="/models/k",
            tokenizer=None,
            dataset_path=dataset,
            requests=16,
            concurrency=1,
            input_len=512,
            output_len=512,
            warmup_requests=2,
            seed=3,
            output_file="/tmp/o.jsonl",
        )
        flags = [a for a in argv if a.startswith("--")]
        assert set(flags) <= known, set(flags) - known
        assert argv[argv.index("--random-range-ratio") + 1] == "1.0"  # fixed lengths, not U[1, len]
        assert argv[argv.index("--dataset-name") + 1] == ("random" if dataset else "random-ids")
