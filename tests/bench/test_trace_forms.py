"""bench/trace_forms.py: the per-strategy costs it prints agree with the hand-worked accounting."""

from bench.trace_forms import form_costs


def test_gold_forms_cost_what_the_hand_worked_traces_say():
    """Under v4 the terse plan predicts 10 of its 32 tokens in global and the direct focus 8 of 21
    (tests/rollouts/protocol/test_parser.py works both by hand); v5 refuses `direct` and starts in local,
    so its plan predicts 8 of 32 there (g_0 and the 7 tokens after `<global>` completes)."""
    v4 = {
        (s, t): (reads, tokens, share)
        for s, t, reads, tokens, share in form_costs("configs/tiny.yaml", [], 1)
    }
    assert {s for s, _ in v4} == {"plan", "direct", "sentence", "candidates"}
    single = {s: v4[(s, "niah_single")] for s in ("plan", "direct", "sentence", "candidates")}
    assert single["plan"][1:] == (32, 10 / 32) and single["direct"][1:] == (21, 8 / 21)
    assert single["candidates"] == single["plan"]  # no look-alike needle: the candidate list is the plan
    assert single["direct"][0] < single["plan"][0] < single["sentence"][0]
    assert v4[("candidates", "niah_multikey")][0] > v4[("plan", "niah_multikey")][0]
    v5 = {(s, t): rest for s, t, *rest in form_costs("configs/tiny.yaml", ["run.protocol_version=5"], 1)}
    assert "direct" not in {s for s, _ in v5}
    assert v5[("plan", "niah_single")][1:] == [32, 8 / 32]
    assert v5[("plan", "niah_single")][0] < single["plan"][0]  # the tags before `<global>` read no chunk
