"""Which NCCL settings a probe measures: the NCCL part of the experiment's space, searched.

The NCCL dimensions are the space's environment knobs named NCCL_* (the logging ones excepted);
a setting is one value per dimension, None meaning "not set". "NCCL defaults" (nothing set) is
always probed first: it is the baseline every ranking keeps.

A small NCCL space (at most `budget` settings) is enumerated. A large one is searched, because
one setting costs seconds on a GPU host and search_spaces/nccl.yaml alone has 3,456 settings
(hours, for a stage meant to take minutes). `SettingSearch` asks in this order, deterministic for
a seed: the defaults; every single-variable change from the defaults (the main effects, which on
small all-reduces are most of the story: protocol, P2P level, channels); then repeatedly the
one-variable neighbours of the best setting so far (local refinement, which finds the interactions
such as P2P_LEVEL x PROTO); and when no unprobed neighbour is left, seeded random settings.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping

from orchestrator.config import knobs
from orchestrator.config.experiment import Scalar, SweepSpec
from orchestrator.records import Frozen

DEFAULTS_LABEL = "NCCL defaults"
DEFAULT_BUDGET = 48
"""Settings probed when the experiment or the command line gives no budget (about a minute on a GPU host
at ~1 s per setting, see gpu.py)."""
_NOT_TUNABLE = frozenset({"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS"})


class NcclSetting(Frozen):
    """One NCCL setting: the variables it sets (sorted by name; unset ones are absent)."""

    env: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, values: Mapping[str, Scalar]) -> NcclSetting:
        """The setting with these values; None (not set) is left out."""
        return cls(env=tuple(sorted((k, str(v)) for k, v in values.items() if v is not None)))

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.env) or DEFAULTS_LABEL

    def as_env(self) -> dict[str, str]:
        return dict(self.env)

    @property
    def is_defaults(self) -> bool:
        return not self.env


Dimensions = Mapping[str, tuple[Scalar, ...]]


def nccl_dimensions(spec: SweepSpec) -> dict[str, tuple[Scalar, ...]]:
    """The NCCL environment knobs of the experiment's space and their values, None ("not set") first.

    A dimension that is conditional (`when`) can also be inactive, which is the same as not set, so
    None is one of its values.
    """
    dims: dict[str, tuple[Scalar, ...]] = {}
    for name, param in spec.space.params.items():
        knob = knobs.KNOBS.get(name)
        if knob is None or knob.target != "env" or not name.startswith("NCCL_") or name in _NOT_TUNABLE:
            continue
        values = list(param.values())
        if None not in values and param.when:
            values.append(None)
        dims[name] = tuple(sorted(values, key=lambda v: v is not None))  # stable: the space's order
    return dims


def space_size(dims: Dimensions) -> int:
    return math.prod(len(v) for v in dims.values()) if dims else 1


def planned_settings(spec: SweepSpec) -> int:
    """How many NCCL settings the experiment's probe stage will measure (0 without one)."""
    dims = nccl_dimensions(spec)
    if not spec.probe.enabled or not dims:
        return 0
    return min(spec.probe.budget or DEFAULT_BUDGET, space_size(dims))


class SettingSearch:
    """Ask for the next setting to probe, tell its objective (lower is better; None: it failed).

    Enumerates when the space fits the budget, else searches it (see the module docstring).
    """

    def __init__(self, dims: Dimensions, *, budget: int = DEFAULT_BUDGET, seed: int = 0):
        if budget < 1:
            raise ValueError(f"a probe budget must be >= 1 setting, but got {budget}")
        self.dims = {k: tuple(v) for k, v in dims.items()}
        self.budget = budget
        self.seed = seed
        self.told: dict[NcclSetting, float | None] = {}
        self.asked: list[NcclSetting] = []
        self._queue: list[NcclSetting] = self._initial()

    @property
    def enumerates(self) -> bool:
        return space_size(self.dims) <= self.budget

    def _initial(self) -> list[NcclSetting]:
        defaults = {k: None for k in self.dims}
        first = [NcclSetting.of(defaults)]
        if self.enumerates:
            names = list(self.dims)
            every = [NcclSetting.of(dict(zip(names, combo))) for combo in itertools.product(*self.dims.values())]
            return first + [s for s in every if s not in first]
        main_effects = [
            NcclSetting.of({**defaults, name: value})
            for name, values in self.dims.items()
            for value in values
            if value is not None
        ]
        random.Random(self.seed).shuffle(main_effects)  # a budget smaller than the main effects samples them
        return first + main_effects

    def ask(self) -> NcclSetting | None:
        """The next setting to probe, or None when the budget is spent or nothing is left."""
        if len(self.asked) >= self.budget:
            return None
        while self._queue:
            setting = self._queue.pop(0)
            if setting not in self.asked:
                self.asked.append(setting)
                return setting
        refined = self._refine()
        if refined is not None:
            self.asked.append(refined)
        return refined

    def tell(self, setting: NcclSetting, objective: float | None) -> None:
        if setting not in self.asked:
            raise ValueError(f"{setting.label!r} was never asked for; tell only what ask() returned")
        self.told[setting] = objective

    def best(self) -> NcclSetting | None:
        scored = [(v, s.label, s) for s, v in self.told.items() if v is not None]
        return min(scored)[2] if scored else None

    def _refine(self) -> NcclSetting | None:
        best = self.best()
        if best is not None:
            current = {k: None for k in self.dims} | {k: v for k, v in best.env}
            for name, values in self.dims.items():
                for value in values:
                    candidate = NcclSetting.of({**current, name: value})
                    if candidate not in self.asked:
                        return candidate
        if self.enumerates:
            return None
        rng = random.Random(f"{self.seed}:{len(self.asked)}")
        for _ in range(1000):
            candidate = NcclSetting.of({k: rng.choice(v) for k, v in self.dims.items()})
            if candidate not in self.asked:
                return candidate
        return None
