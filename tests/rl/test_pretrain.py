"""`heed pretrain` (rl/pretrain.py) on a model of two layers: a stopped run resumes to the same weights as an
uninterrupted one, the base folder holds bf16 weights whose checksum its card records, the config names
a bad key, and a Selective Attention base trains with L_mem from its first step."""

import copy
import json
import re

import pytest
import torch
from safetensors import safe_open

from rl.config import ConfigError
from rl.config.validation import from_mapping
from rl.pretrain import (
    CARD,
    CARD_RESULTS,
    CHECKPOINT,
    CURVE,
    STANDARD_COMMAND,
    PretrainConfig,
    Pretraining,
    load_pretrain_config,
    pretrain,
    sha256,
)
from rollouts.selective.constants import SELECTIVE

SMALL = [
    "model.hidden_size=64", "model.num_hidden_layers=2", "model.num_attention_heads=2",
    "model.num_key_value_heads=1", "model.intermediate_size=128", "seq_len=128", "batch_size=2",
    "max_steps=4", "warmup_steps=2", "log_every=1", "eval_every=2", "eval_batches=1", "save_every=2",
    "card_examples=1", "threads=1", "recall_warmup.steps=0", "recall_warmup.replay=false",
]  # fmt: skip


def config(tmp_path, name, *more):
    return load_pretrain_config(
        "configs/base/tiny-base.yaml",
        [*SMALL, f"run_dir={tmp_path / name}", f"out={tmp_path / name}/base", *more],
    )


