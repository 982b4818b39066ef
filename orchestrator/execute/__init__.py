"""Where trials run.

- `ray_actor`: a Ray actor per trial holding `tp` GPUs (the only Ray importer).
"""
