"""A generation's life under every fault, end to end.

The app runs under a real ASGI server (uvicorn in a thread, or daphne/uvicorn worker processes),
the provider is the simulator over loopback, and each test asserts both the stored row and what
the upstream saw: whether its connection was closed, and how many chunks it sent after that.
"""

from __future__ import annotations

import html
import io
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest
from django.core.management import call_command

from chatstream.models import Generation
from chatstream.testing import Simulator

from .conftest import Browser, generation_id, read_events
from .workers import DATABASES, Workers

pytestmark = pytest.mark.django_db(transaction=True)

REDIS_URL = os.environ.get("CHATSTREAM_TEST_REDIS", "redis://127.0.0.1:6379/0")

Status = Generation.Status


def stream_all(browser: Browser, url: str) -> list[tuple[float, str, str]]:
    with browser.client.stream("GET", url) as response:
        assert response.status_code == 200
        return list(read_events(response))


def read_deltas_then_leave(browser: Browser, url: str, count: int) -> str:
    """Read ``count`` delta events, then drop the connection as a closing tab would."""
    text = ""
    with browser.client.stream("GET", url) as response:
        seen = 0
        for _at, name, data in read_events(response):
            if name == "delta":
                text += html.unescape(data)
                seen += 1
                if seen == count:
                    break
    return text


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def final_row(url: str) -> Generation:
    gid = generation_id(url)
    return wait_for(lambda: Generation.objects.exclude(status__in=Generation.LIVE)
                    .filter(pk=gid).first())


# --- 1. Claim once -----------------------------------------------------------------------------


def test_concurrent_stream_requests_make_one_upstream_call_and_the_same_text(
    make_user, browser_for, simulator, use_model
):
    model = use_model("default?tps=60")
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", model)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: stream_all(browser, url), range(4)))
    assert len(simulator.requests) == 1
    stored = Generation.objects.get(pk=generation_id(url)).content
    for events in results:
        assert events[-1][1] == "done"
        assert html.unescape("".join(d for _, n, d in events if n == "delta")) == stored
    # And any later request (an EventSource reconnect) replays, never calls upstream again.
    assert stream_all(browser, url)[-1][1] == "done"
    assert len(simulator.requests) == 1


