"""A server the app cannot stream on is found at the first stream, named in the log once, and
every reply it would break is answered with an honest error instead (chatstream/_serving.py).
The WSGI case is in test_access.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from chatstream.models import Generation
from chatstream.stream import _serving

from .conftest import LOOP, ASGIServer, Browser, generation_id, read_events


class NoSockConnectLoop(asyncio.SelectorEventLoop):
    """An event loop without one of the calls an upstream connection makes (as uvloop's
    ``create_connection`` once lacked an argument the app passed)."""

    async def sock_connect(self, sock: Any, address: Any) -> None:
        raise NotImplementedError("sock_connect")


@pytest.fixture
def fresh_verdicts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process's verdicts on loops, and what it has logged, as in a new process."""
    monkeypatch.setattr(_serving, "_verdicts", {})
    monkeypatch.setattr(_serving, "_told", set())


@pytest.mark.parametrize("fast_streams", [True, False], ids=["fast-streams", "django-view"])
def test_a_loop_that_cannot_connect_answers_each_reply_with_an_error_and_logs_once(
        fast_streams, make_user, simulator, caplog, fresh_verdicts):
    user = make_user()
    with ASGIServer(fast_streams=fast_streams, loop_factory=NoSockConnectLoop) as server:
        browser = Browser(server.url, user)
        for _reply in range(2):
            url = browser.send(browser.new_conversation(), "Hi", "fast")
            with browser.client.stream("GET", url) as response:
                events = [(name, data) for _at, name, data in read_events(response)]
            assert [name for name, _data in events] == ["error", "done"]
            assert "cannot stream replies" in events[0][1]
            assert 'data-status="failed"' in events[1][1]  # the final message, with Retry
            row = Generation.objects.get(pk=generation_id(url))
            assert (row.status, row.error_type) == ("failed", "unsupported_server")
            assert row.completed_at is not None
            logged = [r for r in caplog.records if r.name == "chatstream.serving"]
            assert len(logged) == 1, "named once per process, not per reply"
            assert "NoSockConnectLoop" in logged[0].getMessage()
            assert "uvicorn" in logged[0].getMessage()  # what to do
        browser.close()
    assert simulator.requests == []  # the provider was never called


def test_the_loops_the_app_supports_pass_the_check(fresh_verdicts):
    async def check() -> str | None:
        return await _serving.problem()

    assert asyncio.run(check()) is None
    import uvloop

    assert uvloop.run(check()) is None


async def test_the_suite_runs_on_the_loop_it_names():
    """CHATSTREAM_TEST_LOOP=uvloop must not quietly run on asyncio's loop (or the other way)."""
    on_uvloop = type(asyncio.get_running_loop()).__module__.startswith("uvloop")
    assert on_uvloop == (LOOP == "uvloop")

    async def elsewhere() -> bool:  # what asgiref's and the test servers' loops are made by
        return type(asyncio.get_running_loop()).__module__.startswith("uvloop")

    assert await asyncio.to_thread(asyncio.run, elsewhere()) == on_uvloop


def test_streams_that_start_together_share_one_check_of_the_loop(fresh_verdicts, monkeypatch):
    """A burst of first streams (clients coming back after a deploy) waits for one check
    instead of each opening sockets of its own."""
    checks = []
    check = _serving._try_loop

    async def counted() -> str | None:
        checks.append(1)
        return await check()

    monkeypatch.setattr(_serving, "_try_loop", counted)

    async def burst() -> list[str | None]:
        return await asyncio.gather(*(_serving.problem() for _ in range(200)))

    assert asyncio.run(burst()) == [None] * 200
    assert len(checks) == 1
