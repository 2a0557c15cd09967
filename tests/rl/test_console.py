"""What a person sees: framework chatter goes to the run's log file, errors still reach the console, and
progress lines replace tqdm frames when the output is piped. Run in a subprocess: routing changes the
process's logging for good."""

import subprocess
import sys

from tests.rl.jobs import ROOT

SCRIPT = """
import logging, sys, warnings
from rl.console import route_framework_logs
path = route_framework_logs(sys.argv[1])
logging.getLogger("vllm.engine").info("engine chatter")
logging.getLogger("transformers.trainer").warning("trainer warning")
warnings.warn("a python warning")
logging.getLogger("ray").error("a real error")
logging.getLogger("wandb.sdk").error("wandb shutdown noise")
print("heed line")
"""


def test_framework_logs_go_to_the_run_directory_and_errors_to_the_console(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    log = (tmp_path / "logs" / "heed.log").read_text()
    for line in (
        "engine chatter",
        "trainer warning",
        "a python warning",
        "a real error",
        "wandb shutdown noise",
    ):
        assert line in log, line
    console = out.stdout + out.stderr
    assert "heed line" in out.stdout and "a real error" in out.stderr
    for line in ("engine chatter", "trainer warning", "a python warning", "wandb shutdown noise"):
        assert line not in console, line
