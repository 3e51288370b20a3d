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

``POST /agent`` with ``{"messages": [...]}`` is the same with a tool loop, as a user would
write one (bench_tools.py's peer): the request offers two tools, the reply's tool-call fragments
are gathered by index, the functions are called directly, and the next request carries their
results, until a reply asks for none; every step's content deltas are re-emitted as they come
(:func:`agent_reply`, which bench_tools.py also runs in its own process).

Environment: ``BARE_UPSTREAM_URL`` (the OpenAI base URL, default http://127.0.0.1:8001/v1),
``BARE_MODEL`` (the model string sent upstream), ``BARE_AGENT_MODEL`` (the same, for
``/agent``), ``BARE_MAX_CONNECTIONS``.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import time
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
AGENT_MODEL = os.environ.get("BARE_AGENT_MODEL", "agent")
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


# -- the tool loop ---------------------------------------------------------------------------------


def get_weather(city: str, unit: str) -> dict[str, Any]:
    return {"city": city, "sky": "clear", "unit": unit}


async def get_time(timezone: str) -> str:
    return "12:00"


FUNCTIONS: dict[str, Any] = {"get_weather": get_weather, "get_time": get_time}
# What the request offers: the schemas a user writes by hand (chatstream sends the same, made
# from the annotations of bench/agent_tools.py's functions).
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "unit": {"type": "string"}},
                       "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The time in a timezone.",
        "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}},
                       "required": ["timezone"], "additionalProperties": False}}},
]
MAX_STEPS = 8


async def agent_reply(shared: httpx.AsyncClient, upstream: str, model: str,
                      messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = TOOLS,
                      marks: list[float] | None = None) -> AsyncIterator[str]:
    """The reply's content deltas, step after step: each step's tool calls are called and their
    results sent in the next request, until a reply asks for none (or ``MAX_STEPS``, the last
    sent without tools). ``marks`` gets ``time.perf_counter()`` at each step's end and after each
    round of calls."""
    messages = list(messages)
    for step in range(1, MAX_STEPS + 1):
        payload: dict[str, Any] = {"model": model, "messages": messages, "stream": True,
                                   "stream_options": {"include_usage": True}, "max_tokens": 1024}
        if tools and step < MAX_STEPS:
            payload["tools"] = tools
        calls: dict[int, dict[str, str]] = {}
        async with shared.stream("POST", upstream + "/chat/completions",
                                 content=orjson.dumps(payload),
                                 headers=REQUEST_HEADERS) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                for choice in orjson.loads(data).get("choices") or ():
                    if choice.get("index", 0):
                        continue
                    delta = choice.get("delta") or {}
                    if text := delta.get("content"):
                        yield text
                    for fragment in delta.get("tool_calls") or ():
                        call = calls.setdefault(fragment.get("index", 0),
                                                {"id": "", "name": "", "arguments": ""})
                        function = fragment.get("function") or {}
                        call["id"] = fragment.get("id") or call["id"]
                        call["name"] += function.get("name") or ""
                        call["arguments"] += function.get("arguments") or ""
        if marks is not None:
            marks.append(time.perf_counter())
        if not calls:
            return
        asked = [calls[index] for index in sorted(calls)]
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": c["arguments"]}} for c in asked]})
        for call in asked:
            result = FUNCTIONS[call["name"]](**orjson.loads(call["arguments"]))
            if inspect.isawaitable(result):
                result = await result
            messages.append({"role": "tool", "tool_call_id": call["id"], "content":
                             result if isinstance(result, str) else orjson.dumps(result).decode()})
        if marks is not None:
            marks.append(time.perf_counter())


async def _relay_agent(messages: list[dict[str, Any]]) -> AsyncIterator[bytes]:
    assert client is not None
    async for text in agent_reply(client, UPSTREAM, AGENT_MODEL, messages):
        yield _event("delta", escape(text))
    yield _event("done", "")


async def agent(request: Request) -> Response:
    messages = orjson.loads(await request.body()).get("messages")
    if not isinstance(messages, list):
        return JSONResponse({"error": "messages must be a list"}, status_code=400)
    return StreamingResponse(_relay_agent(messages), media_type="text/event-stream",
                             headers=HEADERS)


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


app = Starlette(routes=[Route("/stream", stream, methods=["POST"]),
                       Route("/agent", agent, methods=["POST"])], lifespan=lifespan)
