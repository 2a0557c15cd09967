"""The task generators by name, with the defaults that make each name what RULER and the papers mean.

``make_task("niah_multikey", {"num_distractors": 5})`` builds a configured generator; unknown names
and unknown or invalid parameters raise ``DataError`` naming them.
"""

from __future__ import annotations

from dataclasses import fields

from ..schema import DataError
from .aggregation import CommonWords, FrequentWords
from .base import Draft, Task, finalize
from .multi_span import MultiSpan
from .niah import NeedleInHaystack
from .two_hop import TwoHopNeedle
from .variable_assignment import VariableAssignment
from .variable_tracking import VariableTracking

# name -> (generator class, defaults that distinguish this name)
TASKS: dict[str, tuple[type[Task], dict]] = {
    "niah_single": (NeedleInHaystack, {}),
    "niah_multikey": (NeedleInHaystack, {"num_distractors": 3}),
    "niah_multivalue": (NeedleInHaystack, {"num_values": 4}),
    "niah_multiquery": (NeedleInHaystack, {"num_queries": 4}),
    "niah_twohop": (TwoHopNeedle, {}),
    "variable_tracking": (VariableTracking, {}),
    "multi_span": (MultiSpan, {}),
    "aggregation_cwe": (CommonWords, {}),
    "aggregation_fwe": (FrequentWords, {}),
    "variable_assignment": (VariableAssignment, {}),
}


def task_params(name: str) -> list[str]:
    """The parameter names a task accepts."""
    cls, _ = TASKS[name]
    return [f.name for f in fields(cls) if f.name != "name"]


def make_task(name: str, params: dict | None = None) -> Task:
    """A generator for task ``name`` with ``params`` over its defaults."""
    if name not in TASKS:
        raise DataError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    cls, defaults = TASKS[name]
    params = dict(params or {})
    unknown = sorted(set(params) - set(task_params(name)))
    if unknown:
        raise DataError(f"task {name}: unknown params {unknown}; it accepts {task_params(name)}")
    types = {f.name: f.type for f in fields(cls)}
    for key, value in params.items():
        if not _has_type(value, types[key]):
            raise DataError(f"task {name}: params.{key}={value!r} must be of type {types[key]}")
    return cls(name=name, **{**defaults, **params})


def _has_type(value, annotation: str) -> bool:
    # Annotations are strings here (postponed evaluation); the generators use only these four.
    if annotation == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation == "str":
        return isinstance(value, str)
    if annotation == "tuple[str, ...]":
        return isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
    raise TypeError(f"no type check for parameter annotation {annotation!r}")


__all__ = ["TASKS", "Draft", "Task", "finalize", "make_task", "task_params"]
