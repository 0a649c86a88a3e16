"""Decision scoring: structure on the tiny model, behaviour on the embedded model.

The tiny model's answers are random, so tiny tests check shapes, sums and that the batched
shared-prefix path equals a plain reference (one full forward pass per prompt / option).
"""

from __future__ import annotations

import asyncio
import math
import os
from pathlib import Path
from typing import Any

import pytest

from serve_app.errors import ContextLengthExceededError, UnprocessableRequestError
from serve_app.models.loader import LoadedModel, load_model
from serve_app.prompts import decisions as prompts
from serve_app.prompts.chat_encoding import encode_chat
from serve_app.serving.scoring import (
    DecisionQuestion,
    LikelihoodScorer,
    QuestionOutcome,
    build_trie,
    calibrated,
)
from tests.conftest import engine_config

EMBEDDED_DIR = Path(os.path.expanduser("~/.cache/serve-app/models/qwen2.5-coder-0.5b"))

STATE = {"user": {"name": "Ada", "tags": ["admin", "ops"]}, "open_tickets": 3, "note": "é ok"}


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    return load_model("tiny", threads=1)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def make_scorer(loaded: LoadedModel, context_length: int, **options: Any) -> LikelihoodScorer:
    """A scorer on its own scoring engine, on the HF model (the reference numbers)."""
    return LikelihoodScorer.for_model(loaded, engine_config(runner="hf"), context_length, **options)


@pytest.fixture()
def scorer(tiny: LoadedModel) -> LikelihoodScorer:
    return make_scorer(tiny, 4096)


def mixed_questions() -> list[DecisionQuestion]:
    return [
        DecisionQuestion("admin", "noul", "The user is an admin.", {"true": "tags has admin"}),
        DecisionQuestion("fast_choice", "choice", {"hint": "pick"}, {"A": "one", "B": ["two"]}),
        DecisionQuestion(
            "slow_choice", "choice", None, {"label1": None, "label2": "x", "lab": {"k": 1}}
        ),
        DecisionQuestion("load", "score", "How loaded?", ["idle", "busy", {"level": "max"}]),
    ]


# ------------------------------------------------------------------ reference


def reference(scorer: LikelihoodScorer, state: Any, q: DecisionQuestion) -> dict[str, float]:
    """Straightforward scoring: full prompt forward passes, no cache, no batching; the kinds
    the scorer calibrates are divided by the same reference on the content-free state."""
    answer = QuestionOutcome(q.name, q.kind, softmax(reference_log_scores(scorer, state, q)))
    if q.kind not in scorer.calibrate:
        return answer.probabilities
    null = reference_log_scores(scorer, prompts.CONTENT_FREE_STATE, q)
    return calibrated(answer, QuestionOutcome(q.name, q.kind, softmax(null))).probabilities


def softmax(scores: dict[str, float]) -> dict[str, float]:
    top = max(scores.values())
    weights = {o: math.exp(s - top) for o, s in scores.items()}
    return {o: w / sum(weights.values()) for o, w in weights.items()}


def reference_log_scores(
    scorer: LikelihoodScorer, state: Any, q: DecisionQuestion, only: list[str] | None = None
) -> dict[str, float]:
    """Unnormalised log-likelihood per option (optionally for a few options only)."""
    import torch

    model = scorer.engine.loaded.model
    options, answers, user = question_parts(scorer, q)
    ids = full_prompt(scorer, state, user)
    keep = [i for i, o in enumerate(options) if only is None or o in only]
    firsts = [{seq[0] for seq in alts} for alts in answers]
    disjoint = sum(len(f) for f in firsts) == len(set().union(*firsts))
    with torch.inference_mode():
        if disjoint:
            lp = model(torch.tensor([ids])).logits[0, -1].double().log_softmax(-1)
            scores = [float(lp[[s[0] for s in answers[i]]].logsumexp(0)) for i in keep]
        else:
            scores = []
            for alts in [answers[i] for i in keep]:
                per_seq = []
                for seq in alts:
                    full = seq + [scorer.end_id]
                    logits = model(torch.tensor([ids + full[:-1]])).logits[0].double()
                    lp = logits[len(ids) - 1 :].log_softmax(-1)
                    per_seq.append(sum(float(lp[j, t]) for j, t in enumerate(full)))
                scores.append(float(torch.tensor(per_seq).logsumexp(0)))
    return {options[i]: score for i, score in zip(keep, scores, strict=True)}


