"""``heed serve``: an exported policy behind vLLM's OpenAI-compatible server, DA laid out and accounted for.

- :mod:`rl.serving.command`: the command line (vLLM's arguments from ``heed.json``, the server in-process);
- :mod:`rl.serving.requests`: a request's question and documents -> the prompt ``heed eval`` would send;
- :mod:`rl.serving.accounting`: a finished completion -> KV tokens read under DA and vanilla, mode mix,
  violations; the Prometheus series on ``/metrics``;
- :mod:`rl.serving.middleware`: the ASGI middleware vLLM loads (``--middleware``) that joins them;
- :mod:`rl.serving.client`: ``ask(question, documents) -> (answer, accounting)`` with the ``openai`` client.
"""
