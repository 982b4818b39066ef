"""The probe on a GPU host: `tp` rank workers, one fresh NCCL process group per setting.

Each rank is a `python .../probe/_worker.py` process that imports torch once and forks a
child per setting (see _worker.py for why). Per setting, every rank's child gets the same
environment (the experiment's fixed NCCL variables, the setting's, NCCL_DEBUG=INFO with the INIT,
ENV and TUNING subsystems; the space's other NCCL variables unset, so "NCCL defaults" means
defaults), creates the process group over a fresh TCP rendezvous port, times every size eager and
inside a CUDA graph (medians of the repeats), and writes its result file. The driver then checks
the environment as trials do: each rank's os.environ for the requested variables, and NCCL's own
"set by environment" lines; it reads NCCL's TUNING lines for the algorithm, protocol and channels.
A setting whose ranks have not all answered by the deadline (forced NCCL_ALGO/NCCL_PROTO can hang)
has its children killed by process group and is recorded as `hang`.

Cost of one setting: fork, CUDA context and NCCL communicator set-up, then the timing itself;
measured on the lent H200 host (docs/measurements/h200-probe-worker-cost.json, one rank, 5 sizes
graph + eager): 0.65-1.04 s per setting, after 5.75 s of worker start (torch's import), paid once
for the whole probe. A fresh torchrun per setting costs 9-10 s, so a 48-setting probe takes about a
minute instead of eight (more ranks add communicator set-up, not imports).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from orchestrator.nccllog import DeviceLog, choice_for, env_problems, parse_nccl_log, version_of
from orchestrator.probe.result import Mode, ProbeRow, SettingRecord, Status
from orchestrator.probe.settings import NcclSetting
from orchestrator.probe.sizes import ProbeSize

_WORKER = Path(__file__).with_name("_worker.py")
NCCL_LOGGING = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,TUNING"}


class ProbeUnavailable(Exception):
    """The GPU path cannot run here; the message says why (no torch, too few GPUs)."""


def unavailable_reason() -> str | None:
    """Why the GPU probe cannot start on this machine before any process is spawned, or None."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed: install the probe extra on the GPU host (pip install 'sglang-sweep[probe]')"
    return None


_GONE = -999
"""Exit code recorded for a child whose rank worker itself went away."""


def _kill(pid: int) -> None:
    """SIGKILL a setting's child and its process group (the child may not have made its group yet)."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Rank:
    """One rank worker process and the lines it prints."""

    def __init__(self, rank: int, world: int, backend: str, env: Mapping[str, str], log: Path):
        self.rank = rank
        self.log = log
        self._stderr = open(log, "ab")
        # The worker runs as a script (stdlib + torch): importing the package would add seconds per rank.
        self.proc = subprocess.Popen(
            [sys.executable, str(_WORKER), str(rank), str(world), backend],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=dict(env),
            start_new_session=True,
            text=True,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None  # stdout=PIPE
        for line in stream:
            with contextlib.suppress(json.JSONDecodeError):
                self.lines.put(json.loads(line))
        self.lines.put({"gone": self.proc.wait()})

    def next(self, timeout: float) -> dict[str, Any] | None:
        """The worker's next line, waiting at most `timeout` seconds; None when none came."""
        try:
            return self.lines.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None  # stdin=PIPE
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def close(self, timeout_s: float = 5.0) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.send({"quit": True})
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._stderr.close()


