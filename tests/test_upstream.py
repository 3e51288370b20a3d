"""chatstream.provider: the request a provider receives, and the pool it is sent from."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from chatstream import __version__
from chatstream.conf import conf
from chatstream.provider import _network, _request

from .test_network import with_server


@pytest.fixture
def provider(settings: Any) -> Any:
    def configure(**entry: Any) -> Any:
        settings.CHATSTREAM_PROVIDERS = {"p": {"API_KEY": "sk-test", **entry}}
        settings.CHATSTREAM_MODELS = {"m": {"PROVIDER": "p", "MODEL": "model-x"}}
        model = conf.get_model("m")
        assert model is not None
        return model

    return configure


def test_a_request_names_chatstream_and_a_site_can_replace_any_header(provider):
    model = provider(BASE_URL="http://127.0.0.1:9/v1/")
    request = _request.build_request(model, [{"role": "user", "content": "Hi"}])
    assert request.url == "http://127.0.0.1:9/v1/chat/completions"
    assert request.headers["User-Agent"] == f"chatstream/{__version__}"
    assert request.headers["Authorization"] == "Bearer sk-test"
    # A site's header replaces ours whatever its case: never two of one header on the wire.
    model = provider(BASE_URL="http://127.0.0.1:9/v1",
                     HEADERS={"user-agent": "site/2", "X-Title": "Site"})
    headers = _request.build_request(model, []).headers
    assert [name for name in headers if name.lower() == "user-agent"] == ["user-agent"]
    assert headers["user-agent"] == "site/2" and headers["X-Title"] == "Site"


def test_no_cookie_set_by_a_provider_goes_back_with_a_later_request(provider):
    """One pool serves every user's streams: a cookie from one reply must not ride along with
    the next user's request (as it would through an httpx.AsyncClient's cookie jar)."""
    heads: list[bytes] = []

    async def set_a_cookie_each_time(reader: asyncio.StreamReader,
                                     writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            length = next(int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                          if line.startswith(b"content-length:"))
            await reader.readexactly(length)
            heads.append(head)
            writer.write(b"HTTP/1.1 200 OK\r\nSet-Cookie: session=someone; Path=/\r\n"
                         b"Content-Length: 2\r\n\r\nok")
            await writer.drain()

    async def two_requests(port: int) -> None:
        request = _request.build_request(provider(BASE_URL=f"http://127.0.0.1:{port}/v1"), [])
        try:
            for _ in range(2):
                response = await _request.send(request, b"{}")
                try:
                    assert await response.aread() == b"ok"
                finally:
                    await response.aclose()
        finally:
            await _request.aclose_transports()

    with_server(set_a_cookie_each_time, two_requests)
    assert len(heads) == 2
    for head in heads:
        lines = head.lower().split(b"\r\n")
        assert not [line for line in lines if line.startswith(b"cookie:")], head
        assert f"user-agent: chatstream/{__version__}".encode() in lines


def test_the_pool_is_one_per_loop_over_our_network_layer_and_closes_with_its_loop(
        provider, chatstream_simulator):
    """A loop's end (asyncio.run, async_to_sync, a server shutting down) closes its idle
    keep-alive connections; left open, their sockets would wait for the garbage collector."""
    opened: list[Any] = []

    async def trace(event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.complete":
            opened.append(info["return_value"])

    async def two_calls() -> Any:
        transport = await _request.get_transport()
        assert await _request.get_transport() is transport
        request = _request.build_request(provider(BASE_URL=chatstream_simulator.base_url), [
            {"role": "user", "content": "Hi"}])
        for _ in range(2):
            response = await _request.send(request, b'{"model": "default?tps=1000", '
                                                    b'"stream": true, "messages": []}', trace)
            try:
                await response.aread()
            finally:
                await response.aclose()
        return transport

    transport = asyncio.run(two_calls())
    assert len(opened) == 1  # the second call reused the kept-alive connection
    [stream] = opened
    assert isinstance(stream, _network.Stream)  # the pool reaches the network through Backend
    assert stream._protocol.ended  # connection_lost has run: its socket is closed
    assert transport.pool.connections == []
    assert all(not loop.is_closed() for loop, _ in _request._transports.items())


def test_the_ca_bundle_is_loaded_once_per_process_not_per_loop(monkeypatch):
    """Each event loop gets a pool (every async view of a WSGI site runs on a loop of its
    own); loading certifi's CA bundle for each took ~45 ms, twice over."""
    import ssl

    import httpx

    made: list[ssl.SSLContext] = []
    create = httpx.create_ssl_context

    def counted(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        made.append(create(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(httpx, "create_ssl_context", counted)
    _network._ssl_context.cache_clear()

    async def pool() -> Any:
        try:
            return await _request.get_transport()
        finally:
            await _request.aclose_transports()

    pools = [asyncio.run(pool()) for _ in range(3)]
    assert len({id(made_for_loop) for made_for_loop in pools}) == 3  # a pool for each loop
    assert len(made) == 1  # and one context for all
    assert made[0].verify_mode == ssl.CERT_REQUIRED and made[0].check_hostname
