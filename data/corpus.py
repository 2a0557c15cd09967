"""The pretraining corpus of Heed's base model: the synthetic world of the tasks, as plain text, no DA tags.

A base model must have learned to read before post-training asks it to read less. Qwen3 learned from the
web; Heed's base learns from documents this module writes over the same word list, filler and needle
facts the tasks use, so everything a task asks about is something the base has read about:

- **Contexts** drawn by the task generators themselves (``niah_single``, ``niah_multikey`` with one to three
  look-alike keys, ``niah_twohop``), 3 to ``max_chunks`` chunks, their facts worded by one phrasing family
  (``phrasing``, data/phrasings.py: ``train`` for the shipped base); the ``heldout`` family never appears, so
  an eval on it measures reading.
- **Questions with their answers**, in three layouts: ``compact`` (the tokens of the DA prompt Heed's default
  lays out, ``Magic Chunk N:`` headers and block padding included, then a plain answer that may name the
  chunk it comes from), ``plain`` (the documents as one text, then up to four question/answer pairs, about
  the asked key and about the look-alikes), ``chat`` (the context and question as a user turn of the chat
  template, the answer as the assistant's).
- **Lookup tables** (``lookup_share``): 2 to 24 facts about look-alike keys (some of them links to another
  key's number), then questions about them in any order, each answered: dense associative recall, the skill
  a model must have before a needle in a long context can teach it anything (one answer in hundreds of
  tokens is too rare a signal for a small model to find retrieval from).
- **Filler** alone (``filler_share``): sentences, so the base models the language around the facts.

Batches are a pure function of (seed, step): :func:`batch` draws documents from ``Random(seed, step)`` and
packs their tokens, each document closed by the tokenizer's ``<|endoftext|>``, into ``batch_size`` rows of
``seq_len`` tokens, dropping what does not fit. A resumed run therefore sees the same batches as an
uninterrupted one, with no data file to keep. :meth:`Corpus.warmup_batch` packs only the easiest recall
tables (``recall_table``), what a pretraining run starts on. What is left out: documents longer than
``seq_len`` (the context lengths are sized below it) and any curriculum over lengths.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass, field

import torch

from . import phrasings
from .filler import TokenCounter, filler_sentence
from .packing import CHUNK_FILL
from .tasks import make_task
from .tasks.names import magic_keys

LAYOUTS = ("compact", "plain", "chat")
_NUMBER = re.compile(r" (\d+)\.$")  # every fact ends with its value


@dataclass(frozen=True)
class CorpusConfig:
    """What the corpus draws. Weights need not sum to one."""

    chunk_tokens: int = 27  # as the tiny configs' data.build.chunk_tokens: one 32-token block per chunk
    min_chunks: int = 3
    max_chunks: int = 24  # twice the default's largest trained count (11), and more
    value_digits: int = 2  # the default's magic numbers: one token each
    tasks: dict[str, float] = field(default_factory=lambda: {"single": 1.0, "multikey": 2.0, "twohop": 2.0})
    layouts: dict[str, float] = field(default_factory=lambda: {"compact": 2.0, "plain": 1.0, "chat": 1.0})
    lookup_share: float = 0.5  # documents that are lookup tables (module docstring)
    filler_share: float = 0.05  # documents of filler alone
    phrasing: str = "train"  # the family contexts and questions are worded in (never "heldout" for training)

    def __post_init__(self):
        if not 1 <= self.min_chunks <= self.max_chunks:
            raise ValueError(
                f"corpus chunks: need 1 <= min_chunks <= max_chunks, got {self.min_chunks}, {self.max_chunks}"
            )
        if self.phrasing not in phrasings.FAMILIES or self.phrasing == "heldout":
            trained = [f for f in phrasings.FAMILIES if f != "heldout"]
            raise ValueError(
                f"corpus phrasing {self.phrasing!r}: choose one of {trained} (heldout is for evals)"
            )
        for name, table, known in (("tasks", self.tasks, _TASKS), ("layouts", self.layouts, LAYOUTS)):
            unknown = sorted(set(table) - set(known))
            if unknown or not any(w > 0 for w in table.values()):
                raise ValueError(f"corpus {name}: {unknown or 'no positive weight'}; known: {sorted(known)}")


# corpus task -> (generator name, its params but the distractor count, distractor counts to draw from)
_TASKS = {
    "single": ("niah_single", (0,)),
    "multikey": ("niah_multikey", (1, 2, 3)),
    "twohop": ("niah_twohop", (0, 1, 2)),
}


@dataclass
class QA:
    question: str
    answer: str  # the value
    chunk: int  # 1-based chunk of the fact that holds it
    hop: tuple[str, str, int] | None = None  # two-hop: (asked key, linked key, the link's chunk)


@dataclass
class Context:
    documents: list[str]
    asked: QA
    more: list[QA]  # questions about the other keys of the context


class Corpus:
    """Draws documents of the corpus and packs them into token batches (module docstring)."""

    def __init__(self, tokenizer, config: CorpusConfig | None = None):
        self.tokenizer = tokenizer
        self.config = config or CorpusConfig()
        self.count = TokenCounter(tokenizer)
        self.separator = tokenizer.convert_tokens_to_ids("<|endoftext|>")
        self.eos = tokenizer.eos_token_id
        self._generators = {}

    def batch(self, seed: int, step: int, batch_size: int, seq_len: int) -> torch.Tensor:
        """``[batch_size, seq_len]`` token ids of step ``step`` (the same for the same arguments)."""
        return self._pack(random.Random(f"{seed}/{step}"), self.document, batch_size, seq_len)

    def warmup_batch(
        self,
        seed: int,
        step: int,
        batch_size: int,
        seq_len: int,
        terse_share: float = 0.0,
        near_share: float = 0.0,
        sentence_share: float = 0.0,
        noun_share: float = 0.0,
    ) -> torch.Tensor:
        """A batch of :meth:`recall_table` documents only, ``terse_share`` of them in the tasks' terse form,
        ``near_share`` of those with look-alike keys and ``sentence_share`` of them (drawn apart) with their
        facts in sentences, ``noun_share`` of the look-alike ones with every look-alike sharing the noun
        (``magic_keys(share="noun")``, the harder twin): what a pretraining run starts on (its
        ``recall_warmup``) so that recall forms before the corpus's longer forms need it."""

        def table(r: random.Random) -> list[int]:
            terse = terse_share > 0 and r.random() < terse_share  # no draw when 0: the same batches
            near = terse and near_share > 0 and r.random() < near_share
            sentences = terse and sentence_share > 0 and r.random() < sentence_share
            twins = "noun" if near and noun_share > 0 and r.random() < noun_share else "either"
            return self._ids(self.recall_table(r, terse=terse, near=near, sentences=sentences, twins=twins))

        return self._pack(random.Random(f"{seed}/warmup/{step}"), table, batch_size, seq_len)

    def _pack(self, rng: random.Random, document, batch_size: int, seq_len: int) -> torch.Tensor:
        rows = []
        for _ in range(batch_size):
            row: list[int] = []
            while len(row) < seq_len:
                row += document(rng) + [self.separator]
            rows.append(row[:seq_len])
        return torch.tensor(rows, dtype=torch.long)

    def document(self, rng: random.Random) -> list[int]:
        """One document's token ids: filler, or a context with its questions in a drawn layout."""
        cfg = self.config
        draw = rng.random()
        if draw < cfg.filler_share:
            sentences = " ".join(filler_sentence(rng) for _ in range(rng.randint(4, 40)))
            return self._ids(sentences)
        if draw < cfg.filler_share + cfg.lookup_share:
            return self._ids(self.lookup(rng))
        context = self.context(rng)
        layout = _draw(rng, cfg.layouts)
        return getattr(self, f"_{layout}")(rng, context)

    def context(self, rng: random.Random, phrasing: str | None = None, kind: str | None = None) -> Context:
        """A context and its questions: of task ``kind`` (default: drawn by the config's weights), worded in
        the ``phrasing`` family (default: the config's)."""
        cfg = self.config
        kind = kind or _draw(rng, cfg.tasks)
        name, distractors = _TASKS[kind]
        n_chunks = rng.randint(max(cfg.min_chunks, 2 + max(distractors)), cfg.max_chunks)
        target = round((n_chunks - 0.5) * CHUNK_FILL * cfg.chunk_tokens)
        params = {"value_digits": cfg.value_digits, "phrasing": phrasing or cfg.phrasing}
        if kind != "single":
            params["num_distractors"] = rng.choice(distractors)
        task = self._task(name, params)
        draft = task.draft(rng, self.count, target, cfg.chunk_tokens, False)
        meta = draft.meta
        if kind == "twohop":  # needles: the link, then the linked key's fact
            link, facts = draft.needles[0], [draft.needles[1], *meta["distractor_needles"]]
            keys = [meta["linked_key"], *meta["distractor_keys"]]
        else:
            link, facts, keys = (
                None,
                [*draft.needles, *meta["distractor_needles"]],
                [*meta["keys"], *meta["distractor_keys"]],
            )
        chunk = {text: _chunk_of(draft.documents, text) for text in filter(None, [link, *facts])}
        hop = (meta["keys"][0], keys[0], chunk[link]) if link else None
        asked = QA(draft.question, draft.answers[0], chunk[facts[0]], hop)
        family = phrasing or cfg.phrasing
        more = [QA(phrasings.question(rng, family, k), _value(f), chunk[f]) for k, f in zip(keys, facts)]
        rng.shuffle(more)
        return Context(draft.documents, asked, more)

    def lookup(self, rng: random.Random) -> str:
        """A lookup table: facts about 2-6 keys (half the tables) or 7-24 (in half the tables a third of them near misses of another;
        about one in five a link to an earlier key's number), then as many questions in any order, each
        answered. A third of the tables are terse records (``silver-owl: 63.``), the rest sentences."""
        family, digits = self.config.phrasing, self.config.value_digits
        n = (
            rng.randint(2, 6) if rng.random() < 0.5 else rng.randint(7, 24)
        )  # recall forms on short tables first
        keys = magic_keys(rng, n, near=n // 3 if rng.random() < 0.5 else 0)
        rng.shuffle(keys)
        terse = rng.random() < 1 / 3
        values: dict[str, str] = {}
        facts = []
        for i, key in enumerate(keys):
            if i and rng.random() < 0.2:
                other = rng.choice(keys[:i])
                values[key] = values[other]
                facts.append(
                    f" {key}: see {other}." if terse else " " + phrasings.link(rng, family, key, other)
                )
            else:
                values[key] = str(rng.randint(10 ** (digits - 1), 10**digits - 1))
                facts.append(
                    f" {key}: {values[key]}."
                    if terse
                    else " " + phrasings.needle(rng, family, key, values[key])
                )
        asked = [rng.choice(keys) for _ in range(n)]
        if terse:
            lines = [f" {k}: {values[k]}." for k in asked]  # after a space, as in the facts: the same tokens
        elif rng.random() < 0.5:
            lines = [f"Question: {phrasings.question(rng, family, k)}\nAnswer: {values[k]}." for k in asked]
        else:
            lines = [f"The magic number of {k} is {values[k]}." for k in asked]
        return "".join(facts) + "\n\n" + "\n".join(lines) + "\n"

    def recall_table(
        self,
        rng: random.Random,
        terse: bool = False,
        near: bool = False,
        sentences: bool = False,
        twins: str = "either",
    ) -> str:
        """The easiest associative recall: 2-4 words of the word list (one token each after a space), each
        followed at once by its number (``" owl 63."``), then the words asked again in any order with their
        numbers. An induction head solves it by matching one token back; a small model learns that here in
        a few million tokens, and the binding carries over to the ``terse`` form, the tasks' keys and a colon
        (``" silver-owl: 63."``), which it does not learn from the start in that budget (bench/BENCHMARKS.md,
        "Copying is learned, binding is not"). ``near`` (terse only): every key after the first shares a
        word with it (``silver-owl`` beside ``silver-fox``), multikey's look-alikes, which a model that binds
        unrelated keys still confuses; ``twins="noun"``: the word shared is always the noun. ``sentences``
        (terse only): the facts are the tasks' needles in the corpus's phrasing family
        (``" One of the special magic numbers for silver-owl is: 63."``) and each is restated from its key
        to its value (``" silver-owl is: 63."``): the key is then several tokens before its value, as in the
        documents, where a binding learned on ``key: value`` weakens."""
        if (near or sentences) and not terse:
            raise ValueError(
                "recall_table(near=True or sentences=True) needs terse=True: they are the tasks' keys"
            )
        digits = self.config.value_digits
        n = rng.randint(2, 4)
        if terse:
            keys = magic_keys(rng, n, near=n - 1 if near else 0, share=twins)
        else:
            keys = rng.sample(_word_list(), n)
        numbers = rng.sample(range(10 ** (digits - 1), 10**digits), n)
        value = dict(zip(keys, map(str, numbers), strict=True))
        if sentences:
            fact = {k: phrasings.needle(rng, self.config.phrasing, k, value[k]) for k in keys}
            facts = "".join(f" {fact[k]}" for k in keys)
            asked = [f" {phrasings.restated(fact[k], k, value[k])}." for k in rng.choices(keys, k=n)]
            return facts + "\n\n" + "\n".join(asked) + "\n"
        sep = ": " if terse else " "
        facts = "".join(f" {k}{sep}{value[k]}." for k in keys)
        return facts + "\n\n" + "\n".join(f" {k}{sep}{value[k]}." for k in rng.choices(keys, k=n)) + "\n"

    # -- layouts ---------------------------------------------------------------------------------------

    def prompt(self, context: Context) -> list[int]:
        """The token ids of ``context``'s question laid out as Heed's default prompts it (compact, no
        protocol instructions): the ``compact`` layout's text before its answer, and what the card asks."""
        from rollouts.protocol import build_prompt

        layout = build_prompt(
            context.asked.question, context.documents, self.tokenizer, block_size=32,
            chunk_tokens=self.config.chunk_tokens, style="compact", instructions=False,
        )  # fmt: skip
        return list(layout.input_ids)

    def _compact(self, rng: random.Random, context: Context) -> list[int]:
        return self.prompt(context) + self._ids(_answer(rng, context.asked, cite=True)) + [self.eos]

    def _plain(self, rng: random.Random, context: Context) -> list[int]:
        pairs = [context.asked, *context.more][: rng.randint(1, 4)]
        rng.shuffle(pairs)
        text = " ".join(context.documents) + "\n\n"
        text += "".join(f"Question: {qa.question}\nAnswer: {_answer(rng, qa, cite=False)}\n" for qa in pairs)
        return self._ids(text)

    def _chat(self, rng: random.Random, context: Context) -> list[int]:
        messages = [
            {"role": "user", "content": "\n".join(context.documents) + "\n\n" + context.asked.question},
            {"role": "assistant", "content": _answer(rng, context.asked, cite=False)},
        ]
        return self._ids(self.tokenizer.apply_chat_template(messages, tokenize=False))

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _task(self, name: str, params: dict):
        key = (name, tuple(sorted(params.items())))
        if key not in self._generators:
            self._generators[key] = make_task(name, params)
        return self._generators[key]


def _answer(rng: random.Random, qa: QA, cite: bool) -> str:
    """A plain-text answer: the value after a space (the token the document holds), worded one of a few
    ways; ``cite``: may name the chunk(s) it was read from (the compact layout has chunk headers)."""
    value = qa.answer
    if cite and qa.hop and rng.random() < 0.7:
        key, other, link_chunk = qa.hop
        return f"Magic Chunk {link_chunk} says {key} uses the number of {other}. Magic Chunk {qa.chunk} gives it: {value}."
    if cite and rng.random() < 0.6:
        return rng.choice(
            ("Magic Chunk {c} says {v}.", "It is in Magic Chunk {c}: {v}.", "Magic Chunk {c}: {v}.")
        ).format(c=qa.chunk, v=value)
    return rng.choice(("The number is {v}.", "It is {v}.", "The magic number is {v}.")).format(v=value)


@functools.cache
def _word_list() -> list[str]:
    from .tokenizer import word_list

    return sorted(set(word_list()))


def _value(fact: str) -> str:
    return _NUMBER.search(fact).group(1)


def _chunk_of(documents: list[str], text: str) -> int:
    return next(i for i, doc in enumerate(documents, 1) if text in doc)


def _draw(rng: random.Random, weights: dict[str, float]) -> str:
    names = sorted(n for n, w in weights.items() if w > 0)
    return rng.choices(names, weights=[weights[n] for n in names])[0]
