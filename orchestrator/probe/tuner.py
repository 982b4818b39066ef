"""`--format nccl-tuner`: the probe's per-size winners as rules for NCCL's example tuner plugin.

NCCL's ext-tuner/example plugin reads a CSV file (NCCL_TUNER_PLUGIN=<libnccl-tuner-example.so>,
NCCL_TUNER_CONFIG_FILE=<this file>), one rule a line, first match wins:

    collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]

Every rule written here names its channels explicitly, and each collective ends with a catch-all
rule (0 .. SIZE_MAX): where channels is -1 or no rule matches, that plugin forces one channel.
All-reduce rules come from the probe: for each probed size, the choice NCCL made (its TUNING line)
under the setting that was fastest at that size; neighbouring sizes with the same choice merge, and
a range ends halfway (geometrically) to the next probed size. The other collectives were not
probed; their catch-all uses ring with the all-reduce's large-message protocol and channels.
NCCL_ALGO / NCCL_PROTO must not be set beside the file: they mask the plugin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import UserError
from orchestrator.nccllog import NcclChoice
from orchestrator.probe.result import PROBE_FILE, ProbeResult, ProbeRow, read_probe

SIZE_MAX = (1 << 64) - 1
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce")
ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOCOLS = ("ll", "ll128", "simple")


@dataclass(frozen=True)
class TunerRule:
    """One line of the tuner plugin's CSV file."""

    collective: str
    min_bytes: int
    max_bytes: int
    algorithm: str
    protocol: str
    channels: int
    n_nodes: int
    n_ranks: int
    num_pipe_ops: int | None = None
    reg_buff: int | None = None

    def line(self) -> str:
        fields = [
            self.collective,
            self.min_bytes,
            self.max_bytes,
            self.algorithm,
            self.protocol,
            self.channels,
            self.n_nodes,
            self.n_ranks,
        ]
        if self.num_pipe_ops is not None or self.reg_buff is not None:
            fields.append(-1 if self.num_pipe_ops is None else self.num_pipe_ops)
        if self.reg_buff is not None:
            fields.append(self.reg_buff)
        return ",".join(str(f) for f in fields)


def _winner(rows: list[ProbeRow]) -> ProbeRow | None:
    ok = [
        r
        for r in rows
        if r.status == "ok"
        and r.median_us is not None
        and r.nccl_choice is not None
        and r.nccl_choice.channels is not None
    ]
    graph = [r for r in ok if r.mode == "graph"]
    return min(graph or ok, key=lambda r: (r.median_us, r.setting), default=None)


def _rule(collective: str, lo: int, hi: int, choice: NcclChoice, tp: int) -> TunerRule:
    assert choice.channels is not None  # _winner keeps only choices with channels
    return TunerRule(
        collective, lo, hi, choice.algorithm.lower(), choice.protocol.lower(), choice.channels, n_nodes=1, n_ranks=tp
    )


def tuner_rules(result: ProbeResult) -> tuple[TunerRule, ...]:
    """The rules for `result`: all-reduce by size, then a catch-all per collective.

    Raises ValueError when no probed size has a working setting with a known NCCL choice (channels
    included): then there is nothing to pin.
    """
    by_size: dict[int, list[ProbeRow]] = {}
    for row in result.rows:
        by_size.setdefault(row.nbytes, []).append(row)
    winners = [(n, w.nccl_choice) for n in sorted(by_size) if (w := _winner(by_size[n])) and w.nccl_choice]
    if not winners:
        raise ValueError(
            "the probe recorded no NCCL choice (algorithm, protocol, channels) for any size; run it "
            "with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING (sweep probe sets it) and again"
        )
    rules: list[TunerRule] = []
    lo = 0
    for i, (nbytes, choice) in enumerate(winners):
        last = i == len(winners) - 1
        if not last and winners[i + 1][1] == choice:
            continue  # the next size chose the same: one range
        hi = nbytes if last else math.isqrt(nbytes * winners[i + 1][0])
        rules.append(_rule("allreduce", lo, hi, choice, result.tp))
        lo = hi + 1
    large = winners[-1][1]
    rules.append(_rule("allreduce", 0, SIZE_MAX, large, result.tp))
    for collective in COLLECTIVES[1:]:
        rules.append(_rule(collective, 0, SIZE_MAX, large.model_copy(update={"algorithm": "RING"}), result.tp))
    return tuple(rules)


