"""The worked examples in the protocol's and the visibility rule's docstrings run, and pass, with the suite."""

import doctest
import importlib

import pytest

MODULES = ["rollouts.protocol.parser", "rollouts.masks.visibility", "data.traces"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no docstring examples"
    assert result.failed == 0
