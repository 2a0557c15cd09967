"""Every worked example in a docstring runs, and passes, with the suite: the modules are found by their
``>>>`` lines, so a module that gains examples is tested without being listed."""

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("data", "rollouts", "rewards", "rl", "bench")


def _modules_with_examples() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if ">>> " in path.read_text(encoding="utf-8"):
                parts = path.relative_to(ROOT).with_suffix("").parts
                found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


MODULES = _modules_with_examples()


def test_the_examples_are_found():
    # the modules whose examples the protocol and rewards docs lean on; a broken scan would find none
    assert {
        "rollouts.protocol.parser",
        "rollouts.masks.visibility",
        "data.traces",
        "rewards.efficiency",
    } <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has '>>> ' but no docstring example ran"
    assert result.failed == 0
