"""How stage two starts after the probe (sweep/_probe_stage.apply_probe) on a real simulated probe and
a real Optuna sqlite study: at one stream the study searches the kept NCCL settings; for an objective
judged at several streams it searches the NCCL knobs one by one, warm-started from the settings the
probe measured fastest at the decode size, without speculation (issue 20)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "probe"))
from probe_helpers import write_spec  # noqa: E402

from orchestrator.probe import rank_settings, run_probe  # noqa: E402
from orchestrator.search import space as sp  # noqa: E402
from orchestrator.search.study import Study  # noqa: E402
from orchestrator.sweep._probe_stage import apply_probe  # noqa: E402


def _started(tmp_path: Path, concurrency: int) -> tuple[Study, list, object]:
    spec = write_spec(
        tmp_path,
        benchmark={"concurrency": concurrency, "requests": max(3, concurrency)},
        probe={"enabled": True, "keep_within": 1.2},
    )
    result = run_probe(spec, tmp_path / "wd", budget=24)
    study = Study(f"sqlite:///{tmp_path / 'optuna.db'}", spec.name, spec.space, spec.sampler, ["maximize"])
    study.open()
    summary = apply_probe(study, spec, result)
    return study, [study.ask() for _ in range(4)], (spec, result, summary)


def test_at_one_stream_stage_two_searches_the_kept_settings(tmp_path: Path) -> None:
    study, asked, (_, _, summary) = _started(tmp_path, 1)
    assert study.nccl_settings and "searched" not in summary
    assert all(a is not None and a[1].get("speculative_algorithm") == "EAGLE3" for a in asked[:3])  # warm start


def test_at_several_streams_the_decode_winners_start_without_speculation_and_knobs_are_searched(tmp_path) -> None:
    study, asked, (spec, result, summary) = _started(tmp_path, 32)
    assert not study.nccl_settings and summary["searched"] == "knob by knob"
    ranked = rank_settings(result, keep_within=1.2, keep_decode=True)
    fastest = min((r for r in ranked if r.kept and r.decode_relative is not None), key=lambda r: r.decode_relative)
    first = asked[0]
    assert first is not None and first[2]["probe_setting"] == fastest.setting
    assert first[1]["speculative_algorithm"] is None  # the load may not speculate at all
    assert {k: v for k, v in first[1].items() if not k.startswith("NCCL_")} == {
        k: v for k, v in sp.baseline_params(spec.space).items() if not k.startswith("NCCL_")
    }
    assert asked[3] is not None and asked[3][1]["speculative_algorithm"] == "EAGLE3"  # the default speculation too
