"""What the user wrote and what it means to SGLang (pure: no processes, no network).

- `experiment`: the experiment and search-space models, loading and validation (`load`, `SweepSpec`).
- `knobs`: the typed catalogue of every knob (NCCL variables, SGLang flags) and the env allow-list.
"""
