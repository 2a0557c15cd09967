"""Tiny Qwen3-architecture models built from a config, for CPU runs and tests (no hub downloads).

The default size comes from a measured sweep on 2 CPU cores: hidden 128, 4 layers, 4 query / 2 KV
heads, head_dim 32 (vLLM's CPU attention needs head_dim >= 32), intermediate 512 — about 1.1M
parameters plus embeddings. Larger tiny models learned no better per minute there.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TinyModelConfig:
    """Shape of a tiny Qwen3 decoder."""

    hidden_size: int = 128  # model width
    num_hidden_layers: int = 4
    num_attention_heads: int = 4  # query heads
    num_key_value_heads: int = 2  # KV heads (GQA)
    head_dim: int = 32  # vLLM's CPU attention needs >= 32
    intermediate_size: int = 512  # MLP width
    max_position_embeddings: int = 8192
    seed: int = 0  # initialization seed

    def __post_init__(self):
        if self.head_dim < 32:
            raise ValueError(f"head_dim={self.head_dim}: vLLM's CPU attention needs head_dim >= 32")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")


def build_tiny_model(tokenizer, config: TinyModelConfig | None = None, dtype: torch.dtype = torch.float32):
    """A randomly initialized ``Qwen3ForCausalLM`` sized for ``tokenizer`` (deterministic per seed)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = config or TinyModelConfig()
    hf_config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        intermediate_size=config.intermediate_size,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa",
        dtype=dtype,
    )
    with torch.random.fork_rng():
        torch.manual_seed(config.seed)
        model = Qwen3ForCausalLM(hf_config)
    return model.to(dtype)
