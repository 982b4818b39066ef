"""The verdict's one door to the sweep: what the promotion asks of the night it ends, and nothing else.

The rounds, the gate and the choice never see the sweep's Context, its executor, its study or its tracker:
they ask the port to run these arms for a round (and get back each run's outcome), for the clock and the
time left, for the trials the search measured, and to register what they chose. The sweep implements it
(sweep/_port.SweepPort); a test can implement it with a fake night.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from orchestrator.config.experiment import SweepSpec
from orchestrator.records import ParamValue, TrialOutcome
from orchestrator.verdict.arm import Arm


@dataclass(frozen=True)
class Run:
    """One confirmation run as the port hands it back: the arm, its outcome, or why it was lost."""

    arm: Arm
    outcome: TrialOutcome | None
    lost: str | None = None


@dataclass(frozen=True)
class Chosen:
    """What the verdict registers: the configuration, the MLflow run that measured it, its own figures and the
    registry version's description. The port turns it into the serving config and champion.env."""

    run_id: str
    params: dict[str, ParamValue]
    number: int
    """The search trial it is, or is derived from."""
    metrics: dict[str, float]
    fingerprint_hash: str
    allreduce_backend: str
    derivation: str
    description: str


class Port(Protocol):
    """What the verdict needs of the sweep."""

    @property
    def spec(self) -> SweepSpec:
        """The experiment."""

    @property
    def outcomes(self) -> list[TrialOutcome]:
        """Every trial the search measured (the baseline's included), in the order they finished."""

    @property
    def workdir(self) -> Path:
        """The sweep's work directory (confirm/ and champion.env are written there)."""

    @property
    def resume_hint(self) -> str:
        """The command that resumes this sweep, for the messages that say what to do."""

    @property
    def timeout_s(self) -> float:
        """The whole night's wall time."""

    def elapsed(self) -> float:
        """Seconds of the night spent so far (the sweep's clock)."""

    def remaining(self) -> float:
        """Seconds of the night left."""

    def slots(self) -> int:
        """Runs that can go at once."""

    def interrupted(self) -> bool:
        """Ctrl-C or SIGTERM was pressed: stop between runs."""

    def stop_for_interrupt(self) -> None:
        """Record that the promotion stopped on an interruption (the sweep's stop reason)."""

    def run_round(self, order: Sequence[Arm], round_i: int, of: int) -> Iterator[Run]:
        """Run the arms of round `round_i` (0-based, of `of`) in `order`, as many at a time as there are
        slots, and hand back each finished run, its files kept and logged."""

    def arm_dir(self, round_i: int, arm: str) -> Path:
        """Where the run of `arm` in round `round_i` keeps its files."""

    def dropped(self, name: str, why: str) -> None:
        """An arm left out for want of time (said to the user as it happens)."""

    def pending(self) -> int:
        """Results waiting in the tracking outbox."""

    def run_id_of(self, outcome: TrialOutcome) -> str | None:
        """The trial's MLflow run (after the outbox is sent), or None while MLflow cannot say."""

    def confirm_run_id(self, number: int, folder: Path) -> str | None:
        """The MLflow run of the confirmation run kept in `folder`, or None while MLflow cannot say."""

    def register(self, chosen: Chosen) -> tuple[str, Path]:
        """Register the chosen configuration under the promotion's alias and write the sweep's env file for
        it; the registry version and the env file. Raises TrackingError when the registry refuses."""
