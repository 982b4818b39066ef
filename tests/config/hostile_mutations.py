"""Mutated experiment files and search spaces, the kinds issue 11 measured: hostile values in every
field, hostile YAML, hostile files and entangled spaces. Shared by tests/config/test_fuzz_mutations.py
(in process, every call under a time limit) and bench/fuzz_experiments.py (the real CLI, with a time
and memory limit, before/after counts).

Each mutation says whether a correct loader must refuse it (`must_refuse`): a value that is wrong
whatever the field (NaN, infinity, 1e30, 2^64, a control character, `true` for a number, ...).
"""

from __future__ import annotations

import copy
import math
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SPACE: dict[str, Any] = {
    "params": {
        "NCCL_PROTO": {"choices": [None, "LL", "Simple"]},
        "NCCL_MAX_NCHANNELS": {"low": 2, "high": 16, "step": 2, "when": {"NCCL_PROTO": "LL"}},
        "speculative_algorithm": {"choices": [None, "EAGLE3"]},
        "speculative_num_steps": {"low": 1, "high": 4, "when": {"speculative_algorithm": "EAGLE3"}},
        "speculative_eagle_topk": {"choices": [2, 4], "when": {"speculative_algorithm": "EAGLE3"}},
        "speculative_num_draft_tokens": {"choices": [4, 8], "when": {"speculative_algorithm": "EAGLE3"}},
    }
}
EXPERIMENT: dict[str, Any] = {
    "name": "fuzz",
    "engine": "simulator",
    "server": {
        "model": "m",
        "draft_model": "d",
        "tp": 2,
        "startup_timeout_s": 30,
        "env": {"NCCL_DEBUG": "INFO"},
        "flags": {"mem-fraction-static": 0.8},
    },
    "simulator": {
        "hardware_profile": "pcie-rtxpro6000-x8",
        "model_profile": "kimi-k2.5",
        "noise": 0.02,
        "faults": ["slow_start=1"],
    },
    "search_space": ["space.yaml"],
    "benchmark": {"requests": 3, "concurrency": 1, "input_len": 64, "output_len": 64, "timeout_s": 60},
    "objective": {"metric": "decode_tok_s", "constraints": {"itl_ms_p99": {"max": 60}}},
    "budget": {"trials": 10, "wall_time": "30m", "concurrent_trials": 2, "max_failure_rate": 0.5},
    "sampler": {"kind": "tpe", "seed": 1, "startup_trials": 4},
    "tracking": {"experiment": "fuzz"},
    "promotion": {"model_name": "fuzz-model", "min_gain": 0.01},
}

# Values wrong in any field (must be refused), and values that may be right somewhere (either way).
WRONG: list[Any] = [float("nan"), float("inf"), -float("inf"), 1e30, 2**64, "x\ny", "x\x00y", True]
ODD: list[Any] = [None, -1, 0, "", [], {}, "a" * 5000, 0.5]


@dataclass(frozen=True)
class Mutation:
    name: str
    must_refuse: bool
    experiment: str
    """The experiment file's text."""
    space: str | None = None
    """The search space file's text (None: the base space)."""
    special: str | None = None
    """A non-regular file placed as the search space: fifo, dev_zero, dev_urandom, directory."""


def _leaves(node: Any, path: tuple = ()) -> Iterator[tuple]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(node, list) and node and not isinstance(node[0], (dict, list)):
        yield (*path, 0)
    else:
        yield path


def _set(data: dict, path: tuple, value: Any) -> dict:
    data = copy.deepcopy(data)
    node: Any = data
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return data


def _dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=False, width=1 << 20)


def _bool_for_a_number(original: Any, value: Any) -> bool:
    return value is True and isinstance(original, (int, float)) and not isinstance(original, bool)