def question_parts(scorer: LikelihoodScorer, q: DecisionQuestion) -> tuple:
    """Options, their token sequences and the user message, as the prompts module builds them."""
    if q.kind == "noul":
        user = prompts.noul_message(q.name, q.instructions, q.criteria)
        return ["true", "false"], scorer.noul_answers, user
    if q.kind == "choice":
        options = list(q.criteria)
        user = prompts.choice_message(q.name, q.instructions, q.criteria)
    else:
        options = [str(k) for k in range(len(q.criteria))]
        user = prompts.score_message(q.name, q.instructions, q.criteria)
    return options, [[scorer.encode(option)] for option in options], user


def full_prompt(scorer: LikelihoodScorer, state: Any, user: str) -> list[int]:
    """The whole prompt encoded in one go by the project's chat encoder."""
    messages = prompts.question_messages(prompts.state_block(state) + user)
    return encode_chat(scorer.tokenizer, messages)


def assert_close(got: dict[str, float], want: dict[str, float], tol: float = 1e-4) -> None:
    assert list(got) == list(want)
    for key in want:
        assert got[key] == pytest.approx(want[key], abs=tol), key


# ------------------------------------------------------------------ rendering


def test_render_value_is_json_not_repr() -> None:
    nested = {"b": {"z": [1, None, True]}, "a": "é"}
    text = prompts.render_value(nested)
    assert text == (
        '{\n  "b": {\n    "z": [\n      1,\n      null,\n      true\n    ]\n  },\n  "a": "é"\n}'
    )
    assert "None" not in text and "True" not in text and "'" not in text
    assert prompts.render_value("plain text") == "plain text"
    assert prompts.render_value(None) == ""
    assert prompts.render_value([1, "x"]) == '[\n  1,\n  "x"\n]'


def test_state_comes_first_and_criteria_are_in_prompt() -> None:
    user = prompts.noul_message("q", "The sky is green.", {"true": {"colour": "green"}})
    messages = prompts.question_messages(prompts.state_block(STATE) + user)
    assert messages[0] == {"role": "system", "content": prompts.SYSTEM_TASK}
    # Worked examples come before the question's own turn, answered in the words read.
    assert [m["role"] for m in messages[1:-1]] == ["user", "assistant"] * len(prompts.NOUL_EXAMPLES)
    assert {m["content"] for m in messages[2:-1:2]} == {"yes", "no"}
    content = messages[-1]["content"]
    assert content.startswith("State:\n{") and '"name": "Ada"' in content
    assert content.index('"name": "Ada"') < content.index("The sky is green.")
    assert '"colour": "green"' in content


def test_split_tokenization_equals_full(scorer: LikelihoodScorer) -> None:
    """The state is tokenized once and reused; that must equal encoding each prompt whole."""
    frame = scorer.frame
    for state in (STATE, "ends with a word", "ends with newlines\n\n", ["x", 1], "<|im_end|>"):
        for q in mixed_questions():
            user = question_parts(scorer, q)[2]
            split = frame.head + scorer.encode(prompts.state_block(state))
            split += scorer.encode(user) + frame.tail
            assert split == full_prompt(scorer, state, user)


# ------------------------------------------------------------------ structure (tiny)


def test_probabilities_cover_options_and_sum_to_one(scorer: LikelihoodScorer) -> None:
    questions = mixed_questions()
    result = run(scorer.score(STATE, questions, cache_salt="test"))
    assert list(result.outcomes) == [q.name for q in questions]
    expected_keys = {
        "admin": ["true", "false"],
        "fast_choice": ["A", "B"],
        "slow_choice": ["label1", "label2", "lab"],
        "load": ["0", "1", "2"],
    }
    for name, outcome in result.outcomes.items():
        assert list(outcome.probabilities) == expected_keys[name]
        assert all(isinstance(p, float) and 0.0 <= p <= 1.0 for p in outcome.probabilities.values())
        assert sum(outcome.probabilities.values()) == pytest.approx(1.0, abs=1e-6)
        assert outcome.confidence == max(outcome.probabilities.values())
    load = result.outcomes["load"]
    expected = sum(k * load.probabilities[str(k)] for k in range(3))
    assert load.expected_level == pytest.approx(expected)
    assert result.input_tokens > 0 and result.output_tokens > 0


def test_paths_are_the_intended_ones(scorer: LikelihoodScorer) -> None:
    """Sanity for the tests below: the mixed set exercises both scoring paths."""
    result = run(scorer.score(STATE, mixed_questions(), cache_salt="test"))
    # One read each for the single-distribution questions; the slow choice reads its trie.
    slow = build_trie(question_parts(scorer, mixed_questions()[2])[1], scorer.end_id)
    assert result.output_tokens == 3 + len(slow.reads)
    true_side, false_side = scorer.noul_answers
    encode = scorer.encode
    assert [encode("true")[0]] in true_side and [encode("True")[0]] in true_side
    assert [encode("False")[0]] in false_side
    assert scorer.end_id == scorer.tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_batched_shared_prefix_matches_reference(scorer: LikelihoodScorer) -> None:
    questions = mixed_questions()
    result = run(scorer.score(STATE, questions, cache_salt="test"))
    for q in questions:
        assert_close(result.outcomes[q.name].probabilities, reference(scorer, STATE, q))
    # The state was run once, not once per question.
    whole = [full_prompt(scorer, STATE, question_parts(scorer, q)[2]) for q in questions]
    assert result.input_tokens < sum(len(ids) for ids in whole)