def test_idle_upstream_connections_beyond_the_keepalive_limit_are_closed(
    make_user, browser_for, simulator, use_model, settings
):
    """A burst of streams must not leave a pool of idle connections behind (httpcore scans its
    whole pool for every request: a large idle pool makes the next burst cost seconds)."""
    from chatstream.provider import _request

    def close_pools() -> None:  # the next stream then makes a pool with current settings
        import asyncio

        for loop, _transport in _request._transports.items():
            if loop.is_running():  # the test server's loop; others closed theirs as they ended
                asyncio.run_coroutine_threadsafe(_request.aclose_transports(), loop).result(5)
        assert not _request._transports.items()

    settings.CHATSTREAM_MAX_KEEPALIVE_CONNECTIONS = 2
    close_pools()
    model = use_model("default?tps=200")
    browser = browser_for(make_user())
    conversation = browser.new_conversation()
    urls = [browser.send(conversation, f"Hi {i}", model) for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        assert all(events[-1][1] == "done" for events in pool.map(
            lambda url: stream_all(browser, url), urls))
    assert len(simulator.requests) == 6
    [(_loop, transport)] = _request._transports.items()
    pool = transport.pool
    assert len(pool.connections) <= 2, pool.connections
    close_pools()


# --- 2. Browser disconnect ---------------------------------------------------------------------


@contextmanager
def serving(kind: str, asgi_server):
    """The app under uvicorn (in a thread) or daphne (its own process), with current settings."""
    if kind == "uvicorn":
        yield asgi_server.url
    else:
        with Workers(server="daphne") as workers:
            yield workers.url


@pytest.mark.parametrize("server", ["uvicorn", "daphne"])
def test_browser_disconnect_closes_upstream_at_once_and_keeps_partial_text(
    make_user, simulator, use_model, asgi_server, server
):
    model = use_model("default?tps=20")
    with serving(server, asgi_server) as base_url:
        browser = Browser(base_url, make_user())
        generation = _disconnect_after_three_deltas(browser, simulator, model)
        browser.close()
    assert generation.status == Status.CANCELLED
    assert generation.reason == "client disconnected"
    assert generation.usage_source == Generation.UsageSource.ESTIMATED
    assert generation.completion_tokens and generation.completion_tokens > 0
    assert generation.completed_at is not None


def _disconnect_after_three_deltas(browser, simulator, model):
    url = browser.send(browser.new_conversation(), "Hi", model)
    received = read_deltas_then_leave(browser, url, 3)
    left_at = time.monotonic()
    record = simulator.last_request
    assert record.wait_closed(5)
    assert record.client_closed, "the upstream kept streaming after the browser left"
    assert record.client_closed_at - left_at < 1.0  # measured in bench/: a few ms
    assert record.chunks_after_close == 0
    generation = final_row(url)
    assert generation.content.startswith(received)
    return generation


@pytest.mark.parametrize("front", ["django", "fast-streams"])
def test_disconnect_while_django_is_blocked_sending_still_closes_upstream(
    make_user, simulator, use_model, front
):
    """Drive the ASGI application with a send() that blocks, as a stalled client would."""
    import asyncio

    from asgiref.sync import async_to_sync
    from django.conf import settings
    from django.core.asgi import get_asgi_application
    from django.test import Client

    from chatstream.asgi import with_fast_streams

    model = use_model("default?tps=40")
    user = make_user()
    client = Client()
    client.force_login(user)
    conversation = client.post("/chat/new/")["Location"]
    fragment = client.post(conversation + "messages/", {"content": "Hi", "model": model},
                           headers={"HX-Request": "true"}).content.decode()
    url = html.unescape(fragment.split('sse-connect="')[1].split('"')[0])
    path, _, query = url.partition("?")
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"

    async def scenario() -> None:
        app = get_asgi_application()
        if front == "fast-streams":
            app = with_fast_streams(app)
        disconnect = asyncio.Event()
        body_sent = asyncio.Event()

        async def receive():
            if not body_sent.is_set():
                body_sent.set()
                return {"type": "http.request", "body": b"", "more_body": False}
            await disconnect.wait()
            return {"type": "http.disconnect"}

        bodies = 0

        async def send(message):
            nonlocal bodies
            if message["type"] == "http.response.body" and message.get("body"):
                bodies += 1
                if bodies >= 2:  # the client stops reading: this send never returns
                    disconnect.set()
                    await asyncio.Event().wait()

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
                 "query_string": query.encode(), "root_path": "",
                 "headers": [(b"host", b"testserver"), (b"cookie", cookie.encode())],
                 "client": ("127.0.0.1", 5000), "server": ("testserver", 80)}
        # As in uvicorn and daphne, the request runs in a task of its own.
        await asyncio.wait_for(asyncio.create_task(app(scope, receive, send)), 10)
        record = await simulator.await_for_requests(1)
        assert await record[0].await_closed(5)
        # Let the detached final save finish before the loop ends.
        from chatstream.stream import _run

        while _run._background:
            await asyncio.wait(set(_run._background))

    async_to_sync(scenario)()
    record = simulator.last_request
    assert record.client_closed and not record.completed
    generation = final_row(url)
    assert generation.status == Status.CANCELLED
    assert generation.reason == "client disconnected"


# --- 3. Stop -----------------------------------------------------------------------------------


