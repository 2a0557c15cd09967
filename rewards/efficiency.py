"""KV-read efficiency: the fraction of KV-cache reading a completion saved against vanilla attention.

``saving = 1 - attended / vanilla`` over every decoding step of one completion, where *attended* is what
the engine read (block-rounded KV tokens, docs/ARCHITECTURE.md, contract 7: accounting is exact; from
``CompletionTrace.kv_tokens`` or the trajectory's per-layer counts) and *vanilla* is the same sequence
under full causal attention (``CompletionTrace.kv_tokens_vanilla``). A ``global``-only completion reads
exactly what vanilla reads and saves 0; no completion can save more than 1. Savings are measured in one of three units:

- ``tokens``: KV tokens (summed over layers when layers differ).
- ``bytes``: ``tokens x bytes per token per layer`` (:class:`~rollouts.masks.KVShape`). Every layer that
  keeps KV has the same footprint, so this ratio equals the token ratio; absolute bytes are reported by
  :func:`kv_bytes`.
- ``time``: the paper's roofline decoding time (§5.4, Tab. 3: MFU 40 %, MBU 70 %, a B200 with 8 TB/s of
  HBM and 2.25 dense bf16 PFLOPS). Each operation of a decoding step takes
  ``max(FLOPs / (MFU x peak FLOPs), bytes / (MBU x bandwidth))`` (its roofline), and a step takes the
  **sum** over its operations: the matmuls (``2 x matmul_params`` FLOPs per token, compute-bound: in the
  paper's saturated large-batch regime weight reads are amortized over the batch and left out) plus
  attention (``4 x query_heads x head_dim`` FLOPs and the KV bytes of every token read, in every layer).
  A sum, not one max over the whole step, because the kernels of a step run one after another and do not
  overlap; it is also how the paper reads its own numbers: it splits vanilla decoding time into shares
  (global KV reads are 73 % / 86 % of it, matmuls and local reads the rest) and says the mask shrinks only
  the KV share, which is only meaningful when the parts add. Decode attention is memory-bound by a wide
  margin (8 FLOPs per byte for a GQA group of 8 in bf16 against a ridge of about 160 here), so the time
  saving is the byte saving diluted by the matmul time, which DA does not change. Vanilla is the same
  sequence under causal attention (contract 7), not a separate vanilla generation as in the
  paper, so both sides have the same steps and the same matmul time. Local attention (sliding-window or
  linear layers of hybrid models) is not modeled: Heed's models keep full KV in every layer.

Selective Attention eviction (``Trajectory.kv_tokens_per_layer``, ``[n, layers]``): each layer's count
already leaves out the tokens evicted from that layer, so evicted tokens count as not read, layer by
layer; vanilla reads every token in every layer.

**The reward's efficiency** (:func:`budget_efficiency`) is not this saving. The saving is relative to
the completion's own steps, so appending cheap text (more steps under ``local`` or a focus) raises it
while nothing useful is read: GRPO found exactly that door. The reward measures the completion's
absolute reads against a per-example budget instead: ``clip(1 - attended / budget, 0, 1)``, where the
budget is what vanilla causal attention reads over ``reference_steps`` decoding steps from the same
prompt (:func:`~rollouts.masks.causal_kv_tokens`, the accounting's own vanilla count), in the same unit.
Every step reads at least one KV token, so writing more never raises it; reading less (fewer steps, or
steps that hide chunks) always does. :func:`kv_saving` stays the paper's number for dashboards and evals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rollouts.masks import KVShape, causal_kv_tokens
from rollouts.trajectory import Trajectory

from .settings import above, setting, within

EFFICIENCY_UNITS = ("tokens", "bytes", "time")


@dataclass(frozen=True)
class Roofline:
    """An accelerator and how well decoding uses it (defaults: the paper's B200, MFU 40 %, MBU 70 %).

    Each field is declared here once: default, help and range (:mod:`rewards.settings`). ``RewardConfig``
    exposes them under the same names as keys of the ``rewards:`` section and checks what a run config
    gives them.
    """

    hbm_bandwidth: float = setting(
        8e12, "Roofline: memory bandwidth in bytes/s (default: a B200's 8 TB/s).", above(0)
    )
    peak_flops: float = setting(
        2.25e15, "Roofline: peak dense FLOP/s (default: a B200's 2.25 bf16 PFLOPS).", above(0)
    )
    mfu: float = setting(
        0.4, "Roofline: model FLOPs utilization in (0, 1] (the paper's 40%).", within(0, 1, open_low=True)
    )
    mbu: float = setting(
        0.7,
        "Roofline: memory bandwidth utilization in (0, 1] (the paper's 70%).",
        within(0, 1, open_low=True),
    )

    def seconds(self, flops, nbytes):
        """Roofline time of one operation (works on arrays): bound by compute or by memory traffic."""
        return np.maximum(flops / (self.mfu * self.peak_flops), nbytes / (self.mbu * self.hbm_bandwidth))


@dataclass(frozen=True)
class DecodeCost:
    """What a model's decoding step costs: its KV footprint, attention width and matmul size.

    ``matmul_params`` is the number of weights each generated token multiplies (the active parameters;
    0 leaves the matmuls out, and the time saving equals the byte saving).
    """

    kv: KVShape
    query_heads: int
    matmul_params: int = 0

    def __post_init__(self):
        if self.query_heads < 1:
            raise ValueError(f"DecodeCost.query_heads must be >= 1, got {self.query_heads}")
        if self.matmul_params < 0:
            raise ValueError(f"DecodeCost.matmul_params must be >= 0, got {self.matmul_params}")

    @property
    def bytes_per_layer_token(self) -> float:
        return self.kv.bytes_per_token / self.kv.num_layers

    @property
    def flops_per_layer_token(self) -> int:
        """Attention FLOPs per KV token read in one layer: ``q.K`` and ``p.V`` for every query head."""
        return 4 * self.query_heads * self.kv.head_dim

    @classmethod
    def from_config(cls, config, dtype=None, matmul_params: int = 0) -> DecodeCost:
        """From a HF model config; ``dtype`` as in :meth:`KVShape.from_config`."""
        text = getattr(config, "text_config", None) or config
        return cls(KVShape.from_config(config, dtype), text.num_attention_heads, matmul_params)


@dataclass(frozen=True)
class KVReads:
    """KV tokens read per decoding step by the policy and by vanilla causal attention.

    ``read`` is ``[n]`` (the same count in every layer) or ``[n, layers]`` (per layer, SA eviction);
    ``vanilla`` is ``[n]``, the count every layer reads under causal attention. ``prompt_len`` is the
    prompt the steps decode from (``None``: unknown), which :func:`budget_efficiency` needs.
    """

    read: np.ndarray  # [n] or [n, layers]
    vanilla: np.ndarray  # [n]
    prompt_len: int | None = None

    def __post_init__(self):
        if self.prompt_len is not None and (isinstance(self.prompt_len, bool) or int(self.prompt_len) < 1):
            raise ValueError(f"prompt_len must be a positive number of tokens, got {self.prompt_len!r}")
        read, vanilla = np.asarray(self.read), np.asarray(self.vanilla)
        if vanilla.ndim != 1 or read.ndim not in (1, 2) or len(read) != len(vanilla):
            raise ValueError(
                f"KV reads must be [n] or [n, layers] against vanilla [n]; got {read.shape} and {vanilla.shape}"
            )
        if read.ndim == 2 and read.shape[1] == 0:
            raise ValueError("per-layer KV reads have no layers")
        if not len(vanilla):
            raise ValueError("no decoding steps")
        for name, a in (("read", read), ("vanilla", vanilla)):
            # dtype kinds, not np.issubdtype: this runs once per completion and the latter costs microseconds
            kind = a.dtype.kind
            if (
                kind not in "iuf"
                or (kind == "f" and not np.isfinite(a).all())
                or (kind != "u" and a.min() < 0)
            ):
                raise ValueError(f"KV {name} counts must be finite and >= 0")
        object.__setattr__(self, "read", read)
        object.__setattr__(self, "vanilla", vanilla)
        if self.prompt_len is not None:
            object.__setattr__(self, "prompt_len", int(self.prompt_len))

    @property
    def layers(self) -> int | None:
        """Layer count of per-layer reads, ``None`` when every layer reads the same."""
        return self.read.shape[1] if self.read.ndim == 2 else None

    def layer_tokens(self, num_layers: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """``([n], [n])`` KV tokens read per step summed over layers, by the policy and by vanilla.

        ``num_layers`` counts the layers for ``[n]`` reads; per-layer reads bring their own.
        """
        if self.read.ndim == 2:
            if num_layers not in (1, self.read.shape[1]):
                raise ValueError(
                    f"per-layer KV reads have {self.read.shape[1]} layers but the model keeps KV in {num_layers}"
                )
            return self.read.sum(axis=1), self.vanilla * self.read.shape[1]
        return self.read * num_layers, self.vanilla * num_layers

    @classmethod
    def from_trajectory(cls, trajectory: Trajectory) -> KVReads:
        """What the engine read in the trajectory's mode (per layer when SA eviction is active)."""
        read = trajectory.kv_tokens_per_layer
        read = trajectory.kv_tokens_read if read is None else read
        return cls(read, trajectory.trace.kv_tokens_vanilla, trajectory.layout.prompt_len)

    @classmethod
    def causal(cls, prompt_len: int, steps: int, layers: int | None = None) -> KVReads:
        """Vanilla causal attention over ``steps`` decoding steps from a ``prompt_len``-token prompt
        (``layers``: as per-layer reads, for comparing with per-layer reads)."""
        vanilla = causal_kv_tokens(prompt_len, steps)
        read = vanilla if layers is None else np.repeat(vanilla[:, None], layers, axis=1)
        return cls(read, vanilla, prompt_len)


def kv_bytes(reads: KVReads, kv: KVShape) -> tuple[int, int]:
    """KV bytes read over the completion, by the policy and by vanilla."""
    read, vanilla = reads.layer_tokens(kv.num_layers)
    per_layer_token = kv.bytes_per_token // kv.num_layers
    return int(read.sum()) * per_layer_token, int(vanilla.sum()) * per_layer_token


def decode_seconds(reads: KVReads, cost: DecodeCost, roofline: Roofline = Roofline()) -> tuple[float, float]:
    """Roofline decoding time of the completion (seconds, summed over steps), policy and vanilla.

    >>> from rollouts.masks import KVShape, causal_kv_tokens
    >>> cost = DecodeCost(KVShape(num_layers=1, num_kv_heads=1, head_dim=128), query_heads=8)
    >>> reads = KVReads(np.array([10_000, 0]), np.array([10_000, 10_001]))
    >>> [f"{t * 1e9:.0f} ns" for t in decode_seconds(reads, cost)]  # 512 B/token at 5.6 TB/s
    ['914 ns', '1829 ns']
    """
    read, vanilla = reads.layer_tokens(cost.kv.num_layers)
    matmul = roofline.seconds(2.0 * cost.matmul_params, 0.0) * len(read)

    def attention(tokens: np.ndarray) -> float:
        flops = tokens * float(cost.flops_per_layer_token)
        return float(roofline.seconds(flops, tokens * cost.bytes_per_layer_token).sum())

    return float(matmul + attention(read)), float(matmul + attention(vanilla))


def kv_saving(
    reads: KVReads, unit: str = "tokens", cost: DecodeCost | None = None, roofline: Roofline = Roofline()
) -> float:
    """``1 - attended / vanilla`` in ``unit``; ``bytes`` and ``time`` need the model's ``cost``.

    >>> kv_saving(KVReads(np.array([100, 21, 22, 60]), np.array([100, 101, 102, 103])))
    0.5
    """
    attended, full = read_amounts(reads, unit, cost, roofline)
    if full <= 0:
        raise ValueError("vanilla attention read nothing")
    return float(1.0 - attended / full)


def budget_efficiency(
    reads: KVReads,
    reference_steps: int,
    unit: str = "tokens",
    cost: DecodeCost | None = None,
    roofline: Roofline = Roofline(),
) -> float:
    """``clip(1 - attended / budget, 0, 1)``: the completion's reads against what vanilla attention reads
    over ``reference_steps`` steps from the same prompt (``reads.prompt_len``), in ``unit``.

    >>> reads = KVReads(np.array([100, 21, 22, 60]), np.array([100, 101, 102, 103]), prompt_len=100)
    >>> round(budget_efficiency(reads, reference_steps=4), 3)  # the same 406-token budget: kv_saving's 0.5
    0.5
    >>> padded = KVReads(np.array([100, 21, 22, 60, 23, 24]), np.arange(100, 106), prompt_len=100)
    >>> round(kv_saving(padded), 3), round(budget_efficiency(padded, reference_steps=4), 3)  # two cheap steps more
    (0.593, 0.384)
    """
    if reads.prompt_len is None:
        raise ValueError("the budget efficiency needs the prompt length the completion decoded from")
    if reference_steps < 1:
        raise ValueError(f"reference_steps must be >= 1, got {reference_steps}")
    attended, _ = read_amounts(reads, unit, cost, roofline)
    budget, _ = read_amounts(
        KVReads.causal(reads.prompt_len, reference_steps, reads.layers), unit, cost, roofline
    )
    return float(min(max(1.0 - attended / budget, 0.0), 1.0))


def read_amounts(
    reads: KVReads, unit: str = "tokens", cost: DecodeCost | None = None, roofline: Roofline = Roofline()
) -> tuple[float, float]:
    """``(attended, vanilla)`` over the completion in ``unit``: KV tokens (summed over layers), KV bytes or
    roofline seconds; ``bytes`` and ``time`` need the model's ``cost``."""
    if unit == "tokens":
        read, vanilla = reads.layer_tokens()
        return float(read.sum()), float(vanilla.sum())
    if unit in ("bytes", "time"):
        if cost is None:
            raise ValueError(f"a KV saving in {unit} needs the model's DecodeCost")
        amounts = kv_bytes(reads, cost.kv) if unit == "bytes" else decode_seconds(reads, cost, roofline)
        return float(amounts[0]), float(amounts[1])
    raise ValueError(f"unit must be one of {EFFICIENCY_UNITS}, got {unit!r}")
