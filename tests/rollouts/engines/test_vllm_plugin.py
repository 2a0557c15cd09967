"""The plugin's worker logic on a hand-built batch: which rows are rewritten, into what, and what is refused.

A stand-in model runner carries exactly the fields the hooks read (vLLM 0.32.0 names); the attention
metadata is vLLM's real ``CommonAttentionMetadata``. Expected block lists are written out by hand
from the layout, not computed by the code under test.
"""

import subprocess
import sys
from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from vllm import SamplingParams
from vllm.config.compilation import CUDAGraphMode
from vllm.exceptions import VLLMValidationError
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

from rollouts.engines import vllm_hooks
from rollouts.engines.da_args import da_cache_salt, da_extra_args, read_da_args
from rollouts.engines.vllm_admission import admit_request, engine_problems
from rollouts.engines.vllm_da_worker import DAMaskLost, DAUnsupported, DAWorkerState, runner_problems
from rollouts.protocol import PromptLayout

BS = 32
# 96-token prompt: block 0 scaffold, block 1 = magic chunk 1, block 2 scaffold.
LAYOUT = PromptLayout(tuple(range(300, 396)), BS, ((32, 64),))
LOCAL = [27, 475, 29]  # "<local>" in the session tokenizer (test_ids_are_the_session_tokenizers)
TEXT = [87, 367, 220, 89, 1177, 365]  # "x y z and the"


def vllm_config(**overrides):
    config = NS(
        speculative_config=None,
        scheduler_config=NS(async_scheduling=False),
        compilation_config=NS(cudagraph_mode=CUDAGraphMode.NONE),
        parallel_config=NS(
            use_ubatching=False,
            decode_context_parallel_size=1,
            prefill_context_parallel_size=1,
            tensor_parallel_size=1,
        ),
        use_v2_model_runner=False,
        cache_config=NS(block_size=BS, enable_prefix_caching=True),
        model_config=NS(hf_config=NS(model_type="qwen3")),
    )
    for key, value in overrides.items():
        target = config
        *path, leaf = key.split("__")
        for part in path:
            target = getattr(target, part)
        setattr(target, leaf, value)
    return config


def kv_spec(block_size=BS):
    return FullAttentionSpec(block_size=block_size, num_kv_heads=2, head_size=32, dtype=torch.float32)


class FakeRunner:
    """The fields of GPUModelRunner the DA hooks read, for one batch."""

    def __init__(self, rows, token_table, groups=None):
        # rows: (req_id, extra_args, output_token_ids, num_computed, query_len)
        self.vllm_config = vllm_config()
        self.kv_cache_config = NS(kv_cache_groups=groups or [NS(kv_cache_spec=kv_spec())])
        self.requests = {
            rid: NS(sampling_params=SamplingParams(extra_args=extra), prompt_token_ids=list(LAYOUT.input_ids),
                    output_token_ids=out)
            for rid, extra, out, _, _ in rows
        }  # fmt: skip
        table = np.zeros((8, 16), dtype=np.int32)
        for i in range(len(rows)):
            table[i] = np.arange(16) + 100 * (i + 1)  # row i: logical block b -> physical 100*(i+1) + b
        self.input_batch = NS(
            req_ids=[r[0] for r in rows],
            num_computed_tokens_cpu=np.array([r[3] for r in rows] + [0] * (8 - len(rows))),
            block_table=[NS(get_numpy_array=lambda: table)],
        )
        self.query_start_loc = NS(np=np.concatenate([[0], np.cumsum([r[4] for r in rows])]))
        self.block_table = table
        state = DAWorkerState()
        state._token_table = token_table
        setattr(self, vllm_hooks._STATE_ATTR, state)

    @property
    def state(self) -> DAWorkerState:
        return getattr(self, vllm_hooks._STATE_ATTR)


def common_metadata(runner, seq_lens):
    n = len(seq_lens)
    table = torch.from_numpy(runner.block_table)  # shares memory, like the CPU runner's "device" table
    qsl = torch.tensor(runner.query_start_loc.np, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_reqs=n, num_actual_tokens=int(qsl[-1]), max_query_len=int((qsl[1:] - qsl[:-1]).max()),
        max_seq_len=max(seq_lens), block_table_tensor=table[:n], slot_mapping=torch.arange(int(qsl[-1])),
        seq_lens_cpu_upper_bound=torch.tensor(seq_lens, dtype=torch.int32),
    )  # fmt: skip


