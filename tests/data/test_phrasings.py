"""Phrasing families (data/phrasings.py): each template states its fact so a reader of the text alone finds
it, families share no template, and RULER's family is RULER's one sentence."""

import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from data import phrasings
from data.tasks import make_task
from data.traces import render_trace
from rollouts.protocol import parse_completion

from .helpers import generate
from .solvers import niah_twohop


def test_families_share_no_template():
    for table in (phrasings.NEEDLES, phrasings.LINKS, phrasings.QUESTIONS):
        seen = {}
        for family, templates in table.items():
            for template in templates:
                if family != "ruler":  # ruler's sentence is one of train's on purpose (the same world)
                    assert seen.setdefault(template, family) == family, f"{template!r} in two families"
        assert not set(table["heldout"]) & set(table["train"])


def test_the_varied_family_is_composed_of_many_wordings_none_of_heldouts():
    # heldout's own words (those no other family uses) never reach a training row through `varied`
    def words(templates):
        return {w for t in templates for w in re.findall(r"[a-z]+", t.lower())}

    for table in (phrasings.NEEDLES, phrasings.LINKS, phrasings.QUESTIONS):
        own = words(table["heldout"]) - words(table["train"] + table["ruler"])
        assert own and not own & words(table["varied"]), own & words(table["varied"])
    assert len(phrasings.NEEDLES["varied"]) >= 100 and len(phrasings.QUESTIONS["varied"]) >= 20
    assert len(phrasings.LINKS["varied"]) >= 12
    # every varied needle restates from its key to its value, what a `keyed` focus copies
    for template in phrasings.NEEDLES["varied"]:
        fact = template.format(key="silver-owl", value=63)
        assert phrasings.restated(fact, "silver-owl", 63).startswith("silver-owl"), fact
        assert phrasings.restated(fact, "silver-owl", 63).endswith(" 63"), fact


@pytest.mark.parametrize("family", ["ruler", "train", "varied"])
def test_a_training_familys_link_and_needle_fit_one_chunk_with_the_longest_keys(tokenizer, family):
    # A two-hop link names two keys and must fit one 27-token chunk's room for needles (data/packing.py,
    # CHUNK_FILL): with the lexicon's longest keys, every template at once.
    from data.packing import CHUNK_FILL
    from data.tasks.names import _KEY_NOUNS, lexicon

    def tokens(text):
        return len(tokenizer(" " + text, add_special_tokens=False)["input_ids"])

    words = lexicon()
    keys = [f"{a}-{n}" for a in words["adjective"] for c in _KEY_NOUNS for n in words[c]]
    longest = sorted(keys, key=tokens)[-6:]
    room = CHUNK_FILL * 27
    for template in phrasings.LINKS[family]:
        worst = max(tokens(template.format(key=a, other=b)) for a in longest for b in longest if a != b)
        assert worst <= room, (template, worst)
    for template in phrasings.NEEDLES[family]:
        assert max(tokens(template.format(key=k, value=99)) for k in longest) <= room, template


@given(st.sampled_from(phrasings.FAMILIES), st.integers(0, 10**6), st.integers(10, 99))
def test_a_needle_names_its_key_and_ends_with_its_value_after_a_space(family, seed, value):
    text = phrasings.needle(random.Random(seed), family, "silver-owl", value)
    assert re.search(r"(^| )silver-owl\b", text) and text.endswith(f" {value}.")
    assert text[0].isupper() or text.startswith("silver-owl")  # a key opening a sentence keeps its case
    link = phrasings.link(random.Random(seed), family, "silver-owl", "red-fox")
    assert "silver-owl" in link and "red-fox" in link and not re.search(r"\d", link)
    question = phrasings.question(random.Random(seed), family, "silver-owl")
    assert "silver-owl" in question and question.endswith(("?", "."))


def test_an_unknown_family_is_refused_by_the_task():
    with pytest.raises(Exception, match="phrasing"):
        make_task("niah_single", {"phrasing": "poetic"})


def test_ruler_family_keeps_rulers_sentence_and_draws_nothing_more(tokenizer):
    default = generate(tokenizer, "niah_single", 300, params={"value_digits": 2})
    ruler = generate(tokenizer, "niah_single", 300, params={"value_digits": 2, "phrasing": "ruler"})
    assert default.documents == ruler.documents and default.question == ruler.question
    assert ruler.needles[0].startswith("One of the special magic numbers for ")


@pytest.mark.parametrize("family", ["train", "heldout", "varied"])
def test_a_family_words_the_needles_and_question_of_its_own_templates(tokenizer, family):
    example = generate(tokenizer, "niah_multikey", 600, params={"value_digits": 2, "phrasing": family})
    key = re.findall(r"[a-z]+-[a-z]+", example.question)[0]
    templates = [t.format(key=key, value=example.answers[0]) for t in phrasings.NEEDLES[family]]
    assert example.needles[0] in templates
    assert example.question in [t.format(key=key) for t in phrasings.QUESTIONS[family]]


@given(seed=st.integers(0, 10**6), target=st.sampled_from([160, 250, 520]))
def test_two_hop_link_comes_first_and_a_reader_of_the_text_alone_answers(tokenizer, seed, target):
    from data.filler import TokenCounter

    task = make_task("niah_twohop", {"num_distractors": 2})
    draft = task.draft(random.Random(seed), TokenCounter(tokenizer), target, 27, ood=False)
    link_chunk, fact_chunk = draft.evidence_chunks
    assert link_chunk < fact_chunk
    assert (
        draft.needles[0] in draft.documents[link_chunk - 1]
        and draft.needles[1] in draft.documents[fact_chunk - 1]
    )
    assert niah_twohop(draft.question, "\n".join(draft.documents)) == draft.answers
    # the look-alikes: half the distractor keys share a word with the linked key
    linked = set(draft.meta["linked_key"].split("-"))
    assert any(linked & set(k.split("-")) for k in draft.meta["distractor_keys"])
    # the keyed chain: the link's chunk, copying the linked key; then every chunk holding a needle
    # of the linked key or a look-alike (found here in the text), the linked needle's words on to the answer
    trace = render_trace(draft.plan, random.Random(0), False, "terse", strategy="keyed")
    parsed = parse_completion(trace, len(draft.documents), version=4)
    assert (parsed.answer, parsed.violations) == (draft.answers[0], [])
    first, second = [s for s in parsed.segments if s.mode == "focus"]
    facts = [draft.needles[1], *draft.meta["distractor_needles"]]
    holding = tuple(sorted(i for i, doc in enumerate(draft.documents, 1) if any(f in doc for f in facts)))
    assert (first.chunks, second.chunks) == ((link_chunk,), holding)
    link, fact = re.findall(r"<focus[^>]*> (.*?)</focus>", trace)
    assert link == draft.meta["linked_key"]
    assert (
        fact.startswith(draft.meta["linked_key"])
        and fact.endswith(draft.answers[0])
        and fact in draft.needles[1]
    )


def test_two_hop_in_the_heldout_family_asks_in_its_words(tokenizer):
    from data.filler import TokenCounter

    task = make_task("niah_twohop", {"phrasing": "heldout"})
    draft = task.draft(random.Random(0), TokenCounter(tokenizer), 250, 27, ood=False)
    key = draft.meta["keys"][0]
    assert draft.question in [t.format(key=key) for t in phrasings.QUESTIONS["heldout"]]
