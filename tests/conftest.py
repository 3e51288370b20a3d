"""Shared fixtures: the simulated upstream, the app's settings pointing at it, a real ASGI server.

The upstream is always the simulator over loopback; end-to-end tests drive the app through
uvicorn on a real socket (``asgi_server``), as a browser would.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, TypeVar

import httpx
import pytest
from django.contrib.auth import get_user_model
from hypothesis import settings as hypothesis_settings

from chatstream.testing import Simulator

pytest_plugins = ["chatstream.testing.pytest_plugin"]

# Property tests check what the code does, not how fast: speed is measured in bench/, and a
# slow moment of a loaded CI machine must not fail an example (Hypothesis's 200 ms deadline).
hypothesis_settings.register_profile("chatstream", deadline=None)
hypothesis_settings.load_profile("chatstream")

# A canary: no 8-character piece of it may ever appear in a response.
API_KEY = "sk-canary-4f1d2c9e8b7a6d5c4b3a2f1e0d9c8b7a"

REQUIRE_SERVICES = os.environ.get("CHATSTREAM_REQUIRE_SERVICES") == "1"

# The event loop the suite runs on, in this process and in the servers it starts: asyncio's
# own, or uvloop (what uvicorn[standard] and gunicorn's uvicorn worker run in production).
LOOP = os.environ.get("CHATSTREAM_TEST_LOOP", "asyncio")
if LOOP not in ("asyncio", "uvloop"):
    raise pytest.UsageError(f"CHATSTREAM_TEST_LOOP={LOOP!r}: use asyncio or uvloop")

T = TypeVar("T")


def pytest_configure(config: pytest.Config) -> None:
    if LOOP == "uvloop":  # every loop made from here on (pytest-asyncio, asgiref, asyncio.run)
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def pytest_report_header(config: pytest.Config) -> str:
    return f"event loop: {LOOP} (CHATSTREAM_TEST_LOOP)"


@pytest.fixture(autouse=True)
def chatstream_settings(settings: Any, chatstream_simulator: Simulator) -> Any:
    """Every test's app talks to the session's simulator, with the canary key."""
    settings.CHATSTREAM_PROVIDERS = {
        "default": {"BASE_URL": chatstream_simulator.base_url, "API_KEY": API_KEY},
    }
    settings.CHATSTREAM_MODELS = {
        "fast": {"PROVIDER": "default", "MODEL": "fast", "LABEL": "Fast"},
    }
    settings.CHATSTREAM_DEFAULT_MODEL = None
    return settings


@pytest.fixture
def use_model(settings: Any) -> Callable[[str], str]:
    """Allow-list one model whose name selects a simulator scenario; returns its key."""

    def use(spec: str, key: str = "test") -> str:
        settings.CHATSTREAM_MODELS = {key: {"PROVIDER": "default", "MODEL": spec}}
        return key

    return use


# --- a real ASGI server ---------------------------------------------------------------------------


class ASGIServer:
    """uvicorn serving the project on a free loopback port, in a thread.

    As the demo serves it (``project/asgi.py``): ticketed streams in front of Django
    (``chatstream.asgi.with_fast_streams``); ``fast_streams=False`` serves Django alone.
    ``loop_factory`` runs it on an event loop of the test's choosing.
    """

    def __init__(self, *, fast_streams: bool = True,
                 loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None) -> None:
        import uvicorn
        from django.core.asgi import get_asgi_application

        from chatstream.asgi import with_fast_streams

        self.socket = socket.socket()
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        app = get_asgi_application()
        config = uvicorn.Config(with_fast_streams(app) if fast_streams else app, loop=LOOP,
                                lifespan="off", log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        if loop_factory is None:
            run = partial(self.server.run, sockets=[self.socket])
        else:  # uvicorn's own loop setting names asyncio's or uvloop's only
            def run() -> None:
                with asyncio.Runner(loop_factory=loop_factory) as runner:
                    runner.run(self.server.serve(sockets=[self.socket]))
        self.thread = threading.Thread(target=run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.socket.close()

    def __enter__(self) -> ASGIServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@pytest.fixture(scope="session")
def asgi_server(django_db_setup: Any, django_db_blocker: Any) -> Iterator[ASGIServer]:
    with ASGIServer() as server:
        yield server


@pytest.fixture(scope="session")
def django_asgi_server(django_db_setup: Any, django_db_blocker: Any) -> Iterator[ASGIServer]:
    """The project without the stream front: every request goes through Django's cycle."""
    with ASGIServer(fast_streams=False) as server:
        yield server


# --- users and logged-in HTTP clients -------------------------------------------------------------


@pytest.fixture
def make_user(transactional_db: Any) -> Callable[..., Any]:
    def make(username: str = "alice", **fields: Any) -> Any:
        return get_user_model().objects.create_user(username=username, password="pw", **fields)

    return make


