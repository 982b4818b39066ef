"""The values of the promotion pipeline (verdict/promote.py): each step returns one, frozen.

Champion     the trial to confirm, the baseline, its MLflow run
Arms         what the rounds measure, and what the night's time left out
Gate         the main pair's decision with its figures, contributions and loads
Choice       the configuration to register (the champion or a simpler one)
Registered   the registry version and champion.env
Promotion    how the promotion ended, with every value it reached
Decided      the outcome as the study keeps it, for --resume
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.records import Frozen, ParamValue, TrialOutcome, prefill_group
from orchestrator.results import select
from orchestrator.results.figures import Confirmed, Contribution, LevelGain, PartCheck
from orchestrator.stats import Contrast
from orchestrator.verdict.arm import Arm, ConfirmationRow
from orchestrator.verdict.gate import Decision, Evidence, Verdict
from orchestrator.verdict.value import Outcome


@dataclass(frozen=True)
class Champion:
    """The searched trial the confirmation is about, the baseline it is measured against, its MLflow run."""

    trial: TrialOutcome
    baseline: TrialOutcome
    """The last complete baseline of the search (the gate-less verdict compares with it)."""
    run_id: str
    metric: str
    runner_up: TrialOutcome | None = None
    """The best searched trial from another region (pick.runner_up) with promotion.explain; without it, the
    rival the search can least rule out as better than the pick (pick.rival)."""
    search: Contrast | None = None
    """What the search's own measurements say of the runner-up against it (select.search_contrast)."""

    @property
    def search_value(self) -> float:
        """Its search-phase measurement (one run, the best of many: optimistic)."""
        return float(getattr(self.trial.metrics, self.metric))

    def summary(self) -> dict[str, Any]:
        """summary.json's `champion`: {number, params (the set ones), search_<metric>, allreduce_backend (the
        backend its server recorded carrying decode/verify, TrialOutcome.allreduce_path)}."""
        return {
            "number": self.trial.number,
            "params": {k: v for k, v in self.trial.params.items() if v is not None},
            f"search_{self.metric}": self.search_value,
            "allreduce_backend": self.trial.allreduce_path,
        }


@dataclass(frozen=True)
class Arms:
    """What the confirmation measures, and the step-control comparison among them."""

    arms: tuple[Arm, ...]
    counterpart: str
    """arms.ADAPTIVE or FIXED: the kind of step control the champion is compared with ("" when none)."""
    fixed: str
    """The fixed side in words ("fixed 3 steps"), when compared."""
    dropped: tuple[str, ...] = ()
    """Arms left out for want of time ("<arm>: <why>", sweep.schedule.plan)."""

    def params_of(self, name: str) -> dict[str, ParamValue]:
        return next(dict(a.params) for a in self.arms if a.name == name)

    def adjustable(self, metric: str, level: int) -> dict[str, dict[str, ParamValue]]:
        """The arms whose runs speed.run_speed_adjusted takes each run's own speed out of (name -> params):
        those measured at the gate's load `level`, where the runner-up prefills as the champion does
        (records.prefill_group: only then can the runs' TTFT tell the two apart) and `metric` at that load
        is one results.select.run_speed adjusts; none otherwise."""
        at = {a.name: dict(a.params) for a in self.arms if a.concurrency == level}
        if select.run_speed_metric(metric, level) is None or "runner_up" not in at or "champion" not in at:
            return {}
        return at if prefill_group(at["runner_up"]) == prefill_group(at["champion"]) else {}


@dataclass(frozen=True)
class Gate:
    """The main pair's decision with what explains it: the figures, each part's contribution, the loads."""

    decision: Decision
    evidence: Evidence
    min_gain: float
    figures: Confirmed
    contributions: tuple[Contribution, ...]
    levels: tuple[LevelGain, ...]
    by_load: str
    """Where the gain stops paying, or adaptive against fixed steps ("" when neither was measured)."""
    verdict: str
    checks: tuple[PartCheck, ...] = ()
    """The equivalence test of each part the ablations measured (promotion.equivalence_margin)."""

    @property
    def passed(self) -> bool:
        return self.decision.verdict is Verdict.promoted

    @property
    def outcome(self) -> Outcome:
        return Outcome(self.decision.verdict.value) if self.decision.verdict is not None else Outcome.undecided

    def record(self) -> dict[str, Any]:
        """summary.json's `gate`."""
        ev = self.evidence
        return {
            "passed": self.passed,
            "gain": ev.gain,
            "ci_low": ev.low,
            "ci_high": ev.high,
            "min_gain": self.min_gain,
            "rounds": ev.rounds,
        }


