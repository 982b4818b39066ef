"""Issue 37, item 6: the nccl-tuner export never chooses a protocol or an algorithm that the search's
correctness screen refused (every search trial that set it had its outputs changed: outcome.outputs_changed
in trials/*/outcome.json), through `sweep export --format nccl-tuner` on a work directory."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.fsio import write_json
from orchestrator.probe import NcclChoice, ProbeResult, ProbeRow, SettingRecord, parse_tuner_config, write_probe
from orchestrator.probe.sizes import message_sizes
from orchestrator.records import TrialOutcome, TrialRole, TrialStatus
from orchestrator.results import formats

SIZES = message_sizes(7168, 2, draft_tokens=[2, 4], large=(1 << 20,))
LL = NcclChoice(algorithm="RING", protocol="LL", channels=2)
LL128 = NcclChoice(algorithm="RING", protocol="LL128", channels=4)
SIMPLE = NcclChoice(algorithm="RING", protocol="SIMPLE", channels=8)


def _probe(wd: Path) -> None:
    """Defaults choose LL everywhere; NCCL_PROTO=LL128 is faster at every size (the PCIe profile's case)."""
    records, rows = [], []
    for label, env, choice, us in (
        ("NCCL defaults", {}, LL, 30.0),
        ("NCCL_PROTO=LL128", {"NCCL_PROTO": "LL128"}, LL128, 20.0),
        ("NCCL_PROTO=Simple", {"NCCL_PROTO": "Simple"}, SIMPLE, 40.0),
    ):
        records.append(SettingRecord(setting=label, env=env, status="ok", seconds=1.0))
        for size in SIZES:
            rows.append(
                ProbeRow(
                    setting=label,
                    env=env,
                    size=size.label,
                    nbytes=size.nbytes,
                    mode="graph",
                    median_us=us,
                    repeats=5,
                    nccl_choice=choice,
                )
            )
    result = ProbeResult(
        experiment="demo",
        engine="simulator",
        host="pcie-rtxpro6000-x8",
        tp=8,
        nccl_version="2.28.9",
        sizes=SIZES,
        settings=tuple(records),
        rows=tuple(rows),
        space_settings=3,
        searched=False,
        seconds=3.0,
    )
    write_probe(result, wd / "probe.json")


def _trial(wd: Path, number: int, proto: str | None, changed: str = "") -> None:
    outcome = TrialOutcome(
        number=number,
        params={"NCCL_PROTO": proto},
        role=TrialRole.search,
        status=TrialStatus.COMPLETE,
        outputs_changed=changed,
    )
    (wd / "trials" / f"{number:04d}").mkdir(parents=True)
    write_json(wd / "trials" / f"{number:04d}" / "outcome.json", outcome.model_dump(mode="json"))


def _export(wd: Path) -> tuple[int, str, str]:
    out = wd / "tuner.csv"
    result = CliRunner().invoke(app, ["export", "--format", "nccl-tuner", "--workdir", str(wd), "-o", str(out)])
    return result.exit_code, result.output, out.read_text() if out.exists() else ""


def test_a_protocol_the_screen_refused_in_every_trial_is_never_chosen(tmp_path: Path) -> None:
    _probe(tmp_path)
    _trial(tmp_path, 1, None)
    _trial(tmp_path, 2, "LL128", "prompt 1: token 3 differs")
    _trial(tmp_path, 3, "LL128", "prompt 2: token 7 differs")
    _trial(tmp_path, 4, "LL")
    code, output, text = _export(tmp_path)
    assert code == 0, output
    protocols = {rule.protocol for rule in parse_tuner_config(text)}
    assert "ll128" not in protocols and "ll" in protocols
    assert (
        "# left out protocol ll128: the correctness screen refused every search trial that set NCCL_PROTO to it "
        "(trials 2, 3)"
    ) in text


def test_without_refusals_the_fastest_choice_stays(tmp_path: Path) -> None:
    """One LL128 trial passed the screen: the refused one may owe it to its other knobs, so LL128 stays."""
    _probe(tmp_path)
    _trial(tmp_path, 1, "LL128", "prompt 1: token 3 differs")
    _trial(tmp_path, 2, "LL128")
    code, output, text = _export(tmp_path)
    assert code == 0, output
    assert {rule.protocol for rule in parse_tuner_config(text)} == {"ll128"}
    assert "left out" not in text


def test_screen_refused_reads_protocols_and_algorithms_in_one_spelling() -> None:
    def trial(n: int, params: dict, changed: str = "", role: TrialRole = TrialRole.search) -> TrialOutcome:
        return TrialOutcome(number=n, params=params, role=role, status=TrialStatus.COMPLETE, outputs_changed=changed)

    refused = formats.screen_refused(
        [
            trial(1, {"NCCL_ALGO": "NVLSTree", "NCCL_PROTO": "LL"}, "changed"),
            trial(2, {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}),
            trial(3, {"NCCL_PROTO": "LL128"}, role=TrialRole.baseline, changed="not screened"),
        ]
    )
    assert refused == {"algorithm": {"nvlstree": [1]}}
    assert formats.tuner_name("NVLS_TREE") == "nvlstree"
