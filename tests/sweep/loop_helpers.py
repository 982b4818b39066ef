"""Shared pieces of the sweep tests: the loop run in-process on a counting executor (the model-backed one
unless told), and the two-part space (NCCL_P2P_LEVEL and EAGLE-3) the confirmation tests measure."""

from __future__ import annotations

import threading
from pathlib import Path

import yaml
from e2e_helpers import demo_experiment, write_experiment
from mlflow_fixtures import copy_store

from orchestrator.config import experiment as spec_mod
from orchestrator.execute.base import Executor, Finished
from orchestrator.sweep import state as st
from orchestrator.sweep.driver import Sweep
from orchestrator.testing import ModelExecutor


class CountingExecutor:
    """An executor (the model-backed one unless told), noting how many trials ran at once."""

    def __init__(self, slots: int, inner: Executor | None = None):
        self.inner: Executor = inner or ModelExecutor(slots)
        self.running_now = 0
        self.most_at_once = 0
        self.submitted: list[int] = []
        self._count = threading.Lock()

    @property
    def clock(self):  # type: ignore[no-untyped-def]
        return self.inner.clock

    def start(self):  # type: ignore[no-untyped-def]
        return self.inner.start()

    def idle(self) -> int:
        return self.inner.idle()

    def abort(self, handle: int) -> None:
        self.inner.abort(handle)

    def close(self) -> None:
        self.inner.close()

    def submit(self, spec):  # type: ignore[no-untyped-def]
        with self._count:
            self.submitted.append(spec.number)
            self.running_now += 1
            self.most_at_once = max(self.most_at_once, self.running_now)
        return self.inner.submit(spec)

    def wait(self, timeout_s: float) -> list[Finished]:
        done = self.inner.wait(timeout_s)
        with self._count:
            self.running_now -= len(done)
        return done


def run_sweep(
    tmp_path: Path, template: Path, data: dict, slots: int = 2, inner: Executor | None = None
) -> tuple[Path, st.SweepSummary, CountingExecutor, list]:
    spec = spec_mod.load(write_experiment(tmp_path, data))
    wd = tmp_path / "wd"
    copy_store(template, wd)
    events: list = []
    executor = CountingExecutor(slots, inner)
    summary = Sweep(spec, wd, executor=executor, on_event=events.append).run()
    return wd, summary, executor, events


def space(tmp_path: Path, steps: int) -> Path:
    """NCCL_P2P_LEVEL=SYS (about +48% on the simulated PCIe host) and EAGLE-3 with `steps` draft steps
    (on top of it: about -1% with 1 step, +8% with 3; nothing left from about 16 streams on)."""
    path = tmp_path / "space.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "two-parts",
                "params": {
                    "NCCL_P2P_LEVEL": {"choices": [None, "SYS"]},
                    "speculative_algorithm": {"choices": [None, "EAGLE3"]},
                    "speculative_num_steps": {"choices": [steps], "when": {"speculative_algorithm": "EAGLE3"}},
                    "speculative_eagle_topk": {"choices": [1], "when": {"speculative_algorithm": "EAGLE3"}},
                },
            }
        )
    )
    return path


def experiment(tmp_path: Path, steps: int, **promotion: object) -> dict:
    """Every point of the space measured once (grid), then the confirmation."""
    data = demo_experiment(
        name="verdict",
        budget={"trials": 4, "concurrent_trials": 2},
        sampler={"kind": "grid", "seed": 0},
        promotion={"min_rounds": 3, "max_rounds": 6, "explain": True, **promotion},
    )
    data["search_space"] = [str(space(tmp_path, steps))]
    return data


def near_tie(tmp_path: Path, *, max_rounds: int, name: str = "neartie") -> dict:
    """A two-step grid at 6% noise whose seeded pick is EAGLE-3 with 4 steps on NCCL_P2P_LEVEL=SYS, truly about
    12% slower than a runner-up two knobs away; a +5% gate of 3 to `max_rounds` rounds."""
    path = tmp_path / "near-tie.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "near-tie",
                "params": {
                    "NCCL_P2P_LEVEL": {"choices": [None, "SYS"]},
                    "NCCL_PROTO": {"choices": [None, "LL"]},
                    "speculative_algorithm": {"choices": [None, "EAGLE3"]},
                    "speculative_num_steps": {"choices": [2, 4], "when": {"speculative_algorithm": "EAGLE3"}},
                    "speculative_eagle_topk": {"choices": [1], "when": {"speculative_algorithm": "EAGLE3"}},
                },
            }
        )
    )
    data = demo_experiment(
        name=name,
        budget={"trials": 12, "concurrent_trials": 2},
        sampler={"kind": "grid", "seed": 3},
        simulator={"noise": 0.06},
        promotion={"min_rounds": 3, "max_rounds": max_rounds, "explain": True, "min_gain": 0.05},
    )
    data["search_space"] = [str(path)]
    return data
