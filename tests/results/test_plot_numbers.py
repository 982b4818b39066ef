"""Optuna's plots on the parent run number the trials as the sweep did (issue 21 item 4). The plots are
drawn from a study holding only the searched trials and baselines; added to it in order, Optuna renumbered
them from 0, so with confirmation runs and skipped proposals left out the champion (trial 26) was drawn as
'Trial 19' and the real trial-0019 was another point."""

from __future__ import annotations

import json
import re

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from orchestrator.search import plots

DIST = {
    "NCCL_PROTO": CategoricalDistribution(["LL", "LL128", "Simple"]),
    "NCCL_ALGO": CategoricalDistribution(["Ring", "Tree"]),
}


def _study(tmp_path) -> str:
    """A stored study as a sweep leaves it: a baseline, searched trials, a failure, confirmation runs and
    skipped proposals between them. Trial 7 is the best; it is the 5th trial the plots draw."""
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="numbers", storage=url, direction="maximize")
    rows = [
        ("baseline", 50.0, {}),
        ("search", 60.0, {}),
        ("confirm", 70.0, {}),
        ("search", None, {"skipped": True}),
        ("search", 55.0, {}),
        ("search", None, {}),
        ("confirm", 71.0, {}),
        ("search", 80.0, {}),
        ("search", 58.0, {}),
    ]
    protos, algos = ["LL", "LL128", "Simple"], ["Ring", "Tree"]
    for i, (role, value, attrs) in enumerate(rows):
        state = TrialState.COMPLETE if value is not None else TrialState.FAIL
        params = {} if role == "baseline" else {"NCCL_PROTO": protos[i % 3], "NCCL_ALGO": algos[i % 2]}
        study.add_trial(
            create_trial(
                state=state,
                value=value,
                params=params,
                distributions={k: DIST[k] for k in params},
                user_attrs={"role": role, **attrs},
            )
        )
    return url


def _figure(html: str) -> dict:
    """The plotly figure of one Plot's `<div>` (its data and layout, as plotly.js receives them)."""
    call = html[html.index("Plotly.newPlot(") :]
    start = call.index("[")
    data, _ = json.JSONDecoder().raw_decode(call[start:])
    return {"data": data}


def test_the_plots_draw_the_trials_under_the_sweeps_numbers(tmp_path):
    drawn = {p.name: _figure(p.html) for p in plots.sweep_plots(_study(tmp_path), "numbers", "decode_tok_s")}
    history = drawn["history"]["data"]
    points = next(t for t in history if t.get("mode") == "markers")
    assert points["x"] == [0, 1, 4, 7, 8] and points["y"] == [50.0, 60.0, 55.0, 80.0, 58.0]
    best = next(t for t in history if t.get("name") == "Best Value")
    assert max(best["y"]) == 80.0 and best["x"][best["y"].index(80.0)] == 7
    # The slice plot names each point's trial in its hover text and colours it by trial number.
    slices = [t for t in drawn["slice"]["data"] if t.get("x")]
    numbers = {int(n) for t in slices for n in re.findall(r"'number': (\d+)", json.dumps(t.get("text")))}
    colors = {int(c) for t in slices for c in t["marker"]["color"]}
    assert numbers <= {1, 4, 7, 8} and colors == {1, 4, 7, 8} and 7 in numbers | colors
