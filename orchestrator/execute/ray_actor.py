"""Trials on Ray: the actor around the trial runner and `RayExecutor`; the only module that imports Ray.

An actor holds `num_gpus = tp` for its lifetime and runs trials one after another, so a Ray cluster
of K GPU hosts keeps K trials in flight without paying actor start-up per trial. A trial goes in as
a TrialSpec and comes back as (TrialOutcome, trial files): the files travel back so a driver on
another host still gets server.log and bench.jsonl into its work directory.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import ray

from orchestrator.clock import RealClock
from orchestrator.config.experiment import SweepSpec
from orchestrator.errors import ClusterUnreachable, RayStartError
from orchestrator.execute import agent_reaper
from orchestrator.execute.base import ExecutorInfo, Finished, last_line, made_outcome
from orchestrator.execute.processes import kill_server_now
from orchestrator.fsio import write_json
from orchestrator.records import FailureKind, TrialOutcome, TrialSpec
from orchestrator.trial.runner import run_trial
from orchestrator.trial.server import reap_orphan

_MAX_FILE_BYTES = 8_000_000
log = logging.getLogger("sweep")


def init_local(*, num_gpus: int | None, node_ip: str = "127.0.0.2", num_cpus: int | None = None) -> dict[str, Any]:
    """Start a private single-node Ray instance bound to a loopback address.

    Ray rewrites 127.0.0.1 to the machine's external address, so the instance advertises another
    loopback address (127.0.0.2) instead. Ray 2.60 still binds the gRPC servers of its GCS, raylet and
    workers to every interface (its GrpcServer listens on 0.0.0.0 unless a server is built for localhost
    only, and no setting changes that); their token authentication guards them, so the token file Ray
    writes with the umask's mode (0644: any local user could read it) is made 0600 (docs/reliability.md).
    `num_gpus` may be logical (the simulator needs no GPU) or None to let Ray detect them.
    """
    private_token_file()  # an existing token: before Ray's processes start with it
    try:
        ctx = ray.init(
            address="local",
            _node_ip_address=node_ip,
            num_gpus=num_gpus,
            num_cpus=num_cpus if num_cpus is not None else max(os.cpu_count() or 1, 2),
            include_dashboard=False,
            object_store_memory=200_000_000,
            log_to_driver=False,
            logging_level=logging.WARNING,
            configure_logging=True,
            # Ray starts its workers 15 above the raylet's niceness and the servers a trial launches inherit
            # it; at 0 they run at the driver's own (observe.niceness_warning).
            _system_config={"worker_niceness": 0},
        )
    except Exception as exc:  # noqa: BLE001 - Ray's start-up timeout is a bare Exception; OSError, TimeoutError too
        with contextlib.suppress(Exception):
            ray.shutdown()  # what did start of the instance goes with it
        first = str(exc).splitlines()[0][:300] if str(exc) else ""
        raise RayStartError(
            f"the private Ray instance on {node_ip} did not start ({type(exc).__name__}: {first}); check free "
            "memory and space in Ray's temporary folder (/tmp/ray, or RAY_TMPDIR), then run the same command "
            "again"
        ) from None
    private_token_file()  # one Ray has just generated
    _watch_agents(ctx)
    return {"address": _address(ctx), "node_ip": node_ip}


_watchdog: subprocess.Popen[bytes] | None = None
"""The agent reaper of this process's private Ray instance; process-wide, as the instance ray.init starts is."""


def _watch_agents(ctx: Any) -> None:
    """Start the watchdog that ends the raylet's agents when this driver ends (execute.agent_reaper)."""
    global _watchdog
    raylets = [p for p in psutil.Process().children() if p.name() == "raylet"]
    if not raylets:
        log.warning("no raylet among this process's children: Ray's agents may outlive a killed driver")
        return
    session = Path(ctx.address_info.get("session_dir") or tempfile.gettempdir())
    (session / "logs").mkdir(parents=True, exist_ok=True)
    _watchdog = agent_reaper.start(raylets[0], session / "logs" / "agent_reaper.log")


def _stop_watchdog() -> None:
    """Close the watchdog's pipe (it ends what the instance left, then exits) and wait for it."""
    global _watchdog
    if _watchdog is None:
        return
    watchdog, _watchdog = _watchdog, None
    if watchdog.stdin is not None:
        watchdog.stdin.close()
    try:
        watchdog.wait(timeout=60)
    except subprocess.TimeoutExpired:
        watchdog.kill()
        watchdog.wait()


def token_file() -> Path:
    """Where Ray 2.60 keeps the token of the clusters it starts (RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token;
    ray/_private/authentication/authentication_token_setup.py)."""
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")