def test_stop_ends_the_stream_with_done_and_closes_upstream(
    make_user, browser_for, simulator, use_model
):
    model = use_model("default?tps=20")
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", model)
    names = []
    stopped_at = None
    with browser.client.stream("GET", url) as response:
        for _at, name, _data in read_events(response):
            names.append(name)
            if names.count("delta") == 3 and stopped_at is None:
                stopped_at = time.monotonic()
                cancel = browser.post(url.replace("/stream/", "/cancel/"))
                assert cancel.status_code == 204
    assert names[-1] == "done"
    record = simulator.last_request
    assert record.client_closed and record.client_closed_at - stopped_at < 1.5
    generation = Generation.objects.get(pk=generation_id(url))
    assert generation.status == Status.CANCELLED
    assert generation.reason == "stopped by user"
    assert generation.content
    # A repeated or late Stop changes nothing.
    assert browser.post(url.replace("/stream/", "/cancel/")).status_code == 204
    assert Generation.objects.get(pk=generation.pk).status == Status.CANCELLED


def test_stop_before_the_stream_starts_is_not_lost_and_no_upstream_call_is_made(
    make_user, browser_for, simulator
):
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", "fast")
    assert browser.post(url.replace("/stream/", "/cancel/")).status_code == 204
    events = stream_all(browser, url)
    assert events[-1][1] == "done"
    assert simulator.requests == []
    generation = Generation.objects.get(pk=generation_id(url))
    assert generation.status == Status.CANCELLED and generation.reason == "stopped by user"
    assert generation.usage_source == Generation.UsageSource.NONE


def test_another_users_stop_is_a_404_and_the_stream_finishes(
    make_user, browser_for, simulator, use_model
):
    model = use_model("default?tps=80")
    owner, other = make_user("owner"), make_user("mallory")
    browser = browser_for(owner)
    url = browser.send(browser.new_conversation(), "Hi", model)
    intruder = browser_for(other)
    with browser.client.stream("GET", url) as response:
        events = read_events(response)
        next(e for e in events if e[1] == "delta")
        assert intruder.post(url.replace("/stream/", "/cancel/")).status_code == 404
        rest = [name for _at, name, _data in events]
    assert rest[-1] == "done"
    assert Generation.objects.get(pk=generation_id(url)).status == Status.COMPLETED


@pytest.fixture(params=["sqlite", "postgres"])
def db_alias(request, require_service):
    """The database the worker processes share: the tests' SQLite file, or PostgreSQL."""
    if request.param == "postgres":
        from .workers import postgres_available

        require_service("PostgreSQL", postgres_available)
        return "postgres"
    return "default"


def user_in(alias: str, username: str = "alice"):
    from django.contrib.auth import get_user_model

    return get_user_model().objects.db_manager(alias).create_user(username, password="pw")


@pytest.mark.django_db(transaction=True, databases=DATABASES)
@pytest.mark.parametrize("layer", ["redis", "database-poll"])
def test_stop_reaches_a_stream_running_in_another_process(
    simulator, use_model, require_service, layer, db_alias
):
    from .workers import redis_available

    if layer == "redis":
        require_service("Redis", redis_available)
        env = {"REDIS_URL": REDIS_URL}
        # No checkpoint pass (which would also find the Stop) before the reply's natural end:
        # only the channel layer's message can reach the stream in time.
        overrides = {"CHATSTREAM_CHECKPOINT_INTERVAL": 30, "CHATSTREAM_STOP_POLL_INTERVAL": 30}
    else:
        env = {}
        overrides = {"CHATSTREAM_CHANNEL_LAYER": None, "CHATSTREAM_STOP_POLL_INTERVAL": 0.2}
    model = use_model("default?tps=20")  # its reply would take ~8.6 s
    user = user_in(db_alias)
    with Workers(workers=1, env=env, overrides=overrides, alias=db_alias) as a, \
            Workers(workers=1, env=env, overrides=overrides, alias=db_alias) as b:
        streamer, stopper = Browser(a.url, user), Browser(b.url, user)
        url = streamer.send(streamer.new_conversation(), "Hi", model)
        names = []
        with streamer.client.stream("GET", url) as response:
            for _at, name, _data in read_events(response):
                names.append(name)
                if names.count("delta") == 2 and len(names) == 2:
                    stopped_at = time.monotonic()
                    assert stopper.post(url.replace("/stream/", "/cancel/")).status_code == 204
        streamer.close()
        stopper.close()
    assert names[-1] == "done"
    record = simulator.last_request
    assert record.client_closed and not record.completed
    # Well before the reply's end, and (through the channel layer) before any checkpoint pass.
    assert record.client_closed_at - stopped_at < 4.0
    generation = Generation.objects.using(db_alias).get(pk=generation_id(url))
    assert generation.status == Status.CANCELLED and generation.reason == "stopped by user"


