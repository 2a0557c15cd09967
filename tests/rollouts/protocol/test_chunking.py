"""Context segmentation: lossless, within the target, at the coarsest boundary that fits."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollouts.protocol.chunking import split_text


def chars(pieces):
    """An additive count (characters), so "within the target" can be checked exactly."""
    return [len(p) for p in pieces]


def test_paragraph_boundaries_win():
    paras = ["a" * 30 + ".\n\n", "b" * 30 + ".\n\n", "c" * 30 + "."]
    assert split_text("".join(paras), 70, chars) == [paras[0] + paras[1], paras[2]]


def test_falls_back_to_lines_then_sentences_then_words():
    lines = "one two three.\nfour five six.\nseven eight nine."
    assert split_text(lines, 32, chars) == ["one two three.\nfour five six.\n", "seven eight nine."]
    sentences = "Alpha beta gamma. Delta epsilon zeta. Eta theta iota."
    assert split_text(sentences, 20, chars) == [
        "Alpha beta gamma.",
        " Delta epsilon zeta.",
        " Eta theta iota.",
    ]
    words = "alpha beta gamma delta"
    assert split_text(words, 11, chars) == ["alpha beta", " gamma", " delta"]


def test_unbreakable_runs_are_cut_within_target():
    assert split_text("x" * 25, 10, chars) == ["x" * 10, "x" * 10, "x" * 5]


def test_bad_target_and_empty_text():
    with pytest.raises(ValueError, match="target"):
        split_text("abc", 0, chars)
    assert split_text("  \n\n ", 10, chars) == []


text_strategy = st.lists(
    st.sampled_from(["word", "longerword", " ", "\n", "\n\n", ".", "!", "x" * 30, "é", "\t", "; "]),
    max_size=80,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=text_strategy, target=st.integers(1, 60))
def test_lossless_and_within_target(text, target):
    chunks = split_text(text, target, chars)
    if not text.strip():
        assert chunks == []
        return
    assert "".join(chunks) == text
    assert all(c.strip() for c in chunks), "a whitespace-only chunk would be an empty magic chunk"
    # a chunk exceeds the target only by whitespace merged into it
    assert all(len(c.rstrip()) <= target or len(c.strip()) <= target for c in chunks)
