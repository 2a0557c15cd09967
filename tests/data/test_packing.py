"""Packing needles into filler documents: placement, the length promise, and impossible requests."""

import random

import pytest

from data.filler import TokenCounter, filler_sentence
from data.packing import Needle, pack_documents
from data.schema import DataError


def test_needles_land_in_their_documents_and_the_total_hits_the_target(tokenizer):
    count = TokenCounter(tokenizer)
    needles = [
        Needle("The vault code is 4471.", 0),
        Needle("The door code is 9012.", 2),
        Needle("Bring a lamp.", 2),
    ]
    docs = pack_documents(random.Random(0), count, needles, 4, 1000, 400, "test")
    assert len(docs) == 4
    assert [i for i, d in enumerate(docs) if "vault code" in d] == [0]
    assert [i for i, d in enumerate(docs) if "door code" in d] == [2]
    assert docs[2].index("door code") < docs[2].index("Bring a lamp.")  # the given order is kept
    total = sum(len(tokenizer(d, add_special_tokens=False)["input_ids"]) for d in docs)
    assert abs(total - 1000) <= 50
    assert all(len(tokenizer(d, add_special_tokens=False)["input_ids"]) <= 400 for d in docs)


def test_filler_carries_nothing_a_needle_is_made_of():
    rng = random.Random(0)
    for _ in range(500):
        sentence = filler_sentence(rng)
        assert not any(ch.isdigit() for ch in sentence) and "=" not in sentence and "-" not in sentence


def test_a_target_shorter_than_the_needles_is_a_clear_error(tokenizer):
    needles = [Needle("One of the special magic numbers for silver-owl is: 4715293.", 0)] * 4
    with pytest.raises(DataError, match=r"target_tokens=40 is too short"):
        pack_documents(random.Random(0), TokenCounter(tokenizer), needles, 2, 40, 400, "niah")
    with pytest.raises(DataError, match=r"chunk_tokens=20 is too small"):
        pack_documents(random.Random(0), TokenCounter(tokenizer), needles[:2], 2, 400, 20, "niah")


@pytest.mark.parametrize("chunk_tokens, target", [(27, 130), (27, 160), (32, 192), (32, 160)])
def test_small_chunks_still_hit_the_length_target(tokenizer, chunk_tokens, target):
    """Each document's filler stops a word or two short of its share; over six or seven one-block chunks
    that used to add up past the 5% tolerance. Counted exactly, the total lands within it."""
    from data.packing import num_docs_for

    count = TokenCounter(tokenizer)
    needle = "One of the special magic numbers for red-owl is: 63."
    for seed in range(40):
        docs = pack_documents(
            random.Random(seed), count, [Needle(needle, seed % 3)], num_docs_for(target, chunk_tokens, 2),
            target, chunk_tokens, "test",
        )  # fmt: skip
        sizes = [len(tokenizer(d, add_special_tokens=False)["input_ids"]) for d in docs]
        assert abs(sum(sizes) - target) <= 0.05 * target, (seed, sizes)
        assert max(sizes) <= chunk_tokens and sum(needle in d for d in docs) == 1
