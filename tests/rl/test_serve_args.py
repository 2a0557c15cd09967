"""`heed serve`'s vLLM arguments: what heed.json implies comes first, the user's options win, contradictions
are refused before anything loads (no vLLM here; the server itself is tests/rl/test_serve.py)."""

import json

import pytest

from rl.serving.command import MIDDLEWARE, ServeError, vllm_argv


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


def test_heed_json_settings_loopback_and_the_middleware(export):
    cpu = _options(vllm_argv(export, [], on_cpu=True))
    assert cpu["--model"] == str(export) and cpu["--block-size"] == "64" and cpu["--host"] == "127.0.0.1"
    assert "--no-async-scheduling" in cpu and cpu["--middleware"] == MIDDLEWARE
    assert json.loads(cpu["--default-chat-template-kwargs"]) == {"enable_thinking": True}
    assert cpu["--dtype"] == "float32" and "--enforce-eager" in cpu and "--no-enable-chunked-prefill" in cpu
    gpu = _options(vllm_argv(export, [], on_cpu=False))
    assert "--dtype" not in gpu and "--enforce-eager" not in gpu and gpu["--block-size"] == "64"
    assert "--no-enable-prefix-caching" not in gpu


def test_user_options_replace_heeds_and_pass_through(export):
    user = ["--host", "0.0.0.0", "--no-enforce-eager", "--dtype=bfloat16", "--port", "9"]
    argv = vllm_argv(export, user, on_cpu=True)
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
    with pytest.raises(ServeError, match="protocol version 99"):
        vllm_argv(export, [], on_cpu=True)
