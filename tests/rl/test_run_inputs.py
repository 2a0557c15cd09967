"""What a run starts from (`rl/run_inputs.py`): a pretrained Selective Attention checkpoint given as
`model.path` (an SA export, to train further) loads under Selective Attention with the run's budgets."""

import pytest
import torch

from rl.config import load_run_config
from rl.run_inputs import grpo_start, run_model
from rollouts.selective.constants import SELECTIVE
from rollouts.selective.eviction import load_budgets
from tests.rollouts.conftest import save_tiny_qwen3


def test_a_selective_attention_checkpoint_starts_a_selective_run(tmp_path, tokenizer, selective_attention):
    checkpoint = save_tiny_qwen3(
        tmp_path / "sa_export", tokenizer, selective_attention=True, selective_budgets=[16, 16, 16, 16]
    )
    config = load_run_config(
        "configs/tiny-selective.yaml",
        [f"model.path={checkpoint}", f"tokenizer.path={checkpoint}", f"data.build.tokenizer={checkpoint}",
         "selective.budgets=[8, 6, 4, 2]", "selective.search_budgets=false"],
    )  # fmt: skip
    model, start = run_model(config, tmp_path / "run", tokenizer, config.selective.budgets)
    assert start == tmp_path / "run" / "init"
    assert model.config.selective_attention and model.config._attn_implementation == SELECTIVE
    assert load_budgets(model.config) == (8, 6, 4, 2)  # the run's, not the checkpoint's
    reloaded = type(model).from_pretrained(checkpoint, attn_implementation=SELECTIVE)
    for (name, a), b in zip(model.state_dict().items(), reloaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name  # the checkpoint's weights, unchanged


def test_grpo_starts_from_the_last_policy_saved_before_it_never_a_checkpoint(tmp_path):
    """The KL reference: by hand, the latest phase before GRPO that saved a policy; GRPO checkpoints, the
    final policy and an unfinished folder (no config.json) are never it."""

    def save(name: str) -> None:
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "config.json").write_text("{}")

    with pytest.raises(FileNotFoundError, match="no policy saved before GRPO"):
        grpo_start(tmp_path)
    save("init")
    assert grpo_start(tmp_path) == tmp_path / "init"
    save("sft")
    (tmp_path / "budget_search").mkdir()  # started, never saved
    save("checkpoints/checkpoint-5")
    save("final")
    assert grpo_start(tmp_path) == tmp_path / "sft"
    save("grpo_budgets")
    assert grpo_start(tmp_path) == tmp_path / "grpo_budgets"
