"""bench/gpu_check.py on a machine without CUDA: it says so and runs nothing; its DA traces are what it says
(run for real on a GPU: bench/BENCHMARKS.md, "The GPU check")."""

import pytest
import torch

from bench import gpu_check


@pytest.mark.skipif(torch.cuda.is_available(), reason="the script runs its checks where CUDA is")
def test_without_cuda_it_runs_nothing_and_says_why(capsys):
    assert gpu_check.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().out


def test_its_traces_plan_focus_on_two_chunks_read_locally_and_answer(tagged_tokenizer):
    traces, completions = gpu_check.da_batch(
        tagged_tokenizer, rows=2, chunks=5, chunk_words=6, completion_words=8
    )
    for trace, ids in zip(traces, completions):
        assert trace.layout.num_chunks == 5 and len(trace.row_state) == len(ids)
        assert not trace.parsed.violations
        modes = [trace.states[s] for s in trace.row_state]
        focus = {s.chunks for s in modes if s.mode == "focus"}
        assert len(focus) == 1 and len(next(iter(focus))) == 2
        assert {s.mode for s in modes} == {"global", "focus", "local"}  # what the training mask must cover
        assert trace.parsed.answer is not None


def test_a_failed_check_is_remembered_and_bf16_readings_are_not_judged(capsys):
    verdicts = gpu_check.Verdicts()
    verdicts.check("fine", 1e-6)
    verdicts.check("read only", 5.0, tol=None)
    verdicts.check("broken", 3e-3)
    assert verdicts.failed == ["broken"]
    out = capsys.readouterr().out
    assert "FAIL broken" in out and "not judged" in out


def test_the_real_shape_section_runs_its_step_on_cpu_and_its_shared_rows_match_per_row_ones(capsys):
    """One narrow layer over Qwen3's 151,936-row embedding, two short GRPO groups: the shared rows' log-probs
    equal one row per completion (judged in fp32), and every phase of the step ran."""
    verdicts = gpu_check.Verdicts()
    narrow = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
              "head_dim": 32}  # fmt: skip
    seconds = gpu_check.real_shape(
        verdicts, device="cpu", layers=1, contexts=(130, 260), generations=2, narrow=narrow
    )
    assert verdicts.failed == []
    assert set(seconds) == {
        "old-policy forward",
        "forward + backward",
        "optimizer (AdamW)",
        "weights to host (sync)",
    }
    assert all(s > 0 for s in seconds.values())
    out = capsys.readouterr().out
    assert "4 completions, packed as 2 rows" in out and "ok   fp32 shared rows" in out
