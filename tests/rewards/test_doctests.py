"""The worked examples in the reward functions' docstrings run, and pass, with the test suite."""

import doctest
import importlib

import pytest

MODULES = ["accuracy", "efficiency", "compliance", "config", "composite", "settings", "trl_rewards"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"rewards.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"rewards.{name} has no docstring examples"
    assert result.failed == 0
