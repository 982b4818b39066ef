"""Load and validate an experiment YAML and the search spaces it names into frozen models: the public face
of config.sections (the models) and config.loading (`load`, `load_space`).

Every user mistake becomes one `SpecError` naming the file, the field path, the rule and the value, with a
fix (did-you-mean for unknown keys and knobs). Nothing downstream re-checks what is validated here."""

from __future__ import annotations

from orchestrator.config.durations import parse_duration
from orchestrator.config.loading import load, load_space
from orchestrator.config.sections import (
    METRIC_NAMES,
    BenchmarkSpec,
    Bound,
    BudgetSpec,
    FaultSpec,
    MetricName,
    ObjectiveSpec,
    Port,
    Positive,
    ProbeSpec,
    PromotionSpec,
    SamplerSpec,
    ServerSpec,
    SimulatorSpec,
    Slug,
    SweepSpec,
    TrackingSpec,
)
from orchestrator.config.space import ParamSpec, Scalar, SearchSpace
from orchestrator.errors import SpecError

__all__ = [
    "METRIC_NAMES",
    "BenchmarkSpec",
    "Bound",
    "BudgetSpec",
    "FaultSpec",
    "MetricName",
    "ObjectiveSpec",
    "ParamSpec",
    "Port",
    "Positive",
    "ProbeSpec",
    "PromotionSpec",
    "SamplerSpec",
    "Scalar",
    "SearchSpace",
    "ServerSpec",
    "SimulatorSpec",
    "Slug",
    "SpecError",
    "SweepSpec",
    "TrackingSpec",
    "load",
    "load_space",
    "parse_duration",
]
