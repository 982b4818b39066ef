"""The simulated scheduler: requests in, tokens out, in real time at the performance model's rate.

One asyncio task plays SGLang's scheduler loop. Waiting requests are prefilled together (the
running batch pauses meanwhile, as without mixed chunking); then every decode iteration serves all
running requests at once and takes the model's cycle time for that batch size. Iterations are
scheduled at absolute deadlines (deadline += cycle), so timer lateness never accumulates: a stream
of N cycles takes N cycles of modelled time to within one timer tick.

Per iteration each request accepts a sampled number of draft tokens plus the bonus token and emits
them together as one chunk: k drafts are accepted with the model's probability (the product of the
per-depth acceptances up to depth k, stopping at the first rejection), drawn by inverting that
distribution with one uniform number per iteration. The uniforms come from a low-discrepancy
sequence (golden-ratio steps from a seeded random start per request), so a short benchmark already
shows the modelled acceptance, as a long one would on real hardware; run-to-run variation is the
job of --sim-noise. Time is scaled by a per-server-run noise factor, a small per-cycle
jitter, and the host drift. Counters follow SGLang's definitions: accept length = tokens per verify
forward (bonus included), accept rate = accepted drafts / (verify forwards * (draft tokens - 1)),
lifetime averages updated at --decode-log-interval boundaries.

With --speculative-adaptive each batch size runs the model's best candidate step count (see
`model._adaptive_cycle`, the switching cost is an assumption stated there); the engine keeps an EMA of
the acceptance length, as SGLang does, and logs SGLang's line whenever the step count changes:
`Adaptive spec params updated: steps 3 -> 1 (ema_accept_len=2.41)`. Accept rates count each cycle's
own draft tokens, since they change with the steps.

The simulated tokenizer maps whitespace-separated words to token ids (one word, one token); output
words are the simulated model's greedy tokens for the context (tokens.py: deterministic in the prompt
and --model-path, changed by the launch's numerics and the modelled corruptions), with the
log-probabilities /generate returns under return_logprob; the model never emits EOS, so a request runs
to max_new_tokens.
"""

from __future__ import annotations

import asyncio
import collections
import math
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.simulator import failures, tokens
from orchestrator.simulator import model as perf
from orchestrator.simulator.logs import Log
from orchestrator.simulator.telemetry import Metrics
from orchestrator.simulator.tokens import detokenize, tokenize

__all__ = ["Engine", "Request", "Timing", "detokenize", "per_cycle_jitter", "run_factor", "run_factors", "tokenize"]

LogprobEntry = tuple[float | None, int, str | None]

_GOLDEN = 0.6180339887498949


CATCH_UP_S = 2.0
"""How far behind its schedule the loop may fall and still catch up (the next steps run back to back until
it is on time again), so a machine under load, whose scheduler wakes the loop late now and then, serves
the modelled rate on average; a longer stall (a stopped process) resumes from now instead of bursting."""


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


@dataclass(frozen=True)
class Timing:
    """What scales modelled time for one server run."""

    run_factor: float
    jitter: float
    drift_per_hour: float
    drift_epoch: float
    prefill_factor: float | None = None
    """The run's factor on prefill time (run_factors' second); None: run_factor, one speed for the run."""

    def factor(self, rng: random.Random, *, prefill: bool = False) -> float:
        hours = max(0.0, time.time() - self.drift_epoch) / 3600.0
        jitter = 1.0 + self.jitter * rng.gauss(0.0, 1.0) if self.jitter else 1.0
        run = self.prefill_factor if prefill and self.prefill_factor is not None else self.run_factor
        return run * (1.0 + self.drift_per_hour * hours) * max(jitter, 0.5)


