"""`heed protocol demo`: lay out a generated example, replay a protocol-correct completion, show the map.

The example is the paper's Acme question: the founding year sits in one magic chunk, the IPO year in
another, filler everywhere else. The replayed completion plans in ``global``, reads each fact under
``focus``, subtracts in ``local`` and answers. For every stretch of decoding steps the demo prints
which chunks the engine reads and how many KV tokens that costs against full causal attention.
"""

from __future__ import annotations

import random

from rich.console import Console
from rich.table import Table

from data.tokenizer import build_tokenizer, word_list
from rollouts.masks import KVShape, trace_completion
from rollouts.protocol import build_prompt, token_bytes_table


def acme_example(num_chunks: int, chunk_words: int, seed: int) -> tuple[str, list[str], int, int]:
    """Question, documents (one per chunk), and the chunk ids holding the two facts."""
    rng = random.Random(seed)
    words = word_list()
    founded, public = sorted(rng.sample(range(2, num_chunks + 1), 2))
    docs = []
    for chunk_id in range(1, num_chunks + 1):
        sentences = []
        while sum(len(s.split()) for s in sentences) < chunk_words:
            sentences.append(
                " ".join(rng.choice(words) for _ in range(rng.randint(6, 12))).capitalize() + "."
            )
        if chunk_id == founded:
            sentences.insert(rng.randrange(len(sentences)), "Acme Corp was founded in 2003 in San Jose.")
        if chunk_id == public:
            sentences.insert(rng.randrange(len(sentences)), "Acme Corp went public on the NYSE in 2011.")
        docs.append(" ".join(sentences))
    question = "How many years after Acme Corp was founded did it go public?"
    return question, docs, founded, public


def gold_completion(founded: int, public: int, thinking: bool) -> str:
    body = (
        f"<global>I need the founding year and the IPO year. Magic Chunk {founded} has the founding, "
        f"Magic Chunk {public} the listing.</global>\n"
        f'<focus magic_chunks="{founded}">Acme Corp was founded in 2003.</focus>\n'
        f'<focus magic_chunks="{public}">Acme Corp went public in 2011.</focus>\n'
        "<local>2011 - 2003 = 8 years.</local>\n"
    )
    if thinking:
        body = f"<think>\n{body}</think>\n"
    return body + "<answer>8 years</answer>"


def run_demo(
    num_chunks: int = 8, chunk_words: int = 150, block_size: int = 32, thinking: bool = False, seed: int = 0
) -> dict:
    console = Console()
    with console.status("building a local BPE tokenizer"):
        tokenizer = build_tokenizer()
    question, docs, founded, public = acme_example(num_chunks, chunk_words, seed)
    layout = build_prompt(
        question, docs, tokenizer, block_size=block_size, chunk_tokens=4 * chunk_words, thinking=thinking
    )
    completion = gold_completion(founded, public, thinking)
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    trace = trace_completion(layout, completion_ids, token_bytes_table(tokenizer))
    parsed = trace.parsed

    console.print(
        f"[bold]Prompt[/]: {layout.prompt_len} tokens, {layout.num_chunks} magic chunks "
        f"(facts in chunks {founded} and {public}), block size {block_size}, layout '{layout.style}'"
    )
    spans = ", ".join(f"{i}:[{s},{e})" for i, (s, e) in enumerate(layout.chunk_spans, start=1))
    console.print(f"[bold]Chunk spans[/] (tokens): {spans}")

    table = Table(title="Decoding steps: the state each token was predicted under and what its forward read")
    table.add_column("steps", no_wrap=True)
    table.add_column("mode", no_wrap=True)
    table.add_column("visible chunks", no_wrap=True)
    table.add_column("text")  # the one column that wraps when the console is narrow: numbers stay whole
    table.add_column("KV read (DA / vanilla)", justify="right", no_wrap=True)
    pred = trace.predicted_state
    pieces = [tokenizer.decode([t]) for t in completion_ids]
    start = 0
    for j in range(1, len(completion_ids) + 1):
        if j == len(completion_ids) or pred[j] != pred[start]:
            state = trace.states[pred[start]]
            vis = "all" if state.mode == "global" else (" ".join(map(str, state.chunks)) or "none")
            bar = "".join(
                "█" if state.mode == "global" or c in state.chunks else "·"
                for c in range(1, layout.num_chunks + 1)
            )
            text = "".join(pieces[start:j]).replace("\n", "⏎")
            da, van = int(trace.kv_tokens[start:j].sum()), int(trace.kv_tokens_vanilla[start:j].sum())
            table.add_row(f"{start}-{j - 1}", state.mode, f"{bar} {vis}", text[:60], f"{da:,} / {van:,}")
            start = j
    console.print(table)

    shape = KVShape(num_layers=28, num_kv_heads=8, head_dim=128, dtype_bytes=2)  # a Qwen3-8B-like KV shape
    da, vanilla = int(trace.kv_tokens.sum()), int(trace.kv_tokens_vanilla.sum())
    console.print(
        f"[bold]Answer[/]: {parsed.answer!r}; violations: {[v.kind for v in parsed.violations] or 'none'}\n"
        f"[bold]KV tokens read[/] over {len(completion_ids)} steps: DA {da:,} vs vanilla {vanilla:,} "
        f"-> saving {trace.saving:.1%} "
        f"({shape.kv_bytes(da) / 2**20:,.0f} MiB vs {shape.kv_bytes(vanilla) / 2**20:,.0f} MiB at a Qwen3-8B KV shape)"
    )
    return {
        "saving": trace.saving,
        "kv_da": da,
        "kv_vanilla": vanilla,
        "answer": parsed.answer,
        "violations": parsed.violations,
    }
