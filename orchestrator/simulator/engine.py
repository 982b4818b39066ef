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
import random
import time
from collections.abc import Callable

from orchestrator.simulator import failures, tokens
from orchestrator.simulator import model as perf
from orchestrator.simulator.adaptive_steps import AdaptiveSteps
from orchestrator.simulator.logs import Log
from orchestrator.simulator.requests import PrefixCache, Request, next_tokens, verify
from orchestrator.simulator.telemetry import Metrics
from orchestrator.simulator.timing import Timing, per_cycle_jitter, run_factor, run_factors
from orchestrator.simulator.tokens import detokenize, tokenize

__all__ = ["Engine", "Request", "Timing", "detokenize", "per_cycle_jitter", "run_factor", "run_factors", "tokenize"]

CATCH_UP_S = 2.0
"""How far behind its schedule the loop may fall and still catch up (the next steps run back to back until
it is on time again), so a machine under load, whose scheduler wakes the loop late now and then, serves
the modelled rate on average; a longer stall (a stopped process) resumes from now instead of bursting."""


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
        self.model_key = model_key
        self.numerics = numerics
        self.adaptive = AdaptiveSteps(cfg, log, ema_alpha)
        """--speculative-adaptive's state: one EMA of the acceptance length per batch-size slot."""
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: list[Request] = []
        self._wake = asyncio.Event()
        self._predictions: dict[int, perf.Prediction] = {}
        self._prefix_cache = PrefixCache()
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
        req.record_finish(self.metrics)

    def flush_cache(self) -> bool:
        if self.running or self.waiting:
            return False
        self._prefix_cache.clear()
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
            req.cached_tokens = self._prefix_cache.lookup(req.input_ids)
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
            self._emit(req, next_tokens(req, 1), now)
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
                accepted = verify(req, pred)
                self._win_proposed += pred.draft_tokens - 1
                cycle_accepted += accepted + 1
                self._win_forward_ct += 1
                self._win_accept_tokens += accepted + 1
                self._win_correct += accepted
                n = accepted + 1
            else:
                n = 1
            n = min(n, req.max_new_tokens - len(req.output_ids))
            self._emit(req, next_tokens(req, n), now)
            if self._maybe_finish(req, now):
                self.running.remove(req)
        self.cycles += 1
        if cfg.adaptive and batch:
            self.adaptive.update(pred.adaptive_slot, pred.steps, cycle_accepted / batch)
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
        req.record_finish(self.metrics)
        req.wake.set()
        return True

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
