"""SGLang 0.5.23's adaptive speculation as the simulated engine keeps it (`--speculative-adaptive`): one EMA of
the acceptance length per batch-size slot (speculative/adaptive_spec_params.py AdaptiveStepSlot), and SGLang's
log line when a slot's steps change. Which steps a slot runs is the performance model's (model._adaptive_cycle)."""

from __future__ import annotations

from orchestrator.simulator import model as perf
from orchestrator.simulator.logs import Log


class AdaptiveSteps:
    """The per-slot EMAs and steps of one server run."""

    def __init__(self, cfg: perf.Config, log: Log, ema_alpha: float = 0.2):
        self.cfg, self.log, self.ema_alpha = cfg, log, ema_alpha
        self.steps_now = cfg.steps
        """The draft steps running now (the last candidate chosen; starts at the initial count)."""
        self.ema_accept_len: float | None = None
        self._slot_ema: dict[int, float] = {}
        self._slot_steps: dict[int, int] = {}

    def update(self, slot: int, steps: int, accept_len: float) -> None:
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
