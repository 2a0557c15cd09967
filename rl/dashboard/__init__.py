"""Dashboards over a run directory: the format a run writes, the HTML report and the terminal summary.

- ``run_dir``: the run-directory contract, :class:`RunWriter` and the tolerant :class:`RunReader`.
- ``records``: a scored trajectory -> its record and a batch's step metrics (mode mix, KV, rewards).
- ``attention_map``: decoding steps x KV blocks for one record, via the shared visibility rule.
- ``charts`` / ``report``: the plotly figures and the self-contained HTML page (``heed dashboard``);
  ``embed``: how a figure sits in the page; ``trajectory_views``: chosen trajectories and sample table;
  ``smoothing``: the smoothed line over every per-step series (TensorBoard's debiased EMA).
- ``text_summary``: ``heed dashboard --text``; ``wandb_mirror``: ``heed dashboard --wandb``.
- ``browser``: headless Chromium (browser test, the screenshot in docs/dashboards.md).
- ``sample_run``: a tiny run directory from scored gold and perturbed traces (no training).
"""

from .report import render_report, write_report
from .run_dir import Run, RunReader, RunWriter, Skipped
from .text_summary import print_summary

__all__ = ["Run", "RunReader", "RunWriter", "Skipped", "print_summary", "render_report", "write_report"]
