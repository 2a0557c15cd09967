"""The smoothed line drawn over every per-step series: TensorBoard's debiased exponential moving average.

A GRPO batch is small, so a per-step mean (accuracy, KV reads, the mode mix) jumps from step to step;
the trend is what a reader wants, next to the raw points. wandb and TensorBoard draw the same curve,
so a number read off this report matches one read off either tracker at the same weight.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

SMOOTHING_WEIGHT = 0.6  # TensorBoard's default slider value; 0 draws the raw values, near 1 a flat line


def smooth(values: Sequence[float], weight: float = SMOOTHING_WEIGHT) -> list[float]:
    """TensorBoard's smoothing: ``ema = weight * ema + (1 - weight) * x`` from ``ema = 0``, divided by
    ``1 - weight ** t`` at the ``t``-th finite value (the debias: a zero start would pull early values
    toward 0). The first value is therefore kept as is. Like TensorBoard, non-finite values pass through
    without entering the average, and a constant series is returned unchanged (no rounding wobble).

    Worked by hand at weight 0.6 on ``[0, 1, 1, 0]``:

    ====  =========================  ==================  ===============
    t     ema                        debias 1 - 0.6^t    smoothed
    ====  =========================  ==================  ===============
    1     0.4 * 0 = 0                0.4                 0
    2     0.6 * 0 + 0.4 * 1 = 0.4    0.64                0.625
    3     0.6 * 0.4 + 0.4 = 0.64     0.784               0.8163
    4     0.6 * 0.64 + 0 = 0.384     0.8704              0.4412
    ====  =========================  ==================  ===============

    >>> [round(v, 4) for v in smooth([0, 1, 1, 0])]
    [0.0, 0.625, 0.8163, 0.4412]
    >>> smooth([3, 3, 3])
    [3.0, 3.0, 3.0]
    """
    if not 0 <= weight < 1:
        raise ValueError(f"smoothing weight must be in [0, 1), got {weight}")
    values = [float(v) for v in values]
    if all(v == values[0] for v in values):  # TensorBoard's constant-series case (tensorboard#786)
        return values
    ema, finite_seen, smoothed = 0.0, 0, []
    for value in values:
        if not math.isfinite(value):
            smoothed.append(value)
            continue
        ema = weight * ema + (1 - weight) * value
        finite_seen += 1
        smoothed.append(ema / (1 - weight**finite_seen))
    return smoothed
