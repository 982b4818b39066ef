"""What a probe found: one row per (setting, size, mode), written as probe.json, and the ranking.

The same shape comes from a GPU host and from the simulator. A setting's score is its mean
all-reduce latency over the verify sizes (inside CUDA graphs when measured there, as decode runs;
eager otherwise): the verify pass is where NCCL settings move decode speed most.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import Field

from orchestrator.fsio import write_atomic
from orchestrator.nccllog import NcclChoice
from orchestrator.probe.settings import DEFAULTS_LABEL
from orchestrator.probe.sizes import ProbeSize
from orchestrator.records import Frozen

Mode = Literal["graph", "eager"]
Status = Literal["ok", "hang", "error"]
PROBE_FILE = "probe.json"


class ProbeRow(Frozen):
    """One all-reduce size under one NCCL setting, in one mode."""

    setting: str
    """The setting's label: "NCCL defaults" or "NCCL_PROTO=LL NCCL_P2P_LEVEL=SYS"."""
    env: dict[str, str]
    """The NCCL variables the setting sets (the experiment's fixed environment comes on top)."""
    size: str
    nbytes: int
    mode: Mode
    median_us: float | None
    """Median over the repeats of the per-call latency (microseconds); None unless status is ok."""
    repeats: int
    nccl_choice: NcclChoice | None = None
    """What NCCL chose for this size (its TUNING line; the model's choice on the simulator)."""
    status: Status = "ok"
    reason: str = ""
    backend: str = "nccl"
    """The all-reduce backend that carried it (a backend row's own backend, or nccl past its workspace)."""


class BackendRecord(Frozen):
    """How probing one all-reduce backend beside NCCL went (issue 19): measured at the same sizes as the NCCL
    settings, or skipped with the reason (its communicator does not import in the probe's environment)."""

    backend: str
    """An all_reduce_backend value the host takes: custom, flashinfer_fusion, pcie_ipc, torch_symm_mem, mscclpp."""
    status: Literal["ok", "skipped", "error"]
    reason: str = ""
    seconds: float = 0.0

    @property
    def label(self) -> str:
        return backend_label(self.backend)


def backend_label(backend: str) -> str:
    """The ranking's name of a backend beside the NCCL settings."""
    return f"all_reduce_backend={backend}"


class SettingRecord(Frozen):
    """How probing one setting went as a whole."""

    setting: str
    env: dict[str, str]
    status: Status
    reason: str = ""
    seconds: float
    """Wall time of this setting (process group set-up, measurement, tear-down)."""
    env_checked: str = ""
    """How the environment was confirmed on every rank (what each rank's os.environ and NCCL said)."""


class ProbeResult(Frozen):
    """A whole probe: where it ran, what it measured, what it cost."""

    experiment: str
    engine: Literal["simulator", "sglang"]
    host: str
    """Hardware profile name on the simulator; the GPUs found on a real host."""
    machine: str = ""
    """The host name of the machine a real probe ran on (socket.gethostname()); '' on the simulator and in
    files written before it was recorded. A probe.json from another machine is not reused there."""
    tp: int
    nccl_version: str | None
    base_env: dict[str, str] = Field(default_factory=dict)
    """The experiment's fixed NCCL environment, applied under every setting."""
    sizes: tuple[ProbeSize, ...]
    settings: tuple[SettingRecord, ...]
    rows: tuple[ProbeRow, ...]
    space_settings: int
    """How many NCCL settings the space holds (probed: len(settings))."""
    searched: bool
    """True when the space was larger than the budget and was searched rather than enumerated."""
    seconds: float
    skipped: str = ""
    """Why nothing was measured (e.g. no GPU here); empty when the probe ran."""
    backends: tuple[BackendRecord, ...] = ()
    """The other backends the host offers, measured at the same sizes or skipped with the reason."""
    backend_rows: tuple[ProbeRow, ...] = ()
    """Their rows (setting: backend_label(backend), env: the experiment's fixed NCCL variables)."""

    @property
    def seconds_per_setting(self) -> float:
        return self.seconds / len(self.settings) if self.settings else 0.0


def write_probe(result: ProbeResult, path: str | Path) -> Path:
    """probe.json, written atomically (temp file, fsync, replace)."""
    return write_atomic(path, result.model_dump_json() + "\n")


def read_probe(path: str | Path) -> ProbeResult:
    return ProbeResult.model_validate_json(Path(path).read_text(encoding="utf-8"))


def probed_nccl(workdir: str | Path) -> str | None:
    """The NCCL version `workdir`'s probe.json measured with; None when there is none, it is unreadable
    or the probe did not learn its NCCL (a mismatch check then has nothing to compare)."""
    path = Path(workdir) / PROBE_FILE
    try:
        return read_probe(path).nccl_version if path.is_file() else None
    except (OSError, ValueError):
        return None


def setting_score(rows: Iterable[ProbeRow], sizes: Iterable[ProbeSize], kind: str = "verify") -> float | None:
    """Mean latency over the `kind` sizes (verify; decode when the experiment has no verify sizes),
    graph mode when measured, else eager; None when any of those rows failed or is missing."""
    sizes = list(sizes)
    wanted = [s.label for s in sizes if s.kind == kind] or [s.label for s in sizes if s.kind == "decode"]
    by_key = {(r.size, r.mode): r for r in rows}
    mode: Mode = "graph" if any(m == "graph" for _, m in by_key) else "eager"
    values = []
    for label in wanted:
        row = by_key.get((label, mode))
        if row is None or row.status != "ok" or row.median_us is None:
            return None
        values.append(row.median_us)
    return statistics.fmean(values) if values else None