class GpuHost:
    """Measures settings on this machine's GPUs (backend nccl) or, for the plumbing tests, on CPU (gloo).

    Use as a context manager: entering starts the rank workers (torch imported once each), leaving
    stops them.
    """

    def __init__(
        self,
        sizes: Sequence[ProbeSize],
        folder: Path,
        *,
        tp: int,
        unset: Sequence[str] = (),
        backend: str = "nccl",
        repeats: int = 5,
        iters: int = 20,
        modes: Sequence[Mode] = ("graph", "eager"),
        deadline_s: float = 60.0,
        start_timeout_s: float = 180.0,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.sizes, self.folder, self.tp, self.unset, self.backend = tuple(sizes), folder, tp, tuple(unset), backend
        self.repeats, self.iters, self.modes, self.deadline_s = repeats, iters, tuple(modes), deadline_s
        self.start_timeout_s = start_timeout_s
        self.clock = clock
        """What the deadlines and a setting's seconds are read from (a test may replace it)."""
        self.env = dict(os.environ if env is None else env)
        self.ranks: list[_Rank] = []
        self.devices = 0
        self.nccl_version: str | None = None
        self._count = 0

    @property
    def host(self) -> str:
        return f"this host ({self.devices} CUDA device(s), backend {self.backend})"

    def __enter__(self) -> GpuHost:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.ranks = [
            _Rank(r, self.tp, self.backend, self.env, self.folder / f"worker-{r}.log") for r in range(self.tp)
        ]
        deadline = self.clock() + self.start_timeout_s
        for rank in self.ranks:
            hello = rank.next(deadline - self.clock())
            if hello is None or not hello.get("ready"):
                self.close()
                tail = rank.log.read_text(errors="replace")[-2000:]
                raise ProbeUnavailable(
                    f"rank worker {rank.rank} did not start within {self.start_timeout_s:g} s: "
                    f"{hello or 'no answer'}\n{tail}"
                )
            self.devices = int(hello.get("cuda_devices", 0))
        if self.backend == "nccl" and self.devices < self.tp:
            self.close()
            raise ProbeUnavailable(f"tp {self.tp} needs {self.tp} CUDA devices, but this host has {self.devices}")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        for rank in self.ranks:
            rank.close()
        self.ranks = []

    def measure(self, setting: NcclSetting, base_env: Mapping[str, str]) -> tuple[SettingRecord, tuple[ProbeRow, ...]]:
        """One setting on every rank, within the deadline."""
        started = self.clock()
        self._count += 1
        env = {**base_env, **setting.as_env(), **NCCL_LOGGING}
        job = {
            "env": env,
            "unset": [n for n in self.unset if n not in env],
            "port": _free_port(),
            "iters": self.iters,
            "repeats": self.repeats,
            "modes": list(self.modes),
            "sizes": [{"label": s.label, "nbytes": s.nbytes} for s in self.sizes],
        }
        files = [
            (
                self.folder / f"setting-{self._count}.rank-{r.rank}.json",
                self.folder / f"setting-{self._count}.rank-{r.rank}.log",
            )
            for r in self.ranks
        ]
        gone = [r.rank for r in self.ranks if r.proc.poll() is not None]
        if gone:
            raise ProbeUnavailable(f"rank worker(s) {', '.join(map(str, gone))} exited; see {self.folder}/worker-*.log")
        for rank, (result, log) in zip(self.ranks, files):
            rank.send({"run": {**job, "result": str(result), "log": str(log)}})
        exits, children = self._await_exits(started + self.deadline_s)
        hung = len(exits) < len(self.ranks)
        self._end_the_rest(exits, children)
        return self._collect(setting, env, files, hung, self.clock() - started)

    def _await_exits(self, deadline: float) -> tuple[dict[int, int], dict[int, int]]:
        """(rank -> exit code, rank -> pid of the child it started) of the ranks that finished by the deadline."""
        children: dict[int, int] = {}
        exits: dict[int, int] = {}
        while len(exits) < len(self.ranks) and self.clock() < deadline:
            for rank in self.ranks:
                message = None if rank.rank in exits else rank.next(min(deadline - self.clock(), 0.05))
                if message is None:
                    continue
                if "started" in message:
                    children[rank.rank] = int(message["started"])
                elif "exited" in message:
                    exits[rank.rank] = int(message["exited"])
                elif "gone" in message:
                    exits[rank.rank] = _GONE
        return exits, children

    def _end_the_rest(self, exits: dict[int, int], children: Mapping[int, int]) -> None:
        """Kill what still runs past the deadline, and wait for every rank's last word (into `exits`)."""
        for r, pid in children.items():
            if r not in exits:  # still running past the deadline
                _kill(pid)
        for rank in self.ranks:
            while rank.rank not in exits:
                message = rank.next(10.0)
                if message is not None and "started" in message:  # it forked only after the deadline
                    _kill(int(message["started"]))
                    continue
                exits[rank.rank] = int(message.get("exited", _GONE)) if message else _GONE

    def _env_problems(
        self, results: list[dict[str, Any] | None], requested: Mapping[str, str], logs: Mapping[int, DeviceLog]
    ) -> list[str]:
        """Requested variables a rank's os.environ or (backend nccl) NCCL's own lines did not show."""
        problems = []
        for r, res in enumerate(results):
            seen = res.get("env", {}) if res is not None else {}
            problems += [
                f"rank {r} has {k}={seen.get(k)!r}, requested {v!r}"
                for k, v in requested.items()
                if res is not None and seen.get(k) != v
            ]
        if self.backend == "nccl":
            problems += env_problems(
                {k: v for k, v in requested.items() if k not in NCCL_LOGGING}, logs, range(self.tp)
            )
        return problems

    def _status(self, hung: bool, results: list[dict[str, Any] | None], problems: Sequence[str]) -> tuple[Status, str]:
        if hung:
            return "hang", f"not every rank finished within the {self.deadline_s:g} s deadline; killed"
        if any(res is None or res.get("error") for res in results):
            return "error", next(
                (res["error"] for res in results if res and res.get("error")), "a rank wrote no result"
            )
        if problems:
            return "error", "environment not applied: " + "; ".join(problems)
        return "ok", ""

    def _collect(
        self, setting: NcclSetting, env: Mapping[str, str], files: list[tuple[Path, Path]], hung: bool, seconds: float
    ) -> tuple[SettingRecord, tuple[ProbeRow, ...]]:
        results = [json.loads(p.read_text()) if p.exists() else None for p, _ in files]
        text = "".join(log.read_text(errors="replace") for _, log in files if log.exists())
        logs = parse_nccl_log(text)
        self.nccl_version = self.nccl_version or version_of(logs)
        requested = {**env}
        status, reason = self._status(hung, results, self._env_problems(results, requested, logs))
        rows = self._rows(setting, results, logs, status, reason)
        checked = (
            (
                f"{len(requested)} variable(s) in os.environ of all {self.tp} ranks"
                + (f"; NCCL echoed {len(logs)} device(s)" if logs else "")
            )
            if status == "ok"
            else ""
        )
        record = SettingRecord(
            setting=setting.label,
            env=setting.as_env(),
            status=status,
            reason=reason,
            seconds=round(seconds, 3),
            env_checked=checked,
        )
        return record, rows

    def _rows(
        self,
        setting: NcclSetting,
        results: list[dict[str, Any] | None],
        logs: Mapping[int, DeviceLog],
        status: Status,
        reason: str,
    ) -> tuple[ProbeRow, ...]:
        modes = [m for m in self.modes if self.backend == "nccl" or m == "eager"]
        return tuple(
            self._row(setting, size, mode, results, logs, status, reason) for size in self.sizes for mode in modes
        )

    def _row(
        self,
        setting: NcclSetting,
        size: ProbeSize,
        mode: Mode,
        results: list[dict[str, Any] | None],
        logs: Mapping[int, DeviceLog],
        status: Status,
        reason: str,
    ) -> ProbeRow:
        """One size in one mode: the slowest rank's median when every rank measured it."""
        medians = [
            row["median_us"]
            for res in results
            if res
            for row in res.get("rows", [])
            if row["size"] == size.label and row["mode"] == mode
        ]
        ok = status == "ok" and len(medians) == len(results)
        # A collective ends when its slowest rank does: the largest of the ranks' medians.
        return ProbeRow(
            setting=setting.label,
            env=setting.as_env(),
            size=size.label,
            nbytes=size.nbytes,
            mode=mode,
            median_us=max(medians) if ok else None,
            repeats=self.repeats if ok else 0,
            nccl_choice=choice_for(logs, size.nbytes),
            status=status if status != "ok" or ok else "error",
            reason=reason if status != "ok" else ("" if ok else "a rank measured nothing"),
        )
