"""The reward's configuration: component weights, the gates on efficiency, grader and roofline knobs.

Every field carries its help text (``dataclasses.fields(RewardConfig)[i].metadata["help"]``) and is
validated on construction; an error names the field and says what it accepts. Run configs give the
fields as a flat mapping (:meth:`RewardConfig.from_dict`), which rejects unknown keys.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from rollouts.protocol import PROTOCOL_VERSION, PROTOCOL_VERSIONS

from .accuracy import GraderOptions
from .efficiency import EFFICIENCY_UNITS, Roofline

EFFICIENCY_REFERENCES = ("budget", "completion")


@dataclass(frozen=True)
class RewardConfig:
    """How the composite DA reward is put together (see ``rewards/composite.py``).

    ``total = accuracy_weight * accuracy + efficiency_weight * efficiency (gated)
    + compliance_weight * compliance + coverage_weight * coverage`` (coverage counts 0 when unknown).
    Efficiency is measured against a per-example budget by default (``efficiency_reference``).
    """

    accuracy_weight: float = field(
        default=1.0, metadata={"help": "Weight of answer accuracy (the graded <answer>, in [0, 1])."}
    )
    efficiency_weight: float = field(
        default=0.5,
        metadata={
            "help": "Weight of the gated KV-read efficiency (in [0, 1], see efficiency_reference). Keep it "
            "below accuracy_weight so that reading less never pays more than being right."
        },
    )
    compliance_weight: float = field(
        default=0.25,
        metadata={
            "help": "Weight of protocol compliance (1 when there are no parser violations, at least one focus "
            "where the example has evidence, and exactly one answer; else 0)."
        },
    )
    coverage_weight: float = field(
        default=0.25,
        metadata={
            "help": "Weight of evidence coverage (fraction of the evidence chunks some focus made visible); "
            "examples without known evidence chunks get 0 from this term."
        },
    )
    efficiency_min_accuracy: float = field(
        default=1.0,
        metadata={
            "help": "Gate: the efficiency term pays only when accuracy >= this (1.0: only fully correct "
            "answers; 0.0 turns the gate off). A wrong answer must not earn anything for skipping reading."
        },
    )
    efficiency_requires_compliance: bool = field(
        default=True,
        metadata={
            "help": "Gate: the efficiency term pays only for protocol-compliant completions, so a correct guess "
            "made without focusing on the evidence (e.g. <local> throughout) earns no saving."
        },
    )
    efficiency_min_coverage: float = field(
        default=1.0,
        metadata={
            "help": "Gate: the efficiency term pays only when evidence coverage >= this (examples without "
            "known evidence pass; 0.0 turns the gate off). 1.0: a right answer reached without focusing "
            "on every evidence chunk is a guess, and its saving came from not reading what it needed; "
            "paying it would make a short guess outscore the honest trace (tests/rewards/test_reward_hacking.py)."
        },
    )
    efficiency_reference: str = field(
        default="budget",
        metadata={
            "help": "What the efficiency term measures reads against. 'budget': clip(1 - attended / budget, "
            "0, 1) with budget = what vanilla causal attention reads over efficiency_reference_tokens "
            "decoding steps from the same prompt, so writing more never raises it. 'completion': the "
            "paper's saving 1 - attended/vanilla over the completion's own steps, which appending cheap "
            "(local or focus) text raises: a door GRPO finds. Dashboards and evals report that saving "
            "(kv_saving) either way."
        },
    )
    efficiency_reference_tokens: int = field(
        default=128,
        metadata={
            "help": "Decoding steps of the 'budget' reference (>= 1): about the length of a good completion "
            "for the task (gold traces of the embedded default are 72-85 tokens). A completion that reads "
            "more than vanilla does over this many steps earns no efficiency; thinking traces need more."
        },
    )
    efficiency_unit: str = field(
        default="tokens",
        metadata={
            "help": "What the saving is measured in: 'tokens' (block-rounded KV tokens), 'bytes' (KV bytes; "
            "the same ratio as tokens, needs the model's DecodeCost) or 'time' (roofline decoding time, "
            "needs the model's DecodeCost)."
        },
    )
    hbm_bandwidth: float = field(
        default=8e12, metadata={"help": "Roofline: memory bandwidth in bytes/s (default: a B200's 8 TB/s)."}
    )
    peak_flops: float = field(
        default=2.25e15,
        metadata={"help": "Roofline: peak dense FLOP/s (default: a B200's 2.25 bf16 PFLOPS)."},
    )
    mfu: float = field(
        default=0.4, metadata={"help": "Roofline: model FLOPs utilization in (0, 1] (the paper's 40%)."}
    )
    mbu: float = field(
        default=0.7, metadata={"help": "Roofline: memory bandwidth utilization in (0, 1] (the paper's 70%)."}
    )
    numeric_rel_tol: float = field(
        default=1e-6, metadata={"help": "Numeric grader: relative tolerance of math.isclose (>= 0)."}
    )
    numeric_abs_tol: float = field(
        default=1e-9, metadata={"help": "Numeric grader: absolute tolerance of math.isclose (>= 0)."}
    )
    answer_length_factor: float = field(
        default=4.0,
        metadata={
            "help": "Length guard (every grader): an answer longer than answer_length_factor x the reference "
            "length + answer_length_slack characters scores 0, so stuffing candidates into one answer "
            "cannot win substring matches (>= 1)."
        },
    )
    answer_length_slack: int = field(
        default=32,
        metadata={"help": "Length guard: characters allowed on top of the scaled reference (>= 0)."},
    )
    strict_string_match: bool = field(
        default=True,
        metadata={
            "help": "string_match_all / string_match_part pay precision too: an answer holding a candidate "
            "that is not a reference (a number when the references are numbers, an upper-case identifier "
            "when they are variable names) scores 0 (reason accuracy/extra_candidates); see "
            "rewards/accuracy.py. false: RULER's recall-only match. Evals report RULER's own metric beside "
            "the reward's accuracy either way (accuracy_ruler)."
        },
    )
    math_timeout_s: int = field(
        default=5,
        metadata={
            "help": "math-verify time limit per parse/compare in seconds (main thread only; 0 disables it)."
        },
    )
    thinking: bool = field(
        default=False,
        metadata={
            "help": "Parse completions given as text in thinking mode (<think> tags are read). Trajectories "
            "and layouts carry their own flag."
        },
    )
    protocol_version: int = field(
        default=PROTOCOL_VERSION,
        metadata={
            "help": f"DA protocol version completions given as text are parsed with (one of {PROTOCOL_VERSIONS}; "
            "2 reads a started but broken tag such as </focus junk as a malformed_tag violation). "
            "Trajectories and layouts carry their own."
        },
    )

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool":
                if not isinstance(value, bool):
                    raise ValueError(f"RewardConfig.{f.name} must be true or false, got {value!r}")
            elif f.type in ("float", "int"):
                if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                    raise ValueError(f"RewardConfig.{f.name} must be a finite number, got {value!r}")
                if f.type == "int" and value != int(value):
                    raise ValueError(f"RewardConfig.{f.name} must be an integer, got {value!r}")
        for name in ("accuracy_weight", "efficiency_weight", "compliance_weight", "coverage_weight"):
            _check(name, getattr(self, name) >= 0, ">= 0", getattr(self, name))
        for name in ("efficiency_min_accuracy", "efficiency_min_coverage"):
            _check(name, 0 <= getattr(self, name) <= 1, "in [0, 1]", getattr(self, name))
        _check(
            "efficiency_reference",
            self.efficiency_reference in EFFICIENCY_REFERENCES,
            f"one of {EFFICIENCY_REFERENCES}",
            self.efficiency_reference,
        )
        _check(
            "efficiency_reference_tokens",
            self.efficiency_reference_tokens >= 1,
            ">= 1",
            self.efficiency_reference_tokens,
        )
        _check(
            "protocol_version",
            self.protocol_version in PROTOCOL_VERSIONS,
            f"one of {PROTOCOL_VERSIONS}",
            self.protocol_version,
        )
        _check(
            "efficiency_unit",
            self.efficiency_unit in EFFICIENCY_UNITS,
            f"one of {EFFICIENCY_UNITS}",
            self.efficiency_unit,
        )
        for name in ("hbm_bandwidth", "peak_flops"):
            _check(name, getattr(self, name) > 0, "> 0", getattr(self, name))
        for name in ("mfu", "mbu"):
            _check(name, 0 < getattr(self, name) <= 1, "in (0, 1]", getattr(self, name))
        for name in ("numeric_rel_tol", "numeric_abs_tol", "answer_length_slack", "math_timeout_s"):
            _check(name, getattr(self, name) >= 0, ">= 0", getattr(self, name))
        _check("answer_length_factor", self.answer_length_factor >= 1, ">= 1", self.answer_length_factor)

    @classmethod
    def from_dict(cls, values: Mapping) -> RewardConfig:
        """Build from a flat mapping (a YAML section); unknown keys are errors that suggest the right one.

        >>> RewardConfig.from_dict({"efficiency_weight": 0.3}).efficiency_weight
        0.3
        >>> RewardConfig.from_dict({"efficency_weight": 0.3})
        Traceback (most recent call last):
        ...
        ValueError: RewardConfig has no field 'efficency_weight' (did you mean 'efficiency_weight'?)
        """
        known = [f.name for f in fields(cls)]
        for key in values:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f"; fields: {', '.join(known)}"
                raise ValueError(f"RewardConfig has no field {key!r}{hint}")
        return cls(**values)

    @property
    def roofline(self) -> Roofline:
        return Roofline(self.hbm_bandwidth, self.peak_flops, self.mfu, self.mbu)

    @property
    def grader_options(self) -> GraderOptions:
        return GraderOptions(
            self.numeric_rel_tol,
            self.numeric_abs_tol,
            self.answer_length_factor,
            int(self.answer_length_slack),
            int(self.math_timeout_s),
            self.strict_string_match,
        )


def _check(name: str, ok: bool, expected: str, value) -> None:
    if not ok:
        raise ValueError(f"RewardConfig.{name} must be {expected}, got {value!r}")


DEFAULT_CONFIG = RewardConfig()
