"""The pretraining corpus (data/corpus.py): no DA tag anywhere, no held-out wording, answers a reader of the
text alone agrees with, and batches that are a pure function of (seed, step)."""

import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from data import phrasings
from data.corpus import Corpus, CorpusConfig
from data.tasks.names import magic_keys
from rollouts.protocol import PROTOCOL_TAG_TOKENS

from .solvers import niah_twohop

TAGS = ("<global", "<focus", "<local", "<answer", "<index", "</global", "</focus", "</local", "</answer")


@pytest.fixture(scope="module")
def corpus(tokenizer):
    return Corpus(tokenizer)


def test_batches_are_a_function_of_seed_and_step(corpus):
    a = corpus.batch(seed=0, step=5, batch_size=2, seq_len=256)
    assert a.shape == (2, 256)
    assert (a == corpus.batch(seed=0, step=5, batch_size=2, seq_len=256)).all()
    assert not (a == corpus.batch(seed=0, step=6, batch_size=2, seq_len=256)).all()
    assert not (a == corpus.batch(seed=1, step=5, batch_size=2, seq_len=256)).all()


def test_no_document_speaks_the_protocol_or_a_held_out_wording(corpus, tokenizer):
    text = tokenizer.decode(corpus.batch(seed=3, step=0, batch_size=8, seq_len=1024).flatten())
    assert not any(tag in text for tag in TAGS + tuple(PROTOCOL_TAG_TOKENS))
    stems = [t.split("{")[0].strip() for t in phrasings.NEEDLES["heldout"] + phrasings.LINKS["heldout"]]
    assert all(stem not in text for stem in stems if len(stem) > 10)


@given(seed=st.integers(0, 10**6))
def test_an_asked_question_is_answered_by_the_text_alone(corpus, seed):
    context = corpus.context(random.Random(seed))
    text = "\n".join(context.documents)
    asked = context.asked
    if asked.hop:  # two hops: the link's key leads to the value
        assert niah_twohop(asked.question, text) == [asked.answer]
    holder = context.documents[asked.chunk - 1]
    assert re.search(rf" {asked.answer}\.", holder), "the cited chunk holds the value"
    for qa in context.more:  # questions about every fact's key: the value stands in the cited chunk
        other = re.findall(r"[a-z]+-[a-z]+", qa.question)[0]
        fact = next(s for s in re.split(r"(?<=\.)\s+", context.documents[qa.chunk - 1]) if other in s)
        assert fact.endswith(f" {qa.answer}.")


@pytest.mark.parametrize("layout", ["plain", "chat"])
def test_the_other_layouts_hold_the_context_and_its_answer(corpus, tokenizer, layout):
    context = corpus.context(random.Random(5))
    text = tokenizer.decode(getattr(corpus, f"_{layout}")(random.Random(5), context))
    assert all(doc in text for doc in context.documents)
    assert context.asked.question in text
    marker = "\nAnswer: " if layout == "plain" else "<|im_start|>assistant\n"
    assert marker in text and text.rstrip().endswith((".", ".<|im_end|>"))


def test_the_compact_layout_is_the_defaults_prompt_then_a_plain_answer(corpus, tokenizer):
    from rollouts.protocol import build_prompt

    rng = random.Random(11)
    context = corpus.context(random.Random(11))
    ids = corpus._compact(rng, context)
    prompt = build_prompt(
        context.asked.question, context.documents, tokenizer, block_size=32, chunk_tokens=27,
        style="compact", instructions=False,
    )  # fmt: skip
    assert ids[: len(prompt.input_ids)] == list(prompt.input_ids)
    answer = tokenizer.decode(ids[len(prompt.input_ids) :])
    assert answer.endswith(f" {context.asked.answer}.<|im_end|>")


def test_bad_weights_are_refused_by_name():
    with pytest.raises(ValueError, match="corpus tasks"):
        CorpusConfig(tasks={"poem": 1.0})
    with pytest.raises(ValueError, match="corpus layouts"):
        CorpusConfig(layouts={"compact": 0.0})
    for family in ("heldout", "poetic"):  # the held-out wording stays out of training; a typo is named
        with pytest.raises(ValueError, match=f"corpus phrasing '{family}'"):
            CorpusConfig(phrasing=family)


