"""The simulated model's tokens: a deterministic next-token distribution over the simulator's words.

Greedy decoding (temperature 0) of a real model is a function of the weights and the context, up to
the numerics of the kernels that computed the logits. This module models exactly that, and nothing
else, so that a correctness check can be tested end to end:

- `model_key(model_path)`: the weights (the same --model-path gives the same model);
- `distribution(state)`: for a context (a rolling hash of the key and every token so far) the top
  two words, their log-probabilities, and whether they are a near tie (`NEAR_TIE_RATE` of positions,
  a gap below `NEAR_TIE_NATS`): there a different reduction order may pick the second word, as SGLang
  is not bit-deterministic across batch shapes and all-reduce settings;
- `Numerics`: what a launch does to the argmax. `signature` names the reduction order (all-reduce
  backend, NCCL algorithm/protocol/channels, the verify batch shape); two launches with the same
  signature decode identically, with different ones they differ at about half the near ties
  (`--enable-deterministic-inference` gives one signature for every launch: an ASSUMPTION, SGLang
  claims batch invariance, not invariance across all-reduce settings). `corrupt_rate` is the share of
  positions whose token is replaced by an unrelated word (silent data corruption); `launch_numerics`
  gives both for a resolved launch;
- `greedy` and `Stream`: the token stream of a prompt; `score`: the log-probability the model gives
  each token of a sequence, with its own top choice there (SGLang's input_token_logprobs and
  input_top_logprobs with top_logprobs_num 1); `top_k`: the best k words at a context (top_logprobs_num k).

Pure: the simulated server (engine.py, api.py) and the model-backed executor share it, so both give
the same outputs for the same launch.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.simulator.model import Config, HardwareProfile, ModelProfile, carried_all_reduce

WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there been one all we their has would when if so no will more out up into do any "
    "time can only other new some could these two may first then its also after our over such where most "
    "made between many those did just through model token draft verify ring channel latency bandwidth kernel"
).split()
FIRST_WORD_ID = 1000
VOCAB_SIZE = 163840
WORD_IDS = {w: FIRST_WORD_ID + i for i, w in enumerate(WORDS)}
ID_WORDS = {i: w for w, i in WORD_IDS.items()}

NEAR_TIE_RATE = 0.004
"""Share of positions where the top two words are within NEAR_TIE_NATS (an assumption, chosen so that a
few hundred tokens of a handful of prompts meet a few near ties)."""
NEAR_TIE_NATS = 0.01
OTHER_WORD_NATS = (6.0, 10.0)
"""How far below the top word the model puts any word but the top two (uniform in this range)."""

_MASK = (1 << 64) - 1


def tokenize(text: str) -> list[int]:
    """One token per whitespace-separated word (an unknown word hashes into the vocabulary)."""
    return [WORD_IDS.get(w) or zlib.crc32(w.encode()) % VOCAB_SIZE for w in text.split()]


def detokenize(ids: Sequence[int]) -> str:
    return "".join(" " + ID_WORDS.get(i, "<unk>") for i in ids)


def _mix(a: int, b: int) -> int:
    """splitmix64 of a combined with b: the rolling hash of a context."""
    z = (a * 0x9E3779B97F4A7C15 + b + 0x632BE59BD9B4E019) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _unit(state: int, salt: int) -> float:
    """A uniform number in [0, 1) drawn from the context."""
    return (_mix(state, salt) >> 11) / float(1 << 53)


def model_key(model_path: str) -> int:
    """The weights: every server of one --model-path is the same model."""
    return _mix(zlib.crc32(model_path.encode()), 0x5EED)


def advance(state: int, token: int) -> int:
    """The context after one more token."""
    return _mix(state, token)


def context(key: int, ids: Sequence[int]) -> int:
    state = key
    for t in ids:
        state = advance(state, t)
    return state


@dataclass(frozen=True)
class Top:
    """The model's two best words at a context and their log-probabilities."""

    first: int
    second: int
    first_logprob: float
    second_logprob: float

    @property
    def near_tie(self) -> bool:
        return self.first_logprob - self.second_logprob < NEAR_TIE_NATS


def distribution(state: int) -> Top:
    """The top two words at a context, from one 64-bit draw (bit fields: first word, second word, the
    first's log-probability, near tie or not, the gap)."""
    n = len(WORDS)
    h = _mix(state, 1)
    first = FIRST_WORD_ID + (h & 0xFFFF) % n
    second = FIRST_WORD_ID + (first - FIRST_WORD_ID + 1 + ((h >> 16) & 0xFF) % (n - 1)) % n
    lp1 = -0.02 - 0.6 * ((h >> 24) & 0xFFF) / 4096.0
    tie = ((h >> 36) & 0xFFFFF) / float(1 << 20) < NEAR_TIE_RATE
    u = ((h >> 56) & 0xFF) / 256.0
    gap = NEAR_TIE_NATS * u if tie else 0.5 + 3.0 * u
    return Top(first, second, lp1, lp1 - gap)


def _logprob(top: Top, state: int, token: int) -> float:
    if token == top.first:
        return top.first_logprob
    if token == top.second:
        return top.second_logprob
    low, high = OTHER_WORD_NATS
    return top.first_logprob - low - (high - low) * _unit(state, 7 + token)


def logprob(state: int, token: int) -> float:
    """The model's log-probability of `token` after the context `state`."""
    return _logprob(distribution(state), state, token)


def top_k(state: int, k: int) -> list[tuple[int, float]]:
    """The model's `k` best words after the context `state`, best first, with their log-probabilities
    (SGLang's top_logprobs_num; the simulated model only ever emits WORDS, so they rank among them)."""
    if k <= 0:
        return []
    top = distribution(state)
    if k <= 2:
        return [(top.first, top.first_logprob), (top.second, top.second_logprob)][:k]
    ranked = sorted(((w, _logprob(top, state, w)) for w in WORD_IDS.values()), key=lambda x: (-x[1], x[0]))
    return ranked[:k]


