"""The DA request wire format: what a client may send, what is rejected, the prefix-cache salt."""

import json

import pytest

from rollouts.engines.da_args import (
    ID_KEY,
    LAYOUT_KEY,
    MODE_KEY,
    da_cache_salt,
    da_extra_args,
    read_da_args,
)
from rollouts.protocol import LayoutError, PromptLayout

LAYOUT = PromptLayout(tuple(range(100, 196)), 32, ((32, 64),))
IDS = list(LAYOUT.input_ids)


def test_requests_without_da_run_unmodified():
    assert read_da_args(None, IDS) is None
    assert read_da_args({}, IDS) is None
    assert read_da_args({"something_else": 1}, IDS) is None
    assert read_da_args({LAYOUT_KEY: LAYOUT.to_wire(), MODE_KEY: "vanilla"}, IDS) is None


@pytest.mark.parametrize("mode", ["da", "da-nm"])
def test_round_trip(mode):
    spec = read_da_args(da_extra_args(LAYOUT, mode, key="k1"), IDS)
    assert spec.layout == LAYOUT and spec.mode == mode and spec.key == "k1"
    assert spec.masked == (mode == "da")


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_layout_keeps_its_protocol_version_through_the_wire(version):
    # a v1 export is served as v1: the engine's tracker parses with the version the wire carries
    from dataclasses import replace

    layout = replace(LAYOUT, protocol_version=version)
    spec = read_da_args(da_extra_args(layout), IDS)
    assert spec.layout.protocol_version == version and spec.layout == layout
    default = read_da_args(da_extra_args(LAYOUT), IDS)  # LAYOUT has the current version
    assert (da_cache_salt(spec) == da_cache_salt(default)) == (version == LAYOUT.protocol_version == 3)


def test_layout_may_travel_as_json_text():
    # `vllm serve` clients send vllm_xargs values as scalars: the layout comes as a JSON string.
    spec = read_da_args({LAYOUT_KEY: json.dumps(LAYOUT.to_wire())}, IDS)
    assert spec.layout == LAYOUT and spec.mode == "da"


@pytest.mark.parametrize(
    ("extra", "ids", "match"),
    [
        ({LAYOUT_KEY: LAYOUT.to_wire()}, IDS[:-1], "95-token prompt|96-token prompt"),
        ({LAYOUT_KEY: {**LAYOUT.to_wire(), "chunk_spans": [[33, 64]]}}, IDS, "not aligned"),
        ({LAYOUT_KEY: {**LAYOUT.to_wire(), "chunk_spans": [[64, 32]]}}, IDS, "empty, unordered"),
        ({LAYOUT_KEY: {**LAYOUT.to_wire(), "chunk_spans": [["a", "b"]]}}, IDS, "two integers"),
        ({LAYOUT_KEY: {**LAYOUT.to_wire(), "chunk_spans": "32-64"}}, IDS, "list of"),
        ({LAYOUT_KEY: {**LAYOUT.to_wire(), "block_size": "32"}}, IDS, "block_size"),
        ({LAYOUT_KEY: {**LAYOUT.to_wire(), "version": -1}}, IDS, "version"),
        ({LAYOUT_KEY: "not json"}, IDS, "JSON"),
        ({LAYOUT_KEY: "[" * 100_000 + "]" * 100_000}, IDS, "nested too deeply"),  # RecursionError, not a 500
        ({LAYOUT_KEY: [1, 2]}, IDS, "must be a dict"),
        ({LAYOUT_KEY: LAYOUT.to_wire(), MODE_KEY: "nope"}, IDS, "heed_mode"),
        ({LAYOUT_KEY: LAYOUT.to_wire(), ID_KEY: 7}, IDS, "heed_id"),
        ({MODE_KEY: "da"}, IDS, "needs a layout"),
    ],
)
def test_bad_requests_raise_layout_error(extra, ids, match):
    with pytest.raises(LayoutError, match=match):
        read_da_args(extra, ids)


def test_cache_salt_separates_layouts_and_modes_only():
    # Same layout and mode -> same salt (a GRPO group shares its prompt blocks); anything else differs.
    a = read_da_args(da_extra_args(LAYOUT, "da", key="a"), IDS)
    b = read_da_args(da_extra_args(LAYOUT, "da", key="b"), IDS)
    other = PromptLayout(LAYOUT.input_ids, 32, ((0, 32),))
    c = read_da_args(da_extra_args(other, "da"), IDS)
    d = read_da_args(da_extra_args(LAYOUT, "da-nm"), IDS)
    assert da_cache_salt(a) == da_cache_salt(b)
    assert len({da_cache_salt(a), da_cache_salt(c), da_cache_salt(d)}) == 3


def test_da_request_builds_prompt_and_params():
    pytest.importorskip("vllm")
    from rollouts.engines.da_args import da_request

    prompt, params = da_request(LAYOUT, "da", max_tokens=3, extra_args={"x": 1})
    assert prompt["prompt_token_ids"] == IDS and prompt["cache_salt"].startswith("heed-da:")
    assert params.extra_args[MODE_KEY] == "da" and params.extra_args["x"] == 1 and params.extra_args[ID_KEY]
    prompt, params = da_request(LAYOUT, "da-nm", max_tokens=3)
    assert "cache_salt" not in prompt  # unmasked KV is ordinary causal KV: shareable
    prompt, params = da_request(LAYOUT, "vanilla", max_tokens=3)
    assert params.extra_args is None
    with pytest.raises(LayoutError):
        da_request(LAYOUT, "da", prompt_token_ids=IDS[:50])
    with pytest.raises(ValueError, match="n=1"):
        da_request(LAYOUT, "da", n=2)