@given(seed=st.integers(0, 10**6))
def test_a_lookup_tables_answers_follow_from_its_facts(corpus, seed):
    """Read the facts like a person: a sentence with a number gives its key's value, a sentence naming two
    keys gives the first the second's; every answered question then matches."""
    text = corpus.lookup(random.Random(seed))
    facts, _, asked = text.partition("\n\n")
    values = {}
    for sentence in re.split(r"(?<=\.)\s+", facts.strip()):
        keys = re.findall(r"[a-z]+-[a-z]+", sentence)
        number = re.search(r" (\d+)\.$", sentence)  # a fact ends with its value; a link names two keys
        if number:
            (key,) = keys
            values[key] = number.group(1)
        else:
            key, other = keys
            values[key] = values[other]  # a link names a key stated before it
    answered = re.findall(r"([a-z]+-[a-z]+)[^\n]*\n?(?:Answer: | is |: )(\d+)\.", asked)
    assert answered and all(values[k] == v for k, v in answered)
    assert not any(tag in text for tag in TAGS)


@given(seed=st.integers(0, 10**6))
def test_a_recall_table_asks_each_word_for_the_number_right_after_it(corpus, tokenizer, seed):
    """Hand-read: the facts are (word, number) pairs, each word one token after a space; every asked line
    repeats a fact."""
    facts, _, asked = corpus.recall_table(random.Random(seed)).partition("\n\n")
    pairs = re.findall(r" ([a-z]+) (\d\d)\.", facts)
    assert 2 <= len(pairs) <= 4 and "".join(f" {w} {n}." for w, n in pairs) == facts
    values = dict(pairs)
    assert len(values) == len(pairs)  # no word twice
    assert all(len(tokenizer(" " + w, add_special_tokens=False)["input_ids"]) == 1 for w in values)
    lines = asked.strip("\n").split("\n")
    assert len(lines) == len(pairs)
    assert all(re.fullmatch(r" ([a-z]+) (\d\d)\.", line).groups() in pairs for line in lines)


@given(seed=st.integers(0, 10**6))
def test_a_look_alike_table_shares_a_word_of_its_first_key_in_every_other_key(corpus, seed):
    """``near``: multikey's look-alikes, hand-read from the text: keys distinct, each after the first has the
    first's adjective or its noun, and every asked line repeats a fact."""
    facts, _, asked = corpus.recall_table(random.Random(seed), terse=True, near=True).partition("\n\n")
    pairs = re.findall(r" ([a-z]+)-([a-z]+): (\d\d)\.", facts)
    assert 2 <= len(pairs) <= 4 and "".join(f" {a}-{n}: {v}." for a, n, v in pairs) == facts
    keys = [(a, n) for a, n, _ in pairs]
    assert len(set(keys)) == len(keys)
    (adj, noun), rest = keys[0], keys[1:]
    assert all((a == adj) != (n == noun) for a, n in rest)  # one word shared, never both
    lines = asked.strip("\n").split("\n")
    assert all(re.fullmatch(r" ([a-z]+)-([a-z]+): (\d\d)\.", line).groups() in pairs for line in lines)


@given(seed=st.integers(0, 10**6), sentences=st.booleans())
def test_a_noun_twin_table_shares_the_first_keys_noun_in_every_other_key(corpus, seed, sentences):
    """``twins="noun"``, hand-read from the text: every key after the first has the first's noun and an
    adjective of its own, so the words right before each value are the same in every fact."""
    table = corpus.recall_table(random.Random(seed), terse=True, near=True, sentences=sentences, twins="noun")
    facts = table.partition("\n\n")[0]
    keys = list(dict.fromkeys(re.findall(r" ([a-z]+)-([a-z]+)[: ]", facts)))
    assert 2 <= len(keys) <= 4
    (adj, noun), rest = keys[0], keys[1:]
    assert all(n == noun and a != adj for a, n in rest)
    assert len({a for a, _ in keys}) == len(keys)


