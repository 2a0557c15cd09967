"""The plugin as production gets it: loaded by vLLM's entry point into a separate engine-core process.

One fresh interpreter (fresh_engine_probe.py) runs stock ``vllm.LLM`` with multiprocessing on and a
16-block KV cache, then reports per-token log-probs; the reference engine recomputes them here.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rollouts.engines import RolloutRequest

from .fresh_engine_probe import probe_layout

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
COMPLETION = '<focus magic_chunks="1">' + " and the" * 60 + "</focus><local>" + " so it" * 60  # 314 tokens


@pytest.fixture(scope="module")
def probe(tiny_model_dir, tokenizer, tmp_path_factory):
    pytest.importorskip("vllm")
    completion = tokenizer(COMPLETION, add_special_tokens=False)["input_ids"]
    tmp = tmp_path_factory.mktemp("probe")
    out, log_path = tmp / "result.json", tmp / "probe.log"
    command = [
        sys.executable, "-m", "tests.rollouts.engines.fresh_engine_probe", tiny_model_dir, json.dumps(completion),
        str(out),
    ]  # fmt: skip
    # Output to a file, not pipes: the engine's child processes inherit the descriptors and can outlive
    # the probe, and reading pipes to EOF would wait for them. Its own session, so none is left behind.
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            proc.wait(timeout=300)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    log_text = log_path.read_text()
    assert out.exists(), f"probe failed (rc={proc.returncode}):\n{log_text[-3000:]}"
    return completion, json.loads(out.read_text()), log_text


@pytest.fixture(scope="module")
def reference(reference_engine, probe):
    completion = probe[0]
    layout = probe_layout()
    requests = [RolloutRequest(layout, mode, forced_ids=completion) for mode in ("da", "da-nm")]
    return dict(zip(("da", "da-nm"), reference_engine.generate(requests)))


def test_entry_point_installs_the_mask_in_the_engine_core(probe, reference):
    # No register() call in the probe: a matching masked run proves the entry point did it.
    _, result, _ = probe
    assert result["hooks_in_workers"] == [True]
    assert np.abs(np.subtract(result["da_single"], reference["da"].logprobs)).max() <= 1e-4
    assert np.abs(np.subtract(result["da_single"], reference["da-nm"].logprobs)).max() > 1e-3


def test_preempted_unmasked_requests_recover_exactly(probe, reference):
    # da-nm requests preempted and re-prefilled: causal recompute is exact, the tracker catches up.
    # (Three 13-block requests cannot share 16 blocks; the da batch of the same shape below is
    # refused for exactly that reason, so preemption does happen here.)
    _, result, _ = probe
    assert len(result["da_nm_preempted"]) == 3
    for logprobs in result["da_nm_preempted"]:
        assert np.abs(np.subtract(logprobs, reference["da-nm"].logprobs)).max() <= 1e-4


def test_preempted_masked_request_is_refused_loudly(probe):
    # A masked request re-prefilled after preemption would silently lose its mask: the worker refuses.
    _, result, log = probe
    assert result["da_preempted"] != "completed"
    assert "DAMaskLost" in log and "prefilled over generated positions" in log
