"""Session-wide fixtures shared by every test package."""

import os
from pathlib import Path

import pytest
from hypothesis import settings

# CI runs every property test on a fixed example sequence (a red CI must be reproducible); local runs
# explore new random examples each time, which is how the fuzzers find new cases.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(scope="session")
def tokenizer():
    """The local byte-level BPE tokenizer with a ChatML chat template (built once per session)."""
    from data.tokenizer import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="session")
def token_table(tokenizer):
    """Per-token-id UTF-8 bytes of ``tokenizer`` (what the streaming parser reads)."""
    from rollouts.protocol import token_bytes_table

    return token_bytes_table(tokenizer)


@pytest.fixture(scope="session")
def small_model(tokenizer):
    """A 2-layer Qwen3 (hidden 64, 2 query / 1 KV heads, head_dim 32) in eval mode, fixed seed."""
    from rl.model import TinyModelConfig, build_tiny_model

    config = TinyModelConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
    )
    return build_tiny_model(tokenizer, config).eval()


# Two small DA rows with different chunk counts: enough for padding, state-table and mask tests.
TWO_ROW_COMPLETIONS = [
    '<global>plan</global><focus magic_chunks="2">the mill</focus><local>so two</local><answer>2</answer>',
    '<local>nothing to read</local><focus magic_chunks="1">bread</focus><answer>1</answer>',
]


@pytest.fixture(scope="session")
def two_rows(tokenizer, token_table):
    """``(traces, completion_ids)`` for two prompts (3 and 2 chunks, block size 16) and their completions."""
    from rollouts.masks import trace_completion
    from rollouts.protocol import build_prompt

    layouts = [
        build_prompt(
            "Where is the mill?",
            ["A quiet river. " * 8, "The old mill. " * 9, "Bread. " * 5],
            tokenizer,
            block_size=16,
        ),
        build_prompt(
            "What is sold?", ["The baker sells bread. " * 6, "Snow falls. " * 4], tokenizer, block_size=16
        ),
    ]
    ids = [tokenizer(c, add_special_tokens=False)["input_ids"] for c in TWO_ROW_COMPLETIONS]
    return [trace_completion(lay, i, token_table) for lay, i in zip(layouts, ids)], ids


def pytest_terminal_summary(terminalreporter):
    """Name the artifacts tests left for CI (the dashboard screenshot), so the log says where they are."""
    artifacts = os.environ.get("HEED_ARTIFACTS_DIR")
    if artifacts and Path(artifacts).is_dir():
        for path in sorted(Path(artifacts).glob("*.png")):
            terminalreporter.write_line(f"artifact: {path}")
