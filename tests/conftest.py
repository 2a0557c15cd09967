"""Session-wide fixtures shared by every test package."""

import os
import re
from pathlib import Path

import pytest
from hypothesis import settings


def in_ci() -> bool:
    """``CI`` set to anything but empty, ``0``, ``false`` or ``no`` (``.ci/run`` sets ``CI=true``)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


# CI runs every property test on a fixed example sequence (a red CI must be reproducible); local runs
# explore new random examples each time, which is how the fuzzers find new cases.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
# A long hunt, chosen on the command line (`--hypothesis-profile=thorough`): 10^4 examples per property.
settings.register_profile("thorough", max_examples=10_000, deadline=None, print_blob=True)
settings.load_profile("ci" if in_ci() else "dev")


@pytest.fixture(scope="session")
def tokenizer():
    """The local byte-level BPE tokenizer with a ChatML chat template (built once per session)."""
    from data.tokenizer import build_tokenizer

    return build_tokenizer()


@pytest.fixture(scope="session")
def tagged_tokenizer():
    """The same BPE with each DA tag one token (``protocol_tokens``), as the embedded default builds it."""
    from data.tokenizer import build_tokenizer

    return build_tokenizer(protocol_tokens=True)


@pytest.fixture(scope="session")
def token_table(tokenizer):
    """Per-token-id UTF-8 bytes of ``tokenizer`` (what the streaming parser reads)."""
    from rollouts.protocol import token_bytes_table

    return token_bytes_table(tokenizer)


@pytest.fixture(scope="session")
def tagged_token_table(tagged_tokenizer):
    """Per-token-id UTF-8 bytes of ``tagged_tokenizer``."""
    from rollouts.protocol import token_bytes_table

    return token_bytes_table(tagged_tokenizer)


@pytest.fixture
def selective_attention():
    """transformers taught Selective Attention (dense kernel), as a recipe or an engine does before it builds
    or loads a Selective Attention model; a test that switches the kernel switches it back."""
    from rollouts.selective.attention import register_selective_attention

    register_selective_attention(kernel="dense")
    yield
    register_selective_attention(kernel="dense")


def small_model_config():
    """A 2-layer Qwen3's shape (hidden 64, 2 query / 1 KV heads, head_dim 32): tests that train one."""
    from rl.model import TinyModelConfig

    return TinyModelConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
    )


@pytest.fixture(scope="session")
def small_model(tokenizer):
    """A :func:`small_model_config` Qwen3 in eval mode, fixed seed."""
    from rl.model import build_tiny_model

    return build_tiny_model(tokenizer, small_model_config()).eval()


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


# The real stack, as a skip reason names it: `pytest.importorskip("vllm")` says "could not import 'vllm': ...",
# the browser test says "chromium not installed".
REAL_STACK = {
    "vllm": "vLLM",
    "ray": "Ray",
    "deepspeed": "DeepSpeed",
    "triton": "Triton",
    "chromium": "Chromium",
}
_REAL_STACK_NAME = re.compile(r"\b(" + "|".join(REAL_STACK) + r")\b", re.IGNORECASE)


def fail_real_stack_skip(report) -> None:
    """Under CI, turn a skip of a real-stack test into a failure that names the tier and the reason.

    Locally a missing vLLM, Ray, DeepSpeed, Triton or Chromium stays a skip. In CI it would hide exactly
    what the integration tests exist for: `importorskip` also skips when vLLM is installed but an import
    inside it fails (a torchvision build, as scripts/setup_venv.sh warns), and a failed Chromium install
    would leave the browser test skipped. A green CI must mean the real stack ran."""
    if not (report.skipped and in_ci()) or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    match = _REAL_STACK_NAME.search(reason)
    if match:
        tier = REAL_STACK[match.group(1).lower()]
        report.outcome = "failed"
        report.longrepr = (
            f"CI=true: the {tier} tier was skipped, and a real-stack test may not skip in CI: {reason}"
        )


TIERS = ("all", "real-stack", "unit")


def pytest_addoption(parser):
    parser.addoption(
        "--tier", choices=TIERS, default="all",
        help="only the real-stack tests (marked slow: vLLM, Ray, DeepSpeed, multi-process jobs) or only the "
        "unit tests; scripts/test.sh runs the two tiers side by side",
    )  # fmt: skip


def pytest_collection_modifyitems(config, items):
    tier = config.getoption("--tier")
    if tier == "all":
        return
    kept, dropped = [], []
    for item in items:
        (kept if bool(item.get_closest_marker("slow")) == (tier == "real-stack") else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    fail_real_stack_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield  # a module-level importorskip skips the whole file at collection
    fail_real_stack_skip(report)
    return report


def pytest_terminal_summary(terminalreporter):
    """Name the artifacts tests left for CI (the dashboard screenshot), so the log says where they are."""
    artifacts = os.environ.get("HEED_ARTIFACTS_DIR")
    if artifacts and Path(artifacts).is_dir():
        for path in sorted(Path(artifacts).glob("*.png")):
            terminalreporter.write_line(f"artifact: {path}")
