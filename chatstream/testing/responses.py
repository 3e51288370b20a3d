"""Answering one ``POST /v1/chat/completions``: record it, check it, then error, stream or reply.

The record is finished just before the response's last write, so a client that has read the
whole response always finds its record final. A client's close cancels the answer's task (see
protocol.py), so nothing is written after it; ``chunks_after_close`` counts any attempt anyway.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import time
import zlib
from collections.abc import Mapping
from typing import Any

from .protocol import Connection, Request
from .recording import RecordedRequest, RequestLog
from .scripts import SCENARIOS, ScenarioError, Script, select, tool_message_problem
from .stream import DROP, STALL, Pause, Reply, Send, actions, completion_body, error_body, plan

_SECRET_HEADERS = ("authorization", "api-key", "x-api-key")


def authorized(headers: dict[str, str], api_key: str | None) -> bool:
    """Whether ``headers`` carry ``api_key`` (Bearer, or Azure's ``api-key``); True without one."""
    if api_key is None:
        return True
    key = api_key.encode()
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key):
        return True
    return hmac.compare_digest(headers.get("api-key", "").encode(), key)  # Azure's header


async def answer(
    conn: Connection,
    request: Request,
    *,
    scenarios: Mapping[str, Script],
    api_key: str | None,
    log: RequestLog,
) -> None:
    """Record and answer one ``POST /v1/chat/completions``."""
    started = time.monotonic()
    try:
        body = json.loads(request.body)
    except (ValueError, UnicodeError):
        body = None
    model = body.get("model") if isinstance(body, dict) else None
    model = model if isinstance(model, str) else ""
    selector = request.headers.get("x-simulator-scenario") or model
    try:
        name, script = select(selector, scenarios)
        problem = ""
    except ScenarioError as exc:
        name, script, problem = "", SCENARIOS["default"], str(exc)
    # Complete before it is logged: other threads may read it the moment it is.
    record = RecordedRequest(
        id="req_" + secrets.token_hex(16) if script.request_id is None else script.request_id,
        model=model,
        scenario=name,
        body=body if body is not None else request.body.decode("utf-8", "replace"),
        headers={header: _redact(header, value) for header, value in request.headers.items()},
        connection_id=conn.number,
    )
    log.add(record)
    conn.on_close = record._closed_by_client
    conn.on_lost = record._connection_lost  # the connection's latest request hears of its end
    try:
        await _answer(conn, request, record, script, problem, started, api_key)
    finally:
        conn.on_close = None
        record._finish(completed=False)  # no-op when the answer finished it


async def _answer(
    conn: Connection,
    request: Request,
    record: RecordedRequest,
    script: Script,
    problem: str,
    started: float,
    api_key: str | None,
) -> None:
    """The error, stream or whole reply; ``record`` is finished just before the last write."""
    headers = {"x-request-id": record.id}

    def fail(status: int, body: dict[str, Any], extra: dict[str, str] | None = None) -> None:
        record.status = status
        record._finish(completed=True)
        send_json(conn, status, body, {**headers, **(extra or {})})

    body = record.body
    if not authorized(request.headers, api_key):
        fail(401, unauthorized(request.headers))
    elif not isinstance(body, dict):
        fail(400, error_body(400, message="We could not parse the JSON body of your request."))
    elif not isinstance(body.get("messages"), list):
        fail(400, error_body(400, message="Missing required parameter: 'messages'."))
    elif problem or (problem := tool_message_problem(body["messages"])):
        fail(400, error_body(400, message=problem))
    elif script.status != 200:
        extra = {"retry-after": str(script.retry_after)} if script.status in (429, 503) else {}
        fail(script.status, error_body(script.status, message=script.error_message or ""), extra)
    else:
        reply = plan(script, body, record.model.partition("?")[0])
        record.status = 200
        headers["openai-processing-ms"] = str(round((time.monotonic() - started) * 1000))
        if body.get("stream") is True:
            await _Streamer(conn, record, reply).run(headers)
        else:
            await _respond_whole(conn, record, reply, headers)


