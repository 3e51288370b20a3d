"""The demo's static files handler closes every file it opens, also for a client that leaves
before its response is ready (a browser leaving a page while the favicon loads).

The server is uvicorn on a real socket; the client is a raw socket that closes once the file is
open. The handler's worker thread is held until the disconnect has reached the application, so
the request is always aborted while the thread still holds the response: the case in which
Django drops the response, and its open file, without closing it.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from .conftest import ASGIServer

FAVICON = "/static/favicon.svg"


class StaticServer(ASGIServer):
    """The project under uvicorn behind the demo's static files handler, whose ``serve`` (run in
    a worker thread) records each file it opens and waits for ``release`` before returning."""

    def __init__(self) -> None:
        super().__init__(fast_streams=False)
        from project.asgi import StaticFilesHandler

        self.opened: list[Any] = []
        self.serving = threading.Event()  # a file is open, its response not yet returned
        self.release = threading.Event()  # serve may return (set by the test, or on disconnect)
        self.disconnected = threading.Event()  # the application has received http.disconnect
        handler = StaticFilesHandler(self.server.config.app)
        serve = handler.serve

        def held_serve(request: Any) -> Any:
            response = serve(request)
            self.opened.append(response.file_to_stream)
            self.serving.set()
            self.release.wait(10)
            return response

        handler.serve = held_serve  # type: ignore[method-assign]
        self.server.config.app = self.watching_disconnects(handler)

    def watching_disconnects(self, app: Callable[..., Any]) -> Callable[..., Any]:
        async def application(scope: Any, receive: Callable[..., Any], send: Any) -> None:
            async def watched_receive() -> Any:
                message = await receive()
                if message["type"] == "http.disconnect":
                    self.disconnected.set()
                    self.release.set()
                return message

            await app(scope, watched_receive, send)

        return application


@pytest.fixture
def static_server() -> Iterator[StaticServer]:
    server = StaticServer()
    with server:
        yield server
    for file in server.opened:  # so a failing test leaves nothing to the garbage collector
        file.close()


def closed_within(file: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not file.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(file.closed)


def test_a_static_file_is_served_and_closed(static_server: StaticServer) -> None:
    static_server.release.set()
    response = httpx.get(static_server.url + FAVICON, timeout=10)
    assert response.status_code == 200
    assert response.content.startswith(b"<svg")
    assert len(static_server.opened) == 1
    assert closed_within(static_server.opened[0], 2)


def test_the_file_of_a_client_that_left_before_its_response_is_closed(
        static_server: StaticServer) -> None:
    with socket.create_connection(("127.0.0.1", static_server.port), timeout=10) as client:
        client.sendall(f"GET {FAVICON} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        assert static_server.serving.wait(10), "the file was never opened"
    assert static_server.disconnected.wait(10), "the disconnect never reached the application"
    assert len(static_server.opened) == 1
    assert closed_within(static_server.opened[0], 2), (
        "the response of the aborted request was dropped with its file still open")
