"""The Ray actor around trial.py; the only module that imports Ray.

An actor holds `num_gpus = tp` for its lifetime and runs trials one after another, so a Ray cluster
of K GPU hosts keeps K trials in flight without paying actor start-up per trial. A trial goes in as
a TrialSpec and comes back as (TrialOutcome, trial files): the files travel back so a driver on
another host still gets server.log and bench.jsonl into its work directory.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import ray

from orchestrator.errors import ClusterUnreachable
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
    """Join an existing Ray cluster (`ray start --head ...`); the package must be installed on every node.

    A loopback head address (127.0.0.2:6379, as in tests) is also the driver's node address:
    Ray would otherwise pick the machine's external interface and find no raylet there.
    """
    host = address.rsplit(":", 1)[0] if ":" in address else ""
    extra: dict[str, Any] = {}
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).is_loopback:
            extra["_node_ip_address"] = host
    try:
        ctx = ray.init(address=address, log_to_driver=False, logging_level="WARNING", **extra)
    except (ConnectionError, RuntimeError) as exc:
        chain, cause = [], exc
        while cause is not None:
            chain.append(f"{type(cause).__name__}: {cause}")
            cause = cause.__cause__ or cause.__context__
        text = " ".join(chain)
        if "AuthenticationError" in text or "InvalidAuthToken" in text:
            raise ClusterUnreachable(
                f"the Ray cluster at {address} uses token authentication and this process has no token: "
                f"1) export RAY_AUTH_MODE=token, and 2) make the cluster's token available "
                f"(~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN)") from None
        raise ClusterUnreachable(f"cannot join the Ray cluster at {address}: {exc}; check that "
                                 f"`ray start --head` runs there and the address is HOST:PORT (or `auto`)") from None
    return {"address": ctx.address_info.get("address")}


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()


# ---------------------------------------------------------------------- what a killed driver leaves


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a live pid from a reused one)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def local_processes() -> list[dict[str, Any]]:
    """Every process descending from this one (the local Ray instance: GCS, raylet, agents, workers).

    `ray.init(address="local")` makes GCS and raylet die with the driver, but when the driver is
    SIGKILLed the raylet's agents (DashboardAgent, RuntimeEnvAgent) outlive it for a minute or more.
    The driver writes this list to its work directory so a resumed driver can end them
    (`reap_processes`).
    """
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    parents[int(entry.name)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [os.getpid()]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent:
                frontier.append(pid)
                start = _start_time(pid)
                if start is not None:
                    found.append({"pid": pid, "start": start, "cmd": _cmdline(pid)[:200]})
    return found


def reap_processes(recorded: list[dict[str, Any]], grace_s: float = 3.0) -> list[str]:
    """End the recorded processes that still run (same pid and start time); say which."""
    alive = [r for r in recorded if _start_time(int(r["pid"])) == int(r["start"])]
    for r in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(r["pid"]), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_start_time(int(r["pid"])) == int(r["start"]) for r in alive):
        time.sleep(0.1)
    for r in alive:
        if _start_time(int(r["pid"])) == int(r["start"]):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(r["pid"]), signal.SIGKILL)
    return [f"{r['pid']} ({r['cmd'][:60]})" for r in alive]


def cluster_gpus() -> float:
    return float(ray.cluster_resources().get("GPU", 0.0))


@ray.remote(max_restarts=0, max_concurrency=2)
class TrialActor:
    """Runs trials on the GPUs Ray gave it. Stores nothing but the config; work happens in run()."""

    def __init__(self) -> None:
        self._current: Path | None = None
        self._lock = threading.Lock()
        self._watching = False

    def where(self) -> dict[str, Any]:
        return {"node": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
                "ip": ray.util.get_node_ip_address(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "pid": os.getpid()}

    def run(self, spec: TrialSpec) -> tuple[TrialOutcome, dict[str, bytes]]:
        from orchestrator.trial.runner import run_trial  # imported in the worker, after Ray set the GPUs

        gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        node = f"{ray.util.get_node_ip_address()}/{ray.get_runtime_context().get_node_id()[:8]}"
        self._watch_raylet()
        with self._lock:
            self._current = Path(spec.trial_dir)
        try:
            outcome = run_trial(spec, gpu_ids=gpu_ids, node=node)
        finally:
            with self._lock:
                self._current = None
        return outcome, _collect(Path(spec.trial_dir))

    def _watch_raylet(self) -> None:
        """Once per actor: if the raylet that started this worker dies, kill the trial's server and exit.

        A local Ray instance dies with its driver, but a worker busy in a trial runs on for seconds,
        or to the trial's end, before it notices, and the server (in a session of its own) outlives
        it. Nobody would collect that outcome; killing the server at once frees the GPUs and leaves
        the trial without outcome.json, so a resumed driver closes it as interrupted and measures it
        again.
        """
        with self._lock:
            if self._watching:
                return
            self._watching = True
        raylet = os.getppid()

        def watch() -> None:
            while os.getppid() == raylet:
                time.sleep(0.2)
            with self._lock:
                current = self._current
            if current is not None:
                _kill_server_now(current)
            os._exit(1)  # before run() can take the killed server for a crash and write an outcome

        threading.Thread(target=watch, name="raylet-watch", daemon=True).start()

    def abort(self, watch_s: float = 60.0) -> list[str]:
        """Kill the current trial's server now (second Ctrl-C); run() then returns a failure.

        A trial may be between steps (its server not started yet, or a port retry starting another
        one), so this keeps killing whatever server the trial starts until run() returns.
        """
        from orchestrator.trial.server import reap_orphan

        with self._lock:
            target = self._current
        done: list[str] = []
        deadline = time.monotonic() + watch_s
        while target is not None and time.monotonic() < deadline:
            if msg := reap_orphan(target):
                done.append(msg)
            with self._lock:
                if self._current != target:
                    break
            time.sleep(0.1)
        return done


def _kill_server_now(trial_dir: Path) -> None:
    """SIGKILL the process group of the trial's server (server.pid), if it is still that server."""
    try:
        pid_s, cmd = (trial_dir / "server.pid").read_text().split("\n", 1)
        pid = int(pid_s)
    except (OSError, ValueError):
        return
    if _cmdline(pid).startswith(cmd.strip()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


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
TaskError = ray.exceptions.RayTaskError
"""The trial code raised (a bug); RayError otherwise means the worker or its node was lost."""
