"""Dataset row -> DA prompt layout: the one place rollouts, SFT and eval turn an example into tokens."""

from __future__ import annotations

from collections.abc import Mapping

from rollouts.protocol import DEFAULT_LAYOUT, LayoutSettings, PromptLayout

DEFAULT_CHUNK_TOKENS = 2048


def layout_example(example: Mapping, tokenizer, settings: LayoutSettings = DEFAULT_LAYOUT) -> PromptLayout:
    """Lay out a schema row (``question``, ``documents``, optional ``chunk_tokens``) as a DA prompt.

    Each document is one magic chunk when the row was cut for its ``chunk_tokens`` (every generator and
    importer does that), so ``evidence_chunks`` index the layout's chunks directly. ``settings`` are the
    run's (or the export's): SFT, rollouts, eval and serving must lay out prompts the same way.
    """
    chunk_tokens = int(example.get("chunk_tokens") or DEFAULT_CHUNK_TOKENS)
    layout = settings.build(
        example["question"], list(example["documents"]), tokenizer, chunk_tokens=chunk_tokens
    )
    if layout.num_chunks != len(example["documents"]):
        raise ValueError(
            f"example {example.get('id', '?')!r}: {len(example['documents'])} documents became {layout.num_chunks} chunks; "
            f"a document is longer than chunk_tokens={chunk_tokens}, so evidence_chunks would point at the wrong chunks"
        )
    return layout


def gold_completion(example: Mapping, thinking: bool = False) -> str:
    """The row's protocol-correct trace in the requested form."""
    return example["gold_completion_thinking" if thinking else "gold_completion"]
