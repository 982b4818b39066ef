"""The simulator's command line: SGLang 0.5.23's own parser, rebuilt from its --help dump, plus ours.

SGLang's flag table is generated at start-up from `orchestrator/reference/sglang_0_5_23/
launch_server_help.txt`, so every real flag is accepted and everything else is rejected exactly as
`sglang serve` rejects it (argparse, `allow_abbrev=True`, exit code 2; `--tp` works as an
abbreviation of `--tp-size`, `--cuda-graph-max-bs` is ambiguous since 0.5.20). The simulator's own
flags are taken out first by a separate parser that does not abbreviate, so they cannot change
which SGLang abbreviations resolve. The help dump carries no types or defaults; the few flags the
simulator interprets get theirs from `_TYPED` (values from reference INTERFACE.md), every other flag
is kept as the string given.

`resolve` (spec_resolve.py) then applies SGLang's resolution rules for the speculative algorithms and
`params_from_launch` turns (argv, environment) into the model's knob dict, so the server and
`model.evaluate` always agree on what a launch means.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from orchestrator.simulator.faults import Faults, parse_faults
from orchestrator.simulator.model import NCCL_PARAM_NAMES, TUNER_RULES
from orchestrator.simulator.profiles import DEFAULT_HARDWARE, DEFAULT_MODEL
from orchestrator.simulator.spec_resolve import (  # noqa: F401 - SGLang's resolution, reachable as cli.resolve
    ADAPTIVE_SLOTS,
    AdaptiveConfig,
    Resolved,
    adaptive_config,
    resolve,
)
from orchestrator.simulator.tuner_plugin import rules_for

PROG = "sglang serve"
_HELP_FILE = "launch_server_help.txt"

# dest -> (type, default) for the flags the simulator reads; defaults as SGLang 0.5.23 resolves them.
_TYPED: dict[str, tuple[type, Any]] = {
    "tp_size": (int, 1),
    "dp_size": (int, 1),
    "pp_size": (int, 1),
    "port": (int, 30000),
    "host": (str, "127.0.0.1"),
    "log_level": (str, "info"),
    "decode_log_interval": (int, 40),
    "speculative_num_steps": (int, None),
    "speculative_eagle_topk": (int, None),
    "speculative_num_draft_tokens": (int, None),
    "speculative_dflash_block_size": (int, None),
    "speculative_ngram_min_bfs_breadth": (int, 1),
    "speculative_ngram_max_bfs_breadth": (int, 10),
    "speculative_ngram_max_trie_depth": (int, 18),
    "speculative_ngram_capacity": (int, 10_000_000),
    "speculative_attention_mode": (str, "prefill"),
    "cuda_graph_max_bs_decode": (int, None),
    "cuda_graph_max_bs_prefill": (int, None),
    "max_running_requests": (int, None),
    "max_total_tokens": (int, None),
    "mem_fraction_static": (float, None),
    "random_seed": (int, None),
    "watchdog_timeout": (float, 300.0),
    "context_length": (int, None),
    "chunked_prefill_size": (int, None),
    "load_format": (str, "auto"),
    "nccl_port": (int, None),
    "page_size": (int, 1),
    "dist_timeout": (int, None),
    "stream_interval": (int, 1),
}


def cuda_graph_config_arg(text: str) -> str:
    """argparse type of --cuda-graph-config, as SGLang's `parse_cuda_graph_config_arg`
    (sglang/srt/model_executor/cuda_graph_config.py): the value must be a JSON object of phases
    (decode, prefill), each an object; otherwise argparse exits 2 with SGLang's sentence,
    `argument --cuda-graph-config: --cuda-graph-config must be JSON: ...`.

    SGLang also refuses keys a phase does not know; the simulator leaves that to it, because the key
    set changes between 0.5.x releases and the help dump does not list it. The text is kept as given:
    `cuda_graph_decode` reads it.
    """
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be a JSON object, got {type(parsed).__name__}")
    for phase, settings in parsed.items():
        if phase not in _CUDA_GRAPH_PHASES:
            raise argparse.ArgumentTypeError(
                f"--cuda-graph-config: unknown phase '{phase}', expected one of {_CUDA_GRAPH_PHASES}"
            )
        if not isinstance(settings, dict):
            raise argparse.ArgumentTypeError(
                f"--cuda-graph-config['{phase}'] must be a JSON object, got {type(settings).__name__}"
            )
    return text


_CUDA_GRAPH_PHASES = ("decode", "prefill")

# dest -> argparse type for flags whose value SGLang checks at parse time, beyond a plain int or float.
_PARSED: dict[str, Any] = {"cuda_graph_config": cuda_graph_config_arg}


@dataclass(frozen=True)
class _Option:
    strings: tuple[str, ...]
    dest: str
    nargs: str | None
    """None: no value (a switch); '1': one value; '+', '*', '?': argparse's."""
    choices: tuple[str, ...] | None
    negatable: bool
    deprecated: str | None


