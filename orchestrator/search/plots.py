"""Optuna's own views of a sweep's study, drawn from its storage: optimization history, parameter
importances, parallel coordinate, slice and, with two objectives, the Pareto front.

Each comes back as an HTML fragment (a plotly `<div>` without plotly.js); `plotly_js()` is the script
once, so a page that inlines it stays self-contained. Only searched trials and baselines are drawn:
confirmation runs, skipped proposals and interrupted trials are no points of the search.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from orchestrator.records import TrialRole

_PLOTTED_ROLES = frozenset({TrialRole.search.value, TrialRole.baseline.value})


@dataclass(frozen=True)
class Plot:
    """One of Optuna's views: a file name for MLflow, a title and the plotly `<div>`."""

    name: str
    title: str
    html: str


def plotly_js() -> str:
    """plotly.js itself (about 4 MB), for a page that must work offline."""
    from plotly.offline import get_plotlyjs  # deferred: plotly is only needed to draw

    return str(get_plotlyjs())


def sweep_plots(storage_url: str, study_name: str, objective: str) -> list[Plot]:
    """Optuna's views of the study's searched trials; empty when the study is missing or fewer than
    two trials completed (nothing to draw). `objective` labels the first value."""
    try:
        stored = optuna.load_study(study_name=study_name, storage=storage_url)
    except KeyError:
        return []
    trials = [
        t
        for t in stored.get_trials(deepcopy=False)
        if t.user_attrs.get("role", TrialRole.search.value) in _PLOTTED_ROLES
        and not t.user_attrs.get("skipped")
        and t.state in (TrialState.COMPLETE, TrialState.FAIL)
    ]
    if sum(1 for t in trials if t.state is TrialState.COMPLETE) < 2:
        return []
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # "A new study created in memory" is no news
    try:
        study = optuna.create_study(directions=stored.directions)
    finally:
        optuna.logging.set_verbosity(verbosity)
    study.add_trials(numbered_as_stored(trials))
    names = [objective] + ([f"objective {i + 1}" for i in range(1, len(study.directions))])
    first: dict[str, Any] = {"target": lambda t: t.values[0], "target_name": objective}
    views = vis_calls(study, names, first)
    plots = []
    for name, title, draw in views:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna's ExperimentalWarning and plotly's deprecations
            try:
                figure = draw()
            except (ValueError, RuntimeError, ZeroDivisionError):  # e.g. one distinct value per knob
                continue
        figure.update_layout(title=title, height=420, margin={"l": 60, "r": 30, "t": 50, "b": 50})
        plots.append(
            Plot(
                name=name,
                title=title,
                html=figure.to_html(full_html=False, include_plotlyjs=False, div_id=f"optuna-{name}"),
            )
        )
    return plots


def numbered_as_stored(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """`trials` with a failed, empty trial in each gap of their numbers, so that a study they are added to
    in order numbers each as the sweep did: Optuna's plots draw and label the tool's trial numbers (the
    champion, trial 26, is not drawn as "Trial 19" when confirmation runs and skipped proposals are left
    out). A failed trial is drawn by no plot, as the failures of the search are not."""
    by_number = {t.number: t for t in trials}
    gap = optuna.trial.create_trial(state=TrialState.FAIL)
    return [by_number.get(n, gap) for n in range(max(by_number, default=-1) + 1)]


def vis_calls(study: optuna.Study, names: list[str], first: dict[str, Any]) -> list[tuple[str, str, Callable[[], Any]]]:
    """(file name, title, drawing call) of each view that applies to the study."""
    v = optuna.visualization
    multi = len(study.directions) > 1
    kw = first if multi else {"target_name": names[0]}
    calls: list[tuple[str, str, Callable[[], Any]]] = [
        ("history", f"Optimization history: {names[0]} by trial", lambda: v.plot_optimization_history(study, **kw)),
        (
            "importances",
            f"Which knobs moved {names[0]} (fANOVA importance)",
            lambda: v.plot_param_importances(
                study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0), **kw
            ),
        ),
        (
            "parallel_coordinate",
            f"Knobs and {names[0]} (parallel coordinate)",
            lambda: v.plot_parallel_coordinate(study, **kw),
        ),
        ("slice", f"{names[0]} per knob value (slice)", lambda: v.plot_slice(study, **kw)),
    ]
    if len(study.directions) == 2:
        calls.append(
            (
                "pareto_front",
                "Pareto front of the two objectives",
                lambda: v.plot_pareto_front(study, target_names=names),
            )
        )
    return calls
