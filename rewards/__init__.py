"""Rewards for DA post-training: accuracy, gated KV-read efficiency, protocol compliance, coverage.

- ``accuracy``: per-example graders (RULER string match with a precision check, exact, F1, numeric,
  math-verify) of the parsed ``<answer>``; ``ruler_grade`` is RULER's own metric, for evals.
- ``efficiency``: KV reads in tokens, bytes or roofline decoding time: the paper's saving
  ``1 - attended / vanilla`` and the reward's ``1 - attended / budget`` (writing more never raises it).
- ``compliance``: protocol compliance and evidence coverage from the parser's result.
- ``composite``: the weighted, gated total with every component and counted reasons, over
  trajectories; ``config``: its documented, validated configuration, every setting declared once
  (``settings``: default, help and range on one field; the roofline's and the graders' by their owners).
- ``trl_rewards``: the same as TRL reward functions (``prompts, completions, **columns``).
- ``terms``: a reward term added in one place (``register_term``): the total, TRL's functions, the
  metrics, the dashboards and ``heed eval``'s table take it from there (``shown``).
"""

from .accuracy import METRICS, Grade, GraderOptions, Ungradable, grade, ruler_grade
from .compliance import compliance, evidence_coverage, narrowed_chunks
from .composite import (
    RewardBatch,
    RewardBreakdown,
    score_parsed,
    score_trajectories,
    score_trajectory,
)
from .config import RewardConfig
from .efficiency import (
    EFFICIENCY_UNITS,
    DecodeCost,
    KVReads,
    Roofline,
    budget_efficiency,
    decode_seconds,
    kv_bytes,
    kv_saving,
)
from .terms import COMPONENTS, RewardTerm, register_term, registered, shown, term_names, unregister_term
from .trl_rewards import (
    ComponentReward,
    DAReward,
    accuracy_reward,
    completion_text,
    compliance_reward,
    coverage_reward,
    da_reward,
    efficiency_reward,
    trl_reward_functions,
)

__all__ = [
    "COMPONENTS",
    "EFFICIENCY_UNITS",
    "METRICS",
    "ComponentReward",
    "DAReward",
    "DecodeCost",
    "Grade",
    "GraderOptions",
    "KVReads",
    "RewardBatch",
    "RewardBreakdown",
    "RewardConfig",
    "RewardTerm",
    "Roofline",
    "Ungradable",
    "accuracy_reward",
    "budget_efficiency",
    "completion_text",
    "compliance",
    "compliance_reward",
    "coverage_reward",
    "da_reward",
    "decode_seconds",
    "efficiency_reward",
    "evidence_coverage",
    "grade",
    "kv_bytes",
    "kv_saving",
    "narrowed_chunks",
    "register_term",
    "registered",
    "ruler_grade",
    "score_parsed",
    "score_trajectories",
    "score_trajectory",
    "shown",
    "term_names",
    "trl_reward_functions",
    "unregister_term",
]