def private_token_file() -> None:
    """Make Ray's token file readable by its owner only (0600) when this user owns it and others may read it."""
    path = token_file()
    try:
        info = path.stat()
        if info.st_uid == os.getuid() and info.st_mode & 0o077 and path.is_file():
            os.chmod(path, 0o600)
            log.info(
                "%s: made 0600 (it was %o): the token guards the private Ray instance's ports",
                path,
                info.st_mode & 0o777,
            )
    except OSError as exc:  # no token (authentication off), or a file we may not change: Ray decides
        log.debug("Ray token file %s left as it is: %s", path, exc)


def connect(address: str) -> dict[str, Any]:
    """Join an existing Ray cluster (`ray start --head ...`); the package must be installed on every node.

    A loopback head address (127.0.0.2:6379, as in tests) is also the driver's node address:
    Ray would otherwise pick the machine's external interface and find no raylet there.
    """
    host = address.rsplit(":", 1)[0] if ":" in address else ""
    _require_reachable(address)
    extra: dict[str, Any] = {}
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).is_loopback:
            extra["_node_ip_address"] = host
    try:
        ctx = ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING, **extra)
    except (ConnectionError, RuntimeError) as exc:
        chain: list[str] = []
        cause: BaseException | None = exc
        while cause is not None:
            chain.append(f"{type(cause).__name__}: {cause}")
            cause = cause.__cause__ or cause.__context__
        text = " ".join(chain)
        if "AuthenticationError" in text or "InvalidAuthToken" in text:
            raise ClusterUnreachable(
                f"the Ray cluster at {address} uses token authentication and this process has no token: "
                f"1) export RAY_AUTH_MODE=token, and 2) make the cluster's token available "
                f"(~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN)"
            ) from None
        raise ClusterUnreachable(
            f"cannot join the Ray cluster at {address}: {exc}; check that "
            f"`ray start --head` runs there and the address is HOST:PORT (or `auto`)"
        ) from None
    return {"address": _address(ctx)}


def _require_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds when nothing listens at HOST:PORT: ray.init would retry for minutes first."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return  # `auto`, or a form Ray resolves itself
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ClusterUnreachable(
            f"cannot join the Ray cluster at {address}: nothing answers there ({exc}); check "
            f"that `ray start --head` runs there and the address is HOST:PORT (or `auto`)"
        ) from None


def _address(ctx: Any) -> str | None:
    """The cluster address of a ray.init() context (typed BaseContext in Ray's stubs, a RayContext at run time)."""
    return ctx.address_info.get("address")


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()
    _stop_watchdog()


