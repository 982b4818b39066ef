"""Keep secrets out of everything the sweep writes: launch.json, logs, MLflow params and tags.

The rule for a secret *name* (is_secret_name):

1. Split the name into words at `_`, `-`, `.`, spaces and camelCase humps, upper-cased
   (`hfToken` -> HF, TOKEN; `AWS_SECRET_ACCESS_KEY` -> AWS, SECRET, ACCESS, KEY).
2. It is secret when a word is one of SECRET_WORDS (TOKEN, KEY, SECRET, PASSWORD, AUTH, ...), or a
   compound ending in one (GITHUBTOKEN, APIKEY, CLIENTSECRET, DBPASSWORD).
   Whole words only, so KEYBOARD, MONKEY, AUTHOR, PASSTHROUGH and TOKENIZERS_PARALLELISM are not
   secret. TOKENS (plural) is deliberately not a secret word: SGLang knobs count tokens
   (SGLANG_..._MAX_NEW_TOKENS, --speculative-num-draft-tokens).
3. Except (a) the knob namespaces that never hold credentials: NCCL_*, CUDA_*, XDG_*; and
   (b) names whose last word says the value only describes or points at a secret:
   ..._PATH, _FILE, _DIR, _SOCK, _MAP, _TYPE, _NAME, _TIMEOUT, _TTL, _ENABLE(D), _MODE, _SIZE
   (HF_TOKEN_PATH, SSH_AUTH_SOCK, speculative_token_map).
   PWD alone (the shell's working directory) is not secret; DB_PWD is.

Text redaction (redact_text) replaces the values of secret-named variables (length >= 6, shorter
values would shred ordinary text) and, whatever the environment, common credential shapes:
Hugging Face `hf_...`, AWS key ids `AKIA...`/`ASIA...`, GitHub `ghp_...`/`github_pat_...`,
OpenAI-style `sk-...`, Slack `xox?-...`, `Bearer ...`, the password in `scheme://user:password@host`,
and the value in `SECRET_NAME=value`, `"SECRET_NAME": "value"`, `--api-key value` and an argv list
serialised as `"--api-key", "value"`.

A URL to show or keep (a storage or tracking URI) goes through mask_url_password.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

MASK = "***"

SECRET_WORDS = frozenset(
    {
        "TOKEN",
        "KEY",
        "SECRET",
        "SECRETS",
        "PASSWORD",
        "PASSWORDS",
        "PASSWD",
        "PASS",
        "PWD",
        "CREDENTIAL",
        "CREDENTIALS",
        "CREDS",
        "AUTH",
        "OAUTH",
        "SESSION",
        "COOKIE",
        "COOKIES",
        "PRIVATE",
        "APIKEY",
        "SIGNATURE",
    }
)
_COMPOUND_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "ACCESSKEY", "PRIVATEKEY")
SAFE_PREFIXES = ("NCCL_", "CUDA_", "XDG_")
REFERENCE_SUFFIXES = frozenset(
    {
        "PATH",
        "FILE",
        "DIR",
        "SOCK",
        "SOCKET",
        "MAP",
        "TYPE",
        "NAME",
        "TIMEOUT",
        "TTL",
        "ENABLE",
        "ENABLED",
        "MODE",
        "SIZE",
    }
)

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SPLIT = re.compile(r"[^A-Za-z0-9]+")


def _words(name: str) -> list[str]:
    return [w.upper() for w in _SPLIT.split(_CAMEL.sub("_", name)) if w]


@functools.lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """Whether a variable, field or flag name looks like it holds a credential (rule in the module doc)."""
    words = _words(name)
    if not words:
        return False
    upper = "_".join(words)
    if any(upper.startswith(p) for p in SAFE_PREFIXES):
        return False
    if words[-1] in REFERENCE_SUFFIXES:
        return False
    if words == ["PWD"]:
        return False
    return any(w in SECRET_WORDS or w.endswith(_COMPOUND_SUFFIXES) for w in words)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of `env` with secret-named values replaced by '***' and credential shapes removed from
    the other values (e.g. a password inside a database URL)."""
    return {k: MASK if is_secret_name(k) else redact_text(str(v), env) for k, v in env.items()}


