"""The peer: what a user would write instead of chatstream, a bare Starlette + httpx proxy.

Run: ``uvicorn bench.bare_proxy:app --port 8002`` (bench_proxy.py starts it for you).

``POST /stream`` with ``{"messages": [...]}`` calls the upstream's Chat Completions with
``stream: true`` through one shared ``httpx.AsyncClient`` whose pool is sized for the
concurrency served (``BARE_MAX_CONNECTIONS``, default 1000: httpx's default of 100 would queue
every stream past the 100th), reads the upstream's server-sent events line by line with
``aiter_lines()`` and decodes each ``data:`` line with orjson (the fastest simple decoder a user
would reach for), and re-emits one
``event: delta`` per content delta, HTML-escaped as chatstream's are (so both do the same work
per delta). No database, no session, no auth, no Stop, no checkpoints: parse and re-emit.

Environment: ``BARE_UPSTREAM_URL`` (the OpenAI base URL, default http://127.0.0.1:8001/v1),
``BARE_MODEL`` (the model string sent upstream), ``BARE_MAX_CONNECTIONS``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from html import escape
from typing import Any

import httpx
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

UPSTREAM = os.environ.get("BARE_UPSTREAM_URL", "http://127.0.0.1:8001/v1").rstrip("/")
MODEL = os.environ.get("BARE_MODEL", "default")
MAX_CONNECTIONS = int(os.environ.get("BARE_MAX_CONNECTIONS", "1000"))
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
REQUEST_HEADERS = {"Authorization": "Bearer bare-proxy", "Content-Type": "application/json"}

client: httpx.AsyncClient | None = None


def _event(name: str, data: str) -> bytes:
    return f"event: {name}\ndata: {data.replace(chr(10), chr(10) + 'data: ')}\n\n".encode()


async def _relay(payload: dict[str, Any]) -> AsyncIterator[bytes]:
    assert client is not None
    async with client.stream("POST", UPSTREAM + "/chat/completions",
                             content=orjson.dumps(payload), headers=REQUEST_HEADERS) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = orjson.loads(data)
            for choice in chunk.get("choices") or ():
                text = (choice.get("delta") or {}).get("content")
                if text and choice.get("index", 0) == 0:
                    yield _event("delta", escape(text))
    yield _event("done", "")


async def stream(request: Request) -> Response:
    body = orjson.loads(await request.body())
    messages = body.get("messages")
    if not isinstance(messages, list):
        return JSONResponse({"error": "messages must be a list"}, status_code=400)
    payload = {"model": MODEL, "messages": messages, "stream": True,
               "stream_options": {"include_usage": True}, "max_tokens": 1024}
    return StreamingResponse(_relay(payload), media_type="text/event-stream", headers=HEADERS)


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    global client
    limits = httpx.Limits(max_connections=MAX_CONNECTIONS,
                          max_keepalive_connections=MAX_CONNECTIONS, keepalive_expiry=30)
    timeout = httpx.Timeout(connect=10, read=60, write=10, pool=10)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as shared:
        client = shared
        yield
    client = None


app = Starlette(routes=[Route("/stream", stream, methods=["POST"])], lifespan=lifespan)