def mutations(seed: int = 0, sample: int | None = None) -> list[Mutation]:
    """Every mutation (or `sample` of them, drawn with `seed`), base experiment first."""
    out = [Mutation("base", False, _dump(EXPERIMENT))]
    leaves = list(_leaves(EXPERIMENT))
    for path in leaves:
        original: Any = EXPERIMENT
        for p in path:
            original = original[p]
        for value in WRONG:
            if value is True and not isinstance(original, (int, float)):
                continue  # `true` for a text field is a type error too, but kept out of the must-refuse class
            wrong = not (value is True and not _bool_for_a_number(original, value))
            if path[:2] == ("server", "flags") and (value is True or value in (1e30, 2**64)):
                wrong = False  # `true` is how a switch flag is written; SGLang checks a flag's range
            if path[:2] == ("objective", "constraints") and value in (1e30, 2**64):
                wrong = False  # a bound no trial reaches is no bound, but not a mistake
            if path == ("search_space", 0):
                wrong = True
            out.append(
                Mutation(f"{'.'.join(map(str, path))}={value!r:.20}", wrong, _dump(_set(EXPERIMENT, path, value)))
            )
        for value in ODD:
            out.append(
                Mutation(f"{'.'.join(map(str, path))}={value!r:.20}", False, _dump(_set(EXPERIMENT, path, value)))
            )
    for key in ("server", "budget", "sampler", "promotion", "benchmark"):
        out.append(Mutation(f"unknown key under {key}", True, _dump(_set(EXPERIMENT, (key, "surprise"), 1))))
    for env_value in ("4\n", "4\x00", "a" * 5000):
        out.append(
            Mutation(
                f"server.env value {env_value[:6]!r}",
                env_value != "a" * 5000,
                _dump(_set(EXPERIMENT, ("server", "env"), {"OMP_NUM_THREADS": env_value})),
            )
        )
    out.append(
        Mutation(
            "unknown hardware profile", True, _dump(_set(EXPERIMENT, ("simulator", "hardware_profile"), "imaginary"))
        )
    )
    out.append(Mutation("unknown fault", True, _dump(_set(EXPERIMENT, ("simulator", "faults"), ["explode=1"]))))
    # Hostile YAML.
    text = _dump(EXPERIMENT)
    out.append(Mutation("duplicate top-level key", True, text + "name: other\n"))
    out.append(Mutation("duplicate nested key", True, text.replace("  tp: 2\n", "  tp: 2\n  tp: 4\n")))
    bomb = "\n".join(
        ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
        + [f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")]
    )
    out.append(Mutation("alias bomb in the experiment", True, bomb + "\n" + text))
    out.append(Mutation("alias bomb as the search space", True, text, space=bomb + "\n"))
    out.append(
        Mutation(
            "alias bomb in a value",
            True,
            "x: &x ["
            + ", ".join(["lol"] * 50)
            + "]\n"
            + "y: &y ["
            + ", ".join(["*x"] * 50)
            + "]\n"
            + text.replace("  model: m\n", "  model: [" + ", ".join(["*y"] * 50) + "]\n"),
        )
    )
    out.append(Mutation("recursive alias", True, "a: &a [*a]\n" + text))
    for depth in (100, 1000, 100_000):
        out.append(Mutation(f"nesting {depth} deep", True, text + "description: " + "[" * depth + "]" * depth + "\n"))
        out.append(
            Mutation(
                f"nesting {depth} deep (mappings)",
                True,
                text + "description: " + "{a: " * depth + "1" + "}" * depth + "\n",
            )
        )
    out.append(Mutation("huge file", True, text + "description: " + "x" * (2 << 20) + "\n"))
    out.append(Mutation("not UTF-8", True, text + "description: \udcff\n"))
    out.append(Mutation("a list at the top", True, "- 1\n- 2\n"))
    out.append(Mutation("tabs", True, "name:\tfuzz\n\t- x\n"))
    for special in ("fifo", "dev_zero", "dev_urandom", "directory"):
        out.append(Mutation(f"search space is {special}", True, text, special=special))
    # Entangled spaces.
    linked = copy.deepcopy(SPACE)
    linked["params"].update(
        {
            "SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2": {"choices": [None, "1"]},
            "SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB": {
                "low": 0,
                "high": 1 << 20,
                "when": {"SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2": "1"},
            },
            "SGLANG_FORCE_CUSTOM_ALL_REDUCE_V2_PULL_SIZE_KB": {
                "low": 0,
                "high": 1 << 20,
                "when": {"SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB": [5, 7]},
            },
        }
    )
    out.append(Mutation("two linked integer ranges", False, text, space=_dump(linked)))
    out.append(
        Mutation(
            "two linked integer ranges, grid sampler",
            True,
            _dump(_set(EXPERIMENT, ("sampler", "kind"), "grid")),
            space=_dump(linked),
        )
    )
    space_leaves = list(_leaves(SPACE))
    for path in space_leaves:
        for value in [*WRONG, *ODD]:
            original: Any = SPACE
            for p in path:
                original = original[p]
            wrong = (
                value in WRONG
                and not (value is True and not _bool_for_a_number(original, value))
                and not (isinstance(value, float) and math.isnan(value) and path[-1] == "when")
            )
            out.append(
                Mutation(
                    f"space {'.'.join(map(str, path))}={value!r:.20}",
                    wrong,
                    text,
                    space=_dump(_set(SPACE, path, value)),
                )
            )
    out.append(
        Mutation(
            "attention mode without a condition",
            True,
            text,
            space=_dump(
                _set(SPACE, ("params", "speculative_attention_mode"), {"choices": [None, "prefill", "decode"]})
            ),
        )
    )
    if sample is not None and sample < len(out):
        rng = random.Random(seed)
        out = [out[0], *rng.sample(out[1:], sample - 1)]
    return out


def materialize(m: Mutation, folder: Path) -> Path:
    """Write the mutation's files into `folder`; the experiment's path."""
    folder.mkdir(parents=True, exist_ok=True)
    space = folder / "space.yaml"
    if m.special == "fifo":
        os.mkfifo(space)
    elif m.special == "directory":
        space.mkdir()
    elif m.special in ("dev_zero", "dev_urandom"):
        space.symlink_to("/dev/zero" if m.special == "dev_zero" else "/dev/urandom")
    else:
        space.write_text(m.space if m.space is not None else _dump(SPACE), encoding="utf-8")
    exp = folder / "exp.yaml"
    exp.write_bytes(m.experiment.encode("utf-8", "surrogateescape"))
    return exp