def _help_text() -> str:
    return (
        resources.files("orchestrator.reference")
        .joinpath("sglang_0_5_23")
        .joinpath(_HELP_FILE)
        .read_text(encoding="utf-8")
    )


_ARG_RE = re.compile(r"^(?P<metavar>\{[^}]*\}|[A-Z0-9_]+)?(?P<rest>.*)$")


def _parse_args_spec(spec: str) -> tuple[str | None, tuple[str, ...] | None]:
    """'X' -> ('1', None); 'X [X ...]' -> '+'; '[X ...]' -> '*'; '[X]' -> '?'; '{a,b}' -> choices."""
    spec = spec.strip()
    if not spec:
        return None, None
    if spec.startswith("[") and spec.endswith("...]"):
        inner = spec[1:].split()[0]
        return "*", tuple(inner[1:-1].split(",")) if inner.startswith("{") else None
    if spec.startswith("["):
        inner = spec[1:-1]
        return "?", tuple(inner[1:-1].split(",")) if inner.startswith("{") else None
    m = _ARG_RE.match(spec)
    assert m is not None
    metavar, rest = m["metavar"] or "", m["rest"].strip()
    choices = tuple(metavar[1:-1].split(",")) if metavar.startswith("{") else None
    return ("+" if rest.endswith("...]") else "1"), choices


@functools.lru_cache(maxsize=1)
def sglang_options() -> tuple[tuple[_Option, ...], frozenset[str]]:
    """Every option of `sglang serve` 0.5.23 and the set of required ones, read from the help dump."""
    text = _help_text()
    usage, _, body = text.partition("\noptions:\n")
    options = [
        opt for invocation, help_lines in _entries(body.splitlines()) if (opt := _option(invocation, help_lines))
    ]
    return tuple(options), frozenset(_required_in_usage(usage))


def _entries(lines: list[str]) -> list[tuple[str, list[str]]]:
    """(invocation, help lines) of each option of the help text's `options:` block."""
    entries: list[tuple[str, list[str]]] = []
    open_entry = False  # a help text continues only on the lines right after its option
    for line in lines:
        if line.startswith("  -"):
            invocation, _, help_first = line[2:].partition("  ")
            entries.append((invocation, [help_first.strip()]))
            open_entry = True
        elif open_entry and line.startswith(" " * 24):
            entries[-1][1].append(line.strip())
        else:
            open_entry = False
    return entries


def _joined(help_lines: list[str]) -> str:
    """The help text in one line; argparse wraps after hyphens: "--cuda-graph-" + "backend-..."."""
    help_text = ""
    for h in filter(None, help_lines):
        help_text += h if help_text.endswith("-") or not help_text else " " + h
    return help_text