class Browser:
    """An httpx client logged in as one user against the live server, CSRF handled like htmx."""

    def __init__(self, base_url: str, user: Any) -> None:
        from django.conf import settings
        from django.test import Client

        django_client = Client()
        django_client.force_login(user)
        self.client = httpx.Client(base_url=base_url, timeout=30)
        self.client.cookies.set(settings.SESSION_COOKIE_NAME,
                                django_client.cookies[settings.SESSION_COOKIE_NAME].value)
        self.user = user
        response = self.client.get("/chat/")
        assert response.status_code == 200, response.text
        self.csrf = self.client.cookies["csrftoken"]

    def post(self, url: str, data: dict[str, Any] | None = None, *, htmx: bool = True,
             **kwargs: Any) -> httpx.Response:
        headers = {"X-CSRFToken": self.csrf, **kwargs.pop("headers", {})}
        if htmx:
            headers["HX-Request"] = "true"
        return self.client.post(url, data=data or {}, headers=headers, **kwargs)

    def new_conversation(self) -> str:
        response = self.post("/chat/new/", htmx=False)
        assert response.status_code == 302, response.text
        return response.headers["location"]

    def send(self, conversation_url: str, content: str = "Hello", model: str = "") -> str:
        """Post a message; return the generation's stream URL from the returned fragment."""
        response = self.post(conversation_url + "messages/", {"content": content, "model": model})
        assert response.status_code == 200, response.text
        return re.search(r'sse-connect="([^"]+)"', response.text).group(1)  # type: ignore[union-attr]

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def browser_for(asgi_server: ASGIServer) -> Iterator[Callable[[Any], Browser]]:
    opened: list[Browser] = []

    def open_for(user: Any) -> Browser:
        browser = Browser(asgi_server.url, user)
        opened.append(browser)
        return browser

    yield open_for
    for browser in opened:
        browser.close()


def read_events(response: httpx.Response) -> Iterator[tuple[float, str, str]]:
    """(arrival time, event name, data) for each event of a live SSE response, as it arrives."""
    from chatstream.sse import SSEDecoder

    decoder = SSEDecoder()
    for chunk in response.iter_raw():
        now = time.monotonic()
        for event in decoder.feed(chunk):
            yield now, event.event, event.data


def generation_id(stream_url: str) -> str:
    return stream_url.split("?")[0].rstrip("/").split("/")[-2]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request: Any, require_service: Callable[[str, Callable[[], bool]], None]) -> str:
    """A test's database alias: the tests' SQLite, then PostgreSQL (skipped without
    CHATSTREAM_TEST_POSTGRES)."""
    if request.param == "postgres":
        from .workers import postgres_available

        require_service("PostgreSQL (CHATSTREAM_TEST_POSTGRES)", postgres_available)
        return "postgres"
    return "default"


@pytest.fixture
def require_service() -> Callable[[str, Callable[[], bool]], None]:
    """Skip a test whose service is missing, or fail it when CI requires the services."""

    def require(name: str, available: Callable[[], bool]) -> None:
        if available():
            return
        message = f"{name} is not reachable"
        if REQUIRE_SERVICES:
            pytest.fail(message + " (CHATSTREAM_REQUIRE_SERVICES=1: CI must run this test)")
        pytest.skip(message)

    return require


# --- work in a thread of its own ------------------------------------------------------------------


def in_thread(target: Callable[[], T], timeout: float = 30.0) -> T:
    """``target()`` in a thread of its own (its own event loop, its own Django connections,
    closed after): what it returns, or what it raised. A thread still running after
    ``timeout`` seconds fails the test with its stack; it is a daemon, so it can't also keep
    the test run from ending."""
    from django.db import connections

    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, target()))
        except BaseException as error:
            outcome.append((False, error))
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, name="in_thread", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        pytest.fail(f"still running after {timeout} s:\n{stack_of(thread)}")
    returned, value = outcome[0]
    if not returned:
        raise value
    return value  # type: ignore[no-any-return]


def stack_of(thread: threading.Thread) -> str:
    frame = sys._current_frames().get(thread.ident or 0)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(no stack)"


def idle_executor(thread: threading.Thread) -> bool:
    """A thread pool's worker waiting for work (the interpreter's exit stops these)."""
    import concurrent.futures.thread

    frame = sys._current_frames().get(thread.ident or 0)
    return frame is not None and frame.f_code is concurrent.futures.thread._worker.__code__


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A thread that is not a daemon and still runs when the tests are over would keep the
    interpreter from exiting, and the run would hang until CI gives up on it: name it, show
    where it is stuck, and fail the run."""
    def stray_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate()
                if t is not threading.main_thread() and not t.daemon and not idle_executor(t)]

    deadline = time.monotonic() + 5  # time to finish what they are doing
    while (stray := stray_threads()) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not stray:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for thread in stray:
        text = f"thread {thread.name!r} is still running after the tests:\n{stack_of(thread)}"
        if reporter is not None:
            reporter.write("\n")
            reporter.write_line(text, red=True)
        else:
            print(text, file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def exit_now() -> None:  # joining the stray threads at exit would wait for ever
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(pytest.ExitCode.TESTS_FAILED))

    session.config.add_cleanup(exit_now)
