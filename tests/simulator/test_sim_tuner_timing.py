"""A loaded NCCL tuner rule file sets the simulated server's timing, as the ranks' TUNING lines say it does.

The launch goes through `params_from_launch` (the server's own path from argv + environment to the model)
with real files: a library named like ext-tuner/example and a CSV rule file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from orchestrator.config.experiment import load
from orchestrator.probe import run_probe
from orchestrator.probe.tuner import tuner_file_from
from orchestrator.simulator import evaluate, load_hardware, load_model, model, params_from_launch

PCIE = load_hardware("pcie-rtxpro6000-x8")
KIMI = load_model("kimi-k2.5")
PLAIN = ["--model-path", "kimi-k2.5", "--tp-size", "8"]
EAGLE3 = [*PLAIN, "--speculative-algorithm", "EAGLE3"]
ALL_REDUCE = re.compile(
    r"\[(\d+)\] NCCL INFO AllReduce: (\d+) Bytes -> Algo (\w+) proto (\w+) channel\{Lo\.\.Hi\}=\{0\.\.(\d+)\}"
)


def plugin_env(tmp_path: Path, rules: str | None, **extra: str) -> dict[str, str]:
    """The environment that loads the simulated ext-tuner/example with `rules` (None: no rule file)."""
    lib = tmp_path / "libnccl-tuner-example.so"
    lib.write_bytes(b"\x7fELF")
    config = tmp_path / "rules.csv"
    if rules is not None:
        config.write_text(rules)
    return {"NCCL_TUNER_PLUGIN": str(lib), "NCCL_TUNER_CONFIG_FILE": str(config), **extra}


def speed(argv: list[str], env: dict[str, str], concurrency: int) -> model.Prediction:
    return evaluate(params_from_launch(argv, env), PCIE, KIMI, concurrency=concurrency)


LL_8 = "allreduce,0,1048576,ring,ll,8,1,8\n"
SIMPLE_1 = "allreduce,0,1048576,ring,simple,1,1,8\n"


@pytest.mark.parametrize("concurrency", [8, 16])
def test_a_rule_forcing_ll_on_8_channels_decodes_as_nccl_proto_ll_with_8_channels(tmp_path, concurrency):
    by_rule = speed(PLAIN, plugin_env(tmp_path, LL_8), concurrency)
    by_env = speed(PLAIN, {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "8"}, concurrency)
    default = speed(PLAIN, {}, concurrency)
    assert (by_rule.nccl_protocol, by_rule.nccl_channels) == (by_env.nccl_protocol, by_env.nccl_channels) == ("LL", 8)
    assert by_rule.decode_tok_s == pytest.approx(by_env.decode_tok_s, rel=1e-12)
    assert by_rule.decode_tok_s > default.decode_tok_s  # NCCL's own choice here is Simple


def test_a_rules_channels_are_not_reduced_for_small_messages_as_ncclS_own_are(tmp_path):
    """One stream's 14 KiB all-reduce: NCCL trims its own 8 channels to 1, a plugin's 8 stay 8 (enqueue.cc)."""
    assert speed(PLAIN, {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "8"}, 1).nccl_channels == 1
    assert speed(PLAIN, plugin_env(tmp_path, LL_8), 1).nccl_channels == 8


@pytest.mark.parametrize("argv", [PLAIN, EAGLE3], ids=["plain", "eagle3"])
@pytest.mark.parametrize("concurrency", [1, 8, 32])
def test_a_rule_forcing_simple_on_one_channel_is_slower(tmp_path, argv, concurrency):
    forced = speed(argv, plugin_env(tmp_path, SIMPLE_1), concurrency)
    assert (forced.nccl_protocol, forced.nccl_channels) == ("Simple", 1)
    assert forced.decode_tok_s < speed(argv, {}, concurrency).decode_tok_s


@pytest.mark.parametrize(
    ("case", "env"),
    [
        ("no plugin asked for", {}),
        (
            "a plugin path that does not exist",
            {"NCCL_TUNER_PLUGIN": "/nonexistent/libnccl-tuner-example.so", "NCCL_TUNER_CONFIG_FILE": "{tmp}/rules.csv"},
        ),
        (
            "a library that is no tuner",
            {"NCCL_TUNER_PLUGIN": "{tmp}/libnccl-net.so", "NCCL_TUNER_CONFIG_FILE": "{tmp}/rules.csv"},
        ),
        ("the plugin turned off", {"NCCL_TUNER_PLUGIN": "none", "NCCL_TUNER_CONFIG_FILE": "{tmp}/rules.csv"}),
    ],
)
def test_a_plugin_that_does_not_load_changes_nothing(tmp_path, case, env):
    (tmp_path / "libnccl-net.so").write_bytes(b"\x7fELF")
    (tmp_path / "rules.csv").write_text(SIMPLE_1)
    env = {k: v.format(tmp=tmp_path) for k, v in env.items()}
    assert params_from_launch(EAGLE3, env)[model.TUNER_RULES] is None, case
    for concurrency in (1, 8):
        assert speed(EAGLE3, env, concurrency) == speed(EAGLE3, {}, concurrency), case


def test_a_loaded_plugin_without_its_rule_file_runs_ncclS_choice_on_one_channel(tmp_path):
    """ext-tuner/example sets one channel before it looks for a rule; with no file it finds none."""
    for concurrency in (8, 16):
        alone, default = speed(PLAIN, plugin_env(tmp_path, None), concurrency), speed(PLAIN, {}, concurrency)
        assert (alone.nccl_algorithm, alone.nccl_protocol) == (default.nccl_algorithm, default.nccl_protocol)
        assert alone.nccl_channels == 1 < default.nccl_channels
        assert alone.decode_tok_s < default.decode_tok_s


def test_nccl_proto_masks_a_rule_and_the_next_rule_applies(tmp_path):
    rules = "allreduce,0,1048576,ring,ll,8,1,8\nallreduce,0,1048576,ring,simple,6,1,8\n"
    masked = speed(PLAIN, plugin_env(tmp_path, rules, NCCL_PROTO="Simple"), 8)
    assert (masked.nccl_protocol, masked.nccl_channels) == ("Simple", 6)
    only_ll = speed(PLAIN, plugin_env(tmp_path, LL_8, NCCL_PROTO="Simple"), 8)
    assert (only_ll.nccl_protocol, only_ll.nccl_channels) == ("Simple", 1)  # no usable rule: one channel


def logged_choices(text: str) -> dict[int, tuple[str, str, int]]:
    """Rank 0's TUNING decisions: bytes -> (algorithm, protocol, channels); every rank must say the same."""
    per_rank: dict[int, dict[int, tuple[str, str, int]]] = {}
    for rank, nbytes, algo, proto, last in ALL_REDUCE.findall(text):
        per_rank.setdefault(int(rank), {})[int(nbytes)] = (algo, proto, int(last) + 1)
    assert len(per_rank) == 8 and all(choices == per_rank[0] for choices in per_rank.values())
    return per_rank[0]


