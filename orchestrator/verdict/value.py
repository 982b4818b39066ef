"""The one value every view of a finished sweep renders: what was deployed and why.

Before this value each view picked its own figures out of summary.json: one named the search's pick, another
the deployed configuration, a third the single highest measurement. A `Verdict` is built once, at the end of
the promotion (`Verdict.of`, from the promotion's summary fields), kept in summary.json (`decision`) and read
back by every view, so they name the same trial, knobs and gain.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from orchestrator.records import Frozen, ParamValue
from orchestrator.results.figures import Confirmed, Contribution, LevelGain


class Outcome(str, enum.Enum):
    """How the promotion ended; `sweep run` exits 0 only for promoted (README: exit codes)."""

    promoted = "promoted"
    unconfirmed = "unconfirmed"
    """Promoted without a gate (promotion.max_rounds: 0)."""
    not_better = "not_better"
    outputs_changed = "outputs_changed"
    """Faster, but its greedy outputs are not the baseline's (promotion.correctness): never promoted."""
    undecided = "undecided"
    no_champion = "no_champion"
    """No feasible trial, no baseline, or the champion could not be registered."""

    @property
    def words(self) -> str:
        return self.value.replace("_", " ")


class Configuration(Frozen):
    """A configuration the verdict names: the trial it is (or is derived from), in words, and its knobs."""

    number: int
    label: str
    """"trial 13", "trial 16 without speculation"."""
    params: dict[str, ParamValue]
    """The knobs it sets (those left at the engine's default are not listed)."""
    kind: str = "champion"
    """The confirmation arm it was measured as: champion | runner_up | no_speculation | default_communication."""


class GateBounds(Frozen):
    """The gate's decision on the deployed configuration (or the pick, when nothing was deployed)."""

    passed: bool
    gain: float | None
    low: float | None
    high: float | None
    min_gain: float | None
    rounds: int


class Verdict(Frozen):
    """What was deployed and why, the deployed configuration and its own figures first."""

    outcome: Outcome | None
    """None: interrupted during the confirmation rounds (a --resume confirms again)."""
    text: str
    """The verdict in words, as the promotion wrote it."""
    metric: str
    deployed: Configuration | None = None
    """What the registry alias and champion.env hold (or are about to); None when nothing was promoted."""
    pick: Configuration | None = None
    """The search's pick (the champion the confirmation started from)."""
    pick_value: float | None = None
    """The pick's search-phase measurement: one run, the best of many (optimistic)."""
    replaced: str = ""
    """Why the deployed configuration is not the search's pick, in one sentence ("" when it is)."""
    figures: Confirmed | None = None
    """The figures of what the verdict is about: the deployed configuration's own (the pick's otherwise)."""
    gate: GateBounds | None = None
    parts: tuple[Contribution, ...] = ()
    """Each part's gain, measured on the pick's ablations in the same rounds."""
    levels: tuple[LevelGain, ...] = ()
    by_load: str = ""
    not_measured: tuple[str, ...] = ()
    model_version: str | None = None
    env_file: str | None = None
    run_id: str | None = None
    """The MLflow run of the deployed configuration (the registry version's source)."""
    importances: dict[str, float] = Field(default_factory=dict)

    # ------------------------------------------------------------------ derived

    @property
    def subject(self) -> Configuration | None:
        """What the figures are about: the deployed configuration, else the search's pick."""
        return self.deployed or self.pick

    @property
    def gated(self) -> bool:
        """Whether interleaved rounds against the baseline measured it (a gate ran)."""
        return self.figures is not None and self.figures.label == "confirmed"

    @property
    def promoted(self) -> bool:
        return self.deployed is not None and self.model_version is not None

    @property
    def parts_of(self) -> Configuration | None:
        """Whose parts `parts` are: the search's pick (its ablations ran in the rounds)."""
        return self.pick if self.parts else None

    def parts_heading(self) -> str:
        """What the parts' lines are about: the deployed configuration's own, or the pick's when another
        configuration was deployed."""
        if self.deployed is None or self.pick is None or self.deployed == self.pick:
            return "why"
        return f"why {self.pick.label} (the search's pick, not deployed) was fast"

    # ------------------------------------------------------------------ builder

    @classmethod
    def of(cls, fields: Mapping[str, Any], metric: str, importances: Mapping[str, float] | None = None) -> Verdict:
        """The Verdict from the promotion's summary fields (sweep/_promotion.Promotion.summary_fields, or a
        summary.json written before this value existed)."""
        pick = _pick(fields)
        deployed = _deployed(fields, pick)
        figures = fields.get("confirmed")
        return cls(
            outcome=_outcome(fields.get("outcome")),
            text=str(fields.get("verdict") or ""),
            metric=metric,
            deployed=deployed,
            pick=pick,
            pick_value=fields.get("search_value"),
            replaced=_replaced(fields, deployed, pick),
            figures=Confirmed.model_validate(figures) if figures is not None else None,
            gate=_gate(fields.get("gate")),
            parts=tuple(Contribution.model_validate(c) for c in fields.get("contributions") or ()),
            levels=tuple(LevelGain.model_validate(lv) for lv in fields.get("concurrency") or ()),
            by_load=str(fields.get("concurrency_verdict") or ""),
            not_measured=tuple(fields.get("not_measured") or ()),
            model_version=fields.get("model_version"),
            env_file=fields.get("env_file"),
            run_id=fields.get("run_id") if fields.get("promoted") else None,
            importances=dict(importances or {}),
        )


def _outcome(value: Any) -> Outcome | None:
    return None if value is None else Outcome(value)


def _set(params: Mapping[str, ParamValue]) -> dict[str, ParamValue]:
    return {k: v for k, v in params.items() if v is not None}


def _pick(fields: Mapping[str, Any]) -> Configuration | None:
    champion = fields.get("champion")
    if not champion:
        return None
    number = int(champion["number"])
    return Configuration(number=number, label=f"trial {number}", params=_set(champion.get("params") or {}))


def _deployed(fields: Mapping[str, Any], pick: Configuration | None) -> Configuration | None:
    """The promoted configuration: `deployed` where the promotion named it, the pick where an older
    summary promoted without naming it."""
    named = fields.get("deployed")
    outcome = _outcome(fields.get("outcome"))
    if named and outcome in (Outcome.promoted, Outcome.unconfirmed):
        return Configuration(
            number=int(named["number"]),
            label=str(named["label"]),
            params=_set(named.get("params") or {}),
            kind=str(named.get("name") or fields.get("promoted_config") or "champion"),
        )
    return pick if fields.get("promoted") else None


def _replaced(fields: Mapping[str, Any], deployed: Configuration | None, pick: Configuration | None) -> str:
    """One sentence on why the deployed configuration is not the search's pick ("" when it is)."""
    if deployed is None or pick is None or deployed == pick:
        return ""
    why = str((fields.get("deployed") or {}).get("why") or "").strip().rstrip(".")
    head = f"{deployed.label} was deployed instead of {pick.label}, the search's pick"
    return f"{head}: {why}" if why else head


def _gate(gate: Mapping[str, Any] | None) -> GateBounds | None:
    if not gate:
        return None
    return GateBounds(
        passed=bool(gate.get("passed")),
        gain=gate.get("gain"),
        low=gate.get("ci_low"),
        high=gate.get("ci_high"),
        min_gain=gate.get("min_gain"),
        rounds=int(gate.get("rounds") or 0),
    )
