"""The worked examples in the dashboard's docstrings run and pass."""

import doctest

import pytest

import rl.dashboard.run_dir
import rl.dashboard.smoothing


@pytest.mark.parametrize("module", [rl.dashboard.run_dir, rl.dashboard.smoothing], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
