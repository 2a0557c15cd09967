"""The post-SFT copy check: which tokens it scores, and that its loss is the trainer's log-prob of them."""

import math

from rl.copy_check import check_copying, value_token_mask
from rl.logprobs import completion_logprobs, pack
from rl.sft import encode_sft_row
from rollouts.masks import trace_completion
from rollouts.protocol import PromptLayout
from tests.rl.test_sft import acme_rows as sft_acme_rows


def acme_rows(n: int) -> list[dict]:
    """test_sft.py's Acme rows, with the two years every gold trace writes as their answers."""
    return [{**row, "answers": ["2003", "2011"]} for row in sft_acme_rows(n)]


def test_value_tokens_spell_every_occurrence_of_the_answers(tokenizer):
    text = acme_rows(1)[0]["gold_completion"]  # 2003 and 2011, once each inside their focus
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    flags = value_token_mask(text, ["2003", "2011"], tokenizer)
    assert len(flags) == len(ids)
    runs, run = [], []
    for token, flag in zip(ids, flags):
        if flag:
            run.append(token)
        elif run:
            runs.append(tokenizer.decode(run).strip())
            run = []
    # the local BPE writes "2011 - 2003" in the local step too: four occurrences, each spelled whole
    assert sorted(runs) == ["2003", "2003", "2011", "2011"]
    assert value_token_mask(text, ["1999"], tokenizer) == [False] * len(ids)


def test_loss_is_the_trainers_log_prob_of_the_value_tokens(tokenizer, token_table, small_model):
    """Recomputed with the trainer's own log-prob forward (rl.logprobs), not the check's label shift."""
    examples = acme_rows(3)
    check = check_copying(small_model, tokenizer, examples, batch_size=2)
    rows = [encode_sft_row(e, tokenizer) for e in examples]
    traces = [
        trace_completion(
            PromptLayout(tuple(r["prompt_ids"]), 32, tuple(map(tuple, r["chunk_spans"]))),
            r["completion_ids"],
            token_table,
        )
        for r in rows
    ]
    logps = completion_logprobs(small_model, pack(traces, [r["completion_ids"] for r in rows], 0))
    total, count = 0.0, 0
    for b, example in enumerate(examples):
        flags = value_token_mask(example["gold_completion"], example["answers"], tokenizer)
        picked = [logps[b, j].item() for j, f in enumerate(flags) if f]
        total, count = total - sum(picked), count + len(picked)
    assert check.tokens == count > 0 and check.n == 3
    assert math.isclose(check.value_nll, total / count, rel_tol=1e-5)
    # an untrained model guesses: its loss sits near a uniform guess over the vocabulary
    assert check.uniform_nll == math.log(small_model.get_output_embeddings().weight.shape[0])
    assert abs(check.value_nll - check.uniform_nll) < 1.0 and check.value_accuracy < 0.2