@dataclass(frozen=True)
class Choice:
    """The configuration to register: the champion, a simpler arm shown equivalent, or the runner-up
    when it measured better in the same rounds; every figure of it measured on it."""

    name: str
    """champion | no_speculation | default_communication | runner_up (its arms' names)."""
    params: dict[str, ParamValue]
    figures: Confirmed
    verdict: str
    outcome: Outcome
    """promoted, or unconfirmed without a gate."""
    number: int = -1
    """The search trial it is, or is derived from."""
    derivation: str = ""
    """How it differs from that trial ("without speculation", "with NCCL at defaults"); "" when it is the trial."""
    decision: Decision | None = None
    """The gate's decision on it against the baseline (None without a gate)."""
    why: str = ""
    """Why it and not the champion, when it is another configuration."""

    @property
    def label(self) -> str:
        """It in words: "trial 16", "trial 16 without speculation"."""
        return f"trial {self.number}" + (f" {self.derivation}" if self.derivation else "")

    @property
    def derived(self) -> bool:
        return bool(self.derivation)

    def deployed(self) -> dict[str, Any]:
        """summary.json's `deployed`."""
        return {
            "name": self.name,
            "label": self.label,
            "number": self.number,
            "params": {k: v for k, v in self.params.items() if v is not None},
            **({"why": self.why} if self.why else {}),
        }


@dataclass(frozen=True)
class Registered:
    """The registry version and the env file of the promoted configuration."""

    model_version: str
    env_file: str
    run_id: str
    promoted_config: str


@dataclass(frozen=True)
class Promotion:
    """How the promotion ended, with every value it reached (None: the step was not reached)."""

    outcome: Outcome | None
    """None: interrupted during the rounds (confirm again on --resume)."""
    verdict: str
    champion: Champion | None = None
    rows: tuple[ConfirmationRow, ...] | None = None
    """Every confirmation run, when rounds ran."""
    gate: Gate | None = None
    confirmed: Confirmed | None = None
    """The figures of what the verdict is about (the registered configuration's, when registered)."""
    registered: Registered | None = None
    not_measured: tuple[str, ...] = ()
    """Confirmation arms the night's time did not hold ("<arm>: <why>")."""
    choice: Choice | None = None
    """The configuration the verdict promoted (or would have, when registering failed)."""

    @property
    def rounds(self) -> int:
        return self.gate.evidence.rounds if self.gate is not None else 0

    def summary_fields(self, metric: str) -> dict[str, Any]:
        """The SweepSummary fields of the steps reached (summary.json leaves out the others)."""
        out: dict[str, Any] = {"verdict": self.verdict}
        if self.outcome is not None:
            out["outcome"] = self.outcome
        if self.champion is not None:
            out.update(champion=self.champion.summary(), search_value=self.champion.search_value)
        if self.rows is not None:
            out["confirmations"] = [r.record(metric) for r in self.rows]
        if self.gate is not None:
            out.update(
                gate=self.gate.record(),
                contributions=list(self.gate.contributions),
                concurrency=list(self.gate.levels),
                concurrency_verdict=self.gate.by_load or None,
            )
        if self.confirmed is not None:
            out["confirmed"] = self.confirmed
        if self.not_measured:
            out["not_measured"] = list(self.not_measured)
        if self.choice is not None:
            out["deployed"] = self.choice.deployed()
        if self.registered is not None:
            r = self.registered
            out.update(
                promoted=True,
                model_version=r.model_version,
                env_file=r.env_file,
                run_id=r.run_id,
                promoted_config=r.promoted_config,
            )
        return out


class Decided(Frozen):
    """The promotion's outcome as the study keeps it (DECISION_ATTR), with the counts it was reached at."""

    outcome: Outcome
    verdict: str
    rounds: int = 0
    model_version: str | None = None
    run_id: str | None = None
    env_file: str | None = None
    promoted_config: str | None = None
    champion: dict[str, Any] | None = None
    launched: int
    complete: int
    failed: int

    def summary_fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"outcome": self.outcome, "verdict": self.verdict}
        if self.champion is not None:
            out["champion"] = self.champion
        if self.model_version is not None:
            out.update(
                promoted=True,
                model_version=self.model_version,
                run_id=self.run_id,
                env_file=self.env_file,
                promoted_config=self.promoted_config,
            )
        return out


# ------------------------------------------------------------------------------ finish
