"""What to try next.

- `space`: distributions, feasibility, space size.
- `study`: the Optuna study (the only Optuna importer): ask, tell, resume, read-only views.
"""
