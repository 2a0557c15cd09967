"""The trajectory record: one prompt, one completion, and everything measured while generating it.

Rollout engines produce it, rewards score it, the trainer learns from it, dashboards draw it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rollouts.masks.visibility import CompletionTrace
from rollouts.protocol.layout import PromptLayout
from rollouts.protocol.parser import ParsedCompletion

ROLLOUT_MODES = ("da", "da-nm", "vanilla")  # mask on / DA prompt without mask (the paper's control) / plain
FINISH_REASONS = ("stop", "length", "error")


@dataclass
class Trajectory:
    """A generated completion with its accounting.

    ``trace`` holds the per-step DA visibility and KV reads (block-rounded); in ``da-nm`` and
    ``vanilla`` modes it is still computed (what DA *would* have read) but the engine read
    ``trace.kv_tokens_vanilla``. ``kv_tokens_per_layer`` is set when Selective Attention eviction
    makes layers differ.
    """

    example: dict[str, Any]  # the dataset row (question, answers, task, evidence_chunks, ...)
    layout: PromptLayout
    completion_ids: list[int]  # [n]
    completion_text: str
    parsed: ParsedCompletion
    trace: CompletionTrace
    mode: str = "da"
    finish_reason: str = "stop"
    logprobs: list[float] | None = None  # [n] sampled-token log-probs from the engine
    kv_tokens_per_layer: np.ndarray | None = None  # [n, layers] when SA eviction is active
    wall_time_s: float = 0.0
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.mode not in ROLLOUT_MODES:
            raise ValueError(f"mode must be one of {ROLLOUT_MODES}, got {self.mode!r}")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")

    @property
    def protocol_version(self) -> int:
        """The DA protocol version the completion was parsed with (its layout's; ``heed.json`` records the
        version a policy was trained on, and the run directory's trajectory records carry this one)."""
        return self.layout.protocol_version

    @property
    def kv_tokens_read(self) -> np.ndarray:
        """``[n]`` KV tokens the engine actually read per step (per layer): under Selective Attention eviction
        the mean over layers of what each layer held, else the DA trace in ``da`` mode and the full causal
        reads otherwise."""
        if self.kv_tokens_per_layer is not None:
            return np.asarray(self.kv_tokens_per_layer).mean(axis=1)
        return self.trace.kv_tokens if self.mode == "da" else self.trace.kv_tokens_vanilla

    @property
    def kv_tokens_by_layer(self) -> list[int] | None:
        """``[L]`` KV tokens each layer read over every decoding step under Selective Attention eviction
        (``None`` without it); their mean is ``kv_tokens_read.sum()``."""
        per_layer = self._per_layer()
        return None if per_layer is None else per_layer.sum(axis=0).tolist()

    @property
    def kv_peak_by_layer(self) -> list[int] | None:
        """``[L]`` the most KV tokens one decoding step read in each layer under eviction: what the layer held,
        at most its budget (``None`` without eviction or without a decoding step)."""
        per_layer = self._per_layer()
        return None if per_layer is None or not len(per_layer) else per_layer.max(axis=0).tolist()

    def _per_layer(self) -> np.ndarray | None:
        """``kv_tokens_per_layer`` as an ``[n, L]`` integer array (``None`` without eviction)."""
        if self.kv_tokens_per_layer is None:
            return None
        per_layer = np.asarray(self.kv_tokens_per_layer, dtype=np.int64)
        return per_layer if per_layer.ndim == 2 else None
