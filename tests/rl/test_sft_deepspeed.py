"""SFT under the DA mask runs with DeepSpeed ZeRO-2 and ZeRO-3 (CPU, gloo) and matches plain training."""

import json

import pytest

from tests.rl.jobs import ROOT, run_job


def sft_losses(deepspeed: str, tmp_path) -> list[float]:
    out = str(tmp_path / deepspeed.replace("/", "_"))
    # MASTER_PORT 0: the job's single rank binds a free port itself (one picked here could be taken first)
    (line,) = run_job("tests.rl.deepspeed_sft_job", deepspeed, "0", out, tag="LOSSES ")
    return json.loads(line)


@pytest.fixture(scope="module")
def plain_losses(tmp_path_factory):
    return sft_losses("none", tmp_path_factory.mktemp("plain"))


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_stages_match_plain_training(stage, plain_losses, tmp_path):
    losses = sft_losses(str(ROOT / f"configs/deepspeed/zero{stage}.json"), tmp_path)
    assert len(losses) == len(plain_losses) == 3
    assert losses[0] == pytest.approx(plain_losses[0], abs=1e-4)  # same data, same init, same masked loss
    assert losses == pytest.approx(plain_losses, abs=5e-3)  # ZeRO's flat buffers vs plain, one rank
    assert losses[-1] < losses[0]
