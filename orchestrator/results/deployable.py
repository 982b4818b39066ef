"""What a deployment takes from a configuration file and what only from itself: the policy the worker
image's entrypoint applies to every configuration it reads, and the exports follow.

- variables: the knob catalogue's (config.knobs.env_rule), never one that names code (`names_code`:
  SGLANG_NCCL_SO_PATH, which SGLang opens with ctypes.CDLL; NCCL_TUNER_PLUGIN, NCCL_NET_PLUGIN, PATH,
  LD_*, ...); those come from the deployment's own environment or `serve-champion --path-env`;
- flags: SGLang's own (the --help dump of the version the worker image runs), matched whole, since
  argparse would take a prefix (--model-pat, --hos, --por) for the flag it begins; never one the
  entrypoint sets (ENTRYPOINT_FLAGS) nor one that runs code (CODE_FLAGS), which a deployment passes
  after the image name;
- values: none a process cannot be given (config.yamlfile.arg_problem: a NUL, a lone surrogate,
  more than 128 KiB).

`deploy_only` is what an export leaves out for that reason. Everything here is pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from orchestrator.config import flags, knobs, yamlfile
from orchestrator.records import ServingConfig

__all__ = [
    "CODE_FLAGS",
    "DEPLOY_SGLANG_VERSION",
    "ENTRYPOINT_FLAGS",
    "config_problem",
    "deploy_only",
    "flag_problem",
    "names_code",
]

_CODE_NAMES = frozenset(
    {
        "PATH",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "PYTHONEXECUTABLE",
        "PYTHONPLATLIBDIR",
        "SGLANG_PYTHON",
        "SERVE_CHAMPION_PYTHON",
        "BASH_ENV",
        "ENV",
        "CUDA_HOME",
        "CUDA_PATH",
    }
)
_CODE_PREFIXES = ("LD_", "DYLD_")
_CODE_SUFFIXES = ("_SO_PATH", "_SO", "_PLUGIN", "_PLUGIN_PATH", "_LIBRARY_PATH", "_LIB_PATH", "_LIBCUDA_PATH")


def names_code(name: str) -> bool:
    """Whether environment variable `name` names code a process loads or runs: an interpreter or a search
    path (PATH, PYTHONPATH, SGLANG_PYTHON), the dynamic loader's settings (LD_*), a library or a plugin
    (SGLANG_NCCL_SO_PATH, which SGLang opens with ctypes.CDLL; NCCL_TUNER_PLUGIN, NCCL_NET_PLUGIN, any
    *_SO_PATH / *_PLUGIN). Such a variable comes from the deployment, never from a configuration file."""
    return name in _CODE_NAMES or name.startswith(_CODE_PREFIXES) or name.endswith(_CODE_SUFFIXES)


DEPLOY_SGLANG_VERSION = knobs.DEFAULT_SGLANG_VERSION
"""The SGLang the worker image runs (lmsysorg/sglang:v0.5.23): its --help dump is the flag allow-list."""
ENTRYPOINT_FLAGS: dict[str, str] = {
    "--model-path": "MODEL_PATH",
    "--model": "MODEL_PATH",
    "--host": "HOST",
    "--port": "PORT",
}
"""Flags the entrypoint sets itself (--model is --model-path's alias), flag -> the setting that gives it."""
CODE_FLAGS: dict[str, str] = {
    "--trust-remote-code": "runs the model repository's own Python code",
    "--enable-custom-logit-processor": "runs logit processors that requests send as serialized Python",
    "--custom-weight-loader": "imports and runs the Python function its value names",
    "--forward-hooks": "attaches hooks that name Python code to the model",
    "--sidecar": "starts the Python module its value names",
    "--sidecar-args": "passes arguments to the --sidecar module",
    "--hicache-storage-backend-extra-config": "can name a Python module_path for the dynamic storage backend",
    "--config": "reads more flags from a file, past this check",
}
"""SGLang 0.5.23 flags that make the server run code (or read flags from elsewhere): a deployment passes
them itself, after the image name; a configuration file never does."""
_NEGATIVE_NUMBER = re.compile(r"-\d+|-\d*\.\d+")


def _option_name(word: str) -> str | None:
    """The option a command-line word names as argparse reads it (`--port=1` -> `--port`), or None for a
    value (a word not starting with '-', '-' alone, a negative number)."""
    if not word.startswith("-") or word == "-" or _NEGATIVE_NUMBER.fullmatch(word):
        return None
    return word.split("=", 1)[0]


def flag_problem(word: str) -> str | None:
    """Why a configuration may not hold the command-line word `word`, or None. Flags are matched whole:
    argparse would take a prefix (--model-pat, --hos, --por) for the flag it begins."""
    name = _option_name(word)
    if name is None:
        return None
    if name in ENTRYPOINT_FLAGS:
        return f"sets {name}, which the entrypoint sets from {ENTRYPOINT_FLAGS[name]}; remove it there"
    if name in CODE_FLAGS:
        return (
            f"sets {name}, which {CODE_FLAGS[name]}; a configuration never does: pass it after the image "
            "name (extra arguments of serve-champion) if this deployment means it"
        )
    known = flags.known_flags(DEPLOY_SGLANG_VERSION) or frozenset()
    if name not in known:
        longer = sorted(f for f in known if f.startswith(name))
        hint = f" (argparse would read it as {longer[0]})" if longer else ""
        return (
            f"holds {yamlfile.shorten(repr(word), 60)}, which is not a flag of SGLang {DEPLOY_SGLANG_VERSION} "
            f"spelt whole{hint}; export the configuration again"
        )
    return None


def config_problem(env: Mapping[str, str], args: list[str]) -> str | None:
    """Why the entrypoint must not run a configuration of environment `env` and SGLang flags `args`, or
    None: names off the knob catalogue's allow-list or naming code, values no process can be given
    (yamlfile.arg_problem), flags `flag_problem` refuses."""
    refused = sorted(n for n in env if knobs.env_rule(n) is not None or names_code(n))
    if refused:
        return (
            f"sets {', '.join(refused)}, which sweep export never writes: a configuration may set only the knob catalogue's NCCL_* "
            f"and SGLANG_* variables (orchestrator/config/knobs.py) and "
            f"{', '.join(sorted(n for n in knobs.PASSTHROUGH_ENV if not n.startswith(('NCCL_', 'SGLANG_'))))}, "
            f"never a path to code (library and plugin paths come from the deployment: serve-champion "
            f"--path-env NAME=VALUE); remove {'that line' if len(refused) == 1 else 'those lines'}, or export "
            "the configuration again"
        )
    for name, value in env.items():
        if why := yamlfile.arg_problem(f"{name}={value}"):
            return f"the value of {name} {why}"
    for i, word in enumerate(args):
        if why := yamlfile.arg_problem(word):
            return f"flag word {i + 1} {why}"
        if why := flag_problem(word):
            return why
    return None


def deploy_only(config: ServingConfig) -> tuple[ServingConfig, list[str]]:
    """The config without what only a deployment may set (`names_code` variables, CODE_FLAGS with their
    values), and what was left out (`NAME=value` and flag words, in order)."""
    left_out = [f"{k}={v}" for k, v in sorted(config.env.items()) if names_code(k)]
    kept: list[str] = []
    dropping = False
    for word in config.sglang_args:
        name = _option_name(word)
        if name is not None:
            dropping = name in CODE_FLAGS
        (left_out if dropping else kept).append(word)
    if not left_out:
        return config, []
    env = {k: v for k, v in config.env.items() if not names_code(k)}
    return config.model_copy(update={"env": env, "sglang_args": tuple(kept)}), left_out
