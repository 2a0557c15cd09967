"""``ask(question, documents) -> (answer, accounting)`` against a ``heed serve`` server, with the ``openai`` client.

The server lays the prompt out (``rl.serving.requests``), so this only names the fields; any OpenAI client
can do the same with ``extra_body={"vllm_xargs": {...}}``. ``answer`` is the text of the completion's
``<answer>`` (``None`` when it wrote none); ``accounting`` is the response's ``"heed"`` record (KV tokens read
under DA and vanilla, mode mix, violations, the raw completion text under ``"text"``)::

    from openai import OpenAI
    from rl.serving.client import ask

    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    answer, accounting = ask(client, "exported/", "Who founded Acme?", ["doc one ...", "doc two ..."])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def ask(
    client,
    model: str,
    question: str,
    documents: Sequence[str],
    *,
    mode: str = "da",
    max_tokens: int = 256,
    temperature: float = 0.0,
    **create: Any,
) -> tuple[str | None, dict[str, Any]]:
    """One DA request; ``create``: further ``client.completions.create`` arguments (``seed``, ``stop``, ...)."""
    response = client.completions.create(
        model=model,
        prompt="",
        max_tokens=max_tokens,
        temperature=temperature,
        extra_body={
            "vllm_xargs": {"heed_question": question, "heed_documents": list(documents), "heed_mode": mode}
        },
        **create,
    )
    accounting = dict((response.model_extra or {}).get("heed") or {})
    if not accounting:
        raise RuntimeError(f"the server at {client.base_url} returned no DA accounting: is it `heed serve`?")
    accounting["text"] = response.choices[0].text
    return accounting.get("answer"), accounting
