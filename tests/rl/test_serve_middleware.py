"""The serving middleware in front of vLLM's `--api-key` check, on a real Starlette stack (no engine): a
request without a valid key reaches vLLM's 401 untouched, before any layout work."""

from argparse import Namespace

import pytest


def test_a_request_without_the_api_key_is_left_to_vllms_401():
    pytest.importorskip("vllm")
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient
    from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

    from rl.serving.middleware import HeedMiddleware

    seen = []

    async def completions(request):
        seen.append(await request.json())
        return JSONResponse({"choices": []})

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
    app.state.args = Namespace(api_key=["secret"])  # no vllm_config: laying anything out would fail
    app.add_middleware(AuthenticationMiddleware, tokens=["secret"])
    app.add_middleware(HeedMiddleware)  # as vLLM adds --middleware: last, so outermost
    body = {"model": "m", "prompt": "", "vllm_xargs": {"heed_question": "q", "heed_documents": ["d"]}}
    with TestClient(app) as client:
        refused = client.post("/v1/completions", json=body)
        wrong = client.post("/v1/completions", json=body, headers={"Authorization": "Bearer nope"})
    assert refused.status_code == wrong.status_code == 401 and refused.json() == {"error": "Unauthorized"}
    assert seen == []