_SHAPES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), MASK),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), MASK),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), MASK),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"), MASK),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"), MASK),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), MASK),
    (re.compile(r"\bBearer\s+[A-Za-z0-9._~+/=-]{6,}"), "Bearer " + MASK),
    (re.compile(r"(?i)\b(Authorization:\s*\w+\s+)\S+"), r"\1" + MASK),
    # scheme://user:password@host -> scheme://user:***@host
    (re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^@\s/]+@"), r"\1" + MASK + "@"),
)
_ASSIGN = re.compile(r"(?P<name>\b[A-Za-z_][A-Za-z0-9_.-]*)(?P<sep>=)(?P<value>\"[^\"]*\"|'[^']*'|[^\s\"',;&)]+)")
_JSON_PAIR = re.compile(r"\"(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)\"(?P<sep>\s*:\s*)\"(?P<value>(?:[^\"\\]|\\.)*)\"")
_FLAG = re.compile(r"(?P<name>--[A-Za-z0-9][A-Za-z0-9-]*)(?P<sep>\s+)(?P<value>[^\s-][^\s]*)")
# An argv list serialised as JSON or a Python repr: "--api-key", "value"
_LISTED_FLAG = re.compile(
    r"(?P<q>[\"'])(?P<name>--[A-Za-z0-9][A-Za-z0-9-]*)(?P=q)(?P<sep>\s*,\s*)(?P<q2>[\"'])(?P<value>(?:(?!(?P=q2))[^\\]|\\.)*)(?P=q2)"
)
_NOT_A_VALUE = frozenset({"", "None", "null", "''", '""', MASK, f"'{MASK}'", f'"{MASK}"'})


def _mask_named(m: re.Match[str]) -> str:
    name, value = m.group("name"), m.group("value")
    if not is_secret_name(name) or value in _NOT_A_VALUE:
        return m.group(0)
    quote = value[0] if value[:1] in ("'", '"') and value[-1:] == value[:1] and len(value) > 1 else ""
    return f"{name}{m.group('sep')}{quote}{MASK}{quote}"


def _mask_json(m: re.Match[str]) -> str:
    if not is_secret_name(m.group("name")) or m.group("value") in _NOT_A_VALUE:
        return m.group(0)
    return f'"{m.group("name")}"{m.group("sep")}"{MASK}"'


def _mask_listed(m: re.Match[str]) -> str:
    if not is_secret_name(m.group("name")) or m.group("value") in _NOT_A_VALUE:
        return m.group(0)
    q, q2 = m.group("q"), m.group("q2")
    return f"{q}{m.group('name')}{q}{m.group('sep')}{q2}{MASK}{q2}"


def redact_argv(argv: Sequence[str]) -> list[str]:
    """An argv list with the value of every secret-named flag (`--api-key X`, `--api-key=X`) masked."""
    out = list(argv)
    for i, arg in enumerate(out):
        name, eq, value = arg.partition("=")
        if not arg.startswith("--") or not is_secret_name(name):
            continue
        if eq:
            out[i] = f"{name}={MASK}"
        elif i + 1 < len(out) and not out[i + 1].startswith("--"):
            out[i + 1] = MASK
    return out


def secret_values(env: Mapping[str, str]) -> list[str]:
    """Values of the secret-named variables of `env` long enough to be searched for (>= 6 chars),
    longest first."""
    found = {str(v) for k, v in env.items() if is_secret_name(k) and len(str(v)) >= 6}
    return sorted(found, key=len, reverse=True)


def redact_text(text: str, env: Mapping[str, str] | None = None) -> str:
    """`text` with every secret value of `env` (default: os.environ) and every credential shape
    replaced by '***'."""
    if not text:
        return text
    return _redact_with(text, secret_values(os.environ if env is None else env))


def _redact_with(text: str, values: list[str]) -> str:
    for value in values:
        text = text.replace(value, MASK)
    for pattern, replacement in _SHAPES:
        text = pattern.sub(replacement, text)
    text = _JSON_PAIR.sub(_mask_json, text)
    text = _LISTED_FLAG.sub(_mask_listed, text)
    text = _ASSIGN.sub(_mask_named, text)
    text = _FLAG.sub(_mask_named, text)
    return text


def redact_env_tree(tree: Any, env: Mapping[str, str] | None = None) -> Any:
    """A copy of a JSON-like tree (dicts, lists, strings) safe to write: values under secret-named
    keys become '***' (None and empty values stay, so "not set" remains visible), the value after a
    secret flag in a list of strings (an argv) too, and every string goes through redact_text."""
    return _redact_tree(tree, secret_values(os.environ if env is None else env))


def _redact_tree(tree: Any, values: list[str]) -> Any:
    # The secret values are read once per tree, not once per string (an observation holds hundreds).
    if isinstance(tree, Mapping):
        out = {}
        for key, value in tree.items():
            if (
                isinstance(key, str)
                and is_secret_name(key)
                and value not in (None, "")
                and not isinstance(value, (Mapping, list, tuple, bool))
            ):
                out[key] = MASK
            else:
                out[key] = _redact_tree(value, values)
        return out
    if isinstance(tree, (list, tuple)):
        items = list(tree)
        if items and all(isinstance(v, str) for v in items):
            items = redact_argv(items)  # an argv list: the value follows its flag
        return type(tree)(_redact_tree(v, values) for v in items)
    if isinstance(tree, str):
        return _redact_with(tree, values) if tree else tree
    return tree


def mask_url_password(url: str) -> str:
    """A URL safe to write down: postgresql://user:secret@host/db -> postgresql://user:***@host/db."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", f":{MASK}@", 1)
    return urlunsplit(parts._replace(netloc=netloc))