def test_single_question_matches_reference(scorer: LikelihoodScorer) -> None:
    q = DecisionQuestion("only", "noul", "Ada has 3 open tickets.")
    result = run(scorer.score("a plain string state", [q], cache_salt="test"))
    want = reference(scorer, "a plain string state", q)
    assert_close(result.outcomes["only"].probabilities, want)


def test_255_labels_with_shared_first_tokens(tiny: LoadedModel) -> None:
    # A small pack size forces several forward passes.
    scorer = make_scorer(tiny, 8192, pack_tokens=64)
    labels = {f"opt{i}": None for i in range(250)} | {c: None for c in "ABCDE"}
    q = DecisionQuestion("many", "choice", "Pick one.", labels)
    result = run(
        scorer.score({"x": 1}, [q, DecisionQuestion("other", "noul", "x is 1")], cache_salt="test")
    )
    probabilities = result.outcomes["many"].probabilities
    assert list(probabilities) == list(labels) and len(probabilities) == 255
    assert sum(probabilities.values()) == pytest.approx(1.0, abs=1e-6)
    # The full reference costs 255 long forward passes: compare log-ratios on a sample.
    sample = ["opt0", "opt1", "opt10", "opt100", "opt249", "A", "E"]
    want = reference_log_scores(scorer, {"x": 1}, q, only=sample)
    for label in sample[1:]:
        got = math.log(probabilities[label]) - math.log(probabilities["opt0"])
        assert got == pytest.approx(want[label] - want["opt0"], abs=1e-4), label


def test_ten_questions_give_ten_outcomes(scorer: LikelihoodScorer) -> None:
    questions = [DecisionQuestion(f"q{i}", "noul", f"Statement number {i}.") for i in range(10)]
    result = run(scorer.score(STATE, questions, cache_salt="test"))
    assert list(result.outcomes) == [f"q{i}" for i in range(10)]
    assert result.output_tokens == 10


def test_calibration_runs_and_bills_the_content_free_pass(tiny: LoadedModel) -> None:
    questions = [DecisionQuestion(f"q{i}", "noul", f"Statement number {i}.") for i in range(3)]
    raw = run(make_scorer(tiny, 4096).score(STATE, questions, cache_salt="test"))
    scorer = make_scorer(tiny, 4096, calibrate=("noul",))
    result = run(scorer.score(STATE, questions, cache_salt="test"))
    null = run(
        make_scorer(tiny, 4096).score(prompts.CONTENT_FREE_STATE, questions, cache_salt="test")
    )
    # Billed: the content-free prompt and its question rows as a second request would be,
    # its system turn served from the cache the state's pass just filled.
    assert result.input_tokens == raw.input_tokens + null.input_tokens
    assert result.output_tokens == raw.output_tokens + null.output_tokens
    assert raw.cached_tokens == 0 and result.cached_tokens >= len(scorer.frame.head)
    for name, outcome in result.outcomes.items():
        want = calibrated(raw.outcomes[name], null.outcomes[name]).probabilities
        assert_close(outcome.probabilities, want, 1e-5)


def test_calibrated_scores_match_the_reference(tiny: LoadedModel) -> None:
    scorer = make_scorer(tiny, 4096, calibrate=("noul", "choice", "score"))
    questions = mixed_questions()
    result = run(scorer.score(STATE, questions, cache_salt="test"))
    for q in questions:
        assert_close(result.outcomes[q.name].probabilities, reference(scorer, STATE, q))


def test_prefix_cache_reuses_state(tiny: LoadedModel) -> None:
    scorer = make_scorer(tiny, 4096)
    questions = mixed_questions()[:2]
    first = run(scorer.score(STATE, questions, cache_salt="test"))
    second = run(scorer.score(STATE, questions, cache_salt="test"))
    assert first.cached_tokens == 0 and second.cached_tokens > 0
    # A cache hit saves work, not billing: the state is charged whether run or reused.
    assert second.input_tokens == first.input_tokens
    for name in first.outcomes:
        assert_close(second.outcomes[name].probabilities, first.outcomes[name].probabilities, 1e-5)
    # Another state still reuses the fixed system turn, but not the state itself.
    other = run(scorer.score({"other": 1}, questions, cache_salt="test"))
    assert 0 < other.cached_tokens < second.cached_tokens
    uncached = make_scorer(tiny, 4096)
    fresh = run(uncached.score({"other": 1}, questions, cache_salt="test"))
    for name in fresh.outcomes:
        assert_close(other.outcomes[name].probabilities, fresh.outcomes[name].probabilities, 1e-4)


