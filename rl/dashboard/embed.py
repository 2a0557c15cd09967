"""How a figure travels in the report page: as JSON in a script tag the page draws, and tests read.

``<script type="application/json" class="heed-figure" data-chart=NAME>`` holds the figure exactly
as ``plotly.io.to_json`` writes it (lists of numbers, no binary encoding), next to the ``<div
id="fig-NAME">`` it is drawn into. ``</`` is escaped as ``<\\/`` (still valid JSON) so no value can
close the script tag.
"""

from __future__ import annotations

import plotly.io as pio


def figure_block(name: str, fig) -> str:
    payload = pio.to_json(fig, validate=False).replace("</", "<\\/")
    return (
        f'<section class="chart" id="chart-{name}"><div id="fig-{name}"></div>'
        f'<script type="application/json" class="heed-figure" data-chart="{name}">{payload}</script>'
        "</section>"
    )
