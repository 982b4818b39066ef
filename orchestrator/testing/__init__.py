"""What tests and benchmarks run the real driver on: the model-backed executor and its virtual clock.

Shipped in the package (not under tests/) so bench/ and users' own experiments can run a simulated
night of the real `sweep.Sweep` in seconds. Nothing in the core imports this room.

- `model_executor`: the Executor on the simulator's model and a virtual clock (slots, submit, wait, abort).
- `model_trial`: one trial as the model answers it (faults, observation, repeats, outputs, seconds).
"""

from orchestrator.clock import VirtualClock
from orchestrator.testing.model_executor import HOST, Answer, ModelExecutor

__all__ = ["HOST", "Answer", "ModelExecutor", "VirtualClock"]