def input_top_k(key: int, ids: Sequence[int], start: int, k: int) -> list[list[tuple[int, float]] | None]:
    """`top_k` at each position of `ids` from `start` (None at `start` itself, as `score`)."""
    out: list[list[tuple[int, float]] | None] = []
    state = key
    for i, token in enumerate(ids):
        if i >= start:
            out.append(None if i == start else top_k(state, k))
        state = advance(state, token)
    return out


@dataclass(frozen=True)
class Numerics:
    """What a launch does to greedy decoding (see the module docstring)."""

    signature: str = ""
    corrupt_rate: float = 0.0
    why: str = ""
    """What corrupts the outputs, in words (empty when nothing does)."""


def next_token(state: int, numerics: Numerics, top: Top | None = None) -> int:
    """The greedy token at a context under a launch's numerics."""
    top = top or distribution(state)
    if numerics.corrupt_rate and _unit(state, 8) < numerics.corrupt_rate:
        n = len(WORDS)
        return FIRST_WORD_ID + (top.first - FIRST_WORD_ID + 2 + int(_unit(state, 9) * (n - 2))) % n
    if top.near_tie and _mix(state, zlib.crc32(numerics.signature.encode())) & 1:
        return top.second
    return top.first


class Stream:
    """The greedy continuation of one prompt, a token at a time (the engine's request state)."""

    def __init__(self, key: int, prompt: Sequence[int], numerics: Numerics):
        self.state = context(key, prompt)
        self.numerics = numerics

    def next(self) -> tuple[int, float, Top]:
        """The next token, the model's log-probability of it, and the model's top two there."""
        top = distribution(self.state)
        token = next_token(self.state, self.numerics, top)
        lp = _logprob(top, self.state, token)
        self.state = advance(self.state, token)
        return token, lp, top


def greedy(key: int, prompt: Sequence[int], n: int, numerics: Numerics) -> list[tuple[int, float]]:
    """The first `n` greedy tokens after `prompt`, each with its log-probability."""
    stream = Stream(key, prompt, numerics)
    return [stream.next()[:2] for _ in range(n)]


def score(key: int, ids: Sequence[int], start: int) -> list[tuple[float | None, int, float | None, int | None]]:
    """For each position from `start`: (log-probability of ids[i] after ids[:i], ids[i], the model's top
    log-probability there, its top token); none at `start` itself, as SGLang reports input logprobs
    (scheduler_components/logprob_result_processor.py: "add None at start, remove last")."""
    out: list[tuple[float | None, int, float | None, int | None]] = []
    state = key
    for i, token in enumerate(ids):
        if i >= start:
            if i == start:
                out.append((None, token, None, None))
            else:
                top = distribution(state)
                out.append((logprob(state, token), token, top.first_logprob, top.first))
        state = advance(state, token)
    return out


LL128_PCIE_CORRUPT_RATE = 0.01
"""MODELLED, NOT MEASURED: the share of tokens corrupted when NCCL_PROTO forces LL128 and NCCL carries
the layers' all-reduces with it on a PCIe host. NCCL's documentation of NCCL_PROTO warns that enabling
LL128 on a platform that does not support it can silently corrupt data (NCCL enables it by default only
where it is known to be safe); the rate is chosen so that a few hundred tokens of a handful of prompts
show it, no real rate is known."""
BROKEN_WIRING_CORRUPT_RATE = 0.05
"""MODELLED: the share of tokens a broken draft/verify wiring changes (fault draft_wiring_broken)."""
BROKEN_WIRING_ACCEPTANCE = 0.02
"""The draft's per-position acceptance with a broken wiring: accept length collapses to about 1."""


def launch_numerics(
    hw: HardwareProfile,
    md: ModelProfile,
    cfg: Config,
    *,
    deterministic: bool = False,
    draft_wiring_broken: bool = False,
) -> Numerics:
    """What a resolved launch does to greedy decoding: its reduction order (the path, NCCL algorithm,
    protocol and channels that carry a decode step's all-reduce, and the verify shape), a single order
    under --enable-deterministic-inference, and the modelled corruptions (LL128 forced on PCIe, a broken
    draft wiring)."""
    token_bytes = md.hidden_size * md.dtype_bytes
    rows = {1} | ({cfg.topk, cfg.draft_tokens} if cfg.speculative else set())
    carried = [carried_all_reduce(hw, cfg.nccl, cfg.comm, cfg.tp, r, token_bytes, cfg.cuda_graph) for r in sorted(rows)]
    decode = carried[0]
    signature = (
        "deterministic"
        if deterministic
        else (
            f"{decode.path}/{decode.algorithm}/{decode.protocol}/{decode.channels}"
            f"/verify{cfg.draft_tokens if cfg.speculative else 0}"
        )
    )
    forced_ll128 = cfg.nccl.protocols is not None and "LL128" in cfg.nccl.protocols
    if hw.interconnect == "pcie" and forced_ll128 and any(c.path == "nccl" and c.protocol == "LL128" for c in carried):
        return Numerics(
            signature,
            LL128_PCIE_CORRUPT_RATE,
            "NCCL_PROTO forces LL128 on a PCIe host (modelled silent corruption, after NCCL's docs)",
        )
    if draft_wiring_broken and cfg.speculative:
        return Numerics(
            signature, BROKEN_WIRING_CORRUPT_RATE, "the draft/verify wiring is broken (fault draft_wiring_broken)"
        )
    return Numerics(signature)