@ray.remote(max_restarts=0, max_concurrency=2)  # type: ignore[call-overload]  # the stubs lack actor options
class TrialActor:
    """Runs trials on the GPUs Ray gave it. Stores nothing but the config; work happens in run()."""

    def __init__(self) -> None:
        self._current: Path | None = None
        self._aborted: Path | None = None
        """A trial aborted before run() began it (the call may reach the actor first): run() skips it."""
        self._lock = threading.Lock()
        self._watching = False

    def where(self) -> dict[str, Any]:
        return {
            "node": ray.get_runtime_context().get_node_id(),
            "host": socket.gethostname(),
            "ip": ray.util.get_node_ip_address(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "pid": os.getpid(),
        }

    def run(self, spec: TrialSpec, launcher_nice: int) -> tuple[TrialOutcome, dict[str, bytes]]:
        """`launcher_nice`: the driver's nice value, the priority a trial's server is held against."""
        gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        node = f"{ray.util.get_node_ip_address()}/{ray.get_runtime_context().get_node_id()[:8]}"
        self._watch_raylet()
        with self._lock:
            aborted, self._aborted = self._aborted == Path(spec.trial_dir), None
            self._current = None if aborted else Path(spec.trial_dir)
        if aborted:
            outcome = made_outcome(spec, FailureKind.interrupted, "aborted before the trial began", time.time())
            write_json(Path(spec.trial_dir) / "outcome.json", outcome.model_dump(mode="json"))
            return outcome, _collect(Path(spec.trial_dir))
        try:
            outcome = run_trial(spec, gpu_ids=gpu_ids, node=node, launcher_nice=launcher_nice)
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
                kill_server_now(current)
            os._exit(1)  # before run() can take the killed server for a crash and write an outcome

        threading.Thread(target=watch, name="raylet-watch", daemon=True).start()

    def abort(self, trial_dir: str) -> list[str]:
        """Kill the server of the trial in `trial_dir` now (second Ctrl-C); run() then returns a failure.

        A trial may be between steps (its server not started yet, or a port retry starting another
        one), so this keeps killing whatever server the trial starts until run() returns, however long
        a loaded machine takes to start it; a trial run() has not begun yet is not begun at all.
        """
        with self._lock:
            target = self._current
            if target is None or target != Path(trial_dir):
                self._aborted, target = Path(trial_dir), None
        done: list[str] = []
        while target is not None:
            if msg := reap_orphan(target):
                done.append(msg)
            with self._lock:
                if self._current != target:
                    break
            time.sleep(0.1)
        return done


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


class RayExecutor:
    """Trials on Ray: one TrialActor per slot, each holding `tp` GPUs, reused trial after trial.

    Without an address a private local instance is started on a loopback address; `logical_gpus`
    gives it GPUs that need no hardware (the simulator).
    """

    def __init__(
        self,
        *,
        tp: int,
        concurrent: int,
        address: str | None = None,
        logical_gpus: int | None = None,
        gpus_per_trial: int | None = None,
    ):
        self.tp = tp
        self.concurrent = concurrent
        self.address = address
        self.logical_gpus = logical_gpus
        self.gpus_per_trial = tp if gpus_per_trial is None else gpus_per_trial
        """GPUs one trial holds: tp, or 0 for a server on CPU (server.device cpu)."""
        self.clock = RealClock()
        self._idle: list[Any] = []
        self._running: dict[Any, tuple[int, Any, TrialSpec]] = {}  # ObjectRef -> (handle, actor, spec)
        self._next = 0

    @classmethod
    def for_sweep(cls, spec: SweepSpec, address: str | None) -> RayExecutor:
        """`budget.concurrent_trials` slots of `server.tp` GPUs; logical GPUs for the simulator; no GPUs
        for a server on CPU (server.device cpu)."""
        tp, n = spec.server.tp, spec.budget.concurrent_trials
        if spec.server.device == "cpu":
            return cls(tp=tp, concurrent=n, address=address, logical_gpus=0, gpus_per_trial=0)
        return cls(tp=tp, concurrent=n, address=address, logical_gpus=tp * n if spec.engine == "simulator" else None)

    def start(self) -> ExecutorInfo:
        info = connect(self.address) if self.address else init_local(num_gpus=self.logical_gpus)
        gpus = float(ray.cluster_resources().get("GPU", 0.0))
        need = self.gpus_per_trial
        if gpus < need:
            raise ClusterUnreachable(
                f"the Ray cluster has {gpus:g} GPUs but one trial needs server.tp={self.tp}; "
                f"add GPUs/hosts or lower server.tp (or set server.device: cpu for SGLang's "
                f"CPU engine)"
            )
        slots = min(self.concurrent, int(gpus // need)) if need else self.concurrent
        self._idle = [self._new_actor() for _ in range(slots)]
        # A local instance is this process's children; a cluster's processes are not ours to end.
        return ExecutorInfo(address=info.get("address"), gpus=gpus, slots=slots, owns_processes=not self.address)

    def _new_actor(self) -> Any:
        return TrialActor.options(num_gpus=self.gpus_per_trial, num_cpus=0).remote()  # type: ignore[attr-defined]

    def idle(self) -> int:
        return len(self._idle)

    def submit(self, spec: TrialSpec) -> int:
        if not self._idle:
            raise RuntimeError(f"submit() with all {len(self._running)} slots busy")
        actor = self._idle.pop()
        self._next += 1
        self._running[actor.run.remote(spec, os.nice(0))] = (self._next, actor, spec)
        return self._next

    def wait(self, timeout_s: float) -> list[Finished]:
        if not self._running:
            return []
        done, _ = ray.wait(list(self._running), num_returns=1, timeout=timeout_s)
        return [self._collect(ref) for ref in done]

    def _collect(self, ref: Any) -> Finished:
        handle, actor, spec = self._running.pop(ref)
        try:
            outcome, files = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            # A bug in the trial code, not a lost machine: keep the traceback, keep the actor.
            log.error("trial %d raised inside its worker:\n%s", spec.number, exc)
            self._idle.append(actor)
            return Finished(
                handle,
                spec,
                made_outcome(
                    spec,
                    FailureKind.internal_error,
                    f"the trial raised {last_line(str(exc))} (traceback in sweep.log)",
                    time.time(),
                ),
                lost=str(exc),
            )
        except ray.exceptions.RayError as exc:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            self._idle.append(self._new_actor())
            return Finished(
                handle,
                spec,
                made_outcome(
                    spec,
                    FailureKind.worker_lost,
                    f"the Ray worker running this trial was lost: {type(exc).__name__}",
                    time.time(),
                ),
                lost=str(exc),
            )
        self._idle.append(actor)
        return Finished(handle, spec, outcome, files)

    def abort(self, handle: int) -> None:
        for h, actor, spec in self._running.values():
            if h == handle:
                # runs beside run() in the actor (max_concurrency=2); not awaited
                actor.abort.remote(spec.trial_dir)

    def close(self) -> None:
        self._idle, self._running = [], {}
        shutdown()