def test_deleting_the_conversation_mid_reply_ends_its_stream_and_logs_no_error(
        make_user, browser_for, use_model, simulator, settings, caplog):
    """The reply's rows go with its conversation: its stream ends within a checkpoint, its
    upstream is closed, and its final save, with nothing left to save it in, is no failure."""
    settings.CHATSTREAM_CHECKPOINT_INTERVAL = 0.1
    browser = browser_for(make_user())
    conversation = browser.new_conversation()
    url = browser.send(conversation, "Hi", use_model("default?tps=20"))
    with caplog.at_level("INFO"), browser.client.stream("GET", url) as response:
        events = read_events(response)
        next(e for e in events if e[1] == "delta")
        assert browser.post(f"{conversation}delete/", htmx=False).status_code == 302
        names = [name for _at, name, _data in events]
    assert names[-1] == "done"
    record = simulator.last_request
    assert record.wait_closed(5) and record.client_closed
    assert not Generation.objects.filter(pk=generation_id(url)).exists()
    assert [r.getMessage() for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")] == []


# --- 4. Upstream faults ------------------------------------------------------------------------

FAULTS = [
    pytest.param("http-401", Status.FAILED, "http_401", 401, False, "not configured correctly",
                 id="auth-401-fails-without-details"),
    pytest.param("http-429", Status.FAILED, "http_429", 429, False, "busy",
                 id="rate-limited-429-says-busy"),
    pytest.param("http-500", Status.FAILED, "http_500", 500, False, "had a problem",
                 id="server-error-500"),
    pytest.param("drop?drop_after=4", Status.INTERRUPTED, "connection_lost", 200, True,
                 "interrupted", id="connection-dropped-mid-stream"),
    pytest.param("no-done", Status.INTERRUPTED, "incomplete", 200, True, "interrupted",
                 id="ended-without-done-or-finish-reason"),
    pytest.param("error-mid?error_after=4", Status.INTERRUPTED, "stream_error", 200, True,
                 "interrupted", id="error-object-mid-stream"),
    pytest.param("malformed?malformed_after=4", Status.INTERRUPTED, "malformed_chunk", 200, True,
                 "interrupted", id="malformed-json-mid-stream"),
]


@pytest.mark.parametrize(("scenario", "status", "error_type", "http_status", "partial", "words"),
                         FAULTS)
def test_upstream_fault_is_stored_and_explained(
    make_user, browser_for, simulator, use_model, scenario, status, error_type, http_status,
    partial, words
):
    model = use_model(scenario + ("&" if "?" in scenario else "?") + "tps=0")
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", model)
    events = stream_all(browser, url)
    names = [name for _at, name, _data in events]
    assert names[-2:] == ["error", "done"]
    notice = events[-2][2]
    assert words in notice
    assert "sk-canary" not in notice and "HTTP" not in notice
    # A 429 or a 5xx, before any content, is tried once more (CHATSTREAM_RETRIES); a call
    # that has streamed, or another error status, never.
    assert len(simulator.requests) == (2 if http_status in (429, 500) else 1)
    generation = Generation.objects.get(pk=generation_id(url))
    assert generation.status == status
    assert generation.error_type == error_type
    assert generation.http_status == http_status
    assert generation.request_id == simulator.last_request.id
    streamed = html.unescape("".join(d for _, n, d in events if n == "delta"))
    assert generation.content == streamed
    assert bool(generation.content) is partial
    expected_usage = "estimated" if partial else "none"
    assert generation.usage_source == expected_usage
    assert generation.completed_at is not None


def test_unreachable_provider_fails_after_one_retry(make_user, browser_for, settings):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    settings.CHATSTREAM_PROVIDERS = {"default": {"BASE_URL": f"http://127.0.0.1:{port}/v1",
                                                 "API_KEY": "k"}}
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", "fast")
    events = stream_all(browser, url)
    assert [n for _a, n, _d in events][-2:] == ["error", "done"]
    assert "could not be reached" in events[-2][2]
    generation = Generation.objects.get(pk=generation_id(url))
    assert generation.status == Status.FAILED and generation.error_type == "connect"
    assert generation.usage_source == "none" and generation.content == ""


def test_connect_failure_is_retried_once_and_then_succeeds(make_user, browser_for, settings):
    # Bound but not listening: the first connection is refused. The simulator takes the
    # port 0.1 s later, before the single retry (0.25 s).
    placeholder = socket.socket()
    placeholder.bind(("127.0.0.1", 0))
    port = placeholder.getsockname()[1]
    settings.CHATSTREAM_PROVIDERS = {"default": {"BASE_URL": f"http://127.0.0.1:{port}/v1",
                                                 "API_KEY": "k"}}
    late = Simulator(port=port)

    def take_over() -> None:
        time.sleep(0.1)
        placeholder.close()
        late.start()

    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", "fast")
    starter = threading.Thread(target=take_over)
    starter.start()
    try:
        events = stream_all(browser, url)
    finally:
        starter.join()
        records = late.requests
        late.stop()
    assert events[-1][1] == "done"
    assert len(records) == 1
    assert Generation.objects.get(pk=generation_id(url)).status == Status.COMPLETED


def test_silence_longer_than_the_inactivity_timeout_interrupts(
    make_user, browser_for, simulator, use_model, settings
):
    settings.CHATSTREAM_INACTIVITY_TIMEOUT = 0.5
    model = use_model("stall?stall_after=3&tps=0")
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", model)
    started = time.monotonic()
    events = stream_all(browser, url)
    assert time.monotonic() - started < 5
    assert events[-1][1] == "done"
    generation = Generation.objects.get(pk=generation_id(url))
    assert generation.status == Status.INTERRUPTED and generation.error_type == "inactivity"
    assert generation.content  # the three chunks before the silence
    assert simulator.last_request.wait_closed(2) and simulator.last_request.client_closed


def test_a_reply_longer_than_the_maximum_duration_is_interrupted(
    make_user, browser_for, simulator, use_model, settings
):
    settings.CHATSTREAM_MAX_DURATION = 0.8
    model = use_model("default?tps=20")
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", model)
    events = stream_all(browser, url)
    assert events[-1][1] == "done"
    generation = Generation.objects.get(pk=generation_id(url))
    assert generation.status == Status.INTERRUPTED and generation.error_type == "deadline"
    assert generation.content and generation.usage_source == "estimated"
    assert simulator.last_request.wait_closed(2) and simulator.last_request.client_closed


def test_retry_creates_a_new_generation_for_the_same_prompt(
    make_user, browser_for, simulator, use_model
):
    browser = browser_for(make_user())
    model = use_model("http-500")
    url = browser.send(browser.new_conversation(), "Hi", model)
    stream_all(browser, url)
    failed = Generation.objects.get(pk=generation_id(url))
    response = browser.post(url.replace("/stream/", "/retry/"))
    assert response.status_code == 200
    retry_url = response.text.split('sse-connect="')[1].split('"')[0]
    retry = Generation.objects.get(pk=generation_id(retry_url))
    assert retry.pk != failed.pk and retry.retry_of == failed
    assert retry.prompt_message == failed.prompt_message and retry.status == Status.PENDING
    assert Generation.objects.get(pk=failed.pk).status == Status.FAILED  # a record stays a record


# --- 5. Durability -----------------------------------------------------------------------------


def test_partial_text_is_checkpointed_while_streaming_not_per_token(
    make_user, browser_for, simulator, use_model, settings
):
    from django.db import connection

    settings.CHATSTREAM_CHECKPOINT_INTERVAL = 0.3
    with connection.cursor() as cursor:  # count writes at the database itself
        cursor.execute("CREATE TABLE IF NOT EXISTS cs_writes (n INTEGER)")
        cursor.execute("DELETE FROM cs_writes")
        cursor.execute("CREATE TRIGGER IF NOT EXISTS cs_count AFTER UPDATE ON "
                       "chatstream_generation BEGIN INSERT INTO cs_writes VALUES (1); END")
    model = use_model("default?tps=40&tokens=80")  # 80 tokens over ~2 s
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", model)
    seen_partials = []
    with browser.client.stream("GET", url) as response:
        for _at, name, _data in read_events(response):
            if name == "delta":
                row = Generation.objects.get(pk=generation_id(url))
                if row.status == Status.STREAMING and row.content:
                    seen_partials.append(row.content)
    generation = Generation.objects.get(pk=generation_id(url))
    assert generation.status == Status.COMPLETED
    assert seen_partials, "no checkpoint was visible while streaming"
    assert all(generation.content.startswith(p) for p in seen_partials)
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM cs_writes")
        writes = cursor.fetchone()[0]
        cursor.execute("DROP TRIGGER cs_count")
    duration = (generation.completed_at - generation.started_at).total_seconds()
    assert writes <= duration / 0.3 + 4, f"{writes} writes for {duration:.1f}s of streaming"
    assert writes < generation.completion_tokens / 4


@pytest.mark.django_db(transaction=True, databases=DATABASES)
def test_killed_worker_leaves_no_stream_behind_after_the_sweeper(simulator, use_model, db_alias):
    import os
    import signal
    import subprocess
    import sys

    from .workers import ROOT, database_env

    model = use_model("default?tps=20")
    user = user_in(db_alias)
    rows = Generation.objects.using(db_alias)
    overrides = {"CHATSTREAM_HEARTBEAT_INTERVAL": 0.2, "CHATSTREAM_CHECKPOINT_INTERVAL": 0.2,
                 "CHATSTREAM_STALE_AFTER": 1.0}
    with Workers(workers=1, overrides=overrides, alias=db_alias) as workers:
        browser = Browser(workers.url, user)
        url = browser.send(browser.new_conversation(), "Hi", model)
        with browser.client.stream("GET", url) as response:
            seen = 0
            events = read_events(response)  # kept referenced: closing it would disconnect
            for _at, name, _data in events:
                seen += name == "delta"
                if seen == 10:
                    break
            row = wait_for(lambda: rows.filter(pk=generation_id(url)).exclude(content="").first())
            os.kill(int(row.worker.rsplit(":", 1)[1]), signal.SIGKILL)
            killed_at = time.monotonic()
        browser.close()
        sweep_env = {**workers.env, **database_env(db_alias)}
    assert simulator.last_request.wait_closed(5) and simulator.last_request.client_closed
    assert rows.get(pk=row.pk).status == Status.STREAMING  # until swept
    time.sleep(max(0.0, 1.2 - (time.monotonic() - killed_at)))

    def sweep() -> str:  # as cron would run it: its own process
        return subprocess.run([sys.executable, "manage.py", "chatstream_sweep"], cwd=ROOT,
                              env=sweep_env, check=True, capture_output=True, text=True).stdout

    assert "Interrupted 1 stale" in sweep()
    generation = rows.get(pk=row.pk)
    assert generation.status == Status.INTERRUPTED
    assert generation.error_type == "worker_lost"
    assert generation.content  # the last checkpoint survived
    assert generation.usage_source == "estimated"
    snapshot = (generation.status, generation.content, generation.completed_at)
    assert "Interrupted 0 stale" in sweep()
    again = rows.get(pk=row.pk)
    assert (again.status, again.content, again.completed_at) == snapshot


def test_pending_generation_nobody_streamed_is_swept_as_cancelled(make_user, browser_for,
                                                                   settings):
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", "fast")
    settings.CHATSTREAM_PENDING_TIMEOUT = 0.1
    time.sleep(0.2)
    call_command("chatstream_sweep", stdout=io.StringIO())
    generation = Generation.objects.get(pk=generation_id(url))
    assert generation.status == Status.CANCELLED and generation.error_type == "abandoned"


# --- 6/7. The wire -----------------------------------------------------------------------------


def test_pings_keep_a_silent_stream_alive(make_user, browser_for, simulator, use_model, settings):
    settings.CHATSTREAM_PING_INTERVAL = 0.2
    model = use_model("default?first_token_delay=1&tps=0")
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", model)
    with browser.client.stream("GET", url) as response:
        raw = b"".join(response.iter_raw())
    before_first_delta = raw.split(b"event: delta")[0]
    assert before_first_delta.count(b": ping\n\n") >= 3
    assert raw.rstrip().endswith(b"</article>")


def test_model_text_cannot_forge_events(make_user, browser_for, simulator, use_model):
    from chatstream.testing import Script

    simulator.register("forge", Script(
        text="a\n\nevent: done\ndata: <b>forged</b>\r\n\r\nid: 9\rretry: 1\n",
        tokens_per_second=0))
    model = use_model("forge")
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", model)
    events = stream_all(browser, url)
    names = [name for _at, name, _data in events]
    assert names.count("done") == 1 and names[-1] == "done"
    assert "<b>" not in "".join(d for _, n, d in events if n == "delta")


def test_stream_view_refuses_other_users_and_anonymous(make_user, browser_for, asgi_server):
    owner = browser_for(make_user("owner"))
    url = owner.send(owner.new_conversation(), "Hi", "fast")
    assert browser_for(make_user("other")).client.get(url).status_code == 404
    anonymous = httpx.get(asgi_server.url + url)
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous.headers["location"]
    assert Generation.objects.get(pk=generation_id(url)).status == Status.PENDING


# --- Reload mid-stream: the reply carries on for the page that shows it ---------------------------


@pytest.mark.parametrize("layer", ["default", None], ids=["channel-layer", "database-only"])
def test_reload_mid_stream_hands_the_live_reply_to_the_reloaded_page(
    make_user, browser_for, simulator, use_model, settings, layer
):
    settings.CHATSTREAM_CHANNEL_LAYER = layer
    model = use_model("default?tps=30")
    browser = browser_for(make_user())
    conversation = browser.new_conversation()
    url = browser.send(conversation, "Hi", model)
    # The old page reads a few deltas; the reload fetches the page, then the old page goes.
    with browser.client.stream("GET", url) as response:
        events = read_events(response)  # kept referenced: the page stays connected meanwhile
        next(e for e in events if e[1] == "delta")
        page = browser.client.get(conversation)
        path = url.split("?")[0]
        # A reply that has started is followed by the session: its URL carries no ticket.
        assert page.status_code == 200 and f'sse-connect="{path}"' in page.text, page.text
    time.sleep(0.3)
    assert not simulator.last_request.client_closed, "the reply was cancelled by the reload"
    events = stream_all(browser, url)  # the reloaded page's EventSource
    assert events[-1][1] == "done"
    assert len(simulator.requests) == 1
    generation = Generation.objects.get(pk=generation_id(url))
    assert generation.status == Status.COMPLETED
    assert html.unescape("".join(d for _, n, d in events if n == "delta")) == generation.content


def test_a_reloaded_page_that_never_follows_lets_the_reply_be_cancelled(
    make_user, browser_for, simulator, use_model, settings
):
    settings.CHATSTREAM_HANDOVER_GRACE = 0.5
    settings.CHATSTREAM_CHECKPOINT_INTERVAL = 0.2
    model = use_model("default?tps=20")
    browser = browser_for(make_user())
    conversation = browser.new_conversation()
    url = browser.send(conversation, "Hi", model)
    with browser.client.stream("GET", url) as response:
        events = read_events(response)
        next(e for e in events if e[1] == "delta")
        browser.client.get(conversation)
        left_at = time.monotonic()
    record = simulator.last_request
    assert record.wait_closed(5) and record.client_closed
    assert record.client_closed_at - left_at < 2.0
    generation = final_row(url)
    assert generation.status == Status.CANCELLED and generation.reason == "client disconnected"
    assert generation.content
