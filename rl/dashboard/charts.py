"""The report's charts: one function per chart, each a plotly figure built from a :class:`Run`.

Every function returns ``None`` when the run logged nothing it could draw, so a run still warming up
(or a trainer that does not log some metric) gives a shorter report, never an error. Values go into
the figures as plain lists, exactly as read from ``metrics.jsonl``, so a test can parse them back.

A series over steps is drawn as wandb and TensorBoard draw it: the logged values as faint points, and
over them the smoothed line (``smoothing.smooth``) in the same color, under one legend entry. The faint
trace carries the metric's name as ``meta`` (its values are the file's); the smoothed trace shares its
``legendgroup`` and has no ``meta``.
"""

from __future__ import annotations

from collections.abc import Callable

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from rewards import shown as reward_shown
from rollouts.protocol import VIOLATION_KINDS, mode_by_name, mode_names, mode_table

from .attention_map import MASKED, AttentionMap
from .records import bin_order
from .run_dir import Run
from .smoothing import SMOOTHING_WEIGHT, smooth

PAPER_GLOBAL_SHARE = 0.27  # the DA paper's zero-shot <global> share of generated tokens (§6.1)
CHUNK_COLORS = ("#9ecae1", "#fdae6b", "#a1d99b", "#bcbddc", "#fc9272", "#c7e9c0")  # cycled over chunks
MASKED_COLOR, SCAFFOLD_COLOR, GENERATED_COLOR = "#f0f0f0", "#636363", "#252525"
INDEX_COLOR = mode_by_name("index").color  # the index region
LINE_COLORS = qualitative.Plotly  # a series' raw points and smoothed line share one, cycled over series
RAW_OPACITY = 0.3  # the logged values stay visible behind the smoothed line, as in wandb and TensorBoard


def _layout(fig: go.Figure, title: str, y_title: str, **extra) -> go.Figure:
    settings = {
        "title": title,
        "template": "plotly_white",
        "xaxis_title": "step",
        "yaxis_title": y_title,
        "height": 340,
        "margin": {"l": 60, "r": 20, "t": 50, "b": 40},
        "legend": {"font": {"size": 10}},
    }
    fig.update_layout(**(settings | extra))
    return fig


def _add_series(
    fig: go.Figure, name: str, steps: list[int], values: list[float], color: str, metric: str | None
) -> None:
    """The logged values as faint points and their smoothed line over them, toggled together.

    ``metric``: the ``metrics.jsonl`` name whose values these are, ``None`` for a derived series."""
    fig.add_trace(
        go.Scatter(
            x=steps,
            y=values,
            mode="lines+markers",
            name=name,
            meta=metric,
            legendgroup=name,
            showlegend=False,
            opacity=RAW_OPACITY,
            line={"color": color, "width": 1},
            marker={"color": color, "size": 4},
        )
    )
    fig.add_trace(
        go.Scatter(
            x=steps,
            y=smooth(values),
            mode="lines",
            name=name,
            legendgroup=name,
            line={"color": color, "width": 2},
            hovertemplate=f"%{{y:.4g}} (smoothed, weight {SMOOTHING_WEIGHT})",
        )
    )


