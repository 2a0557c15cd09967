# Convenience targets; the README's two commands need none of them.
.PHONY: setup test demo screenshot

setup:
	bash scripts/setup_venv.sh

test:
	bash scripts/test.sh

demo: setup
	.venv/bin/heed protocol demo

# The dashboard picture in docs/dashboards.md: the embedded default run (runs/tiny; trained first if absent),
# rendered to HTML and photographed by headless Chromium (apt-get install chromium).
screenshot: setup
	test -f runs/tiny/report.html || .venv/bin/heed train
	.venv/bin/python -m rl.dashboard.browser docs/dashboard.png runs/tiny
