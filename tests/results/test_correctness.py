"""The correctness gate's rule (results/correctness.py) and the parsing of SGLang's /generate answers it
reads (trial/outputs.py), table-driven, without processes. Response shapes as SGLang 0.5.23 writes them:
sglang/srt/managers/tokenizer_manager.py add_logprob_to_meta_info / detokenize_logprob_tokens (lists of
[logprob, token_id, text or null]; the first prompt position has no logprob)."""

from __future__ import annotations

import pytest

from orchestrator.config.correctness import MAX_PROMPTS
from orchestrator.records import OutputsRecord, PromptOutput, ScoredOutput, ScoreRequest
from orchestrator.results import correctness
from orchestrator.trial import outputs


def _record(*streams: tuple[int, ...], error: str = "") -> OutputsRecord:
    return OutputsRecord(
        prompts=tuple(PromptOutput(prompt=i, prompt_ids=(1, 2), output_ids=s) for i, s in enumerate(streams)),
        error=error,
    )


BASE = _record((5, 6, 7, 8), (9, 9, 9, 9))


def _scored(prompt: int, gaps: tuple[float, ...], arm: str = "champion") -> ScoredOutput:
    return ScoredOutput(
        arm=arm, prompt=prompt, logprobs=tuple(-0.1 - g for g in gaps), top_logprobs=tuple(-0.1 for _ in gaps)
    )


CASES = [
    (
        "equal streams",
        _record((5, 6, 7, 8), (9, 9, 9, 9)),
        [],
        True,
        correctness.EQUAL,
        "2 of 2 prompts decode to the baseline's 4 tokens, token for token",
    ),
    (
        "near tie, scored within tolerance",
        _record((5, 6, 3, 4), (9, 9, 9, 9)),
        [_scored(0, (0.0, 0.0, 0.004, 0.0))],
        True,
        correctness.SCORED,
        "outputs differ from the baseline's on 1 of 2 prompts (first at token 2), but the "
        "baseline's server scores every token of them within 0.004 nats of its own top choice (tolerance 0.5)",
    ),
    (
        "corrupted token",
        _record((5, 6, 7, 8), (9, 1, 9, 9)),
        [_scored(1, (0.0, 8.25, 0.0, 0.0))],
        False,
        correctness.SCORED,
        "outputs differ from the baseline's on 1 of 2 prompts (first at token 1); the "
        "baseline's server scores token 1 of prompt 1 8.25 nats below its own top choice (tolerance 0.5 nats)",
    ),
    (
        "differs, not scored",
        _record((5, 6, 7, 8), (9, 1, 9, 9)),
        [_scored(1, (0.0,), arm="runner_up")],
        False,
        correctness.SCORED,
        "and the baseline's server did not score 1 of them (prompt 1 first)",
    ),
    (
        "shorter output",
        _record((5, 6, 7), (9, 9, 9, 9)),
        [],
        False,
        correctness.SCORED,
        "on 1 of 2 prompts (first at token 3)",
    ),
    ("not captured", None, [], False, correctness.MISSING, "no greedy outputs of the champion were captured"),
    (
        "capture cut short",
        _record((5, 6, 7, 8), error="prompt 1: ReadTimeout: timed out"),
        [],
        False,
        correctness.MISSING,
        "the champion's greedy outputs cover 1 of 2 prompts: prompt 1: ReadTimeout: timed out",
    ),
]


@pytest.mark.parametrize("name,candidate,scores,passed,check,figure", CASES, ids=[c[0] for c in CASES])
def test_compare(name, candidate, scores, passed, check, figure):
    verdict = correctness.compare("champion", candidate, BASE, scores, prompts=2, tolerance_nats=0.5)
    assert (verdict.passed, verdict.check) == (passed, check)
    assert figure in verdict.figure
    assert verdict.text().startswith(f"correctness gate ({check}): {'passed' if passed else 'REFUSED'}: ")


def test_missing_baseline_and_other_tokenization_are_refused():
    assert not correctness.compare("champion", BASE, None, [], prompts=2, tolerance_nats=0.5).passed
    other = OutputsRecord(prompts=tuple(p.model_copy(update={"prompt_ids": (1, 3)}) for p in BASE.prompts))
    verdict = correctness.compare("champion", other, BASE, [], prompts=2, tolerance_nats=0.5)
    assert not verdict.passed and "was not tokenized the same by both servers" in verdict.figure