def test_noun_twins_are_a_share_of_the_look_alike_tables_and_cost_no_draw_at_zero(corpus, tokenizer):
    args = dict(seed=0, step=3, batch_size=4, seq_len=256, terse_share=1.0, near_share=1.0)
    assert (corpus.warmup_batch(**args) == corpus.warmup_batch(**args, noun_share=0.0)).all()
    text = tokenizer.decode(corpus.warmup_batch(**args, noun_share=1.0)[0])
    for document in text.split("<|endoftext|>")[:-1]:  # the last one is cut at seq_len
        keys = re.findall(r" ([a-z]+)-([a-z]+): \d\d\.", document.partition("\n\n")[0])
        assert all(n == keys[0][1] for _, n in keys[1:]), document
    with pytest.raises(ValueError, match="share"):
        magic_keys(random.Random(0), 3, near=2, share="adverb")


@given(seed=st.integers(0, 10**6), near=st.booleans())
def test_a_sentence_table_restates_each_asked_fact_from_its_key_to_its_value(corpus, seed, near):
    """``sentences``, hand-read: the facts are needles of the corpus's family (each names one key and then its
    two-digit number), and each asked line is a stretch of one fact that starts at its key and ends at its
    number."""
    table = corpus.recall_table(random.Random(seed), terse=True, near=near, sentences=True)
    facts, _, asked = table.partition("\n\n")
    sentences = re.findall(r" ([^.]*?([a-z]+-[a-z]+)[^.]*? (\d\d)\.)", facts)
    assert 2 <= len(sentences) <= 4 and "".join(f" {s}" for s, _, _ in sentences) == facts
    value = {k: v for _, k, v in sentences}
    sentence = {k: s for s, k, _ in sentences}
    assert len(value) == len(sentences)
    family = corpus.config.phrasing
    templates = phrasings.NEEDLES[family]  # every fact one of its family's needles, capitalised
    assert all(
        any(sentence[k] == (t[0].upper() + t[1:]).format(key=k, value=value[k]) for t in templates)
        for k in value
    )
    for line in asked.strip("\n").split("\n"):
        key = re.match(r" ([a-z]+-[a-z]+) ", line).group(1)
        assert line.endswith(f" {value[key]}.") and line[1:-1] in sentence[key], line


def test_look_alike_tables_need_the_terse_form(corpus):
    with pytest.raises(ValueError, match="terse=True"):
        corpus.recall_table(random.Random(0), near=True)
    with pytest.raises(ValueError, match="terse=True"):
        corpus.recall_table(random.Random(0), sentences=True)


def test_warmup_batches_are_recall_tables_and_a_function_of_seed_and_step(corpus, tokenizer):
    a = corpus.warmup_batch(seed=0, step=3, batch_size=2, seq_len=128)
    assert (a == corpus.warmup_batch(seed=0, step=3, batch_size=2, seq_len=128)).all()
    assert not (a == corpus.warmup_batch(seed=0, step=4, batch_size=2, seq_len=128)).all()
    text = tokenizer.decode(a[0])
    for document in text.split("<|endoftext|>")[:-1]:  # the last one is cut at seq_len
        assert re.fullmatch(r"( [a-z]+ \d\d\.)+\n\n( [a-z]+ \d\d\.\n)+", document), document


def test_terse_warmup_tables_are_the_tasks_form(corpus, tokenizer):
    """``terse_share=1``: every table is ``" silver-owl: 63."`` records, every asked line one of them."""
    text = tokenizer.decode(
        corpus.warmup_batch(seed=0, step=3, batch_size=2, seq_len=256, terse_share=1.0)[0]
    )
    for document in text.split("<|endoftext|>")[:-1]:
        facts, _, asked = document.partition("\n\n")
        pairs = re.findall(r" ([a-z]+-[a-z]+): (\d\d)\.", facts)
        assert 2 <= len(pairs) <= 4 and "".join(f" {k}: {v}." for k, v in pairs) == facts, document
        assert all(re.fullmatch(r" ([a-z]+-[a-z]+): (\d\d)\.", line).groups() in pairs
                   for line in asked.strip("\n").split("\n"))  # fmt: skip
    mixed = tokenizer.decode(
        corpus.warmup_batch(seed=0, step=3, batch_size=4, seq_len=256, terse_share=0.5).flatten()
    )
    assert ": " in mixed and re.search(r" [a-z]+ \d\d\.", mixed)
