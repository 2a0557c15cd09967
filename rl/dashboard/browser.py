"""Open a report in headless Chromium: read back the drawn DOM, or save a screenshot.

Used by the browser test and by the screenshot target (docs/dashboards.md)::

    python -m rl.dashboard.browser docs/dashboard.png runs/tiny   # a run directory -> report -> PNG
    python -m rl.dashboard.browser docs/dashboard.png             # a sample run (no training) instead

The report records JavaScript errors and the number of figures it drew on ``<body>``
(``data-js-errors``, ``data-drawn``), so one ``--dump-dom`` shows whether the page worked. Chromium
runs with a fresh profile and everything that would reach the network turned off.
"""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
_BODY = re.compile(r"<body([^>]*)>")


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _run(page: Path, extra: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    chromium = find_chromium()
    if chromium is None:
        raise FileNotFoundError(
            "no chromium on PATH; on Debian: apt-get install -y --no-install-recommends chromium"
        )
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [
                chromium,
                *FLAGS,
                f"--user-data-dir={profile}",
                "--virtual-time-budget=15000",
                *extra,
                page.resolve().as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        )


@dataclass(frozen=True)
class PageState:
    drawn: int  # figures plotly drew
    js_errors: str  # "" when none
    plots: int  # elements plotly turned into plots


def page_state(page: Path, timeout_s: float = 120) -> PageState:
    """Load ``page`` from ``file://``, let its scripts run, and read what they left in the DOM."""
    dom = _run(page, ["--dump-dom"], timeout_s).stdout
    body = _BODY.search(dom)
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1))) if body else {}
    return PageState(
        drawn=int(attrs.get("data-drawn", "0")),
        js_errors=html.unescape(attrs.get("data-js-errors", "")),
        plots=dom.count('class="plot-container plotly"'),
    )


def screenshot(page: Path, out: Path, width: int = 1280, height: int = 2400, timeout_s: float = 120) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    _run(page, [f"--screenshot={out.resolve()}", f"--window-size={width},{height}"], timeout_s)
    return out


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: python -m rl.dashboard.browser OUT.png [RUN_DIR]", file=sys.stderr)
        return 2
    from .report import write_report
    from .sample_run import write_sample_run

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(argv[1]) if len(argv) == 2 else write_sample_run(Path(tmp) / "sample")
        page, _ = write_report(run, Path(tmp) / "report.html")
        print(screenshot(page, Path(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