def test_prefix_cache_is_partitioned_by_salt(tiny: LoadedModel) -> None:
    """Another account (salt) never hits the state one account cached: only the prompt's
    fixed head, text the service wrote, which every account shares, with the same answers."""
    scorer = make_scorer(tiny, 4096)
    questions = mixed_questions()[:2]
    first = run(scorer.score(STATE, questions, cache_salt="account-a"))
    assert first.cached_tokens == 0
    other = run(scorer.score(STATE, questions, cache_salt="account-b"))
    assert other.cached_tokens == len(scorer.frame.head)
    for name in first.outcomes:
        assert other.outcomes[name].probabilities == first.outcomes[name].probabilities
    again = run(scorer.score(STATE, questions, cache_salt="account-a"))
    assert again.cached_tokens > len(scorer.frame.head)


def test_context_length_exceeded(tiny: LoadedModel) -> None:
    scorer = make_scorer(tiny, 64)
    with pytest.raises(ContextLengthExceededError) as caught:
        run(
            scorer.score(
                "word " * 200, [DecisionQuestion("q", "noul", "Is it long?")], cache_salt="test"
            )
        )
    assert caught.value.param == "state"
    assert caught.value.code == "context_length_exceeded"
    assert "64" in caught.value.message


@pytest.mark.parametrize(
    "question",
    [
        DecisionQuestion("q", "choice", None, {}),
        DecisionQuestion("q", "choice", None, {f"l{i}": None for i in range(256)}),
        DecisionQuestion("q", "score", None, [str(i) for i in range(11)]),
        DecisionQuestion("q", "score", None, ["low", None]),
        DecisionQuestion("q", "other", None, None),  # type: ignore[arg-type]
    ],
)
def test_invalid_questions_are_unprocessable(
    scorer: LikelihoodScorer, question: DecisionQuestion
) -> None:
    with pytest.raises(UnprocessableRequestError):
        run(scorer.score(STATE, [question], cache_salt="test"))


# ------------------------------------------------------------------ behaviour (embedded)


@pytest.fixture(scope="module")
def embedded() -> LikelihoodScorer:
    if not (EMBEDDED_DIR / "config.json").exists():
        pytest.skip(f"embedded model not converted yet ({EMBEDDED_DIR})")
    return make_scorer(load_model(str(EMBEDDED_DIR), threads=2), 32768)


@pytest.mark.embedded
def test_embedded_noul_follows_the_state(embedded: LikelihoodScorer) -> None:
    state = {"city": "Paris", "country": "France", "temperature_celsius": 31}
    result = run(
        embedded.score(
            state,
            [
                DecisionQuestion("in_france", "noul", "The city is in France."),
                DecisionQuestion("in_japan", "noul", "The city is in Japan."),
                DecisionQuestion("hot", "noul", "It is hot.", {"true": "above 25 degrees Celsius"}),
            ],
            cache_salt="test",
        )
    )
    p = {name: o.probabilities["true"] for name, o in result.outcomes.items()}
    assert p["in_france"] > 0.5 > p["in_japan"], p
    assert p["hot"] > 0.5, p


@pytest.mark.embedded
def test_embedded_choice_and_score(embedded: LikelihoodScorer) -> None:
    review = "Absolutely terrible. The product broke after one day and support ignored me."
    labels = {"positive": "the customer is happy", "negative": "the customer is unhappy"}
    scale = ["very negative", "negative", "neutral", "positive", "very positive"]
    result = run(
        embedded.score(
            review,
            [
                DecisionQuestion("sentiment", "choice", "Classify the review's sentiment.", labels),
                DecisionQuestion("rating", "score", "Rate the review's sentiment.", scale),
            ],
            cache_salt="test",
        )
    )
    assert result.outcomes["sentiment"].best == "negative", result.outcomes["sentiment"]
    happy = run(
        embedded.score(
            "Wonderful! Best purchase of my life, it works perfectly and arrived early.",
            [DecisionQuestion("rating", "score", "Rate the review's sentiment.", scale)],
            cache_salt="test",
        )
    )
    low, high = result.outcomes["rating"].expected_level, happy.outcomes["rating"].expected_level
    # The 0.5B model pulls every score towards the middle of the scale; the order holds.
    assert low < high, (low, high)
