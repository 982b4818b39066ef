"""Fault injection specs: what can go wrong with a real SGLang server, on request.

Syntax (each `--sim-fault SPEC`, repeatable, or `SWEEP_SIM_FAULTS="SPEC;SPEC"` in the environment):

    never_ready                        HTTP binds, warmup never finishes: /health and /ready answer 503
                                       forever (a server stuck before "fired up").
    slow_start=SECONDS                 loading takes SECONDS longer; the port is not bound meanwhile.
    crash_after_tokens=N               after N generated tokens in total (warmup and health checks not
                                       counted) the scheduler hits a CUDA error: traceback in the log,
                                       exit code 1, streams cut mid-way.
    nccl_hang_when=VAR:VALUE[,VAR:VALUE...]
                                       if the server's environment has every VAR=VALUE, the first
                                       generation after start-up enters an all-reduce that never
                                       completes: no tokens, process alive, /health 503 after its
                                       timeout, a watchdog line after --watchdog-timeout seconds.
    nccl_hang                          the same, unconditionally.
    hang_after_tokens=N                the same, but only once N tokens were generated (the first
                                       requests complete, a later one hangs: a mid-benchmark hang).
    oom_above_draft_tokens=N           if speculative_num_draft_tokens * speculative_eagle_topk > N,
                                       start-up fails with torch's CUDA out-of-memory error, exit 1.
    env_drop                           rank workers start with every NCCL_* variable removed (the
                                       configuration-drift failure of the field report); NCCL then
                                       runs with its defaults, and the timing model follows.
    draft_wiring_broken                a speculating server's draft/verify wiring is wrong (the field
                                       report's hidden-state wiring bug): every draft's acceptance
                                       drops to tokens.BROKEN_WIRING_ACCEPTANCE (accept length ~1)
                                       and greedy outputs change (tokens.BROKEN_WIRING_CORRUPT_RATE).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from orchestrator.simulator.model import Drafter, ModelProfile
from orchestrator.simulator.tokens import BROKEN_WIRING_ACCEPTANCE


@dataclass(frozen=True)
class Faults:
    never_ready: bool = False
    slow_start_s: float = 0.0
    crash_after_tokens: int | None = None
    nccl_hang_when: tuple[tuple[str, str], ...] | None = None
    """None: no hang fault; () : hang unconditionally; else every (VAR, VALUE) must match."""
    oom_above_draft_tokens: int | None = None
    env_drop: bool = False
    hang_after_tokens: int | None = None
    draft_wiring_broken: bool = False

    def hangs(self, env: Mapping[str, str]) -> bool:
        """Whether generations hang in a collective with the server environment `env`."""
        if self.nccl_hang_when is None:
            return False
        return all(env.get(var) == value for var, value in self.nccl_hang_when)

    def ooms(self, draft_tokens: int, topk: int) -> bool:
        return self.oom_above_draft_tokens is not None and draft_tokens * topk > self.oom_above_draft_tokens

    def model(self, md: ModelProfile) -> ModelProfile:
        """The model profile a server with these faults runs: a broken draft wiring accepts ~no draft."""
        if not self.draft_wiring_broken:
            return md
        broken = {
            name: Drafter(acceptance=BROKEN_WIRING_ACCEPTANCE, width_exponent=d.width_exponent)
            for name, d in md.drafters.items()
        }
        return dataclasses.replace(md, drafters=broken)


_NAMES = (
    "never_ready",
    "slow_start",
    "crash_after_tokens",
    "nccl_hang_when",
    "nccl_hang",
    "oom_above_draft_tokens",
    "env_drop",
    "hang_after_tokens",
    "draft_wiring_broken",
)


def parse_faults(specs: Iterable[str]) -> Faults:
    """Parse fault specs (syntax in the module docstring); ValueError names the bad spec."""
    values: dict = {}
    for raw in specs:
        spec = raw.strip()
        if not spec:
            continue
        name, has_arg, arg = spec.partition("=")
        name = name.strip()
        if name not in _NAMES:
            raise ValueError(f"unknown fault {name!r} in {raw!r} (known: {', '.join(_NAMES)})")
        try:
            if name in ("never_ready", "env_drop", "nccl_hang", "draft_wiring_broken"):
                if has_arg:
                    raise ValueError("takes no value")
                if name == "nccl_hang":
                    values["nccl_hang_when"] = ()
                else:
                    values[name] = True
            elif name == "slow_start":
                seconds = float(arg)
                if seconds < 0:
                    raise ValueError("must be >= 0")
                values["slow_start_s"] = seconds
            elif name in ("crash_after_tokens", "oom_above_draft_tokens", "hang_after_tokens"):
                n = int(arg)
                if n < 0:
                    raise ValueError("must be >= 0")
                values[name] = n
            else:
                pairs = []
                for item in arg.split(","):
                    var, sep, value = item.strip().partition(":")
                    if not sep or not var:
                        raise ValueError("expects VAR:VALUE[,VAR:VALUE...]")
                    pairs.append((var.strip(), value.strip()))
                values["nccl_hang_when"] = tuple(pairs)
        except ValueError as exc:
            raise ValueError(f"fault {raw!r}: {exc}") from None
    return Faults(**values)