def _option(invocation: str, help_lines: list[str]) -> _Option | None:
    """One option from its invocation ("--tp-size TP_SIZE, --tensor-parallel-size TP_SIZE") and help; None
    for -h."""
    strings, nargs, choices = [], None, None
    for part in (p.strip() for p in re.split(r", (?=-)", invocation.strip())):
        name, _, args = part.partition(" ")
        strings.append(name)
        if args:
            nargs, choices = _parse_args_spec(args)
    if "-h" in strings:
        return None
    longs = [s for s in strings if s.startswith("--")]
    negatable = any(s.startswith("--no-") and "--" + s[5:] in longs for s in longs)
    if negatable:
        strings = [s for s in strings if not s.startswith("--no-")]
    help_text = _joined(help_lines)
    deprecated = help_text if help_text.startswith("Deprecated") else None
    return _Option(tuple(strings), longs[0][2:].replace("-", "_"), nargs, choices, negatable, deprecated)


def _required_in_usage(usage: str) -> set[str]:
    depth, required = 0, set()
    for token in re.findall(r"\[|\]|[^\s\[\]]+", usage):
        if token == "[":
            depth += 1
        elif token == "]":
            depth -= 1
        elif depth == 0 and token.startswith("--"):
            required.add(token)
    return required


class _DeprecatedStoreTrue(argparse.Action):
    """SGLang's DeprecatedStoreTrueAction: works, and says it is deprecated."""

    def __init__(self, option_strings, dest, help=None, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=False, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"WARNING: {option_string} is deprecated. {(self.help or '').removeprefix('Deprecated. ')}", flush=True)
        setattr(namespace, self.dest, True)


class _PrintReferenceHelp(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS)

    def __call__(self, parser, namespace, values, option_string=None):
        sys.stdout.write(_help_text())
        sys.stdout.write("\n" + simulator_parser().format_help())
        parser.exit()


@functools.lru_cache(maxsize=1)
def sglang_parser() -> argparse.ArgumentParser:
    """An argparse parser that accepts exactly `sglang serve`'s 0.5.23 flags."""
    parser = argparse.ArgumentParser(prog=PROG, allow_abbrev=True, add_help=False)
    parser.add_argument("-h", "--help", action=_PrintReferenceHelp)
    options, required = sglang_options()
    for opt in options:
        kwargs: dict[str, Any] = {"dest": opt.dest}
        typ, default = _TYPED.get(opt.dest, (str, None))
        if opt.nargs is None:
            if opt.deprecated:
                kwargs.update(action=_DeprecatedStoreTrue, help=opt.deprecated)
            elif opt.negatable:
                kwargs.update(action=argparse.BooleanOptionalAction, default=None)
            else:
                kwargs.update(action="store_true")
        else:
            kwargs.update(type=_PARSED.get(opt.dest, typ), default=default)
            if opt.nargs != "1":
                kwargs["nargs"] = opt.nargs
            if opt.choices:
                kwargs["choices"] = opt.choices if typ is str else tuple(typ(c) for c in opt.choices)
        if any(s in required for s in opt.strings):
            kwargs["required"] = True
        parser.add_argument(*opt.strings, **kwargs)
    return parser


@functools.lru_cache(maxsize=1)
def simulator_parser() -> argparse.ArgumentParser:
    """The simulator-only flags (never abbreviated)."""
    p = argparse.ArgumentParser(
        prog="python -m orchestrator.simulator",
        add_help=False,
        allow_abbrev=False,
        description="simulator options (beside every `sglang serve` option)",
    )
    p.add_argument(
        "--hardware-profile",
        default=DEFAULT_HARDWARE,
        help=f"built-in hardware profile name or path to a YAML/JSON file (default {DEFAULT_HARDWARE})",
    )
    p.add_argument(
        "--model-profile",
        default=DEFAULT_MODEL,
        help=f"built-in model profile name or path to a YAML/JSON file (default {DEFAULT_MODEL})",
    )
    p.add_argument("--sim-seed", type=int, default=None, help="seed of noise and acceptance sampling")
    p.add_argument(
        "--sim-noise",
        type=float,
        default=0.03,
        help="run-to-run multiplicative noise on cycle time, a fraction (default 0.03)",
    )
    p.add_argument(
        "--sim-noise-prefill-correlation",
        type=float,
        default=1.0,
        metavar="R",
        help="how far a run's prefill time shares its decode noise, in [0, 1] (default 1: one speed "
        "for the whole run; 0: TTFT says nothing of the run's decode speed)",
    )
    p.add_argument(
        "--sim-drift",
        type=float,
        default=0.0,
        help="slow host drift: cycle time grows by this fraction per hour since --sim-drift-epoch",
    )
    p.add_argument(
        "--sim-drift-epoch",
        type=float,
        default=None,
        help="UNIX time the drift counts from (default: this process's start)",
    )
    p.add_argument(
        "--sim-time-scale",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="sleep this fraction of the model profile's real load and graph-capture seconds at "
        "start-up (default 0: start at once; 1: real-scale)",
    )
    p.add_argument(
        "--sim-fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a fault (repeatable; also env SWEEP_SIM_FAULTS, ';'-separated); "
        "see `python -m orchestrator.simulator --help`",
    )
    return p


