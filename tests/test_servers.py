"""The app under each ASGI server and event loop a Django site deploys with.

Each server runs as in production: a process of its own, started from its command line (see
``SERVERS`` in tests/workers.py), on the tests' database (PostgreSQL when it answers, else the
SQLite file), with Stop carried by Redis when it answers, else by the database poll. Through
each, a reply streams to its end, a browser that leaves closes the upstream request at once,
Stop ends the reply, and a page that reconnects gets the rest while the reply goes on after its
old connection (its request) has ended; the simulator's log says when the upstream connection
was closed.
"""

from __future__ import annotations

import html
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from chatstream.models import Generation
from chatstream.sse import ServerSentEvent, SSEDecoder
from chatstream.testing import Simulator

from .conftest import Browser, generation_id, read_events
from .workers import DATABASES, Workers, postgres_available, redis_available

pytestmark = pytest.mark.django_db(transaction=True, databases=DATABASES)

CASES = [
    "uvicorn-uvloop-httptools",
    "uvicorn-asyncio-h11",
    "uvicorn-uvloop-django",
    "daphne",
    "gunicorn-uvicorn-worker",
    "hypercorn-asyncio",
    "hypercorn-uvloop",
    "runserver-daphne",
]

# The prompt, echoed back as the reply: one token a word, so "brisk" ends in 0.6 s and "slow"
# would take 3 s.
PROMPT = " ".join(f"w{i}" for i in range(30))
MODELS = {
    "brisk": {"PROVIDER": "default", "MODEL": "echo?tps=50&first_token_delay=0"},
    "slow": {"PROVIDER": "default", "MODEL": "echo?tps=10&first_token_delay=0"},
}

REDIS_URL = os.environ.get("CHATSTREAM_TEST_REDIS", "redis://127.0.0.1:6379/0")

Status = Generation.Status


@pytest.fixture(scope="module", params=CASES)
def server(request: pytest.FixtureRequest, django_db_setup: Any,
           chatstream_simulator: Simulator) -> Iterator[Workers]:
    """One server, started once for the checks below, with two processes where it takes a
    count (gunicorn): a Stop may then reach another process than the stream's."""
    overrides: dict[str, Any] = {
        "CHATSTREAM_PROVIDERS": {"default": {"BASE_URL": chatstream_simulator.base_url,
                                             "API_KEY": "sk-test"}},
        "CHATSTREAM_MODELS": MODELS,
        "CHATSTREAM_DEFAULT_MODEL": None,
    }
    env = {"PYTHONWARNINGS": "default"}  # every warning printed, deprecations included
    if redis_available(REDIS_URL):
        env["REDIS_URL"] = REDIS_URL
    else:
        overrides |= {"CHATSTREAM_CHANNEL_LAYER": None, "CHATSTREAM_STOP_POLL_INTERVAL": 0.2}
    alias = "postgres" if postgres_available() else "default"
    with Workers(server=request.param, workers=2, alias=alias, env=env,
                 overrides=overrides) as workers:
        yield workers


@pytest.fixture
def browser(server: Workers, simulator: Simulator,
            request: pytest.FixtureRequest) -> Iterator[Browser]:
    """A user logged in on the server; a failed check shows what the server printed meanwhile."""
    user = get_user_model().objects.db_manager(server.alias).create_user("alice", password="pw")
    printed = len(server.output())
    failed = request.session.testsfailed
    browser = Browser(server.url, user)
    yield browser
    browser.close()
    if request.session.testsfailed > failed:
        print(f"--- {server.server} printed ---\n{server.output()[printed:]}", file=sys.stderr)


def final_row(server: Workers, url: str, timeout: float = 5) -> Generation:
    """The generation once it has ended (its final save may follow the stream's end)."""
    rows = Generation.objects.using(server.alias).filter(pk=generation_id(url))
    deadline = time.monotonic() + timeout
    while (row := rows.exclude(status__in=Generation.LIVE).first()) is None:
        assert time.monotonic() < deadline, f"still {rows.get().status} after {timeout} s"
        time.sleep(0.02)
    return row


def test_a_reply_streams_to_its_end(server, browser, simulator):
    url = browser.send(browser.new_conversation(), PROMPT, "brisk")
    with browser.client.stream("GET", url) as response:
        assert response.status_code == 200
        events = list(read_events(response))
    names = [name for _at, name, _data in events]
    assert names[-1] == "done" and "error" not in names, f"the reply failed: {events}"
    record = simulator.last_request
    assert record.completed and not record.client_closed
    arrivals = [at for at, name, _data in events if name == "delta"]
    early = sum(at < record.finished_at for at in arrivals)
    assert early >= 5, f"{early} of {len(arrivals)} deltas arrived before the upstream finished"
    assert html.unescape("".join(data for _at, name, data in events if name == "delta")) == PROMPT
    row = final_row(server, url)
    assert row.status == Status.COMPLETED and row.content == PROMPT


