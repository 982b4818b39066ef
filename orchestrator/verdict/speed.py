"""Each run's own speed taken out of the confirmation's rounds, for the one question two near-tied
configurations put to the run-to-run noise: which of the search's pick and its runner-up (or rival) is
better (gate.contending, rounds.still_open, choose.choose). The gate against the baseline takes the values
as measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from orchestrator.records import ParamValue, prefill_group, prefill_x
from orchestrator.stats import Covariate, covariate_adjusted
from orchestrator.verdict.gate import Direction


def run_speed_adjusted(
    values: Mapping[str, Mapping[int, float]],
    ttft: Mapping[tuple[str, int], float],
    params: Mapping[str, Mapping[str, ParamValue]],
    *,
    direction: Direction,
) -> tuple[dict[str, dict[int, float]], Covariate | None]:
    """The rounds' values (arm -> round -> objective) less what each run's TTFT (`ttft`: (arm, round) -> ms)
    says of the run's own speed, for the arms `params` names (steps.Arms.adjustable); with the covariate
    the rounds gave (its slope on the objective oriented so higher is better; None: the arms' and rounds' fit leaves nothing to fit it on). The
    values as they are unless the slope was applied; a run without a TTFT stays as measured.

    Why: a server run that came up slow (clocks, a neighbour on the host) is slow at prefill and at decode
    alike, and at one stream a run's TTFT is its prefill. Two configurations that prefill alike
    (records.prefill_group: the same communication settings, both speculating, other steps, top-k or draft
    tokens) should show the same TTFT, so a difference in their runs' TTFT is a difference in the runs'
    speed, not in the configurations. stats.covariate_adjusted fits the slope within arms and rounds (the
    host's drift is the round's) and moves only arms that share a prefill group against each other; it is
    used only where the slope is told from 0. It decides the runner-up against the champion (`contending`,
    rounds.still_open, choose.choose); the gate against the baseline takes the values as measured. The
    slope's own uncertainty is not carried into the rounds' standard error."""
    out = {name: dict(row) for name, row in values.items()}
    sign = 1.0 if direction == "maximize" else -1.0
    cells = _timed_runs(values, ttft, params, sign)
    # y's fit: the arm and the round (the host's drift); x's: what the arm's prefill depends on, and the round.
    found, covariate = covariate_adjusted(
        [c[2] for c in cells],
        [c[3] for c in cells],
        [(name, i) for name, i, _, _ in cells],
        [(prefill_group(params[name]), i) for name, i, _, _ in cells],
    )
    if covariate is not None and covariate.applied:
        for (name, i, _, _), y in zip(cells, found):
            out[name][i] = math.exp(sign * y)
    return out, covariate


def _timed_runs(
    values: Mapping[str, Mapping[int, float]],
    ttft: Mapping[tuple[str, int], float],
    params: Mapping[str, Mapping[str, ParamValue]],
    sign: float,
) -> list[tuple[str, int, float, float]]:
    """(arm, round, oriented log value, log TTFT) of each run of the arms `params` names that has both."""
    runs = [(name, i, v, prefill_x(ttft.get((name, i)))) for name, row in values.items() for i, v in row.items()]
    return [(name, i, sign * math.log(v), x) for name, i, v, x in runs if name in params and v > 0 and x is not None]
