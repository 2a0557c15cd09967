"""TensorBoard's smoothing against values worked out by hand."""

import math

import pytest

from rl.dashboard.smoothing import SMOOTHING_WEIGHT, smooth


def test_hand_worked_example_at_weight_one_half():
    """[1, 0, 1] at weight 0.5, by hand:
    t=1: ema = 0.5 * 1 = 0.5,                   / (1 - 0.5)   = 1
    t=2: ema = 0.5 * 0.5 + 0.5 * 0 = 0.25,      / (1 - 0.25)  = 1/3
    t=3: ema = 0.5 * 0.25 + 0.5 * 1 = 0.625,    / (1 - 0.125) = 5/7
    """
    assert smooth([1, 0, 1], weight=0.5) == pytest.approx([1, 1 / 3, 5 / 7])


def test_default_weight_is_tensorboards():
    assert SMOOTHING_WEIGHT == 0.6
    # a 0/1 accuracy series: the smoothed line stays inside [0, 1] and between the jumps
    assert smooth([0, 1, 0, 1]) == pytest.approx([0, 0.625, 0.6 * 0.4 / 0.784, 0.544 / 0.8704])


def test_weight_zero_is_the_raw_series():
    assert smooth([3, 1, 4, 1, 5], weight=0) == [3, 1, 4, 1, 5]


def test_constant_series_and_non_finite_values_as_tensorboard():
    """A constant series comes back unchanged; a NaN passes through and does not advance the debias."""
    assert smooth([0.1] * 4) == [0.1] * 4
    out = smooth([1, math.nan, 0], weight=0.5)
    assert out[0] == 1 and math.isnan(out[1]) and out[2] == pytest.approx(0.25 / 0.75)  # 0 is the 2nd value
    assert smooth([]) == []


def test_weight_outside_the_slider_is_refused():
    with pytest.raises(ValueError, match=r"smoothing weight must be in \[0, 1\)"):
        smooth([1, 2], weight=1)