@dataclass(frozen=True)
class SimOptions:
    hardware_profile: str
    model_profile: str
    seed: int | None
    noise: float
    drift_per_hour: float
    drift_epoch: float | None
    faults: Faults
    time_scale: float = 0.0
    """Fraction of the model profile's real start-up seconds slept at start-up."""
    prefill_correlation: float = 1.0
    """How far a run's prefill time shares its run-to-run noise on decode (--sim-noise-prefill-correlation)."""


def parse(argv: Sequence[str], env: Mapping[str, str]) -> tuple[argparse.Namespace, SimOptions]:
    """Parse a command line as `sglang serve` + simulator flags; argparse exits 2 on bad input."""
    sim_ns, rest = simulator_parser().parse_known_args(list(argv))
    fault_specs = list(sim_ns.sim_fault)
    fault_specs += [s for s in env.get("SWEEP_SIM_FAULTS", "").split(";") if s.strip()]
    try:
        faults = parse_faults(fault_specs)
    except ValueError as exc:
        simulator_parser().error(str(exc))
    if sim_ns.sim_noise < 0 or sim_ns.sim_noise >= 0.5:
        simulator_parser().error(f"--sim-noise must be in [0, 0.5), but got {sim_ns.sim_noise}")
    if not 0 <= sim_ns.sim_noise_prefill_correlation <= 1:
        simulator_parser().error(
            f"--sim-noise-prefill-correlation must be in [0, 1], but got {sim_ns.sim_noise_prefill_correlation}"
        )
    if not 0 <= sim_ns.sim_time_scale <= 1:
        simulator_parser().error(f"--sim-time-scale must be in [0, 1], but got {sim_ns.sim_time_scale}")
    ns = sglang_parser().parse_args(rest)
    return ns, SimOptions(
        sim_ns.hardware_profile,
        sim_ns.model_profile,
        sim_ns.sim_seed,
        sim_ns.sim_noise,
        sim_ns.sim_drift,
        sim_ns.sim_drift_epoch,
        faults,
        sim_ns.sim_time_scale,
        sim_ns.sim_noise_prefill_correlation,
    )


def cuda_graph_decode(args: Mapping[str, Any]) -> tuple[bool, int | None]:
    """Whether decode/verify run in CUDA graphs, and the largest batch captured (None = default).

    SGLang folds the convenience and legacy flags (--disable-cuda-graph, --disable-decode-cuda-graph,
    --cuda-graph-backend-decode, --cuda-graph-max-bs-decode) into cuda_graph_config, and every (phase,
    key) the --cuda-graph-config JSON names is locked: "JSON wins over the per-phase --cuda-graph-*
    convenience flags and over legacy flags" (0.5.23 --help; sglang model_executor/cuda_graph_config.py,
    `explicit_keys_in`). So '{"decode":{"backend":"full"}}' captures decode graphs even beside
    --disable-cuda-graph, while '{"decode":{"max_bs":64}}' leaves the backend to the flags.
    """
    enabled = not (
        args.get("disable_cuda_graph")
        or args.get("disable_decode_cuda_graph")
        or args.get("cuda_graph_backend_decode") == "disabled"
    )
    max_bs = args.get("cuda_graph_max_bs_decode")
    decode = _config_phase(args.get("cuda_graph_config"), "decode")
    if "backend" in decode:
        enabled = decode["backend"] != "disabled"
    if decode.get("max_bs") is not None:
        max_bs = int(decode["max_bs"])
    return enabled, max_bs


