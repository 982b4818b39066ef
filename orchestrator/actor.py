"""The Ray actor around trial.py; the only module that imports Ray.

An actor holds `num_gpus = tp` for its lifetime and runs trials one after another, so a Ray cluster
of K GPU hosts keeps K trials in flight without paying actor start-up per trial. A trial goes in as
a TrialSpec and comes back as (TrialOutcome, trial files): the files travel back so a driver on
another host still gets server.log and bench.jsonl into its work directory.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any

import ray

from orchestrator.records import TrialOutcome, TrialSpec

_MAX_FILE_BYTES = 8_000_000


def init_local(*, num_gpus: int | None, node_ip: str = "127.0.0.2", num_cpus: int | None = None) -> dict[str, Any]:
    """Start a private single-node Ray instance bound to a loopback address.

    Ray rewrites 127.0.0.1 to the machine's external address and its ports have no
    authentication, so the instance binds to another loopback address (127.0.0.2) instead.
    `num_gpus` may be logical (the simulator needs no GPU) or None to let Ray detect them.
    """
    ctx = ray.init(
        address="local",
        _node_ip_address=node_ip,
        num_gpus=num_gpus,
        num_cpus=num_cpus if num_cpus is not None else max(os.cpu_count() or 1, 2),
        include_dashboard=False,
        object_store_memory=200_000_000,
        log_to_driver=False,
        logging_level="WARNING",
        configure_logging=True,
    )
    return {"address": ctx.address_info.get("address"), "node_ip": node_ip}


def connect(address: str) -> dict[str, Any]:
    """Join an existing Ray cluster (`ray start --head ...`); the package must be installed on every node."""
    ctx = ray.init(address=address, log_to_driver=False, logging_level="WARNING")
    return {"address": ctx.address_info.get("address")}


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()


def cluster_gpus() -> float:
    return float(ray.cluster_resources().get("GPU", 0.0))


@ray.remote(max_restarts=0, max_concurrency=2)
class TrialActor:
    """Runs trials on the GPUs Ray gave it. Stores nothing but the config; work happens in run()."""

    def __init__(self) -> None:
        self._current: Path | None = None
        self._lock = threading.Lock()

    def where(self) -> dict[str, Any]:
        return {"node": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
                "ip": ray.util.get_node_ip_address(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "pid": os.getpid()}

    def run(self, spec: TrialSpec) -> tuple[TrialOutcome, dict[str, bytes]]:
        from orchestrator.trial import run_trial  # imported in the worker, after Ray set the GPUs

        gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        node = f"{ray.util.get_node_ip_address()}/{ray.get_runtime_context().get_node_id()[:8]}"
        with self._lock:
            self._current = Path(spec.trial_dir)
        try:
            outcome = run_trial(spec, gpu_ids=gpu_ids, node=node)
        finally:
            with self._lock:
                self._current = None
        return outcome, _collect(Path(spec.trial_dir))

    def abort(self) -> str | None:
        """Kill the current trial's server now (second Ctrl-C); run() then returns a failure."""
        from orchestrator.server import reap_orphan

        with self._lock:
            current = self._current
        return reap_orphan(current) if current else None


def _collect(trial_dir: Path) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    for p in sorted(trial_dir.iterdir()) if trial_dir.is_dir() else []:
        if p.is_file() and not p.name.endswith((".tmp", ".pid")):
            size = p.stat().st_size
            with open(p, "rb") as f:
                if size > _MAX_FILE_BYTES:
                    f.seek(size - _MAX_FILE_BYTES)
                files[p.name] = f.read()
    return files


def new_actor(tp: int):
    """One trial actor holding `tp` GPUs (logical ones with the simulator)."""
    return TrialActor.options(num_gpus=tp, num_cpus=0).remote()


def wait(refs: list, timeout_s: float) -> tuple[list, list]:
    return ray.wait(refs, num_returns=1, timeout=timeout_s)


def get(ref) -> Any:
    return ray.get(ref)


def kill(actor) -> None:
    ray.kill(actor, no_restart=True)


ActorDiedError = ray.exceptions.RayActorError
RayError = ray.exceptions.RayError