class _Streamer:
    """Performs one reply's :func:`actions` on a connection: writes, paced pauses, faults."""

    def __init__(self, conn: Connection, record: RecordedRequest, reply: Reply) -> None:
        self.conn = conn
        self.record = record
        self.script = reply.script
        self.reply = reply
        self.loop = asyncio.get_running_loop()
        self.last_write = self.loop.time()
        self.ping = (": keep-alive" + self.script.line_ending * 2).encode()
        # gzip whatever the request's Accept-Encoding said (wbits 31: the gzip container).
        self.gzip = zlib.compressobj(wbits=31) if self.script.gzip else None
        self.held: list[bytes] = []  # compressed, not yet written (see Send.held)

    async def run(self, headers: dict[str, str]) -> None:
        if self.gzip is not None:
            headers = {**headers, "content-encoding": "gzip"}
        self.conn.start_stream(
            200,
            {
                "content-type": "text/event-stream; charset=utf-8",
                "cache-control": "no-cache",
                **headers,
            },
        )
        deadline = self.last_write = self.loop.time()
        for action in actions(self.reply):
            if type(action) is Send:
                await self.send(action.data, content=action.content, held=action.held)
            elif type(action) is Pause:
                # Deadlines follow the script's clock, so pacing never drifts; a client that fell
                # behind (backpressure) gets at most one second's worth of chunks in a burst.
                deadline = max(deadline + action.seconds, self.loop.time() - 1.0)
                await self.wait_until(deadline)
            elif action is DROP:
                self.record._finish(completed=False)
                self.conn.close()  # flushes what was written, then FIN: the body stops mid-way
                return
            elif action is STALL:
                await self.wait_until(None)
        self.record._finish(completed=True)
        if self.gzip is not None:
            self.conn.write_chunk(self.gzip.flush())  # the gzip trailer
        self.conn.end_stream()

    async def send(self, data: bytes, *, content: bool = False, held: bool = False) -> None:
        if self.conn.closed:  # unreachable while the close cancels us; counted to prove it
            self.record._write_after_close()
            return
        big = len(data) > 64 * 1024  # before compression: a gzip bomb's writes are small
        if self.gzip is not None:
            if held:
                self.held.append(self.gzip.compress(data))
                await asyncio.sleep(0)  # other streams' turn: a burst takes a while to compress
                return
            # A sync flush: never empty, and the client can inflate it all now.
            self.held += (self.gzip.compress(data), self.gzip.flush(zlib.Z_SYNC_FLUSH))
            data = b"".join(self.held)
            self.held.clear()
        if self.script.split_writes:
            for piece in _split(data):
                self.conn.write_chunk(piece)
        else:
            self.conn.write_chunk(data)
        self.last_write = self.loop.time()
        if content:
            self.record._chunk_sent()
        await self.conn.drain()
        if big:
            # A flood's writes may fill no buffer, and then drain() does not wait: let the loop
            # run, so a client that closed meanwhile is noticed before the next one.
            await asyncio.sleep(0)

    async def wait_until(self, deadline: float | None) -> None:
        """Sleep until ``deadline`` (None: until cancelled), with keep-alive comments if asked."""
        every = self.script.keepalive_every
        while True:
            if every is not None and (deadline is None or self.last_write + every < deadline):
                await asyncio.sleep(max(0.0, self.last_write + every - self.loop.time()))
                await self.send(self.ping)
                continue
            if deadline is None:
                await self.loop.create_future()  # resolved by nobody: the client's close cancels us
            else:
                await asyncio.sleep(max(0.0, deadline - self.loop.time()))
                return


async def _respond_whole(
    conn: Connection, record: RecordedRequest, reply: Reply, headers: dict[str, str]
) -> None:
    """The non-streaming answer, after as long as streaming it would have taken."""
    script = reply.script
    await asyncio.sleep(script.first_token_delay)
    if script.drop_after is not None:
        record._finish(completed=False)
        conn.close()
        return
    if script.stall_after is not None:
        await asyncio.get_running_loop().create_future()
    if script.tokens_per_second:
        await asyncio.sleep(reply.completion_tokens / script.tokens_per_second)
    record._finish(completed=True)
    send_json(conn, 200, completion_body(reply), headers)


def send_json(
    conn: Connection, status: int, value: Any, headers: dict[str, str] | None = None
) -> None:
    body = json.dumps(value, ensure_ascii=False).encode()
    conn.respond(status, {"content-type": "application/json", **(headers or {})}, body)


def unauthorized(headers: dict[str, str]) -> dict[str, Any]:
    if headers.get("authorization") or headers.get("api-key"):
        message = "Incorrect API key provided."
    else:
        message = (
            "You didn't provide an API key. You need to provide your API key in an Authorization "
            "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
    return error_body(401, message=message, code="invalid_api_key")


def _redact(name: str, value: str) -> str:
    """Secrets in recorded headers keep their scheme and last 4 characters only."""
    if name not in _SECRET_HEADERS:
        return value
    scheme, _, token = value.rpartition(" ")
    tail = token[-4:] if len(token) >= 12 else ""
    return f"{scheme} ***{tail}".strip()


def _split(data: bytes) -> list[bytes]:
    """``data`` in up to three pieces, cut inside multibyte UTF-8 characters where there are any."""
    inside = [i for i in range(1, len(data)) if 0x80 <= data[i] < 0xC0]
    cuts = sorted(
        {inside[0], inside[len(inside) // 2]} if inside else {len(data) // 3, 2 * len(data) // 3}
    )
    pieces, start = [], 0
    for cut in cuts:
        if start < cut:
            pieces.append(data[start:cut])
            start = cut
    pieces.append(data[start:])
    return pieces
