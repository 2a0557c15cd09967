"""The reward's configuration: component weights, the gates on efficiency, grader and roofline knobs.

Every field is a setting (:mod:`rewards.settings`): its default, its help text
(``dataclasses.fields(RewardConfig)[i].metadata["help"]``) and the values it accepts sit on the field
and are checked on construction; an error names the field and says what it accepts. The roofline's and
the graders' knobs are declared once, by ``Roofline`` and ``GraderOptions``: each is one line here that
names its owner's setting (:func:`~rewards.settings.exposed`), and :attr:`RewardConfig.roofline` and
:attr:`RewardConfig.grader_options` are built back from those lines. Run configs give the fields as a
flat mapping (:meth:`RewardConfig.from_dict`), which rejects unknown keys.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cached_property

from rollouts.protocol import PROTOCOL_VERSION, PROTOCOL_VERSIONS

from .accuracy import GraderOptions
from .efficiency import EFFICIENCY_UNITS, Roofline
from .settings import at_least, build, check, exposed, one_of, setting, within

EFFICIENCY_REFERENCES = ("budget", "completion")


@dataclass(frozen=True)
class RewardConfig:
    """How the composite DA reward is put together (see ``rewards/composite.py``).

    ``total = accuracy_weight * accuracy + efficiency_weight * efficiency (gated)
    + compliance_weight * compliance + coverage_weight * coverage`` (coverage counts 0 when unknown).
    Efficiency is measured against a per-example budget by default (``efficiency_reference``).
    """

    accuracy_weight: float = setting(
        1.0, "Weight of answer accuracy (the graded <answer>, in [0, 1]).", at_least(0)
    )
    efficiency_weight: float = setting(
        0.5,
        "Weight of the gated KV-read efficiency (in [0, 1], see efficiency_reference). Keep it below "
        "accuracy_weight so that reading less never pays more than being right.",
        at_least(0),
    )
    compliance_weight: float = setting(
        0.25,
        "Weight of protocol compliance (1 when there are no parser violations, at least one focus where the "
        "example has evidence, and exactly one answer; else 0).",
        at_least(0),
    )
    coverage_weight: float = setting(
        0.25,
        "Weight of evidence coverage (fraction of the evidence chunks some focus made visible); examples "
        "without known evidence chunks get 0 from this term.",
        at_least(0),
    )
    efficiency_min_accuracy: float = setting(
        1.0,
        "Gate: the efficiency term pays only when accuracy >= this (1.0: only fully correct answers; 0.0 "
        "turns the gate off). A wrong answer must not earn anything for skipping reading.",
        within(0, 1),
    )
    efficiency_requires_compliance: bool = setting(
        True,
        "Gate: the efficiency term pays only for protocol-compliant completions, so a correct guess made "
        "without focusing on the evidence (e.g. <local> throughout) earns no saving.",
    )
    efficiency_min_coverage: float = setting(
        1.0,
        "Gate: the efficiency term pays only when evidence coverage >= this (examples without known evidence "
        "pass; 0.0 turns the gate off). 1.0: a right answer reached without focusing on every evidence chunk "
        "is a guess, and its saving came from not reading what it needed; paying it would make a short guess "
        "outscore the honest trace (tests/rewards/test_reward_hacking.py).",
        within(0, 1),
    )
    accuracy_min_coverage: float = setting(
        0.0,
        "Gate: the accuracy term pays only when evidence coverage >= this (examples without known evidence "
        "pass; 0.0, the default, turns the gate off). Under Selective Attention with tight budgets a policy "
        "can answer from what survived eviction while focusing the wrong chunk; 1.0 pays only answers that "
        "focused their evidence, so RL keeps the traces the budgets were searched on. Evals report the "
        "ungated accuracy.",
        within(0, 1),
    )
    efficiency_reference: str = setting(
        "budget",
        "What the efficiency term measures reads against. 'budget': clip(1 - attended / budget, 0, 1) with "
        "budget = what vanilla causal attention reads over efficiency_reference_tokens decoding steps from "
        "the same prompt, so writing more never raises it. 'completion': the paper's saving "
        "1 - attended/vanilla over the completion's own steps, which appending cheap (local or focus) text "
        "raises: a door GRPO finds. Dashboards and evals report that saving (kv_saving) either way.",
        one_of(EFFICIENCY_REFERENCES),
    )
    efficiency_reference_tokens: int = setting(
        128,
        "Decoding steps of the 'budget' reference (>= 1): about the length of a good completion for the task "
        "(gold traces of the embedded default are 72-85 tokens). A completion that reads more than vanilla "
        "does over this many steps earns no efficiency; thinking traces need more.",
        at_least(1),
    )
    efficiency_unit: str = setting(
        "tokens",
        "What the saving is measured in: 'tokens' (block-rounded KV tokens), 'bytes' (KV bytes; the same "
        "ratio as tokens, needs the model's DecodeCost) or 'time' (roofline decoding time, needs the "
        "model's DecodeCost).",
        one_of(EFFICIENCY_UNITS),
    )
    # The roofline's and the graders' settings, declared (default, help, range) by their owners.
    hbm_bandwidth: float = exposed(Roofline, "hbm_bandwidth")
    peak_flops: float = exposed(Roofline, "peak_flops")
    mfu: float = exposed(Roofline, "mfu")
    mbu: float = exposed(Roofline, "mbu")
    numeric_rel_tol: float = exposed(GraderOptions, "numeric_rel_tol")
    numeric_abs_tol: float = exposed(GraderOptions, "numeric_abs_tol")
    answer_length_factor: float = exposed(GraderOptions, "length_factor")
    answer_length_slack: int = exposed(GraderOptions, "length_slack")
    strict_string_match: bool = exposed(GraderOptions, "strict")
    math_timeout_s: int = exposed(GraderOptions, "math_timeout_s")
    thinking: bool = setting(
        False,
        "Parse completions given as text in thinking mode (<think> tags are read). Trajectories and layouts "
        "carry their own flag.",
    )
    protocol_version: int = setting(
        PROTOCOL_VERSION,
        f"DA protocol version completions given as text are parsed with (one of {PROTOCOL_VERSIONS}; 2 reads "
        "a started but broken tag such as </focus junk as a malformed_tag violation). Trajectories and "
        "layouts carry their own.",
        one_of(PROTOCOL_VERSIONS),
    )

    def __post_init__(self):
        check(self)

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

    @cached_property
    def roofline(self) -> Roofline:
        return build(Roofline, self)

    @cached_property
    def grader_options(self) -> GraderOptions:
        return build(GraderOptions, self)


DEFAULT_CONFIG = RewardConfig()
