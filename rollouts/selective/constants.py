"""Selective Attention's names and numbers, torch-free: what configs validate against and checkpoints carry,
and the checks both the config and the code that computes run.

The modules that compute with them import them from here, and so does anything that must stay light (the
run config, export), so no value is written twice.
"""

SELECTIVE = "heed_selective"  # the Selective Attention implementation's registered name
STANDARD = "heed_standard"  # plain softmax attention that can report to an AttentionState (baselines)
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")  # their attention modules call the registry uniformly

# How a Selective Attention prefill (and its backward) runs: "dense" (S and F as [b, n, n], SDPA with -F as a
# bias; any device) or "triton" (rollouts/selective/kernel.py, F never materialised; CUDA)
KERNELS = ("dense", "triton")
# How the kernel choice reaches processes the trainer starts (rollout actors): their environment
KERNEL_ENV = "HEED_SELECTIVE_KERNEL"

DEFAULT_EPS = 0.1  # L_mem's weight; paper: "without further tuning"
DEFAULT_TAU = 1.0  # F at which a key counts as fully masked

MIN_BUDGET = 2  # <BOS>, which is never evicted, and the arriving token itself
CONFIG_KEY = "selective_budgets"  # where a checkpoint's config.json keeps its per-layer budgets
# What a budget search keeps within its tolerance of the full cache (rl/selective/budgets.py): the gold
# traces' loss, or the policy's own greedy accuracy (answers counted where the trace keeps the protocol)
BUDGET_JUDGES = ("loss", "accuracy")
# What gradient a training forward that replays evictions gives the tokens it evicted: "none" (evicted
# tokens are masked out, forward and backward: no signal to keep one) or "straight_through" (the forward
# stays evicted, the backward runs through the same attention without eviction, so a token evicted but
# needed has its F pushed down: rollouts/selective/attention.py)
EVICTION_GRADIENTS = ("none", "straight_through")


def check_accuracy_tolerance(tolerance: float) -> None:
    """The ``accuracy`` judge's tolerance is in accuracy points, 0 to 1.

    >>> check_accuracy_tolerance(1.5)
    Traceback (most recent call last):
    ValueError: the accuracy judge's tolerance is in accuracy points, 0 to 1; got 1.5
    """
    if not 0.0 <= tolerance <= 1.0:
        raise ValueError(f"the accuracy judge's tolerance is in accuracy points, 0 to 1; got {tolerance}")
