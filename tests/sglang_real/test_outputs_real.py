"""The correctness gate's capture against a real SGLang 0.5.23 server on CPU (tiny random Llama): greedy
outputs through the real /generate (prompt and output token ids read from input_token_logprobs /
output_token_logprobs), then the same server scoring a sequence with input logprobs and
input_top_logprobs (trial.outputs.parse_score checks that the positions rate the ids sent); the first
capture also asks top_logprobs_num 5 (output_top_logprobs), which the search's correctness screen reads."""

from __future__ import annotations

from pathlib import Path

from e2e_helpers import write_experiment
from real_helpers import cpu_experiment, write_space

from orchestrator.config import experiment as spec_mod
from orchestrator.records import OutputsRequest, ScoreRequest, TrialSpec, TrialStatus
from orchestrator.results import correctness
from orchestrator.search import space as sp
from orchestrator.trial import outputs
from orchestrator.trial.runner import run_trial


def test_greedy_outputs_and_their_scores_from_a_real_server(
    tmp_path: Path, sglang_python: str, tiny_model: Path
) -> None:
    data = cpu_experiment("real-outputs", tiny_model, sglang_python, write_space(tmp_path), benchmark={"repeats": 1})
    spec = spec_mod.load(write_experiment(tmp_path, data))
    params = sp.baseline_params(spec.space)
    ask = OutputsRequest(prompts=3, max_new_tokens=16, top_logprobs=5)  # as the first baseline asks (sweep/_screen.py)
    first = run_trial(TrialSpec(number=1, params=params, trial_dir=str(tmp_path / "a"), experiment=spec, outputs=ask))
    assert first.status is TrialStatus.COMPLETE, (first.reason, first.log_tail)
    got = outputs.read(tmp_path / "a")
    assert got is not None and got.error == "", got
    assert len(got.prompts) == 3 and all(len(p.output_ids) == 16 and p.prompt_ids for p in got.prompts)
    assert all(all(lp <= 0 for lp in p.output_logprobs) for p in got.prompts)
    # output_top_logprobs: 5 tokens at each position, best first, the greedy token among them at the top
    # (up to numerics: within a near tie of it)
    assert all(len(p.output_top) == 16 and all(len(top) == 5 for top in p.output_top) for p in got.prompts)
    assert all(
        t in dict(top) and top[0][1] - dict(top)[t] < 0.5
        for p in got.prompts
        for top, t in zip(p.output_top, p.output_ids)
    ), [p.output_top[:2] for p in got.prompts]

    # a second server of the same launch: the same greedy tokens (CPU), and its scores of the first's outputs
    score = tuple(
        ScoreRequest(
            arm="champion", prompt=p.prompt, input_ids=(*p.prompt_ids, *p.output_ids), continuation=len(p.output_ids)
        )
        for p in got.prompts
    )
    second = run_trial(
        TrialSpec(
            number=2,
            params=params,
            trial_dir=str(tmp_path / "b"),
            experiment=spec,
            outputs=OutputsRequest(prompts=3, max_new_tokens=16, score=score),
        )
    )
    assert second.status is TrialStatus.COMPLETE, (second.reason, second.log_tail)
    again = outputs.read(tmp_path / "b")
    assert again is not None and again.error == "", again
    assert len(again.scored) == 3 and all(len(s.logprobs) == 16 for s in again.scored)
    # a greedy token is the server's own top choice at its position, up to numerics
    worst = max(top - lp for s in again.scored for lp, top in zip(s.logprobs, s.top_logprobs))
    assert worst < 0.5, worst
    verdict = correctness.compare("champion", got, again, again.scored, prompts=3, tolerance_nats=0.5)
    assert verdict.passed, verdict.text()
    screened = correctness.screen(again, got, prompts=3, tolerance_nats=0.5)  # the search's screen on real tops
    assert screened.passed, screened.text()
