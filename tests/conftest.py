"""Session-wide fixtures shared by every test package."""

import pytest


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