def test_a_stopped_run_resumes_to_the_uninterrupted_runs_weights(tmp_path):
    whole = Pretraining(config(tmp_path, "whole"))
    whole.setup(resume=False)
    whole.train()

    stopped = Pretraining(config(tmp_path, "stopped"))
    stopped.setup(resume=False)
    stopped.train_step(), stopped.train_step()
    stopped.save_checkpoint()  # as the loop does at save_every=2; then the process dies
    resumed = Pretraining(config(tmp_path, "stopped"))
    resumed.setup(resume=True)
    assert resumed.step == 2
    resumed.train()
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_run_writes_its_curve_and_a_bf16_base_whose_card_holds_its_checksum(tmp_path):
    cfg = config(tmp_path, "run")
    results = pretrain(cfg)
    run, out = tmp_path / "run", tmp_path / "run" / "base"
    curve = [json.loads(line) for line in (run / CURVE).read_text().splitlines()]
    assert (
        [r["step"] for r in curve] == [1, 2, 3, 4]
        and "heldout_loss" in curve[1]
        and "heldout_loss" in curve[3]
    )
    assert (run / CHECKPOINT).exists()
    with safe_open(out / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118 (not iterable)
    recorded = json.loads((out / CARD_RESULTS).read_text())
    assert recorded["sha256"] == sha256(out / "model.safetensors") == results["sha256"]
    assert recorded["tokens_seen"] == 4 * 2 * 128
    assert set(recorded["answering"]) == {
        f"{t}/{f}" for t in ("single", "multikey", "twohop") for f in ("train", "heldout")
    }
    assert results["sha256"] in (out / CARD).read_text()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert AutoModelForCausalLM.from_pretrained(out).config.model_type == "qwen3"
    assert "<global>" not in AutoTokenizer.from_pretrained(out).get_vocab()  # a plain base: no DA tags


def test_a_second_run_into_the_same_folder_must_say_resume(tmp_path):
    Pretraining(config(tmp_path, "twice", "max_steps=2")).setup(resume=False)
    run = Pretraining(config(tmp_path, "twice"))
    run.setup(resume=False)
    run.save_checkpoint()
    with pytest.raises(FileExistsError, match="--resume"):
        Pretraining(config(tmp_path, "twice")).setup(resume=False)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        Pretraining(config(tmp_path, "empty")).setup(resume=True)


def test_a_bad_key_is_named():
    with pytest.raises(ConfigError, match="max_step"):
        load_pretrain_config("configs/base/tiny-base.yaml", ["max_step=3"])
    with pytest.raises(ConfigError, match="batch_size"):
        load_pretrain_config("configs/base/tiny-base.yaml", ["batch_size=0"])
    with pytest.raises(ConfigError, match=r"selective\.selection_from_step: the selection must be whole by "):
        load_pretrain_config("configs/base/tiny-base-selective.yaml", ["selective.selection_ramp_steps=9001"])
    with pytest.raises(ConfigError, match=r"selective\.selection_ramp_steps: must be >= 0"):
        load_pretrain_config("configs/base/tiny-base-selective.yaml", ["selective.selection_ramp_steps=-1"])


def test_the_first_steps_train_on_recall_tables_in_their_own_rows_then_the_corpus(tmp_path):
    run = Pretraining(config(tmp_path, "w", "recall_warmup.steps=2", "recall_warmup.batch_size=3",
                             "recall_warmup.seq_len=32", "max_steps=5"))  # fmt: skip
    run.setup(resume=False)
    cfg = run.config
    (tables,) = run.batches(1)
    assert tables.shape == (3, 32) and torch.equal(tables, run.corpus.warmup_batch(cfg.seed, 1, 3, 32))
    (corpus,) = run.batches(2)
    assert torch.equal(corpus, run.corpus.batch(cfg.seed, 2, cfg.batch_size, cfg.seq_len))
    # tokens still to train on: 2 warm-up steps of 3 x 32, then 3 corpus steps
    assert run.tokens_left() == 2 * 3 * 32 + 3 * cfg.batch_size * cfg.seq_len
    run.step = 4
    assert run.tokens_left() == cfg.batch_size * cfg.seq_len
    for bad in ("recall_warmup.steps=-1", "recall_warmup.seq_len=8"):
        with pytest.raises(ConfigError, match="recall_warmup"):
            config(tmp_path, "bad", bad)


def test_replay_trains_each_corpus_step_on_a_batch_of_tables_too(tmp_path):
    run = Pretraining(config(tmp_path, "r", "recall_warmup.steps=1", "recall_warmup.batch_size=2",
                             "recall_warmup.seq_len=32", "recall_warmup.replay=true", "max_steps=2"))  # fmt: skip
    run.setup(resume=False)
    cfg = run.config
    corpus, tables = run.batches(1)
    assert torch.equal(corpus, run.corpus.batch(cfg.seed, 1, cfg.batch_size, cfg.seq_len))
    assert torch.equal(tables, run.corpus.warmup_batch(cfg.seed, 1, 2, 32))
    assert run.tokens_left() == 2 * 32 + cfg.batch_size * cfg.seq_len + 2 * 32
    terse = Pretraining(config(tmp_path, "t", "recall_warmup.steps=4", "recall_warmup.terse_share=1.0",
                               "recall_warmup.terse_after=2"))  # fmt: skip
    terse.setup(resume=False)
    assert ": " not in terse.tokenizer.decode(terse.batches(1)[0][0])  # the easiest form first
    assert ": " in terse.tokenizer.decode(terse.batches(2)[0][0])  # then the tasks' form
    near = Pretraining(config(tmp_path, "n", "recall_warmup.steps=5", "recall_warmup.terse_share=1.0",
                              "recall_warmup.terse_after=0", "recall_warmup.near_share=1.0",
                              "recall_warmup.near_after=3"))  # fmt: skip
    near.setup(resume=False)

    def look_alike(step: int) -> bool:  # every key of the step's first table shares a word with its first
        table = near.tokenizer.decode(near.batches(step)[0][0]).split("\n\n")[0]
        keys = re.findall(r" ([a-z]+)-([a-z]+):", table)
        return all(a == keys[0][0] or n == keys[0][1] for a, n in keys)

    assert look_alike(3) and look_alike(4)  # from near_after on
    assert not all(look_alike(s) for s in range(3))  # unrelated keys before it (one table of 2 may share)
    with pytest.raises(ConfigError, match="near_share"):
        config(tmp_path, "bad", "recall_warmup.near_share=0.5", "recall_warmup.terse_share=0")
    sentences = Pretraining(config(tmp_path, "s", "recall_warmup.steps=5", "recall_warmup.terse_share=1.0",
                                   "recall_warmup.terse_after=0", "recall_warmup.sentence_share=1.0",
                                   "recall_warmup.sentence_after=3"))  # fmt: skip
    sentences.setup(resume=False)
    text = [sentences.tokenizer.decode(sentences.batches(step)[0][0]) for step in range(5)]
    assert not any("number" in t for t in text[:3]) and all("number" in t for t in text[3:])
    with pytest.raises(ConfigError, match="sentence_share"):
        config(
            tmp_path,
            "bad",
            "recall_warmup.sentence_share=0.5",
            "recall_warmup.terse_share=0",
            "recall_warmup.near_share=0",
        )
    with pytest.raises(ConfigError, match="noun_share"):
        config(tmp_path, "bad", "recall_warmup.noun_share=0.5", "recall_warmup.near_share=0")
    nouns = Pretraining(config(tmp_path, "nn", "recall_warmup.steps=5", "recall_warmup.terse_share=1.0",
                               "recall_warmup.terse_after=0", "recall_warmup.near_share=1.0",
                               "recall_warmup.near_after=0", "recall_warmup.noun_share=1.0"))  # fmt: skip
    nouns.setup(resume=False)
    keys = re.findall(r" ([a-z]+)-([a-z]+):", nouns.tokenizer.decode(nouns.batches(0)[0][0]).split("\n\n")[0])
    assert len(keys) >= 2 and all(n == keys[0][1] and a != keys[0][0] for a, n in keys[1:])
    run.train()
    assert run.tokens == 2 * 32 + cfg.batch_size * cfg.seq_len + 2 * 32


@pytest.mark.parametrize(
    "name, recipe_file",
    [
        ("heed-tiny-base", "configs/base/tiny-base.yaml"),
        ("heed-tiny-base-selective", "configs/base/tiny-base-selective.yaml"),
    ],
)
def test_the_shipped_base_is_what_its_card_says(name, recipe_file, selective_attention):
    """models/heed-tiny-base and models/heed-tiny-base-selective: their weights hash to the card's checksum,
    were made by the committed recipe (the card's config is the recipe file's, wherever the run wrote), load
    in transformers (the Selective Attention one once transformers is taught it, as a recipe does), and give
    the card's held-out loss on the corpus's held-out batches (recomputed here, within 2%: another CPU
    rounds differently)."""
    from dataclasses import asdict
    from pathlib import Path

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from data.corpus import Corpus

    base = Path("models") / name
    card = json.loads((base / CARD_RESULTS).read_text())
    assert card["sha256"] == sha256(base / "model.safetensors")
    recipe = load_pretrain_config(recipe_file)
    assert card.get("command", STANDARD_COMMAND) == f"heed pretrain --config {recipe_file}"
    # a key added after the card was written reads as its default, which adds nothing to a recipe
    made_by = from_mapping(PretrainConfig, card["config"], "")
    where = ("run_dir", "out")  # where a run writes is not its recipe
    assert {k: v for k, v in asdict(made_by).items() if k not in where} == {
        k: v for k, v in asdict(recipe).items() if k not in where
    }
    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32).eval()
    assert (model.config._attn_implementation == SELECTIVE) == recipe.selective.enabled
    tokenizer = AutoTokenizer.from_pretrained(base)
    assert sum(p.numel() for p in model.parameters()) == card["parameters"]
    corpus = Corpus(tokenizer, recipe.corpus)
    with torch.no_grad():
        losses = [
            model(input_ids=b, labels=b).loss.item()
            for b in (
                corpus.batch(recipe.seed + 1, i, recipe.batch_size, recipe.seq_len)
                for i in range(recipe.eval_batches)
            )
        ]
    assert sum(losses) / len(losses) == pytest.approx(card["heldout_loss"], rel=0.02)


