"""KV bytes from KV tokens (docs/ARCHITECTURE.md, contract 7: accounting is exact).

``bytes = tokens x layers x 2 (K and V) x kv_heads x head_dim x dtype bytes``. Token counts come from
:mod:`rollouts.masks.visibility`; this module only knows the model's KV shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "fp32": 4,
    "float16": 2,
    "half": 2,
    "fp16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float8": 1,
    "fp8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


@dataclass(frozen=True)
class KVShape:
    """The per-token KV footprint of a model: layers that keep KV, KV heads, head size, element size."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int = 2

    def __post_init__(self):
        for name in ("num_layers", "num_kv_heads", "head_dim", "dtype_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"KVShape.{name} must be >= 1, got {getattr(self, name)}")

    @property
    def bytes_per_token(self) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes(self, tokens):
        """KV bytes for ``tokens`` tokens read (or held) in every layer; works on ints and arrays."""
        return tokens * self.bytes_per_token

    @classmethod
    def from_config(cls, config, dtype: str | torch.dtype | None = None) -> KVShape:
        """From a HF model config (``num_hidden_layers``, ``num_key_value_heads``, ``head_dim``).

        ``dtype`` defaults to the config's ``torch_dtype``/``dtype`` (bf16 if absent), i.e. the KV
        cache dtype vLLM uses unless told otherwise.
        """
        text = getattr(config, "text_config", None) or config
        heads = text.num_attention_heads
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        dtype = dtype or getattr(text, "dtype", None) or getattr(text, "torch_dtype", None) or "bfloat16"
        return cls(text.num_hidden_layers, kv_heads, head_dim, dtype_bytes(dtype))


def dtype_bytes(dtype: str | torch.dtype) -> int:
    """Bytes per element of a dtype given as ``torch.bfloat16`` or a name such as ``"bf16"``."""
    if isinstance(dtype, torch.dtype):
        return torch.empty((), dtype=dtype).element_size()
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPE_BYTES:
        raise ValueError(f"unknown KV dtype {dtype!r}; use one of {sorted(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[name]