@pytest.mark.parametrize(
    ("case", "rules", "extra"),
    [
        (
            "rules by size",
            "allreduce,0,20000,ring,ll,2,1,8\nallreduce,20001,50000,tree,ll128,-1,1,8\n"
            "allreduce,50001,1048576,ring,simple,0,1,8\n",
            {},
        ),
        (
            "a masked rule and no match",
            "allreduce,0,20000,ring,ll,5,1,8\nallreduce,0,30000,ring,simple,3,1,4\n",
            {"NCCL_PROTO": "^LL"},
        ),
    ],
)
def test_the_ranks_tuning_lines_are_the_choices_the_model_times(sim_factory, tmp_path, case, rules, extra):
    env = {**plugin_env(tmp_path, rules, **extra), "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "TUNING"}
    argv = [
        "--tp-size",
        "8",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "2",
        "--speculative-num-draft-tokens",
        "4",
        "--disable-custom-all-reduce",
    ]
    sim = sim_factory(*argv, "--sim-noise", "0", env=env)
    sim.wait_ready()
    logged = logged_choices(sim.log())
    cfg = model.resolve(params_from_launch(["--model-path", "kimi-k2.5", *argv], env), PCIE, KIMI)
    assert isinstance(cfg, model.Config)
    token = KIMI.hidden_size * KIMI.dtype_bytes
    assert sorted(logged) == [token, 2 * token, 4 * token], case
    for nbytes, (algo, proto, channels) in logged.items():
        used = model.all_reduce(PCIE, cfg.nccl, 8, nbytes, cfg.cuda_graph, False)
        assert (used.algorithm.upper(), used.protocol.upper(), used.channels) == (algo, proto, channels), (case, nbytes)
    if extra:
        assert "is marked as IGNORE" in sim.log() and "No matching config found" in sim.log()


def probe_spec(tmp_path: Path):
    """The demo's probe on the field report's PCIe host, without noise."""
    repo = Path(__file__).resolve().parents[2]
    data = {
        "name": "tuner-e2e",
        "engine": "simulator",
        "server": {
            "model": "moonshotai/Kimi-K2.5",
            "draft_model": "lightseekorg/kimi-k2.5-eagle3",
            "tp": 8,
            "env": {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV"},
        },
        "simulator": {"hardware_profile": "pcie-rtxpro6000-x8", "model_profile": "kimi-k2.5", "noise": 0.0},
        "search_space": [str(repo / "search_spaces" / "nccl.yaml"), str(repo / "search_spaces" / "eagle3.yaml")],
        "benchmark": {"requests": 3, "concurrency": 1, "input_len": 64, "output_len": 64},
        "sampler": {"seed": 1},
        "promotion": {"model_name": "tuner-e2e"},
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return load(tmp_path / "exp.yaml")


def test_the_probes_exported_rules_decode_at_least_as_fast_as_nccl_defaults(tmp_path):
    """probe -> `sweep export --format nccl-tuner` -> a server loading the file, on pcie-rtxpro6000-x8
    (measured: plain decode 59.76 / 49.54 / 37.34 / 21.54 tok/s at 1 / 4 / 8 / 32 streams with NCCL's defaults,
    59.76 / 50.08 / 40.61 / 22.19 with the rules; EAGLE3 76.50 / 37.98 / 20.81 at 1 / 8 / 32 against
    77.12 / 39.08 / 20.82)."""
    run_probe(probe_spec(tmp_path), tmp_path / "wd", budget=48)
    text, _ = tuner_file_from(tmp_path / "wd")
    env = plugin_env(tmp_path, text)
    gains = []
    for argv in (PLAIN, EAGLE3):
        for concurrency in (1, 4, 8, 32):
            tuned, default = speed(argv, env, concurrency), speed(argv, {}, concurrency)
            assert tuned.decode_tok_s >= default.decode_tok_s * (1 - 1e-12), (argv[-1], concurrency)
            gains.append(tuned.decode_tok_s / default.decode_tok_s)
    assert max(gains) > 1.05  # the rules are worth loading, not only harmless