class Engine:
    """The scheduler loop (see the module docstring). `run()` is the task; the rest is its state."""

    def __init__(
        self,
        *,
        hw: perf.HardwareProfile,
        model: perf.ModelProfile,
        cfg: perf.Config,
        log: Log,
        metrics: Metrics | None,
        timing: Timing,
        seed: int | None,
        max_running: int,
        decode_log_interval: int,
        max_total_tokens: int,
        record_step_time: bool,
        hang: bool,
        crash_after_tokens: int | None,
        topk_crash: bool,
        hang_after_tokens: int | None = None,
        on_fatal: Callable[[str, str], None],
        watchdog_timeout_s: float,
        ema_alpha: float = 0.2,
        model_key: int = 0,
        numerics: tokens.Numerics = tokens.Numerics(),
    ):
        self.hw, self.model, self.cfg = hw, model, cfg
        self.log, self.metrics, self.timing = log, metrics, timing
        self.rng = random.Random(seed)
        self.max_running = max(1, max_running)
        self.interval = max(1, decode_log_interval)
        self.max_total_tokens = max_total_tokens
        self.record_step_time = record_step_time
        self.hang_armed = hang
        self.hang_after_tokens = hang_after_tokens
        self.crash_after_tokens = crash_after_tokens
        self.topk_crash = topk_crash
        self.on_fatal = on_fatal
        self.watchdog_timeout_s = watchdog_timeout_s
        self.ema_alpha = ema_alpha
        self.model_key = model_key
        self.numerics = numerics
        self.steps_now = cfg.steps
        """The draft steps running now (adaptive: the last candidate chosen; starts at the initial count)."""
        self.ema_accept_len: float | None = None
        self._slot_ema: dict[int, float] = {}
        """Adaptive: one EMA of the acceptance length per batch-size slot (0.5.23 AdaptiveStepSlot)."""
        self._slot_steps: dict[int, int] = {}
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self._wake = asyncio.Event()
        self._predictions: dict[int, perf.Prediction] = {}
        self._prefix_store: collections.deque[tuple[int, ...]] = collections.deque(maxlen=64)
        self.user_tokens = 0
        self.cycles = 0
        # SGLang's metrics reporter: a window per decode-log interval, lifetime totals at boundaries.
        self._win_tokens = 0
        self._win_forward_ct = 0
        self._win_accept_tokens = 0
        self._win_correct = 0
        self._win_proposed = 0
        self._win_start = time.perf_counter()
        self.spec_total_accept_tokens = 0
        self.spec_total_forward_ct = 0
        self.last_gen_throughput = 0.0
        self.step_time_dict: dict[str, list[float]] = {}
        self.cache_hits = 0
        self.cache_lookups = 0

    # ----------------------------------------------------------------------------------- interface
    def submit(self, req: Request) -> None:
        req.phase = self.rng.random()
        req.greedy = tokens.Stream(self.model_key, req.input_ids, self.numerics)
        if req.return_logprob:
            start = req.logprob_start_len if req.logprob_start_len >= 0 else len(req.input_ids)
            req.input_scores = tokens.score(self.model_key, req.input_ids, start)
            if req.top_logprobs_num > 1:
                req.input_tops = tokens.input_top_k(self.model_key, req.input_ids, start, req.top_logprobs_num)
        self.waiting.append(req)
        self._wake.set()

    def abort(self, req: Request) -> None:
        """The client went away: drop the request wherever it is."""
        if req.finished:
            return
        req.aborted = True
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        self._finish_metrics(req)

    def flush_cache(self) -> bool:
        if self.running or self.waiting:
            return False
        self._prefix_store.clear()
        return True

    def prediction(self, batch: int) -> perf.Prediction:
        pred = self._predictions.get(batch)
        if pred is None:
            pred = self._predictions[batch] = perf.cycle(self.hw, self.model, self.cfg, batch)
        return pred

    def avg_spec_accept_length(self) -> float:
        if not self.spec_total_forward_ct:
            return 0.0
        return self.spec_total_accept_tokens / self.spec_total_forward_ct

    # ------------------------------------------------------------------------------------ the loop
    async def run(self) -> None:
        deadline = time.perf_counter()
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
                deadline = time.perf_counter()
            now = time.perf_counter()
            if deadline < now - CATCH_UP_S:
                deadline = now  # fell far behind (a long stall, a stopped process): resume from now
            if self.waiting and len(self.running) < self.max_running:
                deadline = await self._prefill(deadline)
            else:
                deadline = await self._decode(deadline)

    @staticmethod
    async def _sleep_until(deadline: float) -> None:
        delay = deadline - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)

    def _cached_prefix(self, ids: list[int]) -> int:
        best = 0
        for prev in self._prefix_store:
            n = 0
            for a, b in zip(prev, ids):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        self._prefix_store.append(tuple(ids))
        return min(best, max(len(ids) - 1, 0))

    async def _prefill(self, deadline: float) -> float:
        batch: list[Request] = []
        while self.waiting and len(self.running) + len(batch) < self.max_running:
            batch.append(self.waiting.popleft())
        hang_now = self.hang_armed or (
            self.hang_after_tokens is not None and self.user_tokens >= self.hang_after_tokens
        )
        if hang_now and any(r.internal is None for r in batch):
            await self._hang(batch)
        new_tokens = cached = 0
        for req in batch:
            req.cached_tokens = self._cached_prefix(req.input_ids)
            cached += req.cached_tokens
            new_tokens += len(req.input_ids) - req.cached_tokens
            self.cache_lookups += len(req.input_ids)
            self.cache_hits += req.cached_tokens
        seconds = (
            perf.prefill_ms(self.hw, self.model, self.cfg, new_tokens)
            * self.timing.factor(self.rng, prefill=True)
            / 1e3
        )
        deadline += seconds
        await self._sleep_until(deadline)
        now = time.perf_counter()
        for req in batch:
            if req.aborted:
                continue
            self._emit(req, _next_tokens(req, 1), now)
            if self.metrics and req.internal != "health":
                self.metrics.first_token(now - req.created)
            if not self._maybe_finish(req, now):
                self.running.append(req)
        usage = self._used_tokens() / self.max_total_tokens
        self.log.scheduler(
            f"Prefill batch, #new-seq: {len(batch)}, #new-token: {new_tokens}, #cached-token: {cached}, "
            f"token usage: {usage:.2f}, #running-req: {len(self.running)}, #queue-req: {len(self.waiting)}, "
            f"#pending-token: 0, cuda graph: False, input throughput (token/s): {new_tokens / seconds:.2f}"
        )
        if self.metrics:
            self.metrics.prefill_pass(seconds)
            self.metrics.queue_state(
                running=len(self.running),
                queued=len(self.waiting),
                cache_hit_rate=self.cache_hits / max(self.cache_lookups, 1),
            )
        return deadline

    async def _decode(self, deadline: float) -> float:
        batch = len(self.running)
        pred = self.prediction(batch)
        if self.topk_crash:
            self.on_fatal(*failures.draft_topk_out_of_range(at_capture=False))
        factor = self.timing.factor(self.rng)
        deadline += pred.cycle_ms * factor / 1e3
        await self._sleep_until(deadline)
        now = time.perf_counter()
        cfg = self.cfg
        cycle_accepted = 0
        for req in list(self.running):
            if cfg.speculative:
                accepted = _verify(req, pred)
                self._win_proposed += pred.draft_tokens - 1
                cycle_accepted += accepted + 1
                self._win_forward_ct += 1
                self._win_accept_tokens += accepted + 1
                self._win_correct += accepted
                n = accepted + 1
            else:
                n = 1
            n = min(n, req.max_new_tokens - len(req.output_ids))
            self._emit(req, _next_tokens(req, n), now)
            if self._maybe_finish(req, now):
                self.running.remove(req)
        self.cycles += 1
        if cfg.adaptive and batch:
            self._adapt(pred.adaptive_slot, pred.steps, cycle_accepted / batch)
        if self.metrics:
            if cfg.speculative:
                seconds = {
                    "target_verify": (pred.verify_ms or 0.0) * factor / 1e3,
                    "eagle_draft": pred.draft_ms * factor / 1e3,
                    "eagle_draft_extend": pred.draft_extend_ms * factor / 1e3,
                }
            else:
                seconds = {"decode": pred.cycle_ms * factor / 1e3}
            self.metrics.decode_pass(cuda_graph=pred.cuda_graph, seconds=seconds)
        if self.cycles % self.interval == 0:
            self._report(batch, pred.cuda_graph, now)
        if self.crash_after_tokens is not None and self.user_tokens >= self.crash_after_tokens:
            self.on_fatal(*failures.cuda_illegal_access())
        return deadline

    def _adapt(self, slot: int, steps: int, accept_len: float) -> None:
        """SGLang's adaptive speculation: the EMA of the acceptance length of the batch-size slot that ran
        this cycle (0.5.23 AdaptiveStepSlot.update: no update while the slot runs 0 steps), and its line when
        that slot's steps change (a slot starts at the initial count when it is one of its candidates,
        else at the middle one: AdaptiveStepSlot.__init__)."""
        candidates = dict(self.cfg.adaptive_slots).get(slot, (self.cfg.steps,))
        start = self.cfg.steps if self.cfg.steps in candidates else candidates[len(candidates) // 2]
        before = self._slot_steps.get(slot, start)
        ema = self._slot_ema.get(slot)
        if before > 0:
            ema = accept_len if ema is None else self.ema_alpha * accept_len + (1 - self.ema_alpha) * ema
            self._slot_ema[slot] = ema
        self.ema_accept_len = ema
        if steps != before:
            self.log.scheduler(
                f"Adaptive spec params updated: steps {before} -> {steps} "
                f"(ema_accept_len={ema if ema is not None else float(before - 1):.2f})"
            )
        self._slot_steps[slot] = steps
        self.steps_now = steps

    def _emit(self, req: Request, tokens: list[int], now: float) -> None:
        if not tokens:
            return
        req.output_ids.extend(tokens)
        self._win_tokens += len(tokens)
        if req.internal is None:
            self.user_tokens += len(tokens)
        if req.first_token_at is None:
            req.first_token_at = now
        elif self.metrics and req.internal != "health":
            self.metrics.chunk(now - (req.last_chunk_at or now), len(tokens))
        req.last_chunk_at = now
        req.wake.set()

    def _maybe_finish(self, req: Request, now: float) -> bool:
        if len(req.output_ids) < req.max_new_tokens:
            return False
        req.finish_reason = {"type": "length", "length": req.max_new_tokens}
        req.finished_at = now
        self._finish_metrics(req)
        req.wake.set()
        return True

    def _finish_metrics(self, req: Request) -> None:
        if not self.metrics or req.internal == "health":
            return
        end = req.finished_at or time.perf_counter()
        first = req.first_token_at or end
        self.metrics.finished(
            prompt_tokens=len(req.input_ids),
            completion_tokens=len(req.output_ids),
            cached_tokens=req.cached_tokens,
            streaming=req.stream,
            e2e_s=end - req.created,
            decode_s=end - first,
            verify_ct=req.verify_ct,
            aborted=req.aborted,
        )

    def _used_tokens(self) -> int:
        return sum(len(r.input_ids) + len(r.output_ids) for r in self.running)

    def _report(self, batch: int, cuda_graph: bool, now: float) -> None:
        """SGLang's report_decode_stats: the log line, the gauges, the lifetime accept totals."""
        gap = max(now - self._win_start, 1e-9)
        self.last_gen_throughput = self._win_tokens / gap
        used = self._used_tokens()
        usage = used / self.max_total_tokens
        msg = f"Decode batch, #running-req: {len(self.running)}, #token: {used}, token usage: {usage:.2f}, "
        accept_len = accept_rate = None
        if self.cfg.speculative and self._win_forward_ct:
            accept_len = self._win_accept_tokens / self._win_forward_ct
            accept_rate = self._win_correct / max(self._win_proposed, 1)
            msg += f"accept len: {accept_len:.2f}, accept rate: {accept_rate:.2f}, "
            self.spec_total_accept_tokens += self._win_accept_tokens
            self.spec_total_forward_ct += self._win_forward_ct
        msg += (
            f"cuda graph: {cuda_graph}, gen throughput (token/s): {self.last_gen_throughput:.2f}, "
            f"#queue-req: {len(self.waiting)}"
        )
        self.log.scheduler(msg)
        if self.record_step_time:
            self.step_time_dict.setdefault(str(batch), []).append(gap / self.interval)
        if self.metrics:
            self.metrics.report(
                running=len(self.running),
                queued=len(self.waiting),
                used_tokens=used,
                token_usage=usage,
                gen_throughput=self.last_gen_throughput,
                cuda_graph=cuda_graph,
                accept_length=accept_len,
                accept_rate=accept_rate,
            )
        self._win_tokens = self._win_forward_ct = self._win_accept_tokens = self._win_correct = 0
        self._win_proposed = 0
        self._win_start = now

    async def _hang(self, batch: list[Request]) -> None:
        """A collective that never completes: the loop stops here for good (the process lives on)."""
        self.waiting.extendleft(reversed(batch))
        await asyncio.sleep(self.watchdog_timeout_s)
        self.log.scheduler(failures.watchdog_timeout(self.watchdog_timeout_s))
        await asyncio.Event().wait()


def _verify(req: Request, pred: perf.Prediction) -> int:
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


def _next_tokens(req: Request, n: int) -> list[int]:
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


def run_factors(seed: int | None, noise: float, prefill_correlation: float = 1.0) -> tuple[float, float]:
    """One server run's multiplicative noise on (decode cycle time, prefill time), drawn once from the run's
    seed. The decode factor is the run's own draw; the prefill factor shares it by `prefill_correlation`
    (1: one speed for the whole run, what a slower GPU clock gives; 0: prefill's own draw, so a run's
    TTFT says nothing of its decode speed), the rest drawn after it, so the decode factor of a seed is
    the same at every correlation."""
    if noise <= 0:
        return 1.0, 1.0
    rng = random.Random(None if seed is None else seed * 7919 + 1)
    shared = rng.gauss(0.0, 1.0)
    own = rng.gauss(0.0, 1.0)
    c = max(-1.0, min(1.0, prefill_correlation))
    prefill = c * shared + math.sqrt(1.0 - c * c) * own

    def factor(z: float) -> float:
        return max(0.5, 1.0 + noise * max(-3.0, min(3.0, z)))

    return factor(shared), factor(prefill)


def run_factor(seed: int | None, noise: float) -> float:
    """The per-server-run multiplicative noise on cycle time (run_factors' first)."""
    return run_factors(seed, noise)[0]


def per_cycle_jitter(noise: float) -> float:
    """Cycle-to-cycle jitter: a quarter of the run-to-run noise."""
    return noise / 4.0 if noise > 0 else 0.0
