"""Streaming detokenization and stop sequences: chunking must never change the text."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.engine.text import REPLACEMENT_CHAR, IncrementalDetokenizer, StopMatcher
from serve_app.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoTokenizer

    path = build_tiny_model(tmp_path_factory.getbasetemp() / "tiny-model")
    return AutoTokenizer.from_pretrained(path)


def stream(tokenizer: Any, ids: list[int], **kwargs: Any) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, **kwargs)
    return [detok.add(i) for i in ids] + [detok.flush()]


# -- IncrementalDetokenizer -----------------------------------------------------------------

MULTIBYTE = [
    "héllo wörld",
    "日本語のテキスト",
    "party 🎉🎉 time 👩‍👩‍👧",
    "def f(x):\n    return 'é'",
]


@pytest.mark.parametrize("text", MULTIBYTE)
def test_pieces_join_to_full_decode(tokenizer: Any, text: str) -> None:
    ids = tokenizer.encode(text)
    pieces = stream(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert not any(REPLACEMENT_CHAR in piece for piece in pieces)


def test_holds_back_half_characters(tokenizer: Any) -> None:
    ids = tokenizer.encode("日")
    assert len(ids) > 1  # the tiny vocabulary splits it into byte tokens
    detok = IncrementalDetokenizer(tokenizer)
    assert [detok.add(i) for i in ids] == [""] * (len(ids) - 1) + ["日"]
    assert detok.flush() == ""


def test_flush_releases_an_incomplete_character(tokenizer: Any) -> None:
    ids = tokenizer.encode("a日")[:-1]  # cut inside the character
    pieces = stream(tokenizer, ids)
    assert pieces[-1] == tokenizer.decode(ids)[1:]
    assert "".join(pieces) == tokenizer.decode(ids)


def test_prompt_context_is_not_emitted(tokenizer: Any) -> None:
    prompt = tokenizer.encode("<|im_start|>assistant\n")
    ids = tokenizer.encode("Sure: 日本")
    assert "".join(stream(tokenizer, ids, prompt_ids=prompt)) == "Sure: 日本"


def test_skip_special_tokens(tokenizer: Any) -> None:
    ids = tokenizer.encode("ok<|im_end|>")
    assert "".join(stream(tokenizer, ids, skip_special_tokens=True)) == "ok"
    assert "".join(stream(tokenizer, ids)) == "ok<|im_end|>"


def test_decodes_a_bounded_window(tokenizer: Any) -> None:
    """Each step decodes a few recent tokens, not the whole output (no quadratic cost)."""
    sizes: list[int] = []

    class Recording:
        def decode(self, ids: list[int], **kwargs: Any) -> str:
            sizes.append(len(ids))
            return tokenizer.decode(ids, **kwargs)

    ids = tokenizer.encode("for i in range(10):\n    print(i)\n 日本 🎉" * 8)
    detok = IncrementalDetokenizer(Recording())
    "".join(detok.add(i) for i in ids)
    assert len(ids) > 100
    assert max(sizes) <= 10


def test_run_of_invalid_bytes_keeps_a_bounded_window(tokenizer: Any) -> None:
    """A model stuck on stray continuation bytes must not make each step decode everything."""
    lead, continuation = tokenizer.encode("\u0080")  # UTF-8 C2 80, one byte token each
    char = tokenizer.encode("日")
    ids = [continuation] * 60 + char + [lead] * 30 + char[:2] + [continuation] * 30 + char
    sizes: list[int] = []

    class Recording:
        def decode(self, ids: list[int], **kwargs: Any) -> str:
            sizes.append(len(ids))
            return tokenizer.decode(ids, **kwargs)

    pieces = stream(Recording(), ids)
    assert "".join(pieces) == tokenizer.decode(ids)
    assert max(sizes) <= 20
    assert sum(1 for piece in pieces if piece) > 10  # released along the way, not at the end


@settings(max_examples=60, deadline=None)
@given(
    st.one_of(
        st.lists(st.sampled_from([*"ab é日本語🎉\n\t{}", "👩‍👧", "def "]), max_size=30).map(
            "".join
        ),
        st.text(st.characters(codec="utf-8"), max_size=20),  # anything, e.g. rare scripts
    )
)
def test_text_round_trip_property(tokenizer: Any, text: str) -> None:
    ids = tokenizer.encode(text)
    pieces = stream(tokenizer, ids)
    assert "".join(pieces) == tokenizer.decode(ids)
    assert not any(REPLACEMENT_CHAR in piece for piece in pieces)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_arbitrary_token_ids_property(tokenizer: Any, data: st.DataObject) -> None:
    """Even a model emitting invalid byte sequences streams exactly the full decode."""
    ids = data.draw(st.lists(st.integers(0, len(tokenizer) - 1), max_size=30))
    max_pending = data.draw(st.sampled_from([1, 2, 8]))  # small values force early releases
    pieces = stream(tokenizer, ids, max_pending=max_pending)
    full = tokenizer.decode(ids)
    assert "".join(pieces) == full
    if REPLACEMENT_CHAR not in full:
        assert not any(REPLACEMENT_CHAR in piece for piece in pieces)


# -- StopMatcher ----------------------------------------------------------------------------


def feed_all(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    matcher = StopMatcher(stops)
    out, stopped = [], False
    for piece in pieces:
        text, stopped = matcher.feed(piece)
        out.append(text)
    out.append(matcher.flush())
    return "".join(out), stopped


def reference_cut(text: str, stops: list[str]) -> tuple[str, bool]:
    """The text before the stop that completes first (the longest one when several do)."""
    for end in range(1, len(text) + 1):
        done = [s for s in stops if s and text[:end].endswith(s)]
        if done:
            return text[: end - max(map(len, done))], True
    return text, False


def test_stop_straddling_two_pieces_never_reaches_the_client() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("hello ST") == ("hello ", False)
    assert matcher.feed("OP and more") == ("", True)
    assert matcher.feed("later") == ("", True)
    assert matcher.flush() == ""


def test_false_alarm_is_released() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("a ST") == ("a ", False)
    assert matcher.feed("O") == ("", False)
    assert matcher.feed("RY") == ("STORY", False)


def test_flush_releases_held_tail() -> None:
    matcher = StopMatcher(["</end>"])
    assert matcher.feed("done </e") == ("done ", False)
    assert matcher.flush() == "</e"


def test_stop_inside_one_piece() -> None:
    assert StopMatcher(["\n\n"]).feed("para one\n\npara two") == ("para one", True)


def test_empty_stops_are_ignored() -> None:
    assert StopMatcher(["", ""]).feed("anything") == ("anything", False)
    assert StopMatcher(["", "x"]).feed("abxcd") == ("ab", True)


def test_stop_completed_first_wins_whatever_the_split() -> None:
    # "c" completes before "abcd" does, so a stream must cut there; so must a single piece.
    assert feed_all(["abcd", "c"], ["abcd"]) == ("ab", True)
    assert feed_all(["abcd", "c"], ["ab", "cd"]) == ("ab", True)
    assert feed_all(["bc", "abc"], ["xabc"]) == ("x", True)


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet="abc\n", max_size=30),
    stops=st.lists(st.text(alphabet="abc\n", max_size=4), max_size=3),
    cuts=st.lists(st.integers(0, 30), max_size=8),
)
def test_any_split_gives_text_cut_at_first_stop(text: str, stops: list[str], cuts: list[int]):
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    joined, stopped = feed_all(stops, pieces)
    assert (joined, stopped) == reference_cut(text, stops)
    assert not any(stop and stop in joined for stop in stops)
