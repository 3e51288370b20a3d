"""The provider side: requests built from settings only, one shared connection pool per event loop.

Nothing from the browser reaches a request except the conversation's stored text: the URL, the
key and every parameter come from ``CHATSTREAM_PROVIDERS`` / ``CHATSTREAM_MODELS``. The API key
is never logged, rendered or put in an exception.

A provider's error body can echo the prompt, or a credential we sent: its text is kept on the
error's ``detail`` (which the stream engine logs at DEBUG only) with every configured credential
redacted (:func:`redact`). Above DEBUG, a provider's error is its HTTP status, request id and
error code.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from .. import __version__
from .._loops import PerLoop
from ..conf import ModelChoice, conf
from ..exceptions import UpstreamConnectError, UpstreamHTTPError
from . import _network

logger = logging.getLogger("chatstream.upstream")

USER_AGENT = f"chatstream/{__version__}"

@dataclass
class UpstreamRequest:
    """One Chat Completions call, ready to send."""

    provider: str
    url: str
    body: dict[str, Any]
    headers: dict[str, str] = field(repr=False)

    def __repr__(self) -> str:  # never show headers: they hold the key
        url = _QUERY_KEY.sub(_HIDE, self.url)
        return f"UpstreamRequest(provider={self.provider!r}, url={url!r})"


def build_request(model: ModelChoice, messages: list[dict[str, Any]],
                  params: dict[str, Any] | None = None,
                  tools: list[dict[str, Any]] | None = None) -> UpstreamRequest:
    """The streaming request for ``messages`` to the allow-listed ``model``; ``params`` (a
    request hook's, checked when it set them) go on top of the model's own; ``tools``, the
    functions the model may call, as the request's ``tools``."""
    provider = conf.PROVIDERS[model.provider]
    body: dict[str, Any] = {**model.params, "max_tokens": model.max_tokens, **(params or {})}
    body.update(
        model=model.model,
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
    )
    if tools:
        body["tools"] = tools
    # Ask for an uncompressed stream: each event must reach us as soon as it is sent.
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
               "Accept-Encoding": "identity", "User-Agent": USER_AGENT}
    for name, value in provider.get("HEADERS", {}).items():  # a site's header replaces ours
        headers = {k: v for k, v in headers.items() if k.lower() != name.lower()}
        headers[name] = value
    key = provider.get("API_KEY")
    if key:
        auth_header = provider.get("AUTH_HEADER", "Authorization")
        headers[auth_header] = f"Bearer {key}" if auth_header == "Authorization" else key
    return UpstreamRequest(
        provider=model.provider,
        url=provider["BASE_URL"].rstrip("/") + "/chat/completions",
        body=body,
        headers=headers,
    )


def _new_transport() -> _network.Transport:
    size = conf.MAX_CONNECTIONS
    return _network.Transport(httpx.Limits(
        max_connections=size,
        max_keepalive_connections=min(size, conf.MAX_KEEPALIVE_CONNECTIONS),
        keepalive_expiry=30,
    ))


async def _aclose(transport: _network.Transport) -> None:
    await transport.aclose()


# The running loop's connection pool, sized by CHATSTREAM_MAX_CONNECTIONS; closed with the loop.
_transports = PerLoop(_new_transport, close=_aclose)


async def get_transport() -> _network.Transport:
    """The running loop's connection pool (made on first use, closed with the loop)."""
    return await _transports.aget()


async def aclose_transports() -> None:
    """Close the running loop's connection pool now (it is closed with its loop anyway)."""
    transport = _transports.pop()
    if transport is not None:
        await transport.aclose()


async def send(request: UpstreamRequest, body: bytes,
               trace: Callable[[str, dict[str, Any]], Any] | None = None) -> httpx.Response:
    """Send ``request`` (its ``body`` encoded) and return the streaming response, unread.

    Straight to the pool's transport: what ``httpx.AsyncClient`` adds on top (redirects, which
    could carry the key to another host; a cookie jar shared by every user's stream; auth
    flows) is nothing a provider call may use. The caller closes the response.
    ``trace``, if given, is httpcore's trace extension: the stream engine passes one to learn when
    the request has been written.
    """
    extensions: dict[str, Any] = {"timeout": timeout().as_dict()}
    if trace is not None:
        extensions["trace"] = trace
    sent = httpx.Request("POST", _url(request.url), headers=request.headers, content=body,
                         extensions=extensions)
    response = await (await get_transport()).handle_async_request(sent)
    response.request = sent
    return response