class RankedSetting(Frozen):
    rank: int
    setting: str
    env: dict[str, str]
    score_us: float | None
    """Mean verify-size latency (see setting_score); None for a setting that failed."""
    relative: float | None
    """score / best score (1.0 = the best)."""
    kept: bool
    """Within keep_within of the best at the verify sizes (or, ranked with keep_decode, at the decode
    size), or the NCCL defaults (always a candidate)."""
    decode_relative: float | None = None
    """Its decode-size latency / the best decode-size latency: a setting that wins where the load is
    plain decoding (high concurrency, no speculation) is kept even when its verify sizes are slow."""


def _ratio(value: float | None, best: float | None) -> float | None:
    """value / best, or None when either is missing (or best is 0)."""
    return value / best if value is not None and best else None


def _within(ratio: float | None, keep_within: float | None) -> bool:
    return ratio is not None and (keep_within is None or ratio <= keep_within)


def _by_score(pair: tuple[SettingRecord, float | None]) -> tuple[bool, float, str]:
    """Sort key: by score, failed (None) last, ties by the setting's label."""
    record, score = pair
    return score is None, score if score is not None else 0.0, record.setting


def _scores(result: ProbeResult) -> tuple[list[tuple[SettingRecord, float | None]], dict[str, float | None]]:
    """(record, verify-size score) of every probed setting, and each one's decode-size score; None where it failed."""
    scored: list[tuple[SettingRecord, float | None]] = []
    decode: dict[str, float | None] = {}
    for record in result.settings:
        rows = [r for r in result.rows if r.setting == record.setting]
        ok = record.status == "ok"
        scored.append((record, setting_score(rows, result.sizes) if ok else None))
        decode[record.setting] = setting_score(rows, result.sizes, "decode") if ok else None
    return scored, decode


def rank_settings(
    result: ProbeResult, *, keep_within: float | None = None, keep_decode: bool = False
) -> tuple[RankedSetting, ...]:
    """Every probed setting, fastest first (failed ones last), marked kept when within `keep_within`
    of the best score (all working ones when None); with `keep_decode` (an objective judged at several
    streams, where decoding without speculation can win) also when within it of the best decode-size
    latency. The NCCL defaults are always kept."""
    if keep_within is not None and keep_within < 1.0:
        raise ValueError(f"keep_within is a ratio to the best latency and must be >= 1.0, but got {keep_within}")
    scored, decode = _scores(result)
    scored.sort(key=_by_score)
    best = next((s for _, s in scored if s is not None), None)
    best_decode = min((d for d in decode.values() if d is not None), default=None)
    out = []
    for i, (record, score) in enumerate(scored):
        relative = _ratio(score, best)
        decode_relative = _ratio(decode[record.setting], best_decode)
        ratios = (relative, decode_relative) if keep_decode else (relative,)
        kept = record.setting == DEFAULTS_LABEL or any(_within(r, keep_within) for r in ratios)
        out.append(
            RankedSetting(
                rank=i + 1,
                setting=record.setting,
                env=record.env,
                score_us=score,
                relative=relative,
                kept=kept,
                decode_relative=decode_relative,
            )
        )
    return tuple(out)


def rank_with_backends(result: ProbeResult, *, keep_within: float | None = 1.1) -> tuple[RankedSetting, ...]:
    """The NCCL settings and the measured backends in one ranking by the same score (mean latency at the
    verify sizes, graph mode where measured): which carries the messages fastest on this host. `kept` is
    rank_settings' for NCCL settings, within keep_within of the best for a backend."""
    scored: list[tuple[str, dict[str, str], float | None, bool]] = [
        (r.setting, r.env, r.score_us, r.kept) for r in rank_settings(result, keep_within=keep_within)
    ]
    for record in result.backends:
        if record.status != "ok":
            continue
        rows = [r for r in result.backend_rows if r.setting == record.label]
        scored.append((record.label, {}, setting_score(rows, result.sizes), False))
    best = min((score for _, _, score, _ in scored if score is not None), default=None)
    scored.sort(key=lambda s: (s[2] is None, s[2] if s[2] is not None else 0.0, s[0]))
    out = []
    for i, (label, env, score, kept) in enumerate(scored):
        relative = _ratio(score, best)
        backend_kept = label.startswith("all_reduce_backend=") and _within(relative, keep_within)
        out.append(
            RankedSetting(
                rank=i + 1, setting=label, env=env, score_us=score, relative=relative, kept=kept or backend_kept
            )
        )
    return tuple(out)


def backend_lines(result: ProbeResult, *, keep_within: float | None = 1.1) -> list[str]:
    """`sweep probe`'s lines for the other backends: each one's score and place among the backends and NCCL
    settings together, or why it was not measured."""
    ranked = {r.setting: r for r in rank_with_backends(result, keep_within=keep_within)}
    lines = []
    for record in result.backends:
        r = ranked.get(record.label)
        if record.status == "ok" and r is not None and r.score_us is not None and r.relative is not None:
            lines.append(
                f"{record.label}: {r.score_us:.1f} us at the verify sizes, {r.relative:.2f}x the fastest "
                f"(rank {r.rank} of {len(ranked)} backends and NCCL settings)"
            )
        else:
            lines.append(f"{record.label}: {record.status}: {record.reason}")
    return lines