def _lines(
    run: Run,
    names: list[str],
    title: str,
    y_title: str,
    label: Callable[[str], str] = str,
    color: Callable[[str], str | None] = lambda name: None,
    **extra,
):
    """One smoothed series per metric (per phase when a run has several) over the lines that logged it;
    ``color`` picks a metric's color, the default cycles over :data:`LINE_COLORS`."""
    phases = sorted({row["phase"] for row in run.metrics})
    logged = set(run.metric_names())  # the rest ``Run.series`` derived (older runs): no ``meta``
    fig = go.Figure()
    for name in names:
        for phase in phases:
            steps, values = run.series(name, phase)
            if steps:
                trace_name = label(name) if len(phases) == 1 else f"{label(name)} ({phase})"
                # every series adds two traces: len(fig.data) // 2 is this series' index
                line_color = color(name) or LINE_COLORS[len(fig.data) // 2 % len(LINE_COLORS)]
                _add_series(fig, trace_name, steps, values, line_color, name if name in logged else None)
    return _layout(fig, title, y_title, **extra) if fig.data else None


def _prefixed(run: Run, prefix: str) -> list[str]:
    return [n for n in run.metric_names() if n.startswith(prefix)]


def rewards(run: Run):
    names = [f"reward/{name}" for name in reward_shown()]
    return _lines(run, names, "Reward: total and components (batch means)", "reward")


def by_task(kind: str):
    def chart(run: Run):
        prefix = f"{kind}/by_task/"
        return _lines(
            run, _prefixed(run, prefix), f"{kind.capitalize()} by task", kind, lambda n: n[len(prefix) :]
        )

    chart.__name__ = f"{kind}_by_task"
    return chart


def by_length(kind: str):
    def chart(run: Run):
        prefix = f"{kind}/by_length/"
        names = sorted(_prefixed(run, prefix), key=lambda n: bin_order(n[len(prefix) :]))
        title = f"{kind.capitalize()} by context-length bin"
        return _lines(run, names, title, kind, lambda n: n[len(prefix) :])

    chart.__name__ = f"{kind}_by_length"
    return chart


def mode_mix(run: Run):
    """Share of generated tokens by predicted mode over steps (the paper's Figure 5a, per step).

    One line per mode rather than a stacked area: GRPO shifting tokens from ``<global>`` to focus and
    local is a trend in each share, and a stacked area hides every band's trend but the bottom one's."""
    fig = _lines(
        run,
        [mode.metric for mode in mode_table()],
        "Mode mix: share of generated tokens by mode",
        "share",
        label=lambda name: name.split("/", 1)[1],
        color=lambda name: mode_by_name(name.split("/", 1)[1]).color,
        yaxis_range=[0, 1],
    )
    if fig is not None:
        # The paper's zero-shot figure for reference (a shape, not data): 27% of tokens in <global>.
        fig.add_hline(y=PAPER_GLOBAL_SHARE, line_dash="dot", annotation_text="paper, zero-shot: 27% global")
    return fig


def global_share_by_length(run: Run):
    """The ``<global>`` share per context-length bin over steps: the share that caps savings (§6.1)."""
    prefix, suffix = "mode_mix/by_length/", "/global"
    names = [n for n in _prefixed(run, prefix) if n.endswith(suffix)]
    names.sort(key=lambda n: bin_order(n[len(prefix) : -len(suffix)]))

    def label(name: str) -> str:
        return name[len(prefix) : -len(suffix)]

    return _lines(run, names, "Global share by context-length bin", "share of tokens in <global>", label)


def mode_mix_by_length(run: Run):
    """Mode mix per context-length bin at the latest step that logged each bin (Figures 5 and 9)."""
    prefix = "mode_mix/by_length/"
    bins = sorted({n[len(prefix) :].rsplit("/", 1)[0] for n in _prefixed(run, prefix)}, key=bin_order)
    fig = go.Figure()
    for mode in mode_names():
        values = [run.latest(f"{prefix}{b}/{mode}") for b in bins]
        if any(v is not None for v in values):
            fig.add_trace(go.Bar(x=bins, y=values, name=mode, marker_color=mode_by_name(mode).color))
    if not fig.data:
        return None
    return _layout(
        fig,
        "Mode mix by context length (latest step)",
        "share",
        barmode="stack",
        xaxis_title="context tokens",
    )


def kv_per_completion(run: Run):
    """KV tokens one completion reads, DA against vanilla (causal attention over the same tokens):
    what GRPO's efficiency reward teaches the policy to lower, independent of the batch size."""
    label = {"kv/tokens_da_per_completion": "da", "kv/tokens_vanilla_per_completion": "vanilla"}.get
    return _lines(
        run,
        ["kv/tokens_da_per_completion", "kv/tokens_vanilla_per_completion"],
        "KV tokens read per completion: DA vs vanilla",
        "KV tokens, summed over its decoding steps",
        label,
    )


def kv_tokens(run: Run):
    names = ["kv/tokens_da", "kv/tokens_vanilla"]
    return _lines(run, names, "KV tokens read per step: DA vs vanilla (batch sums)", "KV tokens")


def kv_saving(run: Run):
    label = {"kv/saving": "saving (tokens)", "reward/kv_saving": "saving (reward unit, mean)"}.get
    return _lines(run, ["kv/saving", "reward/kv_saving"], "KV-read saving, 1 - DA / vanilla", "saving", label)


def kv_bytes(run: Run):
    return _lines(run, ["kv/bytes_da", "kv/bytes_vanilla"], "KV bytes read per step", "bytes")


def kv_by_layer(run: Run):
    """KV tokens each layer read (Selective Attention eviction gives every layer its own budget)."""
    names = sorted(_prefixed(run, "kv/tokens_da/layer_"))
    return _lines(
        run, names, "KV tokens read per layer (eviction)", "KV tokens", lambda n: n.rsplit("/", 1)[1]
    )


def roofline_time(run: Run):
    label = {"decode/roofline_s_da": "DA", "decode/roofline_s_vanilla": "vanilla"}.get
    return _lines(
        run,
        ["decode/roofline_s_da", "decode/roofline_s_vanilla"],
        "Roofline decoding time per step: DA vs vanilla (batch sums)",
        "seconds",
        label,
    )


def decode_overhead(run: Run):
    return _lines(
        run, ["decode/steps_overhead"], "Decoding-step overhead vs vanilla", "extra steps (fraction)"
    )


def violations(run: Run):
    names = [f"violations/{k}" for k in VIOLATION_KINDS if any(run.series(f"violations/{k}")[1])]
    names += [n for n in _prefixed(run, "violations/") if n not in names and any(run.series(n)[1])]
    return _lines(
        run, names, "Protocol violations per completion", "per completion", lambda n: n.split("/", 1)[1]
    )


def importance_ratios(run: Run):
    return _lines(run, ["is_ratio/mean", "is_ratio/min", "is_ratio/max"], "Importance ratios", "ratio")


def throughput(run: Run):
    return _lines(run, ["throughput/tokens_per_s"], "Throughput", "generated tokens / s")


def eval_comparison(run: Run):
    """Accuracy, KV tokens read and decoding steps per rollout mode, over every eval file's results:
    ``da`` against ``vanilla`` steps is the protocol's decoding-step overhead on free generations."""
    totals: dict[str, list[float]] = {}  # mode -> [accuracy * n, n, kv tokens, decode steps * n]
    for data in run.evals.values():
        for row in data["results"]:
            n, accuracy, kv = (row.get(k) for k in ("n", "accuracy", "kv_tokens"))
            if not all(isinstance(v, int | float) for v in (n, accuracy, kv)):
                continue
            steps = row.get("decode_steps")
            acc = totals.setdefault(str(row.get("mode")), [0.0, 0, 0, 0.0])
            acc[0] += accuracy * n
            acc[1] += n
            acc[2] += kv
            acc[3] += steps * n if isinstance(steps, int | float) else 0.0
    if not totals:
        return None
    modes = sorted(totals)
    per_example = [max(totals[m][1], 1) for m in modes]
    fig = make_subplots(rows=1, cols=3, subplot_titles=("accuracy", "KV tokens read", "decoding steps"))
    fig.add_trace(
        go.Bar(x=modes, y=[totals[m][0] / k for m, k in zip(modes, per_example)], name="accuracy"), 1, 1
    )
    fig.add_trace(go.Bar(x=modes, y=[totals[m][2] for m in modes], name="KV tokens"), 1, 2)
    fig.add_trace(
        go.Bar(x=modes, y=[totals[m][3] / k for m, k in zip(modes, per_example)], name="decoding steps"), 1, 3
    )
    return _layout(fig, "Eval: da / da-nm / vanilla", "", showlegend=False, xaxis_title="")


# Charts only some runs can draw (Selective Attention eviction): absent, they are not "missing"
CONDITIONAL_CHARTS = frozenset({"kv_by_layer"})

# The report's charts over steps, in display order: (anchor name, builder)
STEP_CHARTS = (
    ("rewards", rewards),
    ("accuracy_by_task", by_task("accuracy")),
    ("compliance_by_task", by_task("compliance")),
    ("coverage_by_task", by_task("coverage")),
    ("accuracy_by_length", by_length("accuracy")),
    ("compliance_by_length", by_length("compliance")),
    ("coverage_by_length", by_length("coverage")),
    ("mode_mix", mode_mix),
    ("mode_mix_by_length", mode_mix_by_length),
    ("global_share_by_length", global_share_by_length),
    ("kv_per_completion", kv_per_completion),
    ("kv_tokens", kv_tokens),
    ("kv_saving", kv_saving),
    ("kv_bytes", kv_bytes),
    ("kv_by_layer", kv_by_layer),
    ("roofline_time", roofline_time),
    ("decode_overhead", decode_overhead),
    ("violations", violations),
    ("importance_ratios", importance_ratios),
    ("throughput", throughput),
    ("eval_comparison", eval_comparison),
)


def _discrete_scale(colors: list[str]) -> list[list]:
    """A plotly colorscale mapping integer ``i`` of ``zmin=0..len-1`` to ``colors[i]`` exactly."""
    n = len(colors)
    scale = []
    for i, color in enumerate(colors):
        scale += [[i / n, color], [(i + 1) / n, color]]
    return scale


def attention_map_figure(amap: AttentionMap, title: str):
    """Decoding steps (x) x KV blocks (y): masked cells pale, read cells colored by owning chunk,
    with the predicted mode of every step as a strip above."""
    k = amap.num_chunks
    colors = [MASKED_COLOR, SCAFFOLD_COLOR] + [CHUNK_COLORS[c % len(CHUNK_COLORS)] for c in range(k)]
    colors += [INDEX_COLOR, GENERATED_COLOR]
    steps = list(range(amap.cells.shape[0]))
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.07, 0.93], vertical_spacing=0.02)
    modes = mode_names()
    mode_index = [modes.index(m) for m in amap.modes]
    fig.add_trace(
        go.Heatmap(
            z=[mode_index],
            x=steps,
            zmin=0,
            zmax=len(modes) - 1,
            showscale=False,
            name="mode",
            colorscale=_discrete_scale([mode_by_name(m).color for m in modes]),
            customdata=[amap.modes],
            hovertemplate="step %{x}: %{customdata}<extra></extra>",
        ),
        1,
        1,
    )
    owner_label = ["scaffold"] + [f"chunk {c}" for c in range(1, k + 1)] + ["index", "generated"]
    fig.add_trace(
        go.Heatmap(
            z=(amap.cells.T - MASKED).tolist(),  # shift so masked = 0 for the discrete scale
            x=steps,
            zmin=0,
            zmax=len(colors) - 1,
            showscale=False,
            name="blocks",
            colorscale=_discrete_scale(colors),
            customdata=[[owner_label[o]] * len(steps) for o in amap.chunk_of_block.tolist()],
            hovertemplate="step %{x}, block %{y} (%{customdata}): %{z}<extra>0 = masked</extra>",
        ),
        2,
        1,
    )
    for mode in modes:  # legend entries for the mode strip
        fig.add_trace(
            go.Scatter(x=[None], y=[None], mode="markers", name=mode, marker_color=mode_by_name(mode).color),
            2,
            1,
        )
    fig.update_layout(
        title=title,
        template="plotly_white",
        height=520,
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
        legend={"orientation": "h", "y": 1.08},
    )
    fig.update_yaxes(showticklabels=False, row=1, col=1)
    fig.update_yaxes(title_text="KV block (chunk colors; pale = masked)", row=2, col=1)
    fig.update_xaxes(title_text="decoding step", row=2, col=1)
    return fig
