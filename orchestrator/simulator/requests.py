"""A simulated generation request: what it asked, what it got, its draft counters and SGLang's /generate
meta_info; how one verify of its draft goes and its next greedy tokens (engine.py schedules them)."""

from __future__ import annotations

import asyncio
import collections
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from orchestrator.simulator import model as perf
from orchestrator.simulator import tokens
from orchestrator.simulator.telemetry import Metrics


class PrefixCache:
    """The radix cache as far as the simulator keeps it: the longest common prefix with the last 64 prompts."""

    def __init__(self) -> None:
        self._store: collections.deque[tuple[int, ...]] = collections.deque(maxlen=64)

    def lookup(self, ids: list[int]) -> int:
        """Tokens of `ids` a previous prompt shares (at most all but the last), then remember `ids`."""
        best = 0
        for prev in self._store:
            n = 0
            for a, b in zip(prev, ids):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        self._store.append(tuple(ids))
        return min(best, max(len(ids) - 1, 0))

    def clear(self) -> None:
        self._store.clear()


LogprobEntry = tuple[float | None, int, str | None]

_GOLDEN = 0.6180339887498949


@dataclass(eq=False)
class Request:
    """One generation, from arrival to finish; the HTTP handler waits on `wake`."""

    input_ids: list[int]
    max_new_tokens: int
    stream: bool = False
    internal: str | None = None
    """'warmup' or 'health' for the server's own requests (not counted as user traffic)."""
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: float = field(default_factory=time.perf_counter)
    created_wall: float = field(default_factory=time.time)
    output_ids: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    verify_ct: int = 0
    correct_drafts: int = 0
    proposed_drafts: int = 0
    """Draft tokens offered for verification (each cycle's draft tokens - 1: they vary when adaptive)."""
    accept_histogram: list[int] = field(default_factory=list)
    phase: float = 0.0
    """Where this request's low-discrepancy acceptance sequence starts."""
    first_token_at: float | None = None
    last_chunk_at: float | None = None
    finished_at: float | None = None
    finish_reason: dict | None = None
    aborted: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    return_logprob: bool = False
    logprob_start_len: int = -1
    """SGLang's meaning: the first prompt position to report; -1 only the output tokens."""
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    greedy: tokens.Stream | None = None
    """The greedy stream of this request's context (set at submit)."""
    output_logprobs: list[tuple[float, int, float]] = field(default_factory=list)
    """(log-probability, top token, top log-probability) of each output token."""
    input_scores: list[tuple[float | None, int, float | None, int | None]] = field(default_factory=list)
    output_tops: list[list[tuple[int, float]]] = field(default_factory=list)
    """The model's top_logprobs_num best words at each output position (when more than one is asked)."""
    input_tops: list[list[tuple[int, float]] | None] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.aborted

    def meta_info(self, draft_tokens: int) -> dict:
        """SGLang's /generate meta_info for the request as it stands."""
        now = self.finished_at or time.perf_counter()
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self.finish_reason,
            "prompt_tokens": len(self.input_ids),
            "weight_version": "default",
            "total_retractions": 0,
            "completion_tokens": len(self.output_ids),
            "cached_tokens": self.cached_tokens,
            "e2e_latency": now - self.created,
        }
        if self.verify_ct > 0:
            proposed = self.proposed_drafts or self.verify_ct * (draft_tokens - 1)
            meta.update(
                spec_accept_rate=self.correct_drafts / proposed if proposed else 0.0,
                spec_accept_length=len(self.output_ids) / self.verify_ct,
                spec_num_correct_drafts=self.correct_drafts,
                spec_num_proposed_drafts=proposed,
                spec_verify_ct=self.verify_ct,
                spec_correct_drafts_histogram=list(self.accept_histogram),
            )
        if self.return_logprob:
            meta.update(self._logprobs())
        return meta

    def _entry(self, logprob: float | None, token: int) -> LogprobEntry:
        return (logprob, token, tokens.ID_WORDS.get(token, "<unk>") if self.return_text_in_logprobs else None)

    def _logprobs(self) -> dict[str, Any]:
        """SGLang's logprob fields (tokenizer_manager.py add_logprob_to_meta_info): lists of
        (logprob, token_id, text or None); the top ones per position when top_logprobs_num > 0."""
        out: dict[str, Any] = {
            "input_token_logprobs": [self._entry(lp, t) for lp, t, _, _ in self.input_scores],
            "output_token_logprobs": [
                self._entry(lp, t) for (lp, _, _), t in zip(self.output_logprobs, self.output_ids)
            ],
            "output_token_logprobs_length": len(self.output_logprobs),
        }
        if self.top_logprobs_num == 1:
            out["input_top_logprobs"] = [
                None if top is None else [self._entry(top_lp, top)] for _, _, top_lp, top in self.input_scores
            ]
            out["output_top_logprobs"] = [[self._entry(top_lp, top)] for _, top, top_lp in self.output_logprobs]
        elif self.top_logprobs_num > 1:
            out["input_top_logprobs"] = [
                None if tops is None else [self._entry(lp, t) for t, lp in tops] for tops in self.input_tops
            ]
            out["output_top_logprobs"] = [[self._entry(lp, t) for t, lp in tops] for tops in self.output_tops]
        return out

    def record_finish(self, metrics: Metrics | None) -> None:
        """Count the finished (or aborted) request in /metrics; the server's own requests are not counted."""
        if not metrics or self.internal == "health":
            return
        end = self.finished_at or time.perf_counter()
        first = self.first_token_at or end
        metrics.finished(
            prompt_tokens=len(self.input_ids),
            completion_tokens=len(self.output_ids),
            cached_tokens=self.cached_tokens,
            streaming=self.stream,
            e2e_s=end - self.created,
            decode_s=end - first,
            verify_ct=self.verify_ct,
            aborted=self.aborted,
        )


def verify(req: Request, pred: perf.Prediction) -> int:
    """One verify of `req`'s draft: how many drafts it accepts (its low-discrepancy sequence inverting the
    per-depth acceptance, see the module docstring), with the request's counters updated."""
    u = (req.phase + req.verify_ct * _GOLDEN) % 1.0
    accepted, survive = 0, 1.0
    for a in pred.per_depth_acceptance:
        survive *= a
        if u >= survive:
            break
        accepted += 1
    req.verify_ct += 1
    req.correct_drafts += accepted
    req.proposed_drafts += pred.draft_tokens - 1
    if len(req.accept_histogram) <= accepted:
        req.accept_histogram.extend([0] * (accepted + 1 - len(req.accept_histogram)))
    req.accept_histogram[accepted] += 1
    return accepted


def next_tokens(req: Request, n: int) -> list[int]:
    """The request's next `n` greedy tokens (their log-probabilities kept when it asked for them)."""
    stream = req.greedy
    if stream is None:
        raise RuntimeError("a request decodes only after submit()")
    out = []
    for _ in range(n):
        if req.return_logprob and req.top_logprobs_num > 1:
            req.output_tops.append(tokens.top_k(stream.state, req.top_logprobs_num))
        token, lp, top = stream.next()
        if req.return_logprob:
            req.output_logprobs.append((lp, top.first, top.first_logprob))
        out.append(token)
    return out