def test_ids_are_the_session_tokenizers(tokenizer):
    """The tests below count positions in these ids: a new tokenizer must give the same text and lengths."""
    assert tokenizer(["<local>", "x y z and the"], add_special_tokens=False)["input_ids"] == [LOCAL, TEXT]


@pytest.fixture
def batch(token_table):
    """Row 0: DA decode in local mode (g_8 forwarded at 104); row 1: plain decode; row 2: DA prefill."""
    out = LOCAL + TEXT  # g_0..g_8
    rows = [
        ("da-0", da_extra_args(LAYOUT, "da", key="a"), out, 96 + len(out) - 1, 1),
        ("plain", None, [5, 6], 60, 1),
        ("da-2", da_extra_args(LAYOUT, "da", key="c"), [], 0, 96),
    ]
    return FakeRunner(rows, token_table)


def test_plan_rewrites_only_masked_decode_rows(batch):
    batch.state.plan_step(batch)
    rewrite = batch.state.pending
    assert rewrite.rows == [0]
    # After "<local>x y z and the" the forward at 104 (block 3) sees scaffold blocks 0, 2 and tail 3.
    assert rewrite.blocks[0].tolist() == [0, 2, 3]
    assert rewrite.kv_tokens == [2 * BS + 104 % BS + 1]
    assert batch.state.requests["plain"] is None  # looked up once, then skipped


def test_rewrite_is_a_copy_with_shortened_tables(batch):
    batch.state.plan_step(batch)
    cm = common_metadata(batch, [105, 61, 96])
    before = batch.block_table.copy()
    new = batch.state.pending.apply(cm)
    assert new.block_table_tensor[0, :3].tolist() == [100, 102, 103]  # physical ids of blocks 0, 2, 3
    assert torch.equal(new.block_table_tensor[1:], cm.block_table_tensor[1:])
    assert new.seq_lens.tolist() == [73, 61, 96] and cm.seq_lens.tolist() == [105, 61, 96]
    assert new.seq_lens_cpu_upper_bound.tolist() == [73, 61, 96] and new.max_seq_len == 96
    assert np.array_equal(batch.block_table, before)  # the persistent table is never edited
    assert new.slot_mapping is cm.slot_mapping and new.query_start_loc is cm.query_start_loc
    assert new.compute_num_computed_tokens().tolist() == [72, 60, 0]  # cache was reset, recomputed
    assert batch.state.pending.apply(cm) is new  # attention groups sharing `cm` get the same copy


def test_hooks_pass_through_without_da(token_table):
    runner = FakeRunner([("plain", None, [5], 60, 1)], token_table)
    runner.state.plan_step(runner)
    assert runner.state.pending is None
    cm = common_metadata(runner, [61])
    seen = []
    vllm_hooks.build_attention_metadata(lambda r, **kw: seen.append(vllm_hooks._ACTIVE_REWRITE.get()), runner)
    assert seen == [None]
    assert vllm_hooks.build_metadata(lambda group, c: c, None, cm) is cm


def test_rewrite_scoped_to_real_steps(batch):
    # CUDA-graph capture / dummy runs must neither consume nor see a real step's rewrite.
    batch.state.plan_step(batch)
    cm = common_metadata(batch, [105, 61, 96])
    built = []

    def original(runner, **kwargs):
        built.append(vllm_hooks.build_metadata(lambda group, c: c, None, cm))

    vllm_hooks.build_attention_metadata(original, batch, for_cudagraph_capture=True)
    assert built[-1] is cm and batch.state.pending is not None
    vllm_hooks.build_attention_metadata(original, batch)
    assert built[-1].seq_lens[0] == 73 and batch.state.pending is None
    assert vllm_hooks._ACTIVE_REWRITE.get() is None


def test_reprefill_over_generated_tokens_is_refused_for_masked_requests(token_table):
    # After preemption vLLM recomputes prompt + generated tokens in one unmasked prefill.
    out = LOCAL + TEXT
    runner = FakeRunner([("r", da_extra_args(LAYOUT, "da", key="r"), out, 0, 96 + len(out))], token_table)
    with pytest.raises(DAMaskLost, match=r"prefilled over generated positions 96\.\.104"):
        runner.state.plan_step(runner)


