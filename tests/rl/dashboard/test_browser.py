"""The report in a real browser: headless Chromium opens it from file://, draws every figure without
JavaScript errors, and a screenshot is saved (the path is printed for CI to keep as an artifact)."""

import os
from pathlib import Path

import pytest

from rl.dashboard.browser import find_chromium, page_state, screenshot

from .conftest import figures

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="chromium not installed (Debian: apt-get install -y --no-install-recommends chromium)",
)


def test_report_draws_in_chromium_without_js_errors(report_page):
    path, page = report_page
    state = page_state(path)
    assert state.js_errors == ""
    assert state.drawn == len(figures(page)) == state.plots > 10


def test_report_screenshot(report_page, tmp_path):
    out_dir = Path(os.environ.get("HEED_ARTIFACTS_DIR", tmp_path))
    shot = screenshot(report_page[0], out_dir / "dashboard.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
    print(f"dashboard screenshot: {shot}")
