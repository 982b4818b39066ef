"""An arm of the confirmation: one configuration measured in the interleaved rounds, as a value."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.records import ParamValue


@dataclass(frozen=True)
class Arm:
    """One configuration measured in the rounds."""

    name: str
    """champion | baseline | no_speculation | default_communication | runner_up | champion@8 | baseline@8 ..."""
    params: dict[str, ParamValue]
    number: int
    """The trial it comes from (-1: the baseline)."""
    concurrency: int
    main: bool = False
    """The champion/baseline pair the verdict is about: measured until decided."""

    @property
    def kind(self) -> str:
        """What it is, without the load it is measured at ("champion" for "champion@8")."""
        return self.name.split("@")[0]