def test_unmasked_request_survives_reprefill_and_catches_up(token_table):
    out = LOCAL + TEXT
    extra = da_extra_args(LAYOUT, "da-nm", key="r")
    runner = FakeRunner([("r", extra, out, 0, 96 + len(out) - 1)], token_table)
    runner.state.plan_step(runner)  # re-prefill of positions 0..103: causal, exact
    tracked = runner.state.requests["r"]
    assert tracked.kv_tokens == [97 + j for j in range(8)]
    runner.input_batch.num_computed_tokens_cpu[0] = 104
    runner.query_start_loc.np = np.array([0, 1])
    runner.state.plan_step(runner)  # the tracker replays 9 tokens in one go
    assert tracked.tracker.position == 104 and tracked.tracker.state.mode == "local"
    assert tracked.kv_tokens == [97 + j for j in range(9)]


def test_tracker_replays_when_a_step_is_recomputed(batch):
    batch.state.plan_step(batch)
    tracked = batch.state.requests["da-0"]
    batch.input_batch.num_computed_tokens_cpu[0] = 98  # the forward of g_2 (the ">" of "<local>") again
    batch.state.plan_step(batch)
    assert tracked.tracker.position == 98
    assert batch.state.pending.blocks[0].tolist() == [0, 2, 3]
    assert tracked.kv_tokens == [-1, -1, 2 * BS + 98 % BS + 1]  # 96, 97 never planned in this test


def test_release_and_reports(batch):
    batch.state.plan_step(batch)
    assert batch.state.pop_reports(["a"])["a"]["kv_tokens"][-1] == 73  # still live: collected now
    batch.state.release(["da-0", "plain", "da-2"])
    assert batch.state.requests == {}
    reports = batch.state.pop_reports(["a", "c"])  # "a" was collected already; "c" only prefilled
    assert reports == {"c": {"mode": "da", "prompt_len": 96, "kv_tokens": []}}
    assert batch.state.pop_reports(["c"]) == {}


def test_runner_refuses_incompatible_kv_layouts(token_table):
    sliding = SlidingWindowSpec(
        block_size=BS, num_kv_heads=2, head_size=32, dtype=torch.float32, sliding_window=64
    )
    for groups, match in [
        ([NS(kv_cache_spec=kv_spec()), NS(kv_cache_spec=kv_spec())], "2 KV cache groups"),
        ([NS(kv_cache_spec=sliding)], "not plain full attention"),
        ([NS(kv_cache_spec=kv_spec(16))], "block size 16"),
    ]:
        runner = FakeRunner([("r", da_extra_args(LAYOUT, "da"), LOCAL, 96, 1)], token_table, groups)
        assert any(match in p for p in runner_problems(runner, LAYOUT))
        with pytest.raises(DAUnsupported, match=match):
            runner.state.plan_step(runner)


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"speculative_config": object()}, "speculative decoding"),
        ({"scheduler_config__async_scheduling": True}, "async scheduling"),
        ({"compilation_config__cudagraph_mode": CUDAGraphMode.FULL_AND_PIECEWISE}, "cudagraph_mode"),
        ({"parallel_config__use_ubatching": True}, "DBO"),
        ({"parallel_config__decode_context_parallel_size": 2}, "context parallelism"),
        ({"use_v2_model_runner": True}, "VLLM_USE_V2_MODEL_RUNNER=0"),
    ],
)
def test_engine_settings_that_break_the_mask_are_named(override, match):
    assert engine_problems(vllm_config()) == []
    assert engine_problems(vllm_config(compilation_config__cudagraph_mode=CUDAGraphMode.PIECEWISE)) == []
    (problem,) = engine_problems(vllm_config(**override))
    assert match in problem
    request = NS(sampling_params=SamplingParams(extra_args=da_extra_args(LAYOUT)), prompt_token_ids=list(LAYOUT.input_ids), cache_salt=None)  # fmt: skip
    with pytest.raises(VLLMValidationError, match=match):
        admit_request(vllm_config(**override), request)


