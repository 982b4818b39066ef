"""Where trials run.

- `base`: the `Executor` interface (start, submit, wait, abort, close) and `Finished`.
- `ray_actor`: `RayExecutor`, a Ray actor per slot holding `tp` GPUs (the only Ray importer).
- `inline`: `InlineExecutor`, trials in threads of this process (no Ray), for in-process tests.
- `processes`: what a killed driver leaves running, found and ended through /proc.
- `agent_reaper`: the watchdog that ends the private Ray instance's agents with the driver.
"""

__all__ = ["agent_reaper", "base", "inline", "processes", "ray_actor"]
