"""summary.json's `confirmations` keep their shape now that the rounds return typed rows: the value under
the objective's name, the level, and the reason only for a run that gave no value."""

from __future__ import annotations

import pytest

from orchestrator.records import TrialStatus
from orchestrator.verdict.arm import ConfirmationRow


@pytest.mark.parametrize(
    ("row", "record"),
    [
        (
            ConfirmationRow(round=0, who="champion", status=TrialStatus.COMPLETE, concurrency=8, value=81.5),
            {"round": 0, "who": "champion", "concurrency": 8, "status": "COMPLETE", "decode_tok_s": 81.5},
        ),
        (
            ConfirmationRow(
                round=2, who="baseline@16", status=TrialStatus.FAILED, concurrency=16, reason="server crashed"
            ),
            {
                "round": 2,
                "who": "baseline@16",
                "concurrency": 16,
                "status": "FAILED",
                "decode_tok_s": None,
                "reason": "server crashed",
            },
        ),
        (
            ConfirmationRow(round=1, who="adaptive", status=TrialStatus.FAILED, reason="actor died"),
            {"round": 1, "who": "adaptive", "status": "FAILED", "reason": "actor died"},
        ),
    ],
)
def test_a_row_is_recorded_as_summary_json_holds_it(row: ConfirmationRow, record: dict) -> None:
    assert row.record("decode_tok_s") == record
    assert row.lost is ("concurrency" not in record)
