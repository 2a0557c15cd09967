"""What travels with a DA request through an engine, and the driver-side builder that validates it.

A DA request is an ordinary vLLM request whose ``SamplingParams.extra_args`` carry three flat keys
(flat and JSON-typed, so that ``vllm serve`` clients can send them as ``vllm_xargs``)::

    "heed_da":   PromptLayout.to_wire() as a dict, or the same dict as JSON text
    "heed_mode": "da" (mask on) | "da-nm" (DA prompt, no mask: the paper's control) | "vanilla"
    "heed_id":   optional; the key under which the engine keeps the request's KV-read accounting

Token ids never travel twice: the layout is rebuilt from the wire and the request's own prompt
(:meth:`PromptLayout.from_wire`), so a layout that does not fit its prompt is rejected, not applied.
The wire's ``version`` is the DA protocol version the engine parses the completion with (any of
``PROTOCOL_VERSIONS``: a client serving a v1 export sends v1 layouts and gets v1 parsing and masks).
Requests without ``heed_da`` and ``vanilla`` requests run as stock vLLM runs them.

Prefix caching: the KV a ``da`` request writes for its generated tokens is computed under its mask,
so it must never be served to a request that would read it under another mask. That KV is a
deterministic function of (prompt, layout, generated tokens so far) — the mask is recomputed from
them — so a salt derived from the layout and mode (:func:`da_cache_salt`) is exactly enough:
identical requests (a GRPO group) still share their prompt blocks, nothing else can hit theirs.
The plugin enforces the salt at submission; :func:`da_request` sets it up front.

This module imports no vLLM at import time: the reference engine and the trainer use it too.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollouts.protocol.layout import LayoutError, PromptLayout
from rollouts.trajectory import ROLLOUT_MODES

LAYOUT_KEY = "heed_da"
MODE_KEY = "heed_mode"
ID_KEY = "heed_id"
MASKED_MODES = ("da",)  # modes whose attention the plugin rewrites
TRACKED_MODES = ("da", "da-nm")  # modes whose protocol the engine parses while decoding


@dataclass(frozen=True)
class DASpec:
    """A validated DA request: its layout, mode and accounting key."""

    layout: PromptLayout
    mode: str
    key: str | None = None

    @property
    def masked(self) -> bool:
        return self.mode in MASKED_MODES


def read_da_args(extra_args: dict[str, Any] | None, prompt_token_ids: Sequence[int]) -> DASpec | None:
    """The request's DA spec, ``None`` for a request that runs unmodified; ``LayoutError`` if invalid.

    ``vanilla`` requests return ``None``: they carry nothing the engine must act on.
    """
    if not extra_args or LAYOUT_KEY not in extra_args:
        if extra_args and extra_args.get(MODE_KEY) in TRACKED_MODES:
            raise LayoutError(
                f"{MODE_KEY}={extra_args[MODE_KEY]!r} needs a layout in extra_args[{LAYOUT_KEY!r}]"
            )
        return None
    mode = extra_args.get(MODE_KEY, "da")
    if mode not in ROLLOUT_MODES:
        raise LayoutError(f"{MODE_KEY} must be one of {ROLLOUT_MODES}, got {mode!r}")
    if mode == "vanilla":
        return None
    wire = extra_args[LAYOUT_KEY]
    if isinstance(wire, str):
        try:
            wire = json.loads(wire)
        except ValueError as err:
            raise LayoutError(f"{LAYOUT_KEY} is not valid JSON: {err}") from None
        except RecursionError:  # hostile nesting ("[[[[..."): reject, never a 500
            raise LayoutError(f"{LAYOUT_KEY} is nested too deeply to be a DA layout") from None
    key = extra_args.get(ID_KEY)
    if key is not None and not isinstance(key, str):
        raise LayoutError(f"{ID_KEY} must be a string, got {type(key).__name__}")
    try:
        layout = PromptLayout.from_wire(wire, prompt_token_ids)
    except LayoutError:
        raise
    except (TypeError, ValueError) as err:  # hostile shapes: spans of strings, nested junk, ...
        raise LayoutError(f"malformed DA layout: {err}") from None
    return DASpec(layout, mode, key)


def da_cache_salt(spec: DASpec) -> str:
    """Prefix-cache salt for a masked request: a digest of its layout and mode (see module doc)."""
    wire = json.dumps(spec.layout.to_wire(), sort_keys=True, separators=(",", ":"))
    return "heed-da:" + hashlib.sha256(f"{spec.mode}|{wire}".encode()).hexdigest()[:32]


def da_extra_args(layout: PromptLayout, mode: str = "da", key: str | None = None) -> dict[str, Any]:
    """``extra_args`` for a request in ``mode`` (empty for ``vanilla``)."""
    if mode not in ROLLOUT_MODES:
        raise ValueError(f"mode must be one of {ROLLOUT_MODES}, got {mode!r}")
    if mode == "vanilla":
        return {}
    args: dict[str, Any] = {LAYOUT_KEY: layout.to_wire(), MODE_KEY: mode}
    if key is not None:
        args[ID_KEY] = key
    return args


def da_request(
    layout: PromptLayout,
    mode: str = "da",
    *,
    prompt_token_ids: Sequence[int] | None = None,
    key: str | None = None,
    extra_args: dict[str, Any] | None = None,
    **sampling: Any,
):
    """Build ``(prompt, SamplingParams)`` for one request, validated on the driver.

    Args:
        layout: the DA layout; its ``input_ids`` are the prompt unless ``prompt_token_ids`` is given.
        mode: ``"da"``, ``"da-nm"`` or ``"vanilla"`` (stock vLLM, nothing attached).
        prompt_token_ids: the prompt actually sent; the layout must fit it (``LayoutError`` if not).
        key: accounting key (default: a fresh uuid for tracked modes).
        extra_args: further ``extra_args`` (e.g. forced tokens); DA keys take precedence.
        **sampling: ``SamplingParams`` fields (``max_tokens``, ``temperature``, ``logprobs``, ...).

    Returns a ``TokensPrompt`` dict (with the DA ``cache_salt`` in ``da`` mode) and the params.
    """
    from vllm import SamplingParams

    ids = list(layout.input_ids if prompt_token_ids is None else prompt_token_ids)
    if mode in TRACKED_MODES and key is None:
        key = uuid.uuid4().hex
    args = {**(extra_args or {}), **da_extra_args(layout, mode, key)}
    spec = read_da_args(args, ids)  # the same check the engine runs at submission
    prompt: dict[str, Any] = {"prompt_token_ids": ids}
    if spec is not None and spec.masked:
        prompt["cache_salt"] = da_cache_salt(spec)
    if sampling.get("n", 1) != 1 and spec is not None:
        raise ValueError("DA requests take n=1 (accounting is per request); submit n copies instead")
    return prompt, SamplingParams(extra_args=args or None, **sampling)