def _config_phase(config: object, phase: str) -> dict[str, Any]:
    """The settings --cuda-graph-config gives `phase` ({} when none or not a JSON object)."""
    if not isinstance(config, str) or not config:
        return {}
    try:
        settings = json.loads(config).get(phase, {})
    except (ValueError, AttributeError):
        return {}
    return settings if isinstance(settings, dict) else {}


def params_from_args(args: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """The model's knob dict for resolved server args and the environment NCCL runs in (its NCCL_* values,
    and the rules of the tuner plugin it loads, read from NCCL_TUNER_CONFIG_FILE now)."""
    graph, max_bs = cuda_graph_decode(args)
    params: dict[str, Any] = {
        "tp": args.get("tp_size") or 1,
        "speculative_algorithm": args.get("speculative_algorithm"),
        "speculative_num_steps": args.get("speculative_num_steps"),
        "speculative_eagle_topk": args.get("speculative_eagle_topk"),
        "speculative_num_draft_tokens": args.get("speculative_num_draft_tokens"),
        "speculative_dflash_block_size": args.get("speculative_dflash_block_size"),
        "speculative_ngram_max_bfs_breadth": args.get("speculative_ngram_max_bfs_breadth"),
        "speculative_attention_mode": args.get("speculative_attention_mode"),
        "all_reduce_path": "nccl" if args.get("disable_custom_all_reduce") else "custom",
        "cuda_graph": graph,
        "cuda_graph_max_bs": max_bs,
    }
    if args.get("speculative_adaptive") and args.get("speculative_algorithm") is not None:
        config = adaptive_config(args.get("speculative_adaptive_config"))
        if isinstance(config, AdaptiveConfig):
            params.update(
                speculative_adaptive=True,
                speculative_adaptive_candidate_steps=config.candidate_steps,
                speculative_adaptive_slots=config.slots,
            )
    params.update({name: env.get(name) for name in NCCL_PARAM_NAMES})
    params[TUNER_RULES] = rules_for(env)
    # The communication path (model.resolve_comm): server args and SGLang's environment variables.
    fusion = args.get("flashinfer_allreduce_fusion_backend") or (
        "auto" if args.get("enable_flashinfer_allreduce_fusion") else None
    )
    params.update(
        {
            "disable_custom_all_reduce": bool(args.get("disable_custom_all_reduce")),
            "flashinfer_allreduce_fusion_backend": fusion,
            **{
                key: bool(args.get(key))
                for key in (
                    "enforce_disable_flashinfer_allreduce_fusion",
                    "enable_torch_symm_mem",
                    "enable_mscclpp",
                    "enable_dp_attention",
                )
            },
            "moe_a2a_backend": args.get("moe_a2a_backend"),
            "enable_deterministic_inference": bool(args.get("enable_deterministic_inference"))
            or env.get("SGLANG_ENABLE_DETERMINISTIC_INFERENCE", "").strip().lower() in ("1", "true"),
            **{
                key: env.get(key)
                for key in (
                    "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE",
                    "SGLANG_PCIE_IPC_MAX_NUMEL",
                    "SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB",
                )
            },
        }
    )
    return params


def params_from_launch(argv: Sequence[str], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What a simulator process started with `argv` and `env` runs, as `model.evaluate` params.

    `env` is the environment NCCL sees in the rank workers (os.environ when None); a launch SGLang
    would refuse raises ValueError with SGLang's reason.
    """
    env = dict(os.environ if env is None else env)
    try:
        ns, _ = parse(argv, env)
    except SystemExit as exc:  # argparse already printed SGLang's usage error
        raise ValueError(f"sglang serve rejects these arguments (exit code {exc.code})") from None
    res = resolve(ns)
    if res.error or res.unsupported:
        raise ValueError(res.error or res.unsupported)
    return params_from_args(res.args, env)
