"""What to try next.

- `space`: distributions, feasibility, space size.
- `study`: the Optuna study: ask, tell, resume, read-only views (search/ is the only room that imports Optuna).
- `sampler`: the failure-aware TPE and stage two's sampler (the refinement first, TPE between).
- `refine`: stage two's local refinement: the next untried neighbour of the best measured points.
- `regions`: failures as information: the region a failed (or refused) trial marks, its core and its edge.
- `proposal`: the proposal policy: ask, and settle without a launch what needs none.
- `plots`: Optuna's own views of the study (history, importances, parallel coordinate, slice, Pareto front).
"""
