"""What Heed's base model can do before post-training, measured for its model card, and the card itself.

The check asks the base questions about contexts it never saw, in the layout Heed's default prompts use
(``compact``: ``Magic Chunk N:`` headers, the question before and after), with no DA tags: the base answers
in plain text, greedy, and an answer counts when its last number is the value asked for (the corpus's
answers end with the value, whether or not they name the chunk first). Per task of the corpus and per
phrasing family: the corpus's own wording (``train`` for the shipped base) and ``heldout``, wording it never
saw.
"""

from __future__ import annotations

import contextlib
import random
import re

import torch

_NUMBER = re.compile(r"\d+")
TASKS = ("single", "multikey", "twohop")


@torch.no_grad()
def answering(model, tokenizer, corpus, examples: int, seed: int, max_new_tokens: int = 40) -> dict:
    """``{"<task>/<family>": {"accuracy", "n"}}`` over ``examples`` fresh contexts each (greedy)."""
    model.eval()
    results = {}
    for task in TASKS:
        for family in (corpus.config.phrasing, "heldout"):
            rng = random.Random(f"{seed}/{task}/{family}")
            contexts = [corpus.context(rng, phrasing=family, kind=task) for _ in range(examples)]
            right = 0
            for context in contexts:
                ids = torch.tensor([corpus.prompt(context)])
                with _state_bound(model):
                    out = model.generate(
                        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                        do_sample=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                    )  # fmt: skip
                numbers = _NUMBER.findall(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
                right += bool(numbers) and numbers[-1] == context.asked.answer
            results[f"{task}/{family}"] = {"accuracy": round(right / examples, 4), "n": examples}
    return results


def _state_bound(model):
    """A Selective Attention model decodes over its KV cache with one state per generation; others as is."""
    if not getattr(model.config, "selective_attention", False):
        return contextlib.nullcontext()
    from rollouts.selective.attention import bind_state

    return bind_state(model)


def write_card(path, results: dict) -> None:
    """The model card: what the base is, the command that made it, what it has seen and can do."""
    cfg = results["config"]
    model = cfg["model"]
    rows = "\n".join(
        f"| {key.split('/')[0]} | {key.split('/')[1]} | {v['accuracy']:.3f} | {v['n']} |"
        for key, v in results["answering"].items()
    )
    selective = cfg.get("selective") or {}
    start, ramp = selective.get("selection_from_step", 0), selective.get("selection_ramp_steps", 0)
    since = (
        f"with its selection faded in over steps {start:,}-{start + ramp:,}"
        if start or ramp
        else "from its first step"
    )
    selective_line = (
        f"\n\nA Selective Attention model {since} (head 0's logits mask context for every head, no new "
        f"parameters), trained with L_mem at eps {selective['memory_eps']}, tau {selective['memory_tau']} (arXiv "
        "2410.02703): it loads as one once `rollouts.selective.attention.register_selective_attention()` has run."
        if selective.get("enabled")
        else ""
    )
    path.write_text(f"""# {results["name"]}

Heed's own base model: a {results["parameters"] / 1e6:.2f}M-parameter Qwen3 (hidden {model["hidden_size"]},
{model["num_hidden_layers"]} layers, {model["num_attention_heads"]} query / {model["num_key_value_heads"]} KV heads of
{model["head_dim"]}, MLP {model["intermediate_size"]}, tied embeddings) trained from scratch on the corpus Heed generates
(`data/corpus.py`): documents over Heed's word list with magic-number facts, look-alike keys and two-hop links,
and questions with their answers in three layouts. No DA tags: it is a plain language model of that world, to
be post-trained as a user post-trains Qwen3 (the tags become new tokens, rl/added_tokens.py).{selective_line}

Made by `{results["command"]}` (seed {cfg["seed"]}), bf16 weights.

- steps {results["steps"]}, batch {cfg["batch_size"]} x {cfg["seq_len"]} tokens: **{results["tokens_seen"]:,} tokens seen**
- training time {results["train_seconds"]} s
- **held-out loss {results["heldout_loss"]:.4f}** nats per token ({cfg["eval_batches"]} batches of the corpus
  never trained on, measured on the bf16 weights)
- `model.safetensors` sha256 `{results["sha256"]}`

What it answers before post-training (greedy, plain text, no tags; fresh contexts of {cfg["corpus"]["min_chunks"]}-{cfg["corpus"]["max_chunks"]}
chunks in the default's compact layout; right when the answer's last number is the value; `heldout`: wordings the
corpus never uses, data/phrasings.py):

| task | phrasing | accuracy | n |
|---|---|---|---|
{rows}
""")
