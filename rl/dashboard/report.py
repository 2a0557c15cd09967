"""``heed dashboard RUN_DIR --out report.html``: one self-contained HTML file, readable offline.

The page carries plotly.js inline (no network at view time). Each chart's figure sits in the page as
JSON (``<script type="application/json" class="heed-figure" data-chart=NAME>``) and one small script
draws them all, so the numbers in the page are exactly those read from the run directory — a test can
parse them back. Sections: what was skipped while reading, the charts over steps
(:data:`charts.STEP_CHARTS`; each series a smoothed line over its faint logged points), the da / da-nm /
vanilla eval table, and chosen trajectories with their mode-colored text and attention map.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from plotly.offline import get_plotlyjs

from rollouts.protocol import mode_table
from rollouts.trajectory import ROLLOUT_MODES

from . import charts
from .embed import figure_block
from .run_dir import Run, RunReader
from .smoothing import SMOOTHING_WEIGHT
from .trajectory_views import choose_trajectories, samples_table, trajectory_section

EVAL_MODES = ROLLOUT_MODES  # the eval table's columns: every rollout mode
_SMOOTHING_NOTE = (
    "Faint points: the values logged at each step. Lines: TensorBoard's smoothing of them (debiased "
    f"exponential moving average, weight {SMOOTHING_WEIGHT}), the trend a single batch's noise hides."
)

_CSS = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1200px; color: #222; }
h1 { margin-bottom: 4px; } .meta { color: #666; margin-top: 0; }
.skipped { background: #fff4e5; border: 1px solid #f0b060; padding: 8px 14px; border-radius: 4px; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 12px; }
.missing { color: #888; font-style: italic; }
table { border-collapse: collapse; font-size: 13px; } td, th { border: 1px solid #ddd; padding: 3px 8px; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.completion { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 12px;
  border: 1px solid #ddd; padding: 8px; }
"""


def _css() -> str:
    """The page's style, with a highlight for every mode (registered ones too)."""
    return _CSS + "".join(
        f".mode-{mode.name} {{ background: {mode.background}; }}\n" for mode in mode_table()
    )


_DRAW = """
// Errors are recorded on <body> so a headless browser test can read them from the DOM.
const jsErrors = [];
window.addEventListener('error', (e) => {
  jsErrors.push(String(e.message));
  document.body.dataset.jsErrors = jsErrors.join(' | ');
});
let drawn = 0;
for (const node of document.querySelectorAll('script.heed-figure')) {
  try {
    const fig = JSON.parse(node.textContent);
    Plotly.newPlot(document.getElementById('fig-' + node.dataset.chart), fig.data, fig.layout,
                   {responsive: true, displaylogo: false});
    drawn += 1;
  } catch (err) {
    jsErrors.push(node.dataset.chart + ': ' + err);
    document.body.dataset.jsErrors = jsErrors.join(' | ');
  }
}
document.body.dataset.drawn = String(drawn);
"""


def _skipped_section(run: Run) -> str:
    if not run.skipped:
        return ""
    items = "".join(f"<li>{html.escape(str(s))}</li>" for s in run.skipped)
    title = f"<b>Skipped while reading ({len(run.skipped)}):</b>"
    return f'<div class="skipped" id="skipped">{title}<ul>{items}</ul></div>'


# The eval table's columns per mode: (result field, header, format). "accuracy" is the reward's strict
# grade, "RULER acc." RULER's own recall-only metric (rl/evaluate.py), kept for comparison with RULER.
_EVAL_FIELDS = (
    ("accuracy", "accuracy", "{:.3f}"),
    ("accuracy_ruler", "RULER acc.", "{:.3f}"),
    ("kv_tokens", "KV tokens", "{:,}"),
    ("decode_steps", "steps", "{:.1f}"),
)


