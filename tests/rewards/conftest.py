"""Fixtures for the reward tests: the paper's Acme example laid out as a real DA prompt."""

import pytest

from rollouts.protocol import build_prompt

from .helpers import ACME_QUESTION, acme_documents


@pytest.fixture(scope="session")
def acme_layout(tokenizer):
    layout = build_prompt(ACME_QUESTION, acme_documents(), tokenizer, block_size=32)
    assert layout.num_chunks == 7
    return layout
