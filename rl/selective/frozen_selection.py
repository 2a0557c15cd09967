"""Keeping a Selective Attention base's selection while the rest of the model post-trains.

Every layer's selection logits are head 0's ``q . k`` (rollouts/selective/attention.py ``head0_logits``): the
rows of ``q_proj`` that make head 0's query and the rows of ``k_proj`` that make its key-value group's key.
SFT over a base pretrained with Selective Attention learns the new tags and the Declarative Attention mask
with the selection faded out (``selective.selection_from_step``); when it fades in, what head 0 masks is
what the model has just learned to read, and the LM loss's gradient can push a layer's head-0 logits below
the ReLU everywhere within a few dozen steps at SFT's learning rate. The ReLU then passes no gradient back
(neither the LM loss nor L_mem can revive it), and the layer's eviction rule is a tie at ``F = 0``: a
sliding window, whose budget is the distance from the needle to the end of the prompt
(bench/BENCHMARKS.md, "What decides each eviction"). :func:`frozen_selection` keeps those rows at the
base's values instead, so the model learns to read under the selection the base pretrained with.

What it leaves out: the rows' inputs still train (the embeddings, ``input_layernorm``, and Qwen3's
``q_norm``/``k_norm``, which every head shares), so the selection can still move, more slowly; and under
grouped-query attention head 0's key rows are its whole group's, so the other heads of that group keep
their keys too. The hooks act on whole parameters: under DeepSpeed ZeRO-3, which partitions them, this is
not checked.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch stays unimported here: run configs check check_weight_decay when they load
    import torch


def check_weight_decay(weight_decay: float, name: str = "weight_decay") -> None:
    """The frozen rows get no gradient, but AdamW's decoupled weight decay would still shrink them, so a
    frozen selection needs ``name`` (the optimizer's weight decay) at 0.

    >>> check_weight_decay(0.0)
    >>> check_weight_decay(0.01, "sft.weight_decay")
    Traceback (most recent call last):
    ...
    ValueError: the selection rows are frozen by giving them no gradient, and AdamW's weight decay (0.01) would still shrink them: set sft.weight_decay to 0
    """
    if weight_decay:
        raise ValueError(
            "the selection rows are frozen by giving them no gradient, and AdamW's weight decay "
            f"({weight_decay}) would still shrink them: set {name} to 0"
        )


def selection_rows(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter, int]]:
    """``(name, parameter, rows)`` for each projection that makes head 0's selection logits: in every
    attention module (one with ``q_proj``, ``k_proj`` and ``head_dim``), the first ``head_dim`` output rows
    of ``q_proj`` (head 0's query) and of ``k_proj`` (its group's key), biases included where present."""
    found = []
    for name, module in model.named_modules():
        if not all(hasattr(module, a) for a in ("q_proj", "k_proj", "head_dim")):
            continue
        for proj in ("q_proj", "k_proj"):
            for pname, param in getattr(module, proj).named_parameters(recurse=False):
                found.append((f"{name}.{proj}.{pname}", param, module.head_dim))
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no attention module with q_proj, k_proj and head_dim: the selection "
            "rows cannot be found (Selective Attention supports Qwen3- and Llama-style attention)"
        )
    return found


@contextlib.contextmanager
def frozen_selection(model: torch.nn.Module) -> Iterator[list[str]]:
    """While open, every gradient reaching a selection row (:func:`selection_rows`) is zeroed, so an
    optimizer without weight decay leaves those rows as they are (Adam's update of a weight whose every
    gradient was 0 is 0); yields the names of the frozen parameters. The other rows of the same
    projections train as before.

    >>> import torch
    >>> from transformers import Qwen3Config, Qwen3ForCausalLM
    >>> model = Qwen3ForCausalLM(Qwen3Config(vocab_size=32, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8))
    >>> with frozen_selection(model) as names:
    ...     model(torch.tensor([[1, 2, 3, 4]]), labels=torch.tensor([[1, 2, 3, 4]])).loss.backward()
    >>> names
    ['model.layers.0.self_attn.q_proj.weight', 'model.layers.0.self_attn.k_proj.weight']
    >>> q = model.model.layers[0].self_attn.q_proj.weight.grad
    >>> bool(q[:8].eq(0).all()), bool(q[8:].ne(0).any())  # head 0's query rows, head 1's
    (True, True)
    """
    handles, names = [], []
    for name, param, rows in selection_rows(model):

        def zero_rows(grad: torch.Tensor, rows: int = rows) -> torch.Tensor:  # [rows_out, ...]
            grad = grad.clone()
            grad[:rows] = 0
            return grad

        handles.append(param.register_hook(zero_rows))
        names.append(name)
    try:
        yield names
    finally:
        for handle in handles:
            handle.remove()
