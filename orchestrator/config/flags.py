"""SGLang's flag tables per version: the options `launch_server --help` declares, the flags a tuned
knob emits, and the flags the sweep sets itself (an experiment may not fix those in server.flags)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping
from importlib import resources

from orchestrator.config import knobs

MANAGED_FLAGS: Mapping[str, str] = {
    "--model-path": "server.model",
    "--tp-size": "server.tp",
    "--device": "server.device",
    "--host": "server.host",
    "--port": "server.port_range",
    "--speculative-algorithm": "the speculative_algorithm knob",
    "--speculative-draft-model-path": "server.draft_model or the speculative_draft_model_path knob",
    "--speculative-dflash-block-size": "the speculative_dflash_block_size knob",
    "--speculative-ngram-min-bfs-breadth": "the speculative_ngram_min_bfs_breadth knob",
    "--speculative-ngram-max-bfs-breadth": "the speculative_ngram_max_bfs_breadth knob",
    "--speculative-ngram-match-type": "the speculative_ngram_match_type knob",
    "--speculative-ngram-max-trie-depth": "the speculative_ngram_max_trie_depth knob",
    "--speculative-ngram-capacity": "the speculative_ngram_capacity knob",
    "--speculative-num-steps": "the speculative_num_steps knob",
    "--speculative-eagle-topk": "the speculative_eagle_topk knob",
    "--speculative-num-draft-tokens": "the speculative_num_draft_tokens knob",
    "--speculative-adaptive": "the speculative_adaptive knob (its rules are checked before each launch)",
    "--speculative-adaptive-config": "the speculative_adaptive_config knob (a JSON file checked at load as "
    "SGLang 0.5.23 checks it; steps are checked against its slots' union)",
}
"""Flag -> where its value comes from."""

OVERRIDING_FLAGS: Mapping[str, tuple[str, ...]] = {
    "--cuda-graph-config": ("cuda_graph", "cuda_graph_max_bs"),
    "--cuda-graph-bs-decode": ("cuda_graph_max_bs",),
}
"""Fixed flags SGLang lets win over what a knob emits, flag -> those knobs (0.5.23 --help: "JSON wins over
the per-phase --cuda-graph-* convenience flags"; an explicit capture list makes the largest batch moot).
With the knob swept, every trial would run the same server under different names."""

BACKEND_CONFLICTS: Mapping[str, tuple[tuple[str, ...], str]] = {
    "--disable-custom-all-reduce": (("custom",), "custom all-reduce is never built with it"),
    "--enforce-disable-flashinfer-allreduce-fusion": (
        ("flashinfer_fusion",),
        "it wins over the fusion, asked for or auto-enabled (overrides.py _enforce_disable_allreduce_fusion)",
    ),
    "--flashinfer-allreduce-fusion-backend": (
        ("nccl", "custom", "pcie_ipc", "torch_symm_mem", "mscclpp"),
        "those values pass --enforce-disable-flashinfer-allreduce-fusion, which wins over it",
    ),
    "--enable-flashinfer-allreduce-fusion": (
        ("nccl", "custom", "pcie_ipc", "torch_symm_mem", "mscclpp"),
        "those values pass --enforce-disable-flashinfer-allreduce-fusion, which wins over it",
    ),
    "--enable-mscclpp": (
        ("nccl", "custom", "pcie_ipc", "torch_symm_mem"),
        "MSCCL++ comes first in GroupCoordinator.all_reduce and takes every message up to 4 GiB",
    ),
    "--enable-torch-symm-mem": (("nccl",), "torch symmetric memory then carries what fits its buffer, not NCCL"),
    "--enable-deterministic-inference": (
        ("custom", "pcie_ipc"),
        "deterministic inference turns custom all-reduce and PCIe-IPC off",
    ),
}
"""Fixed flags that defeat values of the all_reduce_backend knob in SGLang 0.5.23 (config/allreduce.py's
resolution, read from its code): flag -> (the values, why). Swept beside them, those trials would run
another backend than their name says."""


def backend_conflict(flag: str, swept: Iterable[object]) -> str | None:
    """Why fixed `flag` cannot stand beside an all_reduce_backend swept over `swept`, or None."""
    values, why = BACKEND_CONFLICTS.get(flag, ((), ""))
    hit = [str(v) for v in swept if str(v) in values]
    if not hit:
        return None
    return (
        f"defeats all_reduce_backend {', '.join(hit)} of the search space in SGLang 0.5.23 ({why}), so "
        f"{'that trial' if len(hit) == 1 else 'those trials'} would run another backend than named; remove "
        f"it from server.flags or {'that value' if len(hit) == 1 else 'those values'} from the space"
    )


_HELP_FILES = {"0.5.23": "sglang_0_5_23/launch_server_help.txt"}

CUDA_GRAPH_CONFIG_EXAMPLE = '{"decode":{"backend":"full","max_bs":256},"prefill":{"backend":"breakable"}}'
"""The 0.5.23 --help example of --cuda-graph-config."""


def cuda_graph_config_problem(text: str) -> str | None:
    """Why SGLang refuses `text` as --cuda-graph-config when it parses its command line, or None.

    The flag's argparse type (`parse_cuda_graph_config_arg`, sglang model_executor/cuda_graph_config.py)
    wants a JSON object of phases (decode, prefill), each an object; anything else ends `sglang serve`
    with exit code 2 before it starts. It also refuses unknown keys inside a phase, but that key set
    changes between 0.5.x releases, so it is left to SGLang (the trial's server.log says which).
    """
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        return f"not JSON ({exc})"
    if not isinstance(parsed, dict):
        return f"a JSON {type(parsed).__name__}, not an object"
    for phase, settings in parsed.items():
        if phase not in ("decode", "prefill"):
            return f"unknown phase {phase!r}"
        if not isinstance(settings, dict):
            return f"phase {phase!r} is a JSON {type(settings).__name__}, not an object"
    return None


_VALUE_RULES: Mapping[str, tuple[Callable[[str], str | None], str]] = {
    "--cuda-graph-config": (
        cuda_graph_config_problem,
        f"a JSON object of phases (decode, prefill), each an object of settings, e.g. '{CUDA_GRAPH_CONFIG_EXAMPLE}'",
    ),
}
"""Flag -> (why SGLang's parser refuses a value, what it takes) for the fixed flags whose value SGLang
checks before start-up beyond a number; a bad one would fail every trial alike."""


_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
"""argparse's `_negative_number_matcher` (Python 3.11): such a word is a value, not an option."""


def dash_problem(value: str | int | float | bool | None) -> str | None:
    """Why SGLang's parser would read `value`, passed as the word after its flag, as an option instead
    (and refuse the command: "expected one argument"), or None.

    Read from argparse (`ArgumentParser._parse_optional`, Python 3.11), which SGLang 0.5.23 parses with
    (sglang/srt/server_args.py::prepare_server_args): a word that starts with '-' is an option unless it
    is a negative number, holds a space or is '-' alone. Checked against an argparse parser of SGLang's
    flags in tests/hardening/test_validation_gaps.py.
    """
    if (
        not isinstance(value, str)
        or not value.startswith("-")
        or value == "-"
        or _NEGATIVE_NUMBER.match(value)
        or " " in value
    ):
        return None
    return (
        f"the value {value!r} starts with '-', so SGLang's parser (argparse) would read it as another option "
        f'and refuse the command ("expected one argument"), failing every trial alike; fix the value '
        f"(no SGLang flag takes one that starts with '-', except a negative number)"
    )


def value_problem(flag: str, value: str | int | float | bool | None) -> str | None:
    """What is wrong with `value` for `flag` in server.flags and how to fix it, or None when SGLang
    would take it (or does not check it when it parses its command line)."""
    if why := dash_problem(value):
        return why
    rule = _VALUE_RULES.get(flag)
    if rule is None or value is None or value is False:  # None and false leave the flag out
        return None
    problem, takes = rule
    why = "true passes no value" if value is True else problem(str(value))
    if why is None:
        return None
    return (
        f"SGLang's {flag} takes {takes}, but got {value!r}: {why}; SGLang would refuse it when it reads "
        f"its command line, so every trial would fail; fix the value (one quoted YAML string)"
    )


def parse_help(text: str) -> frozenset[str]:
    """Every option string an argparse `--help` text declares (aliases included, `--help` left out)."""
    usage, _, options = text.partition("\n\n")
    # The usage block lists each option once; the option lines ("  --tp-size TP_SIZE, --tensor-parallel-size
    # TP_SIZE") add the aliases. Flags merely mentioned in help prose are not options.
    flags = set(re.findall(r"(?<=[\[ |])(--[a-z0-9][a-z0-9-]*[a-z0-9])", usage))
    for line in options.splitlines():
        if m := re.match(r"^  (--?\w.*?)(?:\s{2,}|$)", line):
            flags.update(tok for part in m.group(1).split(", ") if (tok := part.split(" ")[0]).startswith("--"))
    flags.discard("--help")
    return frozenset(flags)


@functools.cache
def known_flags(version: str) -> frozenset[str] | None:
    """Every option string `sglang.launch_server --help` of `version` declares (aliases included),
    or None when no dump of that version ships."""
    rel = _HELP_FILES.get(version)
    if rel is None:
        return None
    return parse_help(resources.files("orchestrator.reference").joinpath(rel).read_text(encoding="utf-8"))


def knob_flags(version: str) -> dict[str, str]:
    """Flags that a tuned knob emits (or that would fight it), flag -> knob, for `version`'s spelling."""
    names = knobs.FLAG_NAMES[version]
    table = {
        "--speculative-attention-mode": "speculative_attention_mode",
        "--disable-custom-all-reduce": "all_reduce_path",
        "--disable-cuda-graph": "cuda_graph",
        names.disable_cuda_graph[0]: "cuda_graph",
        names.cuda_graph_max_bs: "cuda_graph_max_bs",
        "--max-running-requests": "max_running_requests",
    }
    if version not in ("0.5.9",):
        table["--disable-decode-cuda-graph"] = "cuda_graph"
    return table