@functools.lru_cache(maxsize=64)
def _url(url: str) -> httpx.URL:
    return httpx.URL(url)  # parsed once per provider, not per stream


def timeout() -> httpx.Timeout:
    return httpx.Timeout(
        connect=conf.CONNECT_TIMEOUT,
        read=conf.INACTIVITY_TIMEOUT,
        write=conf.CONNECT_TIMEOUT,
        pool=conf.CONNECT_TIMEOUT,
    )


def encode_body(request: UpstreamRequest) -> bytes:
    """The request body as sent, copied to its exact size: it is held for the whole stream.

    (orjson returns its bytes inside a buffer of at least 32 KB; kept per open stream, that
    alone was several KB of resident memory each.)
    """
    return bytes(memoryview(orjson.dumps(request.body)))


async def raise_for_status(response: httpx.Response, request: UpstreamRequest) -> None:
    """Raise UpstreamHTTPError for an error status (its ``detail``: the body's text, redacted)."""
    if response.status_code < 400:
        return
    try:
        raw = await _read_limited(response, 16 * 1024)
    except httpx.HTTPError:
        raw = b""
    code, detail = _error_detail(raw)
    request_id = response.headers.get("x-request-id", "")
    error = UpstreamHTTPError(
        f"The provider answered HTTP {response.status_code}.",
        provider=request.provider,
        request_id=request_id,
        status=response.status_code,
        code=code,
        detail=redact(detail),
    )
    logger.warning("Provider %r answered HTTP %s (request id %r, error code %s)",
                   request.provider, error.status, request_id, redact(str(error.code)))
    error.retry_after = response.headers.get("retry-after", "")  # type: ignore[attr-defined]
    raise error


def connect_error(exc: Exception, request: UpstreamRequest) -> UpstreamConnectError:
    logger.warning("Could not reach provider %r: %s", request.provider, type(exc).__name__)
    return UpstreamConnectError(
        f"Could not reach the provider ({type(exc).__name__}).", provider=request.provider
    )


async def _read_limited(response: httpx.Response, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for chunk in response.aiter_raw():
        parts.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    return b"".join(parts)[:limit]


def _error_detail(raw: bytes) -> tuple[object, str]:
    """An error body's code (or type), unchecked, and its text (at most 500 characters)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, raw[:500].decode("utf-8", "replace")
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        code = error.get("code")
        kind = error.get("type")
        return (code if code is not None else kind,
                f"{kind or code or ''}: {error.get('message', '')}"[:500])
    return None, str(error or data)[:500]


_QUERY_KEY = re.compile(r"([?&](?:key|api_key|api-key|token)=)[^&\s]+", re.IGNORECASE)
_HIDE = r"\1***"

# An API key is secret by definition: redacted from 4 characters (no real key is shorter). A
# HEADERS value may be a secret (api-key, a subscription key) or not (api-version, X-Title):
# redacted from 8 characters, as a shorter secret would be guessed anyway, and a short common
# value ("eu", "true", "Site") would blank that word out of every log line.
_MIN_KEY, _MIN_HEADER_VALUE = 4, 8


def _credentials() -> list[str]:
    """Every configured credential, longest first (so none is left half-redacted)."""
    found: set[str] = set()
    for provider in conf.PROVIDERS.values():
        key = provider.get("API_KEY")
        if isinstance(key, str) and len(key) >= _MIN_KEY:
            found.add(key)
        for value in (provider.get("HEADERS") or {}).values():
            if isinstance(value, str) and len(value.strip()) >= _MIN_HEADER_VALUE:
                found.add(value.strip())
    return sorted(found, key=len, reverse=True)


def redact(text: str, request: UpstreamRequest | None = None) -> str:
    """``text`` with every configured credential replaced by ``***``, wherever it occurs.

    The credentials are every provider's ``API_KEY`` (also what its ``AUTH_HEADER`` sends) and
    every value of its ``HEADERS`` (see ``_credentials`` for the lengths); ``?key=`` query values
    go too. ``request`` is accepted for callers that have one; every provider's are redacted.
    """
    for secret in _credentials():
        text = text.replace(secret, "***")
    return _QUERY_KEY.sub(_HIDE, text)
