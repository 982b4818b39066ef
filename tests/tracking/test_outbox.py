"""Outbox lines: typed, one JSON line each, and the lines earlier versions wrote still read back."""

from __future__ import annotations

import json

import pytest

from orchestrator.tracking.outbox import (
    Backoff,
    EndSweep,
    KillTrial,
    LogSweepSummary,
    LogTrial,
    Outbox,
    parse_line,
    render_line,
)

# Lines exactly as the previous version (one Tracker class, dict lines) wrote them.
EARLIER_LINES = [
    (
        '{"error": "API request failed", "extra_metrics": {"speedup_vs_baseline": 1.5}, '
        '"extra_tags": {}, "op": "log_trial", "outcome_path": "/w/trials/1/outcome.json", '
        '"parent_run_id": "p1", "queued_at": "2026-11-30T01:02:03+00:00", "run_id": "r1"}',
        LogTrial(
            parent_run_id="p1",
            run_id="r1",
            outcome_path="/w/trials/1/outcome.json",
            extra_metrics={"speedup_vs_baseline": 1.5},
            queued_at="2026-11-30T01:02:03+00:00",
            error="API request failed",
        ),
    ),
    (
        '{"error": "e", "extra_metrics": {}, "extra_tags": {"sweep.confirm_round": "0"}, "op": "log_trial", '
        '"outcome_path": "/w/o.json", "parent_run_id": "p1", "queued_at": "t", "run_id": null}',
        LogTrial(
            parent_run_id="p1",
            outcome_path="/w/o.json",
            extra_tags={"sweep.confirm_round": "0"},
            queued_at="t",
            error="e",
        ),
    ),
    (
        '{"error": "e", "op": "kill_trial", "queued_at": "t", "run_id": "r2"}',
        KillTrial(run_id="r2", queued_at="t", error="e"),
    ),
    (
        '{"error": "e", "op": "end_sweep", "parent_run_id": "p1", "queued_at": "t", "status": "KILLED"}',
        EndSweep(parent_run_id="p1", status="KILLED", queued_at="t", error="e"),
    ),
    (
        '{"error": "e", "metrics": {"best_decode_tok_s": 150.5}, "op": "log_sweep_summary", '
        '"parent_run_id": "p1", "queued_at": "t", "summary_dir": "/w/outbox-files/summary-p1", '
        '"tags": {"sweep.champion_trial": "1"}}',
        LogSweepSummary(
            parent_run_id="p1",
            summary_dir="/w/outbox-files/summary-p1",
            metrics={"best_decode_tok_s": 150.5},
            tags={"sweep.champion_trial": "1"},
            queued_at="t",
            error="e",
        ),
    ),
]


@pytest.mark.parametrize(("line", "entry"), EARLIER_LINES)
def test_lines_of_earlier_versions_read_back_and_are_written_the_same(line: str, entry: object) -> None:
    assert parse_line(line) == entry
    assert render_line(parse_line(line)) == line


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"op": "log_tri', "Invalid JSON"),
        ('{"op": "rename_run", "run_id": "r"}', "does not match any of the expected tags"),
        ('{"op": "end_sweep", "parent_run_id": "p", "status": "DONE"}', "status"),
        ('{"op": "log_trial", "parent_run_id": "p"}', "outcome_path"),
        ('{"op": "kill_trial", "run_id": "r", "colour": "red"}', "colour"),
        (
            '{"op": "log_trial", "parent_run_id": "p", "outcome_path": "o", "extra_metrics": {"x": "fast"}}',
            "extra_metrics.x",
        ),
    ],
)
def test_lines_that_are_not_entries_are_refused(line: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_line(line)


def test_entries_are_frozen() -> None:
    entry = EndSweep(parent_run_id="p", status="FINISHED")
    with pytest.raises(ValueError, match="frozen"):
        entry.status = "FAILED"  # type: ignore[misc]


def test_appended_lines_are_counted_and_parse_back(tmp_path) -> None:
    outbox = Outbox(tmp_path / "wd")
    assert outbox.pending() == 0
    entries = [entry for _, entry in EARLIER_LINES]
    for entry in entries:
        outbox.append(entry)
    assert outbox.pending() == len(entries)
    lines = outbox.path.read_text().splitlines()
    assert [parse_line(line) for line in lines] == entries
    assert all(list(json.loads(line)) == sorted(json.loads(line)) for line in lines), "keys sorted"


def test_backoff_opens_after_a_failure_and_closes_after_a_success() -> None:
    backoff = Backoff()
    assert not backoff.active()
    backoff.down()
    assert backoff.active()
    backoff.up()
    assert not backoff.active()