def render_tuner_config(result: ProbeResult) -> str:
    """The CSV file's text, with a header saying where the rules come from and how to load them."""
    header = [
        "# NCCL tuner plugin rules (ext-tuner/example CSV format), first match wins",
        f"# from sweep probe of {result.experiment} on {result.host}, tp {result.tp}, NCCL {result.nccl_version or '?'}",
        "# load: NCCL_TUNER_PLUGIN=<path>/libnccl-tuner-example.so NCCL_TUNER_CONFIG_FILE=<this file>",
        "# and leave NCCL_ALGO / NCCL_PROTO unset (they mask the plugin)",
        "# collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks",
    ]
    return "\n".join(header + [r.line() for r in tuner_rules(result)]) + "\n"


def _int(text: str, what: str, where: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{where}: {what} must be an integer, but got {text!r}") from None


def parse_tuner_config(text: str) -> tuple[TunerRule, ...]:
    """The rules of a tuner CSV file (comments and blank lines skipped); a bad line raises
    ValueError naming the line, the field and the value."""
    rules = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"line {number}"
        fields = [f.strip() for f in line.split(",")]
        if not 8 <= len(fields) <= 10:
            raise ValueError(f"{where}: a rule has 8 to 10 comma-separated fields, but got {len(fields)}: {line!r}")
        collective, algorithm, protocol = fields[0].lower(), fields[3].lower(), fields[4].lower()
        for value, known, what in (
            (collective, COLLECTIVES, "collective"),
            (algorithm, ALGORITHMS, "algorithm"),
            (protocol, PROTOCOLS, "protocol"),
        ):
            if value not in known:
                raise ValueError(f"{where}: {what} must be one of {', '.join(known)}, but got {value!r}")
        numbers = [
            _int(f, name, where)
            for f, name in zip(
                fields[1:3] + fields[5:],
                ("min_bytes", "max_bytes", "channels", "nNodes", "nRanks", "numPipeOps", "regBuff"),
            )
        ]
        if numbers[0] > numbers[1]:
            raise ValueError(f"{where}: min_bytes <= max_bytes must hold, but got ({numbers[0]}, {numbers[1]})")
        rules.append(
            TunerRule(
                collective,
                numbers[0],
                numbers[1],
                algorithm,
                protocol,
                channels=numbers[2],
                n_nodes=numbers[3],
                n_ranks=numbers[4],
                num_pipe_ops=numbers[5] if len(numbers) > 5 else None,
                reg_buff=numbers[6] if len(numbers) > 6 else None,
            )
        )
    return tuple(rules)


def tuner_file_from(workdir: Path) -> tuple[str, Path]:
    """The nccl-tuner file's text from `workdir`'s probe.json, and that file's path; UserError (one
    message with what to do) when there is nothing to derive rules from."""
    path = workdir / PROBE_FILE
    if not path.exists():
        raise UserError(
            f"{path} does not exist: run `sweep probe EXPERIMENT --workdir {workdir}` (or a sweep with "
            f"probe.enabled) first"
        )
    try:
        result = read_probe(path)
    except ValueError as exc:
        raise UserError(f"{path} is not a probe result ({str(exc).splitlines()[0][:200]}); probe again") from None
    if result.skipped or not result.rows:
        raise UserError(f"{path} holds no measurement ({result.skipped or 'no rows'}); probe on the GPU host")
    try:
        return render_tuner_config(result), path
    except ValueError as exc:
        raise UserError(f"cannot derive tuner rules from {path}: {exc}") from None
