"""`sweep export --format adaptive-config`: slots tuned from the measured load levels, in the schema SGLang
0.5.23's loader reads (sglang/srt/speculative/adaptive_spec_params.py `_load_adaptive_config`, as
config/adaptive.py restates it; tests/sglang_real/test_adaptive_export_real.py loads it with 0.5.23 itself)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.config import adaptive
from orchestrator.config import experiment as spec_mod
from orchestrator.records import BenchRecord, TrialOutcome, TrialSpec, TrialStatus
from orchestrator.results import adaptive_export as ax
from orchestrator.results.adaptive_export import LoadMeasurement
from orchestrator.search import space as sp
from orchestrator.trial.runner import run_trial

DEMO = Path(__file__).resolve().parents[2] / "experiments" / "demo.yaml"


def m(level: int, steps: int, value: float, trial: int = 0) -> LoadMeasurement:
    return LoadMeasurement(level, steps, value, f"trials/{trial:04d}")


def test_each_level_keeps_the_steps_that_won_there() -> None:
    slots = ax.tune(
        [
            m(1, 0, 60.0, 1),
            m(1, 3, 80.0, 2),
            m(1, 5, 79.0, 3),  # within 2% of the best: stays a candidate
            m(1, 1, 70.0, 4),
            m(8, 0, 300.0, 5),
            m(8, 1, 310.0, 6),
            m(8, 3, 290.0, 7),
            m(32, 0, 690.0, 8),
            m(32, 1, 650.0, 9),
        ]
    )
    assert [(s.batch_size, s.candidate_steps, s.best) for s in slots] == [
        (1, (3, 5), 3),
        (8, (1,), 1),
        (32, (0,), 0),
    ]
    assert slots[0].runs == ("trials/0001", "trials/0002", "trials/0003", "trials/0004")
    assert slots[1].medians == {0: 300.0, 1: 310.0, 3: 290.0}


def test_repeated_measurements_count_by_their_median_and_ties_go_to_fewer_steps() -> None:
    slots = ax.tune([m(4, 2, 100.0), m(4, 2, 90.0), m(4, 2, 200.0), m(4, 3, 100.0)], within=0.0)
    assert slots[0].medians[2] == 100.0 and slots[0].best == 2 and slots[0].candidate_steps == (2, 3)


def test_nothing_but_the_baseline_measured_is_one_clear_message() -> None:
    with pytest.raises(ValueError, match="no completed trial of a fixed EAGLE/EAGLE3 chain"):
        ax.tune([])
    with pytest.raises(ValueError, match="no completed trial of a fixed EAGLE/EAGLE3 chain"):
        ax.tune([m(1, 0, 60.0), m(8, 0, 300.0)])  # the baseline alone says nothing of drafting


@pytest.mark.parametrize(
    ("params", "steps"),
    [
        ({"speculative_algorithm": None}, 0),
        ({"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 1}, 3),
        ({"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 2}, None),
        ({"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_adaptive": True}, None),
        ({"speculative_algorithm": "DFLASH", "speculative_dflash_block_size": 8}, None),
        ({"speculative_algorithm": "EAGLE3"}, None),  # SGLang's own choice: steps not known
    ],
)
def test_only_chains_adaptive_can_run_are_measurements(params, steps) -> None:
    assert ax.chain_steps(params) == steps


def test_rendered_file_is_what_the_loader_reads_with_the_trace_beside(tmp_path: Path) -> None:
    slots = ax.tune([m(1, 3, 80.0, 2), m(1, 0, 60.0, 1), m(16, 0, 500.0, 3), m(16, 1, 400.0, 4)])
    path = tmp_path / "adaptive.json"
    path.write_text(ax.render(slots, source="runs/x"))
    loaded = adaptive.load(str(path))
    assert [(s.batch_size, s.candidate_steps) for s in loaded.slots] == [(1, (3,)), (16, (0,))]
    trace = json.loads(path.read_text())[ax.TRACE_KEY]
    assert trace["slots"]["1"] == {
        "best_steps": 3,
        "median_output_tok_s": {"0": 60.0, "3": 80.0},
        "runs": ["trials/0001", "trials/0002"],
    }


def _record(i: int, start: float, latency: float, *, warmup: bool = False) -> BenchRecord:
    return BenchRecord(index=i, ok=True, start_s=start, latency_s=latency, warmup=warmup)


def test_held_concurrency_is_the_most_requests_in_flight() -> None:
    records = [
        _record(0, 0.0, 100.0, warmup=True),  # a warm-up overlaps everything: not counted
        _record(1, 10.0, 2.0),
        _record(2, 10.5, 2.0),
        _record(3, 11.0, 2.0),
        _record(4, 12.0, 1.0),  # starts as request 1 ends
    ]
    assert ax.held_concurrency(records) == 3
    assert ax.held_concurrency([]) == 0


def _trial(s: spec_mod.SweepSpec, number: int, steps: int, concurrency: int, folder: Path) -> TrialOutcome:
    params = sp.baseline_params(s.space)
    if steps:
        params.update(speculative_algorithm="EAGLE3", speculative_num_steps=steps, speculative_eagle_topk=1)
    bench = s.benchmark.model_copy(update={"concurrency": concurrency, "requests": 2 * concurrency, "output_len": 24})
    spec = TrialSpec(
        number=number,
        params=params,
        trial_dir=str(folder),
        experiment=s.model_copy(update={"benchmark": bench}),
    )
    return run_trial(spec)


def test_export_from_real_trials_traces_each_slot_to_its_measured_level(tmp_path: Path) -> None:
    """Real trials on the simulator at 1 and 4 streams, steps 0 (no speculation) and 3, kept where a sweep keeps
    search trials and confirmation rounds; the exported slots are exactly the winners their outcome.json files
    and bench.jsonl loads say."""
    base = spec_mod.load(DEMO)
    s = base.model_copy(update={"server": base.server.model_copy(update={"tp": 2})})
    wd = tmp_path / "wd"
    runs = {  # the search's trials at 1 stream, the confirmation's rounds at the 4-stream level
        "trials/0001": (0, 1),
        "trials/0002": (3, 1),
        "confirm/00-baseline@4": (0, 4),
        "confirm/00-champion@4": (3, 4),
    }
    outcomes = [_trial(s, n, *runs[name], wd / name) for n, name in enumerate(runs, start=1)]
    assert all(o.status is TrialStatus.COMPLETE for o in outcomes), [o.reason for o in outcomes]
    measured = ax.measurements_from_workdir(wd)
    assert sorted((x.run, x.concurrency, x.steps) for x in measured) == sorted(
        (name, level, steps) for name, (steps, level) in runs.items()
    )
    out = tmp_path / "adaptive.json"
    result = CliRunner().invoke(app, ["export", "--format", "adaptive-config", "--workdir", str(wd), "-o", str(out)])
    assert result.exit_code == 0, result.output
    loaded = adaptive.load(str(out))
    by_trial = {o.number: o.metrics.output_tok_s for o in outcomes if o.metrics is not None}
    for slot, (a, b) in zip(loaded.slots, [(1, 2), (3, 4)], strict=True):
        winner = 0 if by_trial[a] >= by_trial[b] else 3
        assert winner in slot.candidate_steps
        loser, lost = (3, by_trial[b]) if winner == 0 else (0, by_trial[a])
        assert (loser in slot.candidate_steps) == (lost >= max(by_trial[a], by_trial[b]) * (1 - ax.WITHIN))
    assert [s.batch_size for s in loaded.slots] == [1, 4]


def test_export_without_measurements_says_what_to_run(tmp_path: Path) -> None:
    (tmp_path / "trials").mkdir()
    result = CliRunner().invoke(
        app, ["export", "--format", "adaptive-config", "--workdir", str(tmp_path), "-o", str(tmp_path / "a.json")]
    )
    assert result.exit_code != 0
    assert "no completed trial of a fixed EAGLE/EAGLE3 chain" in result.output
    assert not (tmp_path / "a.json").exists()