def _eval_section(run: Run) -> str:
    if not run.evals:
        return '<p class="missing" id="eval-missing">No eval results in this run yet.</p>'
    parts = []
    for name, data in run.evals.items():
        rows: dict[tuple[str, str], dict[str, dict]] = {}
        for r in data["results"]:
            rows.setdefault((str(r.get("task")), str(r.get("length_bin"))), {})[str(r.get("mode"))] = r
        head = "".join(f'<th colspan="{len(_EVAL_FIELDS)}">{m}</th>' for m in EVAL_MODES)
        sub = "".join(f"<th>{header}</th>" for _, header, _ in _EVAL_FIELDS) * len(EVAL_MODES)
        body = []
        for (task, label), by_mode in sorted(rows.items()):
            cells = []
            for mode in EVAL_MODES:
                r = by_mode.get(mode, {})
                for field, _, fmt in _EVAL_FIELDS:
                    value = r.get(field)
                    text = fmt.format(value) if isinstance(value, int | float) else "–"
                    cells.append(f'<td class="num" data-mode="{mode}" data-field="{field}">{text}</td>')
            body.append(
                f'<tr data-task="{html.escape(task)}" data-bin="{html.escape(label)}">'
                f"<td>{html.escape(task)}</td><td>{html.escape(label)}</td>{''.join(cells)}</tr>"
            )
        parts.append(
            f"<h3>{html.escape(name)} (step {data.get('step')})</h3>"
            f'<table class="eval" data-eval="{html.escape(name)}">'
            f'<tr><th rowspan="2">task</th><th rowspan="2">context</th>{head}</tr>'
            f"<tr>{sub}</tr>{''.join(body)}</table>"
        )
    return "".join(parts)


def render_report(run: Run, trajectory_ids: Sequence[str] = ()) -> str:
    """The report of ``run`` as one HTML string."""
    steps = [row["step"] for row in run.metrics]
    phases = sorted({row["phase"] for row in run.metrics})
    meta = (
        (
            f"{len(run.metrics)} metric lines (steps {min(steps)}–{max(steps)}, {', '.join(phases)}), "
            if steps
            else "no metric lines yet, "
        )
        + f"{len(run.trajectories)} trajectories, {len(run.evals)} eval files"
        + f" · rendered {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    )
    blocks, missing = [], []
    for name, build in charts.STEP_CHARTS:
        fig = build(run)
        if fig is None:
            if name not in charts.CONDITIONAL_CHARTS:
                missing.append(name)
        else:
            blocks.append(figure_block(name, fig))
    missing_note = (
        f'<p class="missing" id="charts-missing">Not logged in this run: {", ".join(missing)}.</p>'
        if missing
        else ""
    )
    chosen = choose_trajectories(run, trajectory_ids)
    trajectories = "".join(trajectory_section(t, i) for i, t in enumerate(chosen)) or (
        '<p class="missing">No trajectories recorded yet.</p>'
    )
    unknown = sorted(set(trajectory_ids) - {t["id"] for t in chosen})
    if unknown:
        trajectories = (
            f'<p class="skipped">No trajectory with id {", ".join(map(html.escape, unknown))}.</p>'
            + trajectories
        )
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>Heed run: {html.escape(run.root.name)}</title><style>{_css()}</style>"
        f'<script type="text/javascript">{get_plotlyjs()}</script></head><body>'
        f"<h1>Heed run: {html.escape(str(run.root))}</h1><p class='meta'>{meta}</p>{_skipped_section(run)}"
        f"<h2>Over steps</h2><p class='meta' id='smoothing-note'>{_SMOOTHING_NOTE}</p>{missing_note}"
        f"<div class='grid'>{''.join(blocks)}</div>"
        f"<h2>Eval: da / da-nm / vanilla</h2>{_eval_section(run)}"
        f"<h2>Trajectories</h2>{samples_table(run)}{trajectories}"
        f"<script>{_DRAW}</script></body></html>"
    )


def write_report(
    run_dir: str | Path, out: str | Path | None = None, trajectory_ids: Sequence[str] = ()
) -> tuple[Path, Run]:
    """Read ``run_dir``, write its report (default ``RUN_DIR/report.html``), return the path and the run."""
    run = RunReader(run_dir).read()
    out = Path(out) if out else Path(run_dir) / "report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_report(run, trajectory_ids), encoding="utf-8")
    return out, run
