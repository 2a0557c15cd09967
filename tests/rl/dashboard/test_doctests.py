"""The worked example in the run-directory docstring runs and passes."""

import doctest

import rl.dashboard.run_dir


def test_run_dir_docstring_example():
    result = doctest.testmod(rl.dashboard.run_dir)
    assert result.attempted > 0 and result.failed == 0
