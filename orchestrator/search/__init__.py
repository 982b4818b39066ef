"""What to try next.

- `space`: distributions, feasibility, space size.
- `study`: the Optuna study: ask, tell, resume, read-only views (search/ is the only room that imports Optuna).
"""
