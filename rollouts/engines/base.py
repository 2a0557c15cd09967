"""What every rollout engine takes and returns: a request in, a Trajectory with its accounting out.

Both engines (vLLM with the plugin, the torch reference) turn a :class:`RolloutRequest` into a
:class:`~rollouts.trajectory.Trajectory` through :func:`build_trajectory`, so text, parse and trace
are derived the same way from the token ids whatever produced them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rollouts.masks.visibility import trace_completion
from rollouts.protocol.layout import PromptLayout
from rollouts.protocol.tokens import TokenTextStream
from rollouts.trajectory import ROLLOUT_MODES, Trajectory


@dataclass(frozen=True)
class RolloutRequest:
    """One completion to generate.

    ``forced_ids`` teacher-forces the start of the completion: the engine emits these tokens
    (through its decode path, under the mode's mask) and reports the model's log-prob of each; with
    ``max_tokens`` larger, decoding then continues as usual. ``max_tokens`` defaults to the forced
    length, or 256 when nothing is forced. EOS does not stop a forced prefix; a forced completion whose last
    token is EOS finishes with ``finish_reason="stop"`` (as if the model had stopped there).
    """

    layout: PromptLayout
    mode: str = "da"
    example: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    forced_ids: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.mode not in ROLLOUT_MODES:
            raise ValueError(f"mode must be one of {ROLLOUT_MODES}, got {self.mode!r}")
        if self.forced_ids is not None:
            if not self.forced_ids:
                raise ValueError("forced_ids must not be empty; use None to sample")
            object.__setattr__(self, "forced_ids", tuple(int(t) for t in self.forced_ids))
        if self.num_tokens < max(1, len(self.forced_ids or ())):
            raise ValueError(f"max_tokens={self.max_tokens} is below the forced length or < 1")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")

    @property
    def num_tokens(self) -> int:
        """The most tokens this request can generate."""
        if self.max_tokens is not None:
            return self.max_tokens
        return len(self.forced_ids) if self.forced_ids is not None else 256

    @property
    def num_forced(self) -> int:
        return len(self.forced_ids) if self.forced_ids is not None else 0


def decode_text(token_ids: Sequence[int], token_table: list[bytes]) -> str:
    """The completion text exactly as the engine's parser read it (special tokens are empty)."""
    stream = TokenTextStream(token_table)
    return "".join(stream(int(t)) for t in token_ids) + stream.flush()


def build_trajectory(
    request: RolloutRequest,
    completion_ids: Sequence[int],
    logprobs: Sequence[float] | None,
    token_table: list[bytes],
    *,
    finish_reason: str = "stop",
    wall_time_s: float = 0.0,
    error: str | None = None,
    extra: dict[str, Any] | None = None,
    kv_tokens_per_layer: Sequence[Sequence[int]] | None = None,
) -> Trajectory:
    """A Trajectory for ``completion_ids``: text, protocol parse and per-step visibility trace.

    ``kv_tokens_per_layer`` ``[n][L]``: under Selective Attention eviction, the keys each layer read in the
    forward that predicted each token (cut to the completion's length)."""
    layout = request.layout
    ids = [int(t) for t in completion_ids]
    text = decode_text(ids, token_table)
    trace = trace_completion(layout, ids, token_table)
    trace.parsed.text = text
    return Trajectory(
        example=request.example,
        layout=layout,
        completion_ids=ids,
        completion_text=text,
        parsed=trace.parsed,
        trace=trace,
        mode=request.mode,
        finish_reason=finish_reason,
        logprobs=None if logprobs is None else [float(x) for x in logprobs],
        wall_time_s=wall_time_s,
        error=error,
        extra=dict(extra or {}),
        kv_tokens_per_layer=None
        if kv_tokens_per_layer is None
        else np.asarray(kv_tokens_per_layer, dtype=np.int64)[: len(ids)],
    )
