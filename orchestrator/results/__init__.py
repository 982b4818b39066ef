"""What the user reads and keeps.

- `select`: champion selection, statistics, the promotion gate.
- `report`: the results table and plots; `export`: env/json/sglang-args files; `truth`: the simulator's optimum.
"""
