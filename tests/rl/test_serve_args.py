"""`heed serve`'s vLLM arguments: what heed.json implies comes first, the user's options win, contradictions
are refused before anything loads (no vLLM here; the server itself is tests/rl/test_serve.py)."""

import json
from types import SimpleNamespace

import pytest

from rl.serving.command import (
    GIB,
    MIDDLEWARE,
    NodeMemory,
    ServeError,
    check_args,
    take_kv_cache_gib,
    vllm_argv,
)

NODE = NodeMemory(node=0, total=10 * GIB, available=7 * GIB)  # as a shared 2-core machine's node 0


@pytest.fixture
def export(tmp_path):
    path = tmp_path / "export"
    path.mkdir()
    (path / "config.json").write_text("{}")
    info = {"protocol_version": 2, "block_size": 64, "thinking": True, "instructions": True}
    (path / "heed.json").write_text(json.dumps(info))
    return path


def _options(argv):
    """{option: value or None} of an argv whose options each take at most one value."""
    out, i = {}, 0
    while i < len(argv):
        has_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        out.setdefault(argv[i], argv[i + 1] if has_value else None)
        i += 2 if has_value else 1
    return out


@pytest.fixture(autouse=True)
def _no_vllm_cpu_sizing_env(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)


def test_heed_json_settings_loopback_and_the_middleware(export):
    cpu = _options(vllm_argv(export, [], on_cpu=True, memory=NODE))
    assert cpu["--model"] == str(export) and cpu["--block-size"] == "64" and cpu["--host"] == "127.0.0.1"
    assert "--no-async-scheduling" in cpu and cpu["--middleware"] == MIDDLEWARE
    assert json.loads(cpu["--default-chat-template-kwargs"]) == {"enable_thinking": True}
    assert cpu["--dtype"] == "float32" and "--enforce-eager" in cpu and "--no-enable-chunked-prefill" in cpu
    gpu = _options(vllm_argv(export, [], on_cpu=False))
    assert "--dtype" not in gpu and "--enforce-eager" not in gpu and gpu["--block-size"] == "64"
    assert "--no-enable-prefix-caching" not in gpu


def test_user_options_replace_heeds_and_pass_through(export):
    user = ["--host", "0.0.0.0", "--no-enforce-eager", "--dtype=bfloat16", "--port", "9"]
    argv = vllm_argv(export, user, on_cpu=True, memory=NODE)
    assert argv[argv.index("--middleware") + 2 :] == user  # after Heed's, untouched
    heeds = argv[: argv.index("--middleware")]
    assert "--host" not in heeds and "--enforce-eager" not in heeds and "--dtype" not in heeds
    assert "--block-size" in heeds and "--no-enable-chunked-prefill" in heeds


def test_selective_attention_export_serves_without_prefix_caching(export):
    (export / "config.json").write_text(json.dumps({"selective_attention": True}))
    assert "--no-enable-prefix-caching" in vllm_argv(export, [], on_cpu=False)


def test_what_cannot_be_served_is_refused(export, tmp_path):
    with pytest.raises(ServeError, match="drop --model"):
        vllm_argv(export, ["--model", "other"], on_cpu=True)
    (export / "heed.json").unlink()
    with pytest.raises(ServeError, match=r"has no heed\.json"):
        vllm_argv(export, [], on_cpu=True)
    with pytest.raises(ServeError, match="not a model folder"):
        vllm_argv(tmp_path / "nowhere", [], on_cpu=True)
    (export / "heed.json").write_text(
        json.dumps({"protocol_version": 99, "block_size": 32, "thinking": False})
    )
    with pytest.raises(
        ServeError, match=r"heed\.json: protocol_version must be one of \(1, 2, 3, 4, 5\), got 99"
    ):
        vllm_argv(export, [], on_cpu=True)


def test_the_cpu_kv_cache_fits_the_node_whatever_its_total(export):
    # vLLM's CPU default asks for 92% of the node's total (9.2 GiB here) with 7 GiB free, and exits
    cpu = _options(vllm_argv(export, [], on_cpu=True, memory=NODE))
    assert int(cpu["--kv-cache-memory-bytes"]) == int(3.5 * GIB)  # half of the 7 GiB free: below 4 GiB
    roomy = NodeMemory(node=1, total=256 * GIB, available=200 * GIB)
    assert (
        int(_options(vllm_argv(export, [], on_cpu=True, memory=roomy))["--kv-cache-memory-bytes"]) == 4 * GIB
    )
    cpu = _options(vllm_argv(export, [], on_cpu=True, kv_cache_gib=0.25, memory=NODE))
    assert int(cpu["--kv-cache-memory-bytes"]) == GIB // 4
    gpu = _options(vllm_argv(export, [], on_cpu=False, memory=NODE))
    assert "--kv-cache-memory-bytes" not in gpu
    with pytest.raises(
        ServeError, match=r"--kv-cache-gib 8 does not fit: NUMA node 0 has 7\.0 of 10\.0 GiB free"
    ):
        vllm_argv(export, [], on_cpu=True, kv_cache_gib=8, memory=NODE)
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ServeError, match="must be a positive number"):
            vllm_argv(export, [], on_cpu=True, kv_cache_gib=bad, memory=NODE)


def test_vllms_own_sizing_replaces_heeds_and_both_at_once_is_refused(export, monkeypatch):
    for user in (["--kv-cache-memory-bytes", "1G"], ["--gpu-memory-utilization=0.3"]):
        argv = vllm_argv(export, user, on_cpu=True, memory=NODE)
        assert argv.count("--kv-cache-memory-bytes") == user.count("--kv-cache-memory-bytes")
        with pytest.raises(ServeError, match="both size the KV cache"):
            vllm_argv(export, user, on_cpu=True, kv_cache_gib=1, memory=NODE)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # vLLM's legacy variable overrides any option
    assert "--kv-cache-memory-bytes" not in vllm_argv(export, [], on_cpu=True, memory=NODE)
    with pytest.raises(ServeError, match="VLLM_CPU_KVCACHE_SPACE both size"):
        vllm_argv(export, [], on_cpu=True, kv_cache_gib=1, memory=NODE)


def test_a_memory_share_vllm_would_refuse_is_one_line_before_loading(export):
    args = SimpleNamespace(block_size=64, async_scheduling=False, kv_cache_memory_bytes=None)
    with pytest.raises(ServeError, match=r"0\.92 reserves 9\.2 GiB on CPU, but NUMA node 0 has 7\.0"):
        check_args(
            SimpleNamespace(**vars(args), gpu_memory_utilization=0.92), export, on_cpu=True, memory=NODE
        )
    check_args(SimpleNamespace(**vars(args), gpu_memory_utilization=0.7), export, on_cpu=True, memory=NODE)
    check_args(SimpleNamespace(**vars(args), gpu_memory_utilization=0.92), export, on_cpu=False, memory=NODE)
    sized = SimpleNamespace(**{**vars(args), "kv_cache_memory_bytes": GIB}, gpu_memory_utilization=0.92)
    check_args(sized, export, on_cpu=True, memory=NODE)  # vLLM skips its check when the bytes are given


def test_kv_cache_gib_is_taken_out_of_the_vllm_options():
    assert take_kv_cache_gib(["--kv_cache_gib=1", "--port", "9"]) == (1.0, ["--port", "9"])
    with pytest.raises(ServeError, match="needs a size"):
        take_kv_cache_gib(["--port", "9", "--kv-cache-gib"])
    with pytest.raises(ServeError, match="takes a size in GiB, got 'lots'"):
        take_kv_cache_gib(["--kv-cache-gib", "lots"])