def _body(prompt_ids, output_ids, output_ids_field=True):
    body = {
        "text": " x",
        "meta_info": {
            "input_token_logprobs": [[None if i == 0 else -1.0, t, None] for i, t in enumerate(prompt_ids)],
            "output_token_logprobs": [[-0.5, t, None] for t in output_ids],
        },
    }
    if output_ids_field:
        body["output_ids"] = list(output_ids)
    return body


def test_parse_capture_reads_prompt_and_output_ids():
    got = outputs.parse_capture(3, _body([11, 12, 13], [7, 8]))
    assert got == PromptOutput(prompt=3, prompt_ids=(11, 12, 13), output_ids=(7, 8), output_logprobs=(-0.5, -0.5))
    assert outputs.parse_capture(0, _body([1], [2], output_ids_field=False)).output_ids == (2,)


@pytest.mark.parametrize(
    "body,message",
    [
        ({"text": "x"}, "the response has no meta_info"),
        ({"meta_info": {"output_token_logprobs": []}}, "has no input_token_logprobs list"),
        (
            {"meta_info": {"input_token_logprobs": [[None, "a", None]], "output_token_logprobs": []}},
            "input_token_logprobs: expected [logprob, token_id, text]",
        ),
        ({**_body([1], [2, 3]), "output_ids": [2, 4]}, "output_ids (2) and output_token_logprobs (2) disagree"),
    ],
)
def test_parse_capture_refuses_what_it_cannot_read(body, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        outputs.parse_capture(0, body)


def test_score_request_and_parse_score():
    score = ScoreRequest(arm="champion", prompt=1, input_ids=(11, 12, 7, 8), continuation=2)
    body = outputs.score_request(score)
    # one position before the output: SGLang gives no logprob at logprob_start_len itself
    assert body["logprob_start_len"] == 1 and body["top_logprobs_num"] == 1 and body["return_logprob"] is True
    assert body["input_ids"] == [11, 12, 7, 8] and body["sampling_params"] == {"temperature": 0, "max_new_tokens": 1}
    answer = {
        "meta_info": {
            "input_token_logprobs": [[None, 12, None], [-0.3, 7, None], [-9.0, 8, None]],
            "input_top_logprobs": [None, [[-0.3, 7, None]], [[-0.2, 5, None]]],
        }
    }
    got = outputs.parse_score(score, answer)
    assert got.logprobs == (-0.3, -9.0) and got.top_logprobs == (-0.3, -0.2)
    wrong = {
        "meta_info": {
            "input_token_logprobs": [[-0.3, 7, None], [-9.0, 9, None]],
            "input_top_logprobs": [[[-0.3, 7, None]], [[-0.2, 5, None]]],
        }
    }
    with pytest.raises(ValueError, match="rates token 9, not the one sent"):
        outputs.parse_score(score, wrong)
    unrated = {
        "meta_info": {
            "input_token_logprobs": [[None, 7, None], [-9.0, 8, None]],
            "input_top_logprobs": [None, [[-0.2, 5, None]]],
        }
    }
    with pytest.raises(ValueError, match="position 0 of the output has no logprob"):
        outputs.parse_score(score, unrated)


def test_the_prompt_set_holds_the_largest_allowed_count():
    assert len(outputs.PROMPTS) == MAX_PROMPTS and len(set(outputs.PROMPTS)) == MAX_PROMPTS


# --- the search's screen (results/correctness.screen): the first differing token against the baseline's tops


def _with_tops(
    streams: tuple[tuple[int, ...], ...], tops: dict[tuple[int, int], tuple[tuple[int, float], ...]]
) -> OutputsRecord:
    """A baseline capture whose position (prompt, k) lists `tops[(prompt, k)]`, else only its own token."""
    return OutputsRecord(
        prompts=tuple(
            PromptOutput(
                prompt=i,
                prompt_ids=(1, 2),
                output_ids=s,
                output_top=tuple(tops.get((i, k), ((t, -0.1),)) for k, t in enumerate(s)),
            )
            for i, s in enumerate(streams)
        )
    )


SCREEN_BASE = _with_tops(
    ((5, 6, 7, 8), (9, 9, 9, 9)),
    {(0, 2): ((7, -0.30), (3, -0.304), (4, -6.5)), (1, 1): ((9, -0.2), (2, -1.0), (4, -7.0))},
)

SCREEN_CASES = [
    (
        "equal streams",
        _record((5, 6, 7, 8), (9, 9, 9, 9)),
        True,
        None,
        "2 of 2 prompts decode to the baseline's tokens",
    ),
    (
        "near tie: the baseline's second choice",
        _record((5, 6, 3, 0), (9, 9, 9, 9)),
        True,
        0.004,
        "outputs differ from the baseline's on 1 of 2 prompts (first at token 2); the first differing tokens rated lie "
        "within 0.004 nats of the baseline's top choice (tolerance 0.5): near ties so far",
    ),
    (
        "listed, but far below",
        _record((5, 6, 4, 0), (9, 9, 9, 9)),
        False,
        6.2,
        "token 2 of prompt 0 is one the baseline puts 6.20 nats below its own top choice there (tolerance 0.5 nats): "
        "the configuration changes the outputs",
    ),
    (
        "outside the baseline's top tokens",
        _record((5, 6, 7, 8), (9, 1, 9, 9)),
        False,
        6.8,
        "token 1 of prompt 1 is one the baseline puts more than 6.80 nats (outside its top 3) below its own top choice",
    ),
    (
        "outside a list that ends within tolerance: not judged",
        _record((5, 1, 7, 8), (9, 9, 9, 9)),
        True,
        None,
        "outputs differ from the baseline's on 1 of 2 prompts (first at token 1); 1 lie outside the baseline's listed top "
        "tokens, not judged (tolerance 0.5): near ties so far",
    ),
    (
        "the worst prompt decides",
        _record((5, 6, 3, 0), (9, 1, 9, 9)),
        False,
        6.8,
        "on 2 of 2 prompts (first at token 1)",
    ),
]


@pytest.mark.parametrize("name,candidate,passed,worst,figure", SCREEN_CASES, ids=[c[0] for c in SCREEN_CASES])
def test_screen(name, candidate, passed, worst, figure):
    got = correctness.screen(candidate, SCREEN_BASE, prompts=2, tolerance_nats=0.5)
    assert got.passed is passed and got.check == correctness.SCREEN, got
    assert figure in got.figure, got.figure
    assert (got.worst_nats is None) if worst is None else got.worst_nats == pytest.approx(worst), got
    assert got.text().startswith(
        "correctness screen (first differing tokens against the baseline's top choices): "
        + ("passed" if passed else "REFUSED")
    )


def test_screen_without_what_it_needs_passes_and_says_why():
    # nothing to judge by is not a refusal: the confirmation's gate checks what it promotes in full
    no_tops = _record((5, 6, 7, 8), (9, 9, 9, 9))
    other = _record((5, 1, 7, 8), (9, 9, 9, 9))
    assert correctness.screen(other, no_tops, prompts=2, tolerance_nats=0.5).passed
    for candidate, baseline in ((None, SCREEN_BASE), (other, None), (_record((5, 6, 7, 8)), SCREEN_BASE)):
        got = correctness.screen(candidate, baseline, prompts=2, tolerance_nats=0.5)
        assert got.passed and got.figure.startswith("not screened: a capture is missing or incomplete"), got


def test_parse_capture_reads_the_top_tokens_best_first():
    body = _body([11, 12], [7, 8])
    body["meta_info"]["output_top_logprobs"] = [[[-0.1, 7, None], [-2.0, 3, None]], [[-3.0, 4, None], [-0.2, 8, None]]]
    got = outputs.parse_capture(0, body)
    assert got.output_top == (((7, -0.1), (3, -2.0)), ((8, -0.2), (4, -3.0)))
    body["meta_info"]["output_top_logprobs"] = body["meta_info"]["output_top_logprobs"][:1]
    with pytest.raises(ValueError, match=r"output_top_logprobs \(1\) and output_token_logprobs \(2\) disagree"):
        outputs.parse_capture(0, body)
    assert outputs.capture_request("p", 8, 5)["top_logprobs_num"] == 5
    assert "top_logprobs_num" not in outputs.capture_request("p", 8)
