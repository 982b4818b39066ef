"""Acceptance on real text: the builtin client runs on a prompt set the user points to (benchmark.dataset_path,
the ShareGPT JSON bench_serving's --dataset-path reads, MT-Bench question.jsonl or JSON lines), reports the
per-request accept length beside the token-weighted one, and labels acceptance from its synthetic generator
as synthetic (the trial's Metrics.sources, MLflow's sweep.metric_sources tag, the plan's warning)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config import experiment as spec_mod
from orchestrator.records import BenchRecord, TrialSpec, TrialStatus
from orchestrator.search import space as sp
from orchestrator.trial import bench, clients
from orchestrator.trial import plan as planner
from orchestrator.trial.runner import run_trial

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "experiments" / "demo.yaml"
SHAREGPT = [
    {"id": "a", "conversations": [{"from": "human", "value": "Explain how a transformer decodes text."}]},
    {"id": "b", "conversations": [{"from": "gpt", "value": "skip me"}, {"from": "human", "value": "Write a haiku."}]},
    {"id": "c", "conversations": []},
]


def test_sharegpt_json_gives_the_first_human_turn(tmp_path: Path) -> None:
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(SHAREGPT))
    assert bench.load_prompts(str(path)) == ["Explain how a transformer decodes text.", "Write a haiku."]


def test_mt_bench_questions_and_json_lines(tmp_path: Path) -> None:
    mt = tmp_path / "question.jsonl"
    mt.write_text('{"question_id": 81, "turns": ["Compose a travel blog post.", "Rewrite it."]}\n')
    assert bench.load_prompts(str(mt)) == ["Compose a travel blog post."]
    lines = tmp_path / "prompts.jsonl"
    lines.write_text('{"prompt": "one"}\n\n{"text": "two"}\n')
    assert bench.load_prompts(str(lines)) == ["one", "two"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read it"),
        ("[1, 2]", "no prompt found"),
        ("{not json", "not a JSON list or JSON lines"),
    ],
)
def test_a_bad_dataset_is_one_clear_message(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "d.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=message) as err:
        bench.load_prompts(str(path))
    assert str(err.value).startswith(f"benchmark.dataset_path {path}:")


def test_per_request_acceptance_beside_the_token_weighted_figure() -> None:
    records = [
        BenchRecord(index=0, ok=True, completion_tokens=30, meta_info={"completion_tokens": 30, "spec_verify_ct": 10}),
        BenchRecord(index=1, ok=True, completion_tokens=10, meta_info={"completion_tokens": 10, "spec_verify_ct": 10}),
        BenchRecord(index=-1, ok=True, warmup=True, meta_info={"completion_tokens": 90, "spec_verify_ct": 10}),
    ]
    # per request: (3 + 1) / 2 = 2 (token-weighted: 40 / 20)
    assert clients.per_request_accept_length(records) == 2.0
    records[1] = records[1].model_copy(update={"meta_info": {"completion_tokens": 10, "spec_verify_ct": 5}})
    assert clients.per_request_accept_length(records) == 2.5  # (3 + 2) / 2, the token-weighted being 40/15
    assert clients.per_request_accept_length([BenchRecord(index=0, ok=True, completion_tokens=5)]) is None


def _speculating(s: spec_mod.SweepSpec) -> dict:
    return {
        **sp.baseline_params(s.space),
        "speculative_algorithm": "EAGLE3",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
    }


def test_the_plan_labels_synthetic_acceptance_and_not_real_text(tmp_path: Path) -> None:
    s = spec_mod.load(DEMO)
    synthetic = planner.make(s, _speculating(s), port=31000)
    assert any(w.startswith("synthetic acceptance:") for w in synthetic.warnings)
    assert not any("synthetic" in w for w in planner.make(s, sp.baseline_params(s.space), port=31000).warnings)
    real = s.model_copy(update={"benchmark": s.benchmark.model_copy(update={"dataset_path": str(tmp_path / "d.json")})})
    assert not any("synthetic" in w for w in planner.make(real, _speculating(s), port=31000).warnings)


def _trial(s: spec_mod.SweepSpec, tmp_path: Path, name: str, dataset: str | None):
    bench_spec = s.benchmark.model_copy(update={"dataset_path": dataset, "requests": 2, "output_len": 16})
    spec = s.model_copy(update={"benchmark": bench_spec, "server": s.server.model_copy(update={"tp": 2})})
    return run_trial(TrialSpec(number=1, params=_speculating(s), trial_dir=str(tmp_path / name), experiment=spec))


def test_a_trial_on_real_text_and_one_on_synthetic_prompts_say_which(tmp_path: Path) -> None:
    s = spec_mod.load(DEMO)
    dataset = tmp_path / "sharegpt.json"
    dataset.write_text(json.dumps(SHAREGPT))
    real = _trial(s, tmp_path, "real", str(dataset))
    assert real.status is TrialStatus.COMPLETE, (real.reason, real.log_tail)
    assert real.metrics is not None and real.metrics.sources["prompts"] == f"real text: {dataset}"
    assert real.metrics.accept_length_per_request is not None and real.metrics.accept_length_per_request > 1.0
    assert "synthetic" not in real.metrics.sources["accept_length"]
    sent = [json.loads(line) for line in (tmp_path / "real" / "bench.jsonl").read_text().splitlines()]
    assert all(r["ok"] for r in sent)
    synthetic = _trial(s, tmp_path, "synthetic", None)
    assert synthetic.metrics is not None and synthetic.metrics.sources["prompts"] == bench.SYNTHETIC
    assert synthetic.metrics.sources["accept_length"].endswith("(synthetic prompts)")


def test_a_missing_dataset_fails_the_trial_with_the_fix(tmp_path: Path) -> None:
    outcome = _trial(spec_mod.load(DEMO), tmp_path, "missing", str(tmp_path / "nowhere.json"))
    assert outcome.status is TrialStatus.FAILED
    assert f"benchmark.dataset_path {tmp_path / 'nowhere.json'}: cannot read it" in outcome.reason
