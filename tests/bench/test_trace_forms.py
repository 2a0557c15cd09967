"""bench/trace_forms.py: the per-strategy costs it prints agree with the hand-worked accounting."""

from bench.trace_forms import form_costs


def costs(overrides):
    return {
        (s, t): (reads, tokens, share)
        for s, t, reads, tokens, share in form_costs("configs/tiny.yaml", overrides, 1)
    }


def test_gold_forms_cost_what_the_hand_worked_traces_say():
    """Spelled by the local BPE (each tag 3 tokens, a focus tag 8), the v4 plan predicts 10 of its 32 tokens
    in global and the direct focus 8 of 21 (tests/rollouts/protocol/test_parser.py works both by hand); v5
    refuses `direct` and starts in local, so its plan predicts 8 of 32 there (g_0 and the 7 tokens after
    `<global>` completes)."""
    v4 = costs(["tokenizer.protocol_tokens=false"])
    assert {s for s, _ in v4} == {"plan", "direct", "sentence", "candidates", "wide", "keyed"}
    single = {s: v4[(s, "niah_single")] for s in ("plan", "direct", "sentence", "candidates", "wide")}
    assert single["plan"][1:] == (32, 10 / 32) and single["direct"][1:] == (21, 8 / 21)
    assert single["candidates"] == single["plan"]  # no look-alike needle: the candidate list is the plan
    assert single["direct"][0] < single["plan"][0] < single["sentence"][0]
    assert v4[("candidates", "niah_multikey")][0] > v4[("plan", "niah_multikey")][0]
    assert single["wide"] == single["direct"]  # no look-alike needle: one chunk to focus
    # among look-alikes `wide` focuses all three needles' chunks: more reads than `direct`'s one
    assert v4[("wide", "niah_multikey")][0] > v4[("direct", "niah_multikey")][0]
    # `keyed` is `wide` with the key written inside the focus: more tokens, each reading those chunks
    assert v4[("keyed", "niah_multikey")][0] > v4[("wide", "niah_multikey")][0]
    v5 = costs(["tokenizer.protocol_tokens=false", "run.protocol_version=5"])
    assert not {"direct", "wide", "keyed"} & {s for s, _ in v5}  # focus before reading: refused under v5
    assert v5[("plan", "niah_single")][1:] == (32, 8 / 32)
    assert v5[("plan", "niah_single")][0] < single["plan"][0]  # the tags before `<global>` read no chunk


def test_with_protocol_tokens_the_cheapest_form_decodes_least_in_global():
    """The default's tokenizer makes each tag one token. By hand: the plan is `<global>` `Ch` `unk` ` 5` `.`
    `</global>` `\\n` `<focus magic_chunks="` ` 5` `">` ` 63` `</focus>` `\\n` `<answer>` ` 63` `</answer>` and
    the end of sequence, 17 tokens of which the first six are predicted in global; `direct` drops the plan
    and its `\\n`, 10 tokens of which three (the focus tag's) are predicted in global. So the cheapest form
    has the lowest global share, which under the BPE's spelled-out tags it did not."""
    tagged = costs([])
    single = {s: tagged[(s, "niah_single")] for s in ("plan", "direct", "sentence", "candidates")}
    assert single["plan"][1:] == (17, 6 / 17) and single["direct"][1:] == (10, 3 / 10)
    assert min(single.values()) == single["direct"]  # the fewest reads
    # (`keyed` writes the key inside its focus: a smaller share in global, bought with more reads)
    assert min(share for (s, _), (*_, share) in tagged.items() if s != "keyed") == single["direct"][2]
    assert tagged[("keyed", "niah_single")][0] > single["direct"][0]
    assert tagged[("candidates", "niah_multikey")][2] > tagged[("plan", "niah_multikey")][2] > 3 / 10
