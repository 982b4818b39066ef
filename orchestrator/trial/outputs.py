"""Greedy outputs of a fixed prompt set, through SGLang's native /generate, for the correctness gate.

`capture` runs after a trial's benchmark when its TrialSpec asks (promotion.correctness): each prompt
is decoded greedily (sampling_params temperature 0, max_new_tokens N) with return_logprob and
logprob_start_len 0, so the response names the prompt's own token ids (input_token_logprobs) beside
the output's (output_token_logprobs; output_ids as well), and, when the request asks (the first
baseline's, for the search's correctness screen), top_logprobs_num best tokens at each output position
(output_top_logprobs: per position a list of [logprob, token_id, text], or null); then each sequence listed to score (another
configuration's output after a prompt, as token ids) is sent back with logprob_start_len at the
output and top_logprobs_num 1: the server's log-probability of each of those tokens, and of its own
top choice there. Field names and shapes: sglang/srt/managers/io_struct.py GenerateReqInput and
tokenizer_manager.py add_logprob_to_meta_info (lists of [logprob, token_id, text or null]).

What comes back is written to outputs.json (records.OutputsRecord). A capture that fails keeps what it
got and says why in `error`; the trial's benchmark stands either way (the gate refuses a promotion
whose outputs are missing).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from orchestrator.fsio import write_json
from orchestrator.records import OutputsRecord, OutputsRequest, PromptOutput, ScoredOutput, ScoreRequest

__all__ = [
    "OUTPUTS_FILE",
    "PROMPTS",
    "capture",
    "capture_request",
    "collect",
    "parse_capture",
    "parse_score",
    "read",
    "score_request",
    "write",
]

OUTPUTS_FILE = "outputs.json"

PROMPTS = (
    "The history of the printing press begins in",
    "Explain in simple words how a transformer model predicts the next token:",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List the steps to bake a loaf of sourdough bread at home.",
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Translate into French: The weather is lovely today and the market is open.",
    "A train leaves the station at 3 pm travelling at 80 km/h. Another train",
    "Summarize the main causes of the First World War in one paragraph.",
    "What is the difference between a process and a thread in an operating system?",
    "Continue the poem: The river runs beneath the ancient stones,",
    "SELECT name, COUNT(*) FROM orders GROUP BY name ORDER BY",
    "The three laws of thermodynamics state that",
    "Give a recipe for a vegetable curry that serves four people.",
    "In a distributed system, consensus algorithms such as Raft",
    "Dear hiring manager, I am writing to apply for the position of",
    "The ring all-reduce algorithm splits each message into chunks and",
)
"""The fixed prompts (promotion.correctness.prompts takes the first ones); at most 16."""


def capture_request(prompt: str, max_new_tokens: int, top_logprobs: int = 0) -> dict[str, Any]:
    """A greedy /generate request that also returns the prompt's and the output's token ids (and, with
    `top_logprobs`, the server's best tokens at each position: top_logprobs_num)."""
    body: dict[str, Any] = {
        "text": prompt,
        "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens},
        "return_logprob": True,
        "logprob_start_len": 0,
        "stream": False,
    }
    if top_logprobs:
        body["top_logprobs_num"] = top_logprobs
    return body


def score_request(score: ScoreRequest) -> dict[str, Any]:
    """A /generate request that scores `score`'s output tokens (their logprobs and the top one at each).
    It starts one position before the output: SGLang reports no logprob at logprob_start_len itself
    (scheduler_components/logprob_result_processor.py, _process_input_token_logprobs: "add None at
    start, remove last"), so the output's first token is rated too."""
    start = max(len(score.input_ids) - score.continuation - 1, 0)
    return {
        "input_ids": list(score.input_ids),
        "sampling_params": {"temperature": 0, "max_new_tokens": 1},
        "return_logprob": True,
        "logprob_start_len": start,
        "top_logprobs_num": 1,
        "stream": False,
    }


def _entries(meta: dict[str, Any], key: str) -> list[Any]:
    value = meta.get(key)
    if not isinstance(value, list):
        raise ValueError(f"the response's meta_info has no {key} list")
    return value


def _entry(item: Any, where: str) -> tuple[float | None, int]:
    """(logprob, token_id) of one [logprob, token_id, text] entry."""
    if not isinstance(item, (list, tuple)) or len(item) < 2 or not isinstance(item[1], int):
        raise ValueError(f"{where}: expected [logprob, token_id, text], got {item!r}"[:200])
    lp = item[0]
    return (None if lp is None else float(lp)), item[1]


def _meta_info(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict) or not isinstance(body.get("meta_info"), dict):
        raise ValueError("the response has no meta_info")
    return body["meta_info"]


def _top_logprobs(meta: dict[str, Any], outputs: int) -> list[tuple[tuple[int, float], ...]]:
    """Per output position, (token_id, logprob) of the top candidates, best first (empty when not asked)."""
    if "output_top_logprobs" not in meta:
        return []
    listed = _entries(meta, "output_top_logprobs")
    if len(listed) != outputs:
        raise ValueError(f"output_top_logprobs ({len(listed)}) and output_token_logprobs ({outputs}) disagree")
    tops = []
    for k, position in enumerate(listed):
        pairs = [_entry(e, f"output_top_logprobs position {k}") for e in position or ()]
        tops.append(tuple(sorted(((t, lp) for lp, t in pairs if lp is not None), key=lambda x: -x[1])))
    return tops


def parse_capture(index: int, body: Any) -> PromptOutput:
    """One prompt's greedy output from a /generate response to `capture_request`; ValueError says what
    is missing."""
    meta = _meta_info(body)
    prompt = [_entry(e, "input_token_logprobs")[1] for e in _entries(meta, "input_token_logprobs")]
    out = [_entry(e, "output_token_logprobs") for e in _entries(meta, "output_token_logprobs")]
    ids = body.get("output_ids")
    if isinstance(ids, list) and ids and ids != [t for _, t in out]:
        raise ValueError(f"output_ids ({len(ids)}) and output_token_logprobs ({len(out)}) disagree")
    return PromptOutput(
        prompt=index,
        prompt_ids=tuple(prompt),
        output_ids=tuple(t for _, t in out),
        output_logprobs=tuple(lp if lp is not None else 0.0 for lp, _ in out),
        output_top=tuple(_top_logprobs(meta, len(out))),
    )


def parse_score(score: ScoreRequest, body: Any) -> ScoredOutput:
    """The server's rating of `score`'s output tokens from a /generate response to `score_request`: the
    last `continuation` entries of input_token_logprobs (checked against the ids sent) and of
    input_top_logprobs."""
    meta = _meta_info(body)
    n = score.continuation
    tokens = _entries(meta, "input_token_logprobs")[-n:] if n else []
    tops = _entries(meta, "input_top_logprobs")[-n:] if n else []
    if len(tokens) != n or len(tops) != n:
        raise ValueError(f"expected {n} scored positions, got {len(tokens)} logprobs and {len(tops)} top logprobs")
    logprobs, top_logprobs = [], []
    for k, (item, top) in enumerate(zip(tokens, tops)):
        lp, token = _entry(item, "input_token_logprobs")
        if token != score.input_ids[len(score.input_ids) - n + k]:
            raise ValueError(f"input_token_logprobs position {k} rates token {token}, not the one sent")
        if lp is None:
            raise ValueError(f"input_token_logprobs position {k} of the output has no logprob")
        if not isinstance(top, list) or not top:
            raise ValueError(f"input_top_logprobs position {k} is empty")
        best, _ = _entry(top[0], "input_top_logprobs")
        logprobs.append(lp)
        top_logprobs.append(lp if best is None else max(best, lp))
    return ScoredOutput(arm=score.arm, prompt=score.prompt, logprobs=tuple(logprobs), top_logprobs=tuple(top_logprobs))


Post = Callable[[dict[str, Any], float], Any]
"""Send one /generate body with a timeout; the decoded JSON answer (httpx.HTTPError, ValueError on failure)."""


def http_post(base_url: str) -> Post:
    def post(body: dict[str, Any], timeout_s: float) -> Any:
        response = httpx.post(base_url + "/generate", json=body, timeout=timeout_s, trust_env=False)
        response.raise_for_status()
        return response.json()

    return post


def collect(request: OutputsRequest, post: Post, remaining: Callable[[], float]) -> OutputsRecord:
    """Capture the prompts (all at once, as a batch), then score the listed sequences (likewise); a
    failure stops it, keeping what completed before."""
    prompts: list[PromptOutput] = []
    scored: list[ScoredOutput] = []

    def one_prompt(i: int) -> PromptOutput:
        return parse_capture(
            i, post(capture_request(PROMPTS[i], request.max_new_tokens, request.top_logprobs), remaining())
        )

    def one_score(s: ScoreRequest) -> ScoredOutput:
        return parse_score(s, post(score_request(s), remaining()))

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(request.prompts, 1)) as pool:
        error = _gather(
            [(f"prompt {i}", pool.submit(one_prompt, i)) for i in range(min(request.prompts, len(PROMPTS)))], prompts
        )
        if not error and request.score:
            error = _gather(
                [(f"scoring {s.arm}'s output of prompt {s.prompt}", pool.submit(one_score, s)) for s in request.score],
                scored,
            )
    return OutputsRecord(prompts=tuple(prompts), scored=tuple(scored), error=error)


def _gather(asked: Sequence[tuple[str, concurrent.futures.Future[Any]]], into: list[Any]) -> str:
    """Results in order into `into`; the first failure's description ("" when none failed)."""
    error = ""
    for step, future in asked:
        try:
            into.append(future.result())
        except (httpx.HTTPError, ValueError) as exc:
            error = error or f"{step}: {type(exc).__name__}: {exc}"[:500]
    return error


def capture(request: OutputsRequest, base_url: str, trial_dir: Path, remaining: Callable[[], float]) -> OutputsRecord:
    """`collect` against the server at `base_url`, written to the trial folder's outputs.json."""
    record = collect(request, http_post(base_url), remaining)
    write(trial_dir, record)
    return record


def write(trial_dir: Path, record: OutputsRecord) -> None:
    write_json(trial_dir / OUTPUTS_FILE, record.model_dump(mode="json"))


def read(trial_dir: Path) -> OutputsRecord | None:
    """A trial folder's outputs.json, or None when missing or unreadable."""
    try:
        return OutputsRecord.model_validate_json((trial_dir / OUTPUTS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