def test_a_browser_that_leaves_closes_the_upstream_at_once(server, browser, simulator):
    url = browser.send(browser.new_conversation(), PROMPT, "slow")
    _events, received = read_reply(browser, url, at_three_words=lambda: True)  # and leave
    assert_cut_short(server, simulator, url, received, since=time.monotonic(),
                     error_type="client_disconnected")


def test_stop_ends_the_reply_and_closes_the_upstream(server, browser, simulator):
    url = browser.send(browser.new_conversation(), PROMPT, "slow")
    stopped_at = []

    def stop() -> bool:
        stopped_at.append(time.monotonic())
        assert browser.post(url.replace("/stream/", "/cancel/")).status_code == 204
        return False  # and read on, to the end of the stream

    events, received = read_reply(browser, url, at_three_words=stop)
    assert events[-1][0] == "done"
    assert_cut_short(server, simulator, url, received, since=stopped_at[0],
                     error_type="stopped_by_user")


def test_a_page_that_reconnects_gets_only_the_rest_and_the_reply_goes_on(server, browser,
                                                                        simulator):
    """The page's new connection (maybe to the other process) asks for the text after the last
    id it got; then its old connection goes: the reply is handed over, not cancelled."""
    url = browser.send(browser.new_conversation(), PROMPT, "slow")
    decoder = SSEDecoder()
    first: list[ServerSentEvent] = []
    with browser.client.stream("GET", url) as response:
        received = response.iter_raw()  # kept: a generator closed early closes the connection
        while len(text_of(first).split()) < 3:
            first += decoder.feed(next(received))
        have = [e.id for e in first if e.event == "delta"][-1]
        request = browser.client.build_request("GET", url.split("?")[0],
                                               headers={"Last-Event-ID": have})
        resumed = browser.client.send(request, stream=True)
        decoder = SSEDecoder()
        rest: list[ServerSentEvent] = []
        chunks = resumed.iter_raw()
        while not rest:  # the server follows the reply for this connection: now leave
            rest += decoder.feed(next(chunks))
    for chunk in chunks:
        rest += decoder.feed(chunk)
    resumed.close()
    assert rest[-1].event == "done"
    assert text_of(first)[:int(have)] + text_of(rest) == PROMPT
    row = final_row(server, url, timeout=10)
    assert row.status == Status.COMPLETED and row.content == PROMPT
    assert len(simulator.requests) == 1 and not simulator.last_request.client_closed


def text_of(events: list[ServerSentEvent]) -> str:
    return html.unescape("".join(e.data for e in events if e.event == "delta"))


def read_reply(browser: Browser, url: str, *,
               at_three_words: Callable[[], bool]) -> tuple[list[tuple[str, str]], str]:
    """The stream's events and the text received, calling ``at_three_words()`` once three words
    have arrived: reading stops there (the browser leaves) when it returns True."""
    events: list[tuple[str, str]] = []
    received = ""
    called = False
    with browser.client.stream("GET", url) as response:
        assert response.status_code == 200
        for _at, name, data in read_events(response):
            events.append((name, data))
            if name == "delta":
                received += html.unescape(data)
                if not called and len(received.split()) >= 3:
                    called = True
                    if at_three_words():
                        break
    assert called, f"the stream ended before three words: {events}"
    return events, received


def assert_cut_short(server: Workers, simulator: Simulator, url: str, received: str, *,
                     since: float, error_type: str) -> None:
    """The upstream was closed within a second of ``since``, nothing was sent after, and the
    reply is stored as cancelled with ``error_type`` and the partial text."""
    record = simulator.last_request
    assert record.wait_closed(5)
    assert record.client_closed, f"the upstream kept streaming ({error_type})"
    assert record.client_closed_at - since < 1.0
    assert record.chunks_after_close == 0
    row = final_row(server, url)
    assert (row.status, row.error_type) == (Status.CANCELLED, error_type)
    assert row.content.startswith(received) and PROMPT.startswith(row.content)
    assert row.content != PROMPT


def test_the_server_printed_no_traceback_nor_warning(server):
    """Runs after the checks above, for each server: an error the app only logged, or a
    warning (the servers run with PYTHONWARNINGS=default: each is printed once), fails here."""
    printed = server.output()
    found = re.findall(r"^.*(?:Traceback|Exception ignored|\w+Warning: ).*$", printed, re.M)
    assert not found, printed