def peak_memory_share(run: Pretraining) -> float:
    """The share of its context a Selective Attention base leaves unmasked, at its peak (L_mem's
    ``max_i M_i / n``), averaged over layers, on the first held-out batch."""
    from rollouts.selective.attention import AttentionState

    state = AttentionState(tau=1.0)
    batch = run.validation[0]
    with torch.no_grad():
        run.model(input_ids=batch, heed_state=state)
    return float(torch.stack(list(state.peak_memory.values())).mean() / batch.shape[1])


def test_a_selective_attention_base_is_one_from_its_first_step_and_l_mem_makes_it_mask(tmp_path):
    """``selective.enabled``: the model is built with Selective Attention, every step adds L_mem to the
    next-token loss, and L_mem does what it is for: the same 30 steps with a large eps leave the base
    masking more of its context than without it. The base folder loads as a Selective Attention model, and
    its card (which decodes with it) says so."""
    from transformers import AutoModelForCausalLM

    steps = ["max_steps=30", "warmup_steps=5", "eval_every=30", "save_every=30", "log_every=30"]
    runs = {}
    for eps in (0.0, 1.0):
        run = Pretraining(
            config(tmp_path, f"eps{eps}", *steps, "selective.enabled=true", f"selective.memory_eps={eps}")
        )
        run.setup(resume=False)
        assert run.model.config.selective_attention and run.model.config._attn_implementation == SELECTIVE
        start = peak_memory_share(run)
        batch = run.batches(0)[0]
        with torch.no_grad():  # the step's loss is the next-token loss plus eps * L_mem, L_mem in (0, 1]
            extra = float(run.loss(batch) - run.model(input_ids=batch, labels=batch).loss)
        assert extra == 0.0 if eps == 0 else 0.0 < extra <= eps
        run.train()
        runs[eps] = (start, peak_memory_share(run), run)
    assert runs[0.0][0] == runs[1.0][0]  # one initialisation
    assert runs[1.0][1] < runs[0.0][1] - 0.05, runs  # L_mem lowered the memory the base keeps

    # faded in: before selection_from_step the step's loss is the same weights' standard-attention loss, and
    # L_mem is eps (1 here) times the whole context, which nothing masks; halfway up the ramp it is neither
    # that nor the full selection's
    faded = Pretraining(
        config(tmp_path, "faded", *steps, "selective.enabled=true", "selective.memory_eps=1.0",
               "selective.selection_from_step=10", "selective.selection_ramp_steps=10")
    )  # fmt: skip
    faded.setup(resume=False)
    standard = copy.deepcopy(faded.model)
    standard.config.selective_attention = False
    standard.set_attn_implementation("sdpa")
    batch = faded.batches(0)[0]
    losses = {}
    with torch.no_grad():
        plain = float(standard(input_ids=batch, labels=batch).loss)
        for step in (9, 15, 20):  # before the ramp, halfway, after it
            faded.step = step
            losses[step] = float(faded.loss(batch))
    assert losses[9] == pytest.approx(plain + 1.0, abs=1e-5)
    assert min(abs(losses[15] - losses[9]), abs(losses[15] - losses[20])) > 1e-3, (plain, losses)
    faded.save(command="heed pretrain --config faded.yaml")  # the card names the command and the fade-in
    card = (tmp_path / "faded" / "base" / CARD).read_text()
    assert "Made by `heed pretrain --config faded.yaml`" in card
    assert "A Selective Attention model with its selection faded in over steps 10-20" in card

    run = runs[1.0][2]
    run.save()
    out = tmp_path / "eps1.0" / "base"
    assert json.loads((out / "config.json").read_text())["selective_attention"] is True
    assert AutoModelForCausalLM.from_pretrained(out).config._attn_implementation == SELECTIVE
    assert "A Selective Attention model from its first step" in (out / CARD).read_text()
