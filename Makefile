# Convenience targets; the README's two commands need none of them.
.PHONY: setup test demo screenshot

setup:
	bash scripts/setup_venv.sh

test:
	bash scripts/test.sh

demo: setup
	.venv/bin/heed protocol demo

# The README's dashboard picture: a sample run directory (gold and perturbed traces, not training),
# rendered to HTML and photographed by headless Chromium (apt-get install chromium).
screenshot: setup
	.venv/bin/python -m rl.dashboard.browser docs/dashboard.png