def test_a_selective_attention_checkpoint_is_refused_under_settings_it_cannot_run_with():
    # served by Heed's attention function, which needs each request prefilled from position 0 and head 0
    # on the rank of every head; the checkpoint's own budgets must be valid
    def config(**override):
        sa = NS(model_type="qwen3", selective_attention=True, num_hidden_layers=2)
        settings = {"model_config__hf_config": sa, "cache_config__enable_prefix_caching": False}
        return vllm_config(**{**settings, **override})

    assert engine_problems(config()) == []
    cases = {
        "prefix caching": {"cache_config__enable_prefix_caching": True},
        "tensor_parallel_size=1": {"parallel_config__tensor_parallel_size": 2},
        "selective_budgets are invalid": {"model_config__hf_config__selective_budgets": [8, 8, 8]},
    }
    for match, override in cases.items():
        (problem,) = engine_problems(config(**override))
        assert match in problem
        for extra in (da_extra_args(LAYOUT), None):  # a DA request and a plain one are both refused
            request = NS(sampling_params=SamplingParams(extra_args=extra), prompt_token_ids=list(LAYOUT.input_ids), cache_salt=None)  # fmt: skip
            with pytest.raises(VLLMValidationError, match=f"Selective Attention checkpoint.*{match}"):
                admit_request(config(**override), request)


def test_admission_salts_masked_requests_only():
    def request(mode, salt=None, **params):
        extra = da_extra_args(LAYOUT, mode)
        sp = SamplingParams(extra_args=extra or None, **params)
        return NS(sampling_params=sp, prompt_token_ids=list(LAYOUT.input_ids), cache_salt=salt)

    expected = da_cache_salt(read_da_args(da_extra_args(LAYOUT, "da"), LAYOUT.input_ids))
    r = request("da")
    assert admit_request(vllm_config(), r).masked and r.cache_salt == expected
    r = request("da", salt="tenant-7")  # a client's own salt is kept, and extended
    admit_request(vllm_config(), r)
    assert r.cache_salt == f"tenant-7|{expected}"
    r = request("da")
    admit_request(vllm_config(cache_config__enable_prefix_caching=False), r)
    assert r.cache_salt is None  # nothing to protect
    for mode in ("da-nm", "vanilla"):
        r = request(mode)
        admit_request(vllm_config(), r)
        assert r.cache_salt is None
    plain = NS(sampling_params=SamplingParams(), prompt_token_ids=[1, 2], cache_salt=None)
    assert (
        admit_request(vllm_config(scheduler_config__async_scheduling=True), plain) is None
    )  # non-DA: never refused


@pytest.mark.parametrize(
    ("request_", "match"),
    [
        (NS(sampling_params=SamplingParams(extra_args=da_extra_args(LAYOUT)), prompt_token_ids=None, cache_salt=None), "embeddings"),
        (NS(sampling_params=SamplingParams(n=2, extra_args=da_extra_args(LAYOUT)), prompt_token_ids=list(LAYOUT.input_ids), cache_salt=None), "n must be 1"),
        (NS(sampling_params=SamplingParams(extra_args=da_extra_args(PromptLayout(LAYOUT.input_ids, 16, ((32, 64),)))), prompt_token_ids=list(LAYOUT.input_ids), cache_salt=None), "block_size=16"),
    ],
)  # fmt: skip
def test_admission_rejects_with_what_to_change(request_, match):
    with pytest.raises(VLLMValidationError, match=match):
        admit_request(vllm_config(), request_)


def test_register_is_lazy_and_idempotent():
    # In a fresh interpreter: register() imports no vLLM; each hook lands once, when its module loads.
    script = """
import sys
from rollouts.engines import vllm_plugin
vllm_plugin.register(); vllm_plugin.register()
assert not any(m.startswith("vllm") for m in sys.modules), "register() imported vLLM"
from vllm.v1.worker import gpu_model_runner, utils
vllm_plugin.register()
for fn in (gpu_model_runner.GPUModelRunner._prepare_inputs, utils.AttentionGroup.build_metadata):
    assert getattr(fn, "__heed_da_patched__", False)
    assert not getattr(fn.__wrapped__, "__heed_da_patched__", False), "patched twice"
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]
