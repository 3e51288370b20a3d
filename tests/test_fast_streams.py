"""Stream tickets, the stream front (chatstream.asgi), and the one-round-trip claim.

Every ticket test runs against both ways of serving the app: Django alone (the view reads the
ticket), and ``with_fast_streams`` in front of it (as project/asgi.py serves it). A ticket only
ever replaces the session lookup: whatever is wrong with it, the session decides.
"""

from __future__ import annotations

import html
import io
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import quote, unquote

import httpx
import pytest
from django.conf import settings as django_settings
from django.forms.models import model_to_dict

from chatstream import store
from chatstream.models import Conversation, Generation, Message
from chatstream.store import _orm, _sql
from chatstream.stream import ticket_user_id
from chatstream.web.wire import PageWire

from .conftest import Browser, generation_id, in_thread, read_events
from .workers import DATABASES

pytestmark = pytest.mark.django_db(transaction=True, databases=DATABASES)

T = TypeVar("T")


@pytest.fixture(params=["fast-streams", "django"])
def server(request: Any) -> Any:
    name = "asgi_server" if request.param == "fast-streams" else "django_asgi_server"
    return request.getfixturevalue(name)


@pytest.fixture
def browser(server: Any) -> Any:
    """Browser(user) against ``server``, closed at the end of the test."""
    opened: list[Browser] = []

    def open_for(user: Any) -> Browser:
        opened.append(Browser(server.url, user))
        return opened[-1]

    yield open_for
    for each in opened:
        each.close()


def events_of(browser: Browser, url: str) -> list[tuple[str, str]]:
    with browser.client.stream("GET", url) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return [(name, data) for _at, name, data in read_events(response)]


def with_ticket(url: str, ticket: str) -> str:
    return f"{url.split('?')[0]}?ticket={quote(ticket)}"


def ticket_of(url: str) -> str:
    return unquote(url.split("?ticket=")[1])


def test_ticketed_stream_streams_and_its_done_message_carries_a_working_csrf_token(
    make_user, simulator, use_model, server, browser
):
    model = use_model("default?tps=200")
    user = browser(make_user())
    url = user.send(user.new_conversation(), "Hi", model)
    assert "?ticket=" in url
    events = events_of(user, url)
    assert [n for n, _ in events if n not in ("delta", "block")] == ["done"]
    generation = Generation.objects.get(pk=generation_id(url))
    assert generation.status == Generation.Status.COMPLETED
    assert html.unescape("".join(d for n, d in events if n == "delta")) == generation.content
    # The final message's Retry form posts as the page would (its own csrfmiddlewaretoken).
    generation.status = Generation.Status.INTERRUPTED
    generation.save(update_fields=["status"])
    done = events_of(user, url)[-1][1]
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', done)
    assert token, done
    retry = user.client.post(url.split("?")[0].replace("/stream/", "/retry/"),
                                data={"csrfmiddlewaretoken": token.group(1)},
                                headers={"HX-Request": "true"})
    assert retry.status_code == 200, retry.text


def test_a_provider_that_never_accepts_delays_the_response_headers_briefly_only(
        make_user, settings, server, browser):
    """The front lets the provider's request go out before its own headers, but waits for no
    more than a moment: a browser must hear that its stream is open, whatever the provider."""
    import socket

    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    queued = []  # fill the accept queue: further connections hang until they time out
    for _ in range(3):
        waiting = socket.socket()
        waiting.setblocking(False)
        waiting.connect_ex(full.getsockname())
        queued.append(waiting)
    settings.CHATSTREAM_PROVIDERS = {"default": {
        "BASE_URL": "http://{}:{}/v1".format(*full.getsockname()), "API_KEY": "sk-x"}}
    settings.CHATSTREAM_MODELS = {"m": {"PROVIDER": "default", "MODEL": "default"}}
    settings.CHATSTREAM_CONNECT_TIMEOUT = 1.0
    try:
        user = browser(make_user())
        url = user.send(user.new_conversation(), "Hi", "m")
        asked = time.monotonic()
        with user.client.stream("GET", url) as response:
            headers_after = time.monotonic() - asked
            assert response.status_code == 200
            events = [(name, time.monotonic() - asked) for _at, name, _data in
                      read_events(response)]
    finally:
        for each in (full, *queued):
            each.close()
    assert headers_after < 0.9, headers_after  # not held for the connect timeout
    assert [name for name, _ in events] == ["error", "done"]
    assert events[0][1] >= 2.0  # two connect attempts of 1 s each, then the error
    generation = Generation.objects.get(pk=generation_id(url))
    assert (generation.status, generation.error_type) == (Generation.Status.FAILED, "connect")


def test_a_ticket_opens_its_stream_for_its_session_only(make_user, simulator, use_model, server,
                                                       browser):
    model = use_model("default?tps=200")
    owner = browser(make_user("owner"))
    url = owner.send(owner.new_conversation(), "Hi", model)
    # Another user, even holding the URL with its ticket, is answered by their session: 404.
    other = browser(make_user("other"))
    assert other.client.get(url).status_code == 404
    # No session at all: the login page, as for any other view.
    anonymous = httpx.get(server.url + url)
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous.headers["location"]
    assert Generation.objects.get(pk=generation_id(url)).status == Generation.Status.PENDING
    assert simulator.requests == []
    assert events_of(owner, url)[-1][0] == "done"


@pytest.mark.parametrize("damage", ["tampered", "other-generation", "expired", "unsigned"])
def test_a_bad_ticket_falls_back_to_the_session(
    make_user, simulator, use_model, server, browser, settings, damage
):
    model = use_model("default?tps=200")
    owner = browser(make_user("owner"))
    conversation = owner.new_conversation()
    first = owner.send(conversation, "One", model)
    url = owner.send(conversation, "Two", model)
    ticket = ticket_of(url)
    bad = {
        "tampered": ticket[:-2] + ("AA" if not ticket.endswith("AA") else "BB"),
        "other-generation": ticket_of(first),
        "expired": ticket,
        "unsigned": str(owner.user.pk),
    }[damage]
    if damage == "expired":
        settings.CHATSTREAM_STREAM_TICKET_MAX_AGE = 0.000001
    url = with_ticket(url, bad)
    anonymous = httpx.get(server.url + url)
    assert anonymous.status_code == 302, anonymous.text  # no session: no stream
    other = browser(make_user("other"))
    assert other.client.get(url).status_code == 404
    assert simulator.requests == []
    assert events_of(owner, url)[-1][0] == "done"  # the owner's session still opens it
    assert len(simulator.requests) == 1


def test_a_ticket_is_bound_to_the_session_it_was_issued_for(make_user, simulator, use_model,
                                                            browser):
    """A logged-in user presenting a ticket minted for another session of theirs: the session
    is asked (and answers for the owner); a copied cookie-less URL opens nothing."""
    model = use_model("default?tps=200")
    user = make_user()
    first = browser(user)
    time.sleep(1.05)  # signed-cookie sessions made in the same second would be identical
    second = browser(user)
    assert first.client.cookies[django_settings.SESSION_COOKIE_NAME] != second.client.cookies[
        django_settings.SESSION_COOKIE_NAME]
    url = first.send(first.new_conversation(), "Hi", model)
    session = first.client.cookies[django_settings.SESSION_COOKIE_NAME]
    pk = generation_id(url)
    assert ticket_user_id(pk, ticket_of(url), session) == str(user.pk)
    assert ticket_user_id(pk, ticket_of(url), second.client.cookies[
        django_settings.SESSION_COOKIE_NAME]) is None
    assert events_of(second, url)[-1][0] == "done"


def test_a_disallowed_host_is_refused_before_anything_runs(make_user, simulator, use_model,
                                                          browser):
    model = use_model("default?tps=200")
    user = browser(make_user())
    url = user.send(user.new_conversation(), "Hi", model)
    response = user.client.get(url, headers={"Host": "evil.example"})
    assert response.status_code == 400
    assert Generation.objects.get(pk=generation_id(url)).status == Generation.Status.PENDING
    assert simulator.requests == []


# --- what a ticket no longer opens: it only starts its reply, for an active user in a live session


def stream_status(browser: Browser, url: str) -> int:
    with browser.client.stream("GET", url) as response:
        response.read()
        return response.status_code


def test_a_ticket_starts_nothing_once_its_session_logged_out(make_user, simulator, use_model,
                                                             server, browser):
    model = use_model("default?tps=200")
    owner = browser(make_user())
    url = owner.send(owner.new_conversation(), "Hi", model)
    old_cookie = owner.client.cookies[django_settings.SESSION_COOKIE_NAME]
    assert owner.post("/accounts/logout/", htmx=False).status_code in (200, 302)
    # Whoever kept the old cookie (signed-cookie sessions stay readable after a logout, as
    # Django documents) and the page's stream URL:
    owner.client.cookies.clear()
    owner.client.cookies.set(django_settings.SESSION_COOKIE_NAME, old_cookie)
    stream_status(owner, url)
    assert simulator.requests == []
    generation = Generation.objects.get(pk=generation_id(url))
    assert (generation.status, generation.error_type) == ("cancelled", "user_signed_out")


@pytest.mark.parametrize("change", ["password", "deactivated", "deactivated-by-update"])
def test_a_ticket_starts_nothing_once_its_user_changed_password_or_was_deactivated(
        make_user, simulator, use_model, server, browser, change):
    from django.contrib.auth import get_user_model

    model = use_model("default?tps=200")
    user = make_user()
    owner = browser(user)
    url = owner.send(owner.new_conversation(), "Hi", model)
    if change == "password":
        user.set_password("a new one")
        user.save()
    elif change == "deactivated":
        user.is_active = False
        user.save()
    else:  # no signal at all: the claim's own statement refuses an inactive user
        get_user_model().objects.filter(pk=user.pk).update(is_active=False)
    status = stream_status(owner, url)
    assert status == 302  # the session no longer authenticates them either
    assert simulator.requests == []
    generation = Generation.objects.get(pk=generation_id(url))
    expected = "pending" if change == "deactivated-by-update" else "cancelled"
    assert generation.status == expected


def test_a_ticket_opens_no_reply_that_has_started(make_user, simulator, use_model, server,
                                                  browser):
    """Replaying or following a reply is the session's to allow, never a ticket's."""
    model = use_model("default?tps=200")
    user = make_user()
    owner = browser(user)
    url = owner.send(owner.new_conversation(), "Hi TOPSECRET", model)
    assert events_of(owner, url)[-1][0] == "done"
    user.set_password("a new one")  # the session ends; the page's URL and cookie are kept
    user.save()
    with owner.client.stream("GET", url) as response:
        body = response.read()
    assert response.status_code == 302 and b"done" not in body, body
    assert len(simulator.requests) == 1


def test_a_ticketed_request_that_resumes_is_the_views_to_answer(make_user, simulator,
                                                                use_model, server, browser):
    """A resume point names text of a reply started already: the ticket starts nothing, and a
    reply not started yet starts from nothing (a ``reset`` first), whichever serves it."""
    model = use_model("default?tps=200")
    owner = browser(make_user())
    conversation = owner.new_conversation()
    for query, headers in (("&after=5", {}), ("", {"Last-Event-ID": "5"})):
        url = owner.send(conversation, "Hi", model)
        with owner.client.stream("GET", url + query, headers=headers) as response:
            assert response.status_code == 200
            names = [name for _at, name, _data in read_events(response)]
        assert names[0] == "reset" and names[-1] == "done"
    assert len(simulator.requests) == 2


def test_the_login_redirect_of_a_stream_keeps_no_ticket(make_user, simulator, use_model, server,
                                                        browser):
    model = use_model("default?tps=200")
    owner = browser(make_user())
    url = owner.send(owner.new_conversation(), "Hi", model)
    anonymous = httpx.get(server.url + url + "&after=3")
    assert anonymous.status_code == 302
    location = unquote(anonymous.headers["location"])
    assert "ticket" not in location and url.split("?")[0] + "?after=3" in location, location


def test_a_stream_carries_the_headers_the_site_adds_to_every_response(
        make_user, simulator, use_model, server, browser):
    model = use_model("default?tps=200")
    owner = browser(make_user())
    url = owner.send(owner.new_conversation(), "Hi", model)
    page = owner.client.get("/chat/")
    with owner.client.stream("GET", url) as response:
        response.read()
    names = ("x-content-type-options", "referrer-policy", "cross-origin-opener-policy",
             "x-frame-options")
    assert all(page.headers.get(n) for n in names), page.headers  # the site's middleware's
    assert {n: response.headers.get(n) for n in names} == {n: page.headers[n] for n in names}
    # A private stream is never stored by a cache on the way.
    assert response.headers["cache-control"] == "no-store"


def test_requests_other_than_ticketed_streams_pass_through_unchanged(make_user, browser_for,
                                                                    asgi_server):
    user = browser_for(make_user())
    assert user.client.get("/chat/?ticket=x").status_code == 200
    assert user.client.get(f"/chat/g/{uuid.uuid4()}/stream/?ticket=x").status_code == 404
    assert httpx.get(asgi_server.url + "/chat/?ticket=x").status_code == 302


# --- every start is served in front: the session's too -----------------------------------------


@pytest.fixture
def through_django() -> Any:
    """The paths of the requests that went through Django's request cycle (``request_started``
    is Django's; the front does not send it)."""
    from django.core.signals import request_started

    paths: list[str] = []

    def started(sender: Any, scope: Any = None, **kwargs: Any) -> None:
        paths.append(scope["path"] if scope else "?")

    request_started.connect(started)
    yield paths
    request_started.disconnect(started)


@pytest.mark.parametrize("start", ["no-ticket", "expired-ticket", "resume", "api"])
def test_a_stream_the_session_opens_is_served_in_front_of_django(
        make_user, simulator, use_model, browser_for, through_django, settings, start):
    model = use_model("default?tps=200")
    owner = browser_for(make_user())
    url = owner.send(owner.new_conversation(), "Hi there", model)
    pk = generation_id(url)
    if start == "expired-ticket":
        settings.CHATSTREAM_STREAM_TICKET_MAX_AGE = 0.000001
    elif start == "no-ticket":
        url = url.split("?")[0]
    elif start == "resume":
        url = url.split("?")[0] + "?after=0"
    else:
        url = f"/chat/api/generations/{pk}/stream/"
    through_django.clear()
    events = events_of(owner, url)
    assert events[-1][0] == "done" and through_django == [], (events, through_django)
    generation = Generation.objects.get(pk=pk)
    assert generation.status == Generation.Status.COMPLETED
    text = "".join(json_or_html(start, d) for n, d in events if n == "delta")
    assert text == generation.content and generation.content
    # Anyone else, signed in or not, is answered by Django: the login, the 404, the 401.
    other = browser_for(make_user("other"))
    through_django.clear()
    assert other.client.get(url).status_code == 404
    anonymous = httpx.get(owner.client.base_url.join(url))
    assert anonymous.status_code == (401 if start == "api" else 302)
    assert len(through_django) == 2


def json_or_html(start: str, data: str) -> str:
    import json

    return json.loads(data)["text"] if start == "api" else html.unescape(data)


def test_a_site_authenticator_keeps_the_json_api_stream_with_django(
        make_user, simulator, use_model, browser_for, through_django, settings):
    settings.CHATSTREAM_API_AUTHENTICATE = "tests.test_fast_streams.nobody"
    model = use_model("default?tps=200")
    owner = browser_for(make_user())
    pk = generation_id(owner.send(owner.new_conversation(), "Hi", model))
    through_django.clear()
    assert events_of(owner, f"/chat/api/generations/{pk}/stream/")[-1][0] == "done"
    assert through_django == [f"/chat/api/generations/{pk}/stream/"]


def nobody(request: Any) -> None:
    """An authenticator that knows no one: the session decides."""
    return None


def test_a_session_verified_with_a_fallback_key_is_cycled_and_its_new_cookie_sent(
        make_user, simulator, use_model, browser_for, settings):
    """Django moves a session signed under an old SECRET_KEY to a new key (and a database
    session deletes the old one): the browser must get the new key, or its next request finds
    itself signed out. (The tests' sessions are signed cookies, the old one still readable.)"""
    model = use_model("default?tps=200")
    owner = browser_for(make_user())
    url = owner.send(owner.new_conversation(), "Hi", model).split("?")[0]
    name = django_settings.SESSION_COOKIE_NAME
    old_key = owner.client.cookies[name]
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = "a new secret key, rotated in " + "x" * 40
    with owner.client.stream("GET", url) as response:
        assert response.status_code == 200
        assert [n for _at, n, _d in read_events(response)][-1] == "done"
    new_key = re.search(rf"{name}=([^;]+)", response.headers["set-cookie"]).group(1)
    assert new_key != old_key
    settings.SECRET_KEY_FALLBACKS = []
    owner.client.cookies.clear()
    owner.client.cookies.set(name, new_key)
    assert owner.client.get("/chat/").status_code == 200


def test_a_cycled_session_keeps_its_new_cookie_when_the_stream_is_refused(
        make_user, simulator, use_model, browser_for, through_django, settings):
    """The same rotation, on a stream the session may not open (another user's reply): the
    front answers the refusal itself, with the new cookie. (Handed to Django, the request would
    carry the old key, which a database session has just deleted: the browser signed out.)"""
    model = use_model("default?tps=200")
    owner = browser_for(make_user())
    url = owner.send(owner.new_conversation(), "Hi", model).split("?")[0]
    other = browser_for(make_user("other"))
    name = django_settings.SESSION_COOKIE_NAME
    old_key = other.client.cookies[name]
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = "a new secret key, rotated in " + "x" * 40
    for path in (url, f"/chat/api/generations/{generation_id(url)}/stream/"):
        other.client.cookies.clear()
        other.client.cookies.set(name, old_key)
        through_django.clear()
        response = other.client.get(path)
        assert response.status_code == 404, response.text
        assert through_django == []
        new_key = re.search(rf"{name}=([^;]+)", response.headers["set-cookie"]).group(1)
        assert new_key != old_key
    settings.SECRET_KEY_FALLBACKS = []
    other.client.cookies.clear()
    other.client.cookies.set(name, new_key)
    assert other.client.get("/chat/").status_code == 200  # still signed in
    assert simulator.requests == []


# --- what the message POST fixes, and the one-round-trip claim ------------------------------------


def test_what_is_sent_upstream_is_fixed_when_the_message_is_posted(
    make_user, simulator, use_model, settings, browser_for
):
    model = use_model("default?tps=200")
    settings.CHATSTREAM_SYSTEM_PROMPT = "Be brief."
    browser = browser_for(make_user())
    conversation = browser.new_conversation()
    events_of(browser, browser.send(conversation, "First question", model))
    url = browser.send(conversation, "Second question", model)
    generation = Generation.objects.get(pk=generation_id(url))
    first_reply = Message.objects.get(role="assistant").content
    expected = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "First question"},
                {"role": "assistant", "content": first_reply},
                {"role": "user", "content": "Second question"}]
    assert generation.upstream_messages == expected
    settings.CHATSTREAM_SYSTEM_PROMPT = "Changed after the post."
    events_of(browser, url)
    assert simulator.last_request.body["messages"] == expected


@pytest.fixture(params=DATABASES)
def alias(request: Any, require_service: Any) -> str:
    if request.param == "postgres":
        require_service("PostgreSQL", lambda: "postgres" in django_settings.DATABASES)
    return request.param


def pending_in(alias: str) -> Generation:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.db_manager(alias).create_user(f"u{uuid.uuid4().hex[:8]}")
    conversation = Conversation.objects.using(alias).create(user=user, title="t")
    message = Message.objects.using(alias).create(conversation=conversation, role="user",
                                                  content="Hi")
    return Generation.objects.using(alias).create(
        conversation=conversation, user=user, prompt_message=message, model="test",
        upstream_messages=[{"role": "user", "content": "Hi ✓"}], tool_calls=[{"x": 1}])


def elsewhere(threaded: Callable[[], T], on_a_loop: Callable[[], Awaitable[T]], path: str) -> T:
    """Run a database step as a stream runs it, on a connection of its own: the threaded
    version (``path="thread"``), or the store's on an event loop (whose pools close after)."""
    from asgiref.sync import async_to_sync

    async def then_close() -> T:
        try:
            return await on_a_loop()
        finally:
            await store.aclose()

    return in_thread(threaded if path == "thread" else async_to_sync(then_close))


def claim_elsewhere(alias: str, generation: Generation, user_id: Any, path: str) -> Any:
    """The claim made as a stream makes it; the claimed row, or None."""
    async def on_a_loop() -> Any:
        # On PostgreSQL the claim is sent on the loop itself, not in a thread.
        assert isinstance(store.for_alias(alias), store.PostgresStore) == (alias == "postgres")
        return await store.for_alias(alias).claim(generation.pk, user_id)

    return elsewhere(lambda: _orm.claim(generation.pk, user_id, alias), on_a_loop, path)


@pytest.mark.parametrize("path", ["thread", "event-loop"])
def test_the_claim_returns_the_row_and_is_committed_at_once(alias, path):
    generation = pending_in(alias)
    claimed = claim_elsewhere(alias, generation, generation.user_id, path)
    stored = Generation.objects.using(alias).get(pk=generation.pk)  # another connection
    assert stored.status == "streaming" and stored.worker == store.WORKER
    assert model_to_dict(claimed) == model_to_dict(stored)
    assert (claimed.pk, claimed.created_at, claimed.upstream_messages, claimed.tool_calls) == (
        stored.pk, stored.created_at, [{"role": "user", "content": "Hi ✓"}], [{"x": 1}])
    # Exactly once: a second claim, or another user's, finds nothing.
    assert claim_elsewhere(alias, generation, generation.user_id, path) is None
    other = pending_in(alias)
    assert claim_elsewhere(alias, other, generation.user_id, path) is None
    assert Generation.objects.using(alias).get(pk=other.pk).status == "pending"


@pytest.mark.parametrize("path", ["thread", "event-loop"])
def test_the_claim_refuses_an_inactive_user(alias, path, require_service):
    from django.contrib.auth import get_user_model

    generation = pending_in(alias)
    get_user_model().objects.db_manager(alias).filter(pk=generation.user_id).update(
        is_active=False)
    assert claim_elsewhere(alias, generation, generation.user_id, path) is None
    assert Generation.objects.using(alias).get(pk=generation.pk).status == "pending"
    get_user_model().objects.db_manager(alias).filter(pk=generation.user_id).update(
        is_active=True)
    assert claim_elsewhere(alias, generation, generation.user_id, path) is not None


def test_claims_that_arrive_together_share_statements_and_each_row_is_claimed_once(
        require_service, settings, monkeypatch):
    import asyncio

    require_service("PostgreSQL", lambda: "postgres" in django_settings.DATABASES)
    settings.CHATSTREAM_CLAIM_POOL_SIZE = 2
    mine = [pending_in("postgres") for _ in range(12)]
    stopped = pending_in("postgres")
    Generation.objects.using("postgres").filter(pk=stopped.pk).update(cancel_requested=True)
    theirs = pending_in("postgres")
    asks = [(g.pk, g.user_id) for g in mine]
    asks += [(mine[0].pk, mine[0].user_id), (mine[5].pk, mine[5].user_id)]  # asked twice
    asks += [(stopped.pk, stopped.user_id), (theirs.pk, mine[1].user_id)]  # not to be taken
    batches: list[int] = []
    statement = _sql.claims_statement

    def counted(db: str, claims: Any) -> Any:
        batches.append(len(claims))
        return statement(db, claims)

    monkeypatch.setattr("chatstream.store._postgres.claims_statement", counted)

    async def all_at_once() -> list[Any]:
        return await asyncio.gather(*(store.for_alias("postgres").claim(g, u) for g, u in asks))

    got = elsewhere(lambda: [], all_at_once, "event-loop")
    won = [c.pk for c in got if c is not None]
    assert sorted(won) == sorted(g.pk for g in mine)  # each exactly once, no other
    for claimed in got:
        if claimed is not None:
            stored = Generation.objects.using("postgres").get(pk=claimed.pk)
            assert model_to_dict(claimed) == model_to_dict(stored)
            assert stored.status == "streaming"
            assert claimed.upstream_messages == stored.upstream_messages
    for generation in (stopped, theirs):
        assert Generation.objects.using("postgres").get(pk=generation.pk).status == "pending"
    assert sum(batches) == len(asks) and len(batches) < len(asks), batches


def checkpoint_elsewhere(alias: str, rows: dict[uuid.UUID, dict[str, Any]], path: str
                         ) -> set[uuid.UUID]:
    return elsewhere(lambda: _orm.checkpoint(rows, alias),
                     lambda: store.for_alias(alias).checkpoint(rows), path)


@pytest.mark.parametrize("path", ["thread", "event-loop"])
def test_a_checkpoint_writes_text_and_heartbeats_and_reports_rows_no_longer_ours(alias, path):
    from django.utils import timezone

    rows = Generation.objects.using(alias)
    streaming, silent, stopped, swept = (pending_in(alias) for _ in range(4))
    rows.filter(pk__in=[streaming.pk, silent.pk, stopped.pk]).update(
        status="streaming", content="Earlier", first_token_at=None)
    rows.filter(pk=stopped.pk).update(cancel_requested=True)
    rows.filter(pk=swept.pk).update(status="interrupted", content="Swept")
    now = timezone.now()
    lost = checkpoint_elsewhere(alias, {
        streaming.pk: {"heartbeat_at": now, "content": "Earlier and more ✓", "first_token_at": now},
        silent.pk: {"heartbeat_at": now},
        stopped.pk: {"heartbeat_at": now, "content": "Not written", "first_token_at": now},
        swept.pk: {"heartbeat_at": now, "content": "Not written", "first_token_at": now},
    }, path)
    assert lost == {stopped.pk, swept.pk}
    got = {g.pk: g for g in rows.filter(pk__in=[streaming.pk, silent.pk, stopped.pk, swept.pk])}
    assert (got[streaming.pk].content, got[streaming.pk].first_token_at,
            got[streaming.pk].heartbeat_at) == ("Earlier and more ✓", now, now)
    assert (got[silent.pk].content, got[silent.pk].first_token_at,
            got[silent.pk].heartbeat_at) == ("Earlier", None, now)
    assert got[stopped.pk].content == "Earlier" and got[stopped.pk].heartbeat_at is None
    assert got[swept.pk].content == "Swept" and got[swept.pk].status == "interrupted"


def test_a_checkpoint_of_more_streams_than_one_query_may_name_finds_each_lost_row(alias):
    """A pass over more live streams than a statement's parameters may name (SQLite's limit
    was 999): every row written, and the lost ones found in every part of the list."""
    from django.utils import timezone

    first = pending_in(alias)
    rows = Generation.objects.using(alias)
    template = rows.get(pk=first.pk)
    copies = [Generation(conversation_id=template.conversation_id, user_id=template.user_id,
                         prompt_message_id=template.prompt_message_id, model="test",
                         status="streaming") for _ in range(1200)]
    rows.bulk_create(copies)
    ids = [g.pk for g in copies]
    stopped = {ids[3], ids[700], ids[1199]}
    rows.filter(pk__in=stopped).update(cancel_requested=True)
    now = timezone.now()
    lost = checkpoint_elsewhere(alias, {pk: {"heartbeat_at": now, "content": f"text {n}"}
                                        for n, pk in enumerate(ids)}, "thread")
    assert lost == stopped
    written = dict(rows.filter(pk__in=ids[:5] + ids[-5:]).values_list("pk", "content"))
    assert written == {pk: ("" if pk in stopped else f"text {ids.index(pk)}")
                       for pk in ids[:5] + ids[-5:]}


def finish_elsewhere(alias: str, generation: Generation, fields: dict[str, Any], path: str
                     ) -> str:
    """The final save as a stream makes it, with the quota's settlement of its outcome; the
    saved generation's status and text."""
    from chatstream import quota

    for name, value in fields.items():
        setattr(generation, name, value)
    settlement = quota.settlement_for(generation)

    async def on_a_loop() -> None:
        await store.for_alias(alias).finish(generation, fields, settlement)

    elsewhere(lambda: _orm.finish(generation, fields, settlement), on_a_loop, path)
    return f"{generation.status}:{generation.content}"


@pytest.mark.parametrize("path", ["thread", "event-loop"])
@pytest.mark.parametrize("usage", ["provider", "estimated", "none"])
def test_the_final_save_stores_outcome_reply_and_settles_the_quota_hold(alias, path, usage):
    from django.utils import timezone

    from chatstream.models import QuotaCharge

    generation = pending_in(alias)
    before = Conversation.objects.using(alias).get(pk=generation.conversation_id).updated_at
    QuotaCharge.objects.using(alias).create(
        user_id=generation.user_id, generation_id=generation.pk, model="test",
        at=timezone.now(), prompt_estimate=10, max_tokens=100, reserved=110)
    generation.status = "streaming"
    tokens = {"provider": (12, 30), "estimated": (None, None), "none": (None, None)}[usage]
    fields = {"status": "completed", "reason": "", "error_type": "", "content": "Done ✓ **x**",
              "finish_reason": "stop", "tool_calls": [{"id": "c1", "name": "f"}],
              "request_id": "req-1", "http_status": 200, "completed_at": timezone.now(),
              "heartbeat_at": None, "usage_source": usage, "prompt_tokens": tokens[0],
              "completion_tokens": tokens[1], "cached_tokens": None}
    assert finish_elsewhere(alias, generation, fields, path) == "completed:Done ✓ **x**"
    stored = Generation.objects.using(alias).get(pk=generation.pk)
    for name, value in fields.items():
        assert getattr(stored, name) == value, name
    reply = Message.objects.using(alias).get(generation=generation.pk)
    assert (reply.role, reply.content, reply.conversation_id) == (
        "assistant", "Done ✓ **x**", generation.conversation_id)
    assert Conversation.objects.using(alias).get(pk=generation.conversation_id).updated_at > before
    charge = QuotaCharge.objects.using(alias).get(generation_id=generation.pk)
    expected = {"provider": (42, "provider"), "none": (0, "released")}.get(usage)
    assert charge.settled_at is not None
    if expected:
        assert (charge.charged, charge.source) == expected
    else:  # estimated: the prompt estimate plus the reply's estimated tokens
        assert charge.source == "estimated" and charge.charged > 10
    # Settling is idempotent: a second save changes the reply but never the charge.
    fields["content"] = "Done again"
    finish_elsewhere(alias, generation, fields, path)
    assert Message.objects.using(alias).get(generation=generation.pk).content == "Done again"
    assert QuotaCharge.objects.using(alias).get(generation_id=generation.pk).charged == (
        charge.charged)


@pytest.mark.parametrize("path", ["thread", "event-loop"])
def test_the_final_save_of_a_generation_deleted_as_it_streamed_stores_nothing(alias, path,
                                                                               caplog):
    """Its conversation (or its user) was deleted meanwhile: no reply message is made for it
    (nothing to hold it), and that is no failure."""
    from django.utils import timezone

    generation = pending_in(alias)
    generation.status = "streaming"
    Conversation.objects.using(alias).filter(pk=generation.conversation_id).delete()
    fields = {"status": "cancelled", "content": "Half a repl", "completed_at": timezone.now()}
    with caplog.at_level("INFO", logger="chatstream"):
        assert finish_elsewhere(alias, generation, fields, path) == "cancelled:Half a repl"
    assert not Message.objects.using(alias).filter(generation=generation.pk).exists()
    assert not Generation.objects.using(alias).filter(pk=generation.pk).exists()
    assert [r.levelname for r in caplog.records if r.name.startswith("chatstream")] == ["INFO"]
    assert "deleted while it streamed" in caplog.records[-1].getMessage()


@pytest.mark.parametrize("length", ["short", "long"])
def test_the_final_save_keeps_the_text_rendered_and_renders_with_it(alias, length):
    """The rendered text is saved with the outcome and the final form is made from it: on the
    event loop a long text is rendered in a thread (see chatstream/web/rendered.py)."""
    import threading

    from django.utils import timezone

    from chatstream.stream import _ending
    from chatstream.web import rendered
    from chatstream.web.rendering import render_markdown

    generation = pending_in(alias)
    generation.status = "streaming"
    content = "Done **x**\n\n" + ("- an item of a list\n" * 200 if length == "long" else "")
    assert (len(content) > rendered.INLINE_LIMIT) == (length == "long")
    threads: dict[str, int] = {}

    def render(saved: Generation) -> str:
        threads["render"] = threading.get_ident()
        return saved.content_html

    async def on_a_loop() -> str:
        threads["loop"] = threading.get_ident()
        return await _ending.save(generation, lambda: fields, lambda: fields, render)

    fields = {"status": "completed", "content": content, "completed_at": timezone.now()}
    final = elsewhere(lambda: "", on_a_loop, "event-loop")
    assert final == render_markdown(content)
    stored = Generation.objects.using(alias).get(pk=generation.pk)
    assert (stored.content_html, stored.content_html_key) == (final, rendered.key())
    assert (threads["render"] == threads["loop"]) == (length == "short")


@pytest.mark.parametrize("async_commit", [True, False], ids=["async-commit", "flushed"])
def test_claim_and_checkpoints_commit_without_waiting_for_the_flush_the_final_save_waits(
        require_service, settings, async_commit):
    """CHATSTREAM_ASYNC_COMMIT: synchronous_commit is off for the pool's claims and
    checkpoints; the outcome is committed with the server's own setting before it is shown."""
    from django.db import connections
    from django.utils import timezone

    require_service("PostgreSQL", lambda: "postgres" in django_settings.DATABASES)
    settings.CHATSTREAM_ASYNC_COMMIT = async_commit
    table = Generation._meta.db_table
    with connections["postgres"].cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        server_default = cursor.fetchone()[0]
        cursor.execute("CREATE TABLE cs_commit_log (id serial PRIMARY KEY, setting text)")
        cursor.execute("CREATE FUNCTION cs_log_commit() RETURNS trigger AS $$ BEGIN "
                       "INSERT INTO cs_commit_log (setting) "
                       "VALUES (current_setting('synchronous_commit')); RETURN NEW; END $$ "
                       "LANGUAGE plpgsql")
        cursor.execute(f"CREATE TRIGGER cs_log_commit AFTER UPDATE ON {table} "
                       "FOR EACH ROW EXECUTE FUNCTION cs_log_commit()")
    try:
        generation = pending_in("postgres")

        async def a_stream() -> None:
            claimed = await store.for_alias("postgres").claim(generation.pk, generation.user_id)
            assert claimed is not None
            now = timezone.now()
            rows = {generation.pk: {"content": "Hi", "first_token_at": now, "heartbeat_at": now}}
            assert await store.for_alias("postgres").checkpoint(rows) == set()
            await store.for_alias("postgres").finish(
                claimed,
                {"status": "completed", "content": "Hi!", "completed_at": timezone.now()})

        elsewhere(lambda: None, a_stream, "event-loop")
        with connections["postgres"].cursor() as cursor:
            cursor.execute("SELECT setting FROM cs_commit_log ORDER BY id")
            logged = [row[0] for row in cursor.fetchall()]
    finally:
        with connections["postgres"].cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS cs_log_commit ON {table}")
            cursor.execute("DROP FUNCTION IF EXISTS cs_log_commit()")
            cursor.execute("DROP TABLE IF EXISTS cs_commit_log")
    skipped = "off" if async_commit else server_default
    assert logged == [skipped, skipped, server_default]  # claim, checkpoint, final save
    assert Generation.objects.using("postgres").get(pk=generation.pk).content == "Hi!"


def test_the_postgresql_pools_close_with_their_loop(require_service):
    import asyncio

    from django.db import connections

    require_service("PostgreSQL", lambda: "postgres" in django_settings.DATABASES)
    generation = pending_in("postgres")

    async def claim() -> Any:
        postgres = store.for_alias("postgres")
        assert await postgres.claim(generation.pk, generation.user_id) is not None
        return store.for_alias("postgres")._loops.peek().pool  # type: ignore[attr-defined]

    # No store.aclose() here: asyncio.run's end must close the pool.
    pool = in_thread(lambda: asyncio.run(claim()))
    assert pool.closed

    def left_open() -> int:  # the connection that claimed, seen by the server
        with connections["postgres"].cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s "
                           "AND pid <> pg_backend_pid()", [f"%{generation.pk.hex}%"])
            return int(cursor.fetchone()[0])

    deadline = time.monotonic() + 5  # a backend leaves the list shortly after its client
    while left_open() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left_open() == 0


@pytest.mark.parametrize("max_age", [0, None])
def test_the_executor_threads_keep_their_sqlite_connection_and_close_it_with_them(max_age):
    """On SQLite with ``CONN_MAX_AGE = 0`` (a new site's settings), each of chatstream's calls
    in a thread used to open a connection of its own (the file, then the PRAGMAs): a thread
    now keeps its connection for its next calls, and closes it when the thread ends. So it
    does when the site keeps connections itself (``None``), where Django left it to the
    garbage collector."""
    import asyncio
    import gc
    import sqlite3
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections
    from django.db.backends.signals import connection_created

    from chatstream._loops import in_executor

    assert django_settings.DATABASES["default"]["CONN_MAX_AGE"] == 0
    site = connections.settings["default"]  # what each thread's new connection is made from
    opened: list[sqlite3.Connection] = []

    def count(sender: Any, connection: Any, **kwargs: Any) -> None:
        if connection.alias == "default":
            opened.append(connection.connection)

    def claimable(pk: Any) -> bool:
        return Generation.objects.filter(pk=pk, status=Generation.Status.PENDING).exists()

    def left_in_a_transaction() -> None:  # as a bug might: Django closes it after the call
        connections["default"].set_autocommit(False)

    async def calls(pk: Any) -> list[Any]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
        done = [await in_executor(claimable)(pk) for _ in range(3)]
        await in_executor(left_in_a_transaction)()
        return done + [await in_executor(claimable)(pk) for _ in range(2)]

    generation = pending_in("default")
    connection_created.connect(count)
    site["CONN_MAX_AGE"] = max_age
    try:
        assert in_thread(lambda: asyncio.run(calls(generation.pk))) == [True] * 5
    finally:
        site["CONN_MAX_AGE"] = 0
        connection_created.disconnect(count)
    # One connection for the first three calls and the fourth, which leaves it unusable; the
    # next one for the last two.
    assert len(opened) == 2
    gc.collect()  # Django's connection is a cycle: collected, not freed, once its thread ends
    for each in opened:
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            each.execute("SELECT 1")
    assert connections["default"].connection not in opened


def test_a_loop_ends_while_its_pool_is_still_connecting(require_service):
    """A loop that shuts down (asyncio.run, asgiref, uvicorn: every task cancelled, then the
    loop closed) while a stream waits for a new database connection ends at once, and the
    connection is given up. (psycopg_pool's workers, which used to make these connections,
    caught the cancellation and tried again: the loop, and the test run, never ended.)"""
    import asyncio
    import gc
    import socket

    from django.db import connections

    require_service("PostgreSQL", lambda: "postgres" in django_settings.DATABASES)
    generation = pending_in("postgres")
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers
    settings_dict = connections["postgres"].settings_dict
    port = settings_dict["PORT"]
    settings_dict["PORT"] = silent.getsockname()[1]

    async def a_stream_starts_then_the_loop_ends() -> None:
        asyncio.get_running_loop().create_task(
            store.for_alias("postgres").claim(generation.pk, generation.user_id))
        await asyncio.sleep(0.3)  # the claim is waiting for the server's answer

    try:
        started = time.monotonic()
        in_thread(lambda: asyncio.run(a_stream_starts_then_the_loop_ends()), timeout=10)
        ended_after = time.monotonic() - started
        silent.settimeout(1)
        client, _ = silent.accept()  # the claim was waiting for this server's answer
        client.settimeout(1)
        assert client.recv(1024)  # libpq's first message
        gc.collect()  # psycopg leaves the abandoned attempt's socket to the garbage collector
        assert client.recv(1024) == b""
        client.close()
    finally:
        settings_dict["PORT"] = port
        silent.close()
    assert ended_after < 5
    assert Generation.objects.using("postgres").get(pk=generation.pk).status == "pending"


# -- what an open stream holds ---------------------------------------------------------------------


def test_a_stream_makes_no_database_connection_object_of_its_own(require_service):
    """Django keeps a connection object per async context: one made in a stream's own context
    (by the claim's statement or the final save's) would live as long as the stream."""
    from django.db import connections
    from django.utils import timezone

    require_service("PostgreSQL", lambda: "postgres" in django_settings.DATABASES)
    generation = pending_in("postgres")

    async def a_stream() -> bool:
        claimed = await store.for_alias("postgres").claim(generation.pk, generation.user_id)
        assert claimed is not None
        made_by_claim = hasattr(connections._connections, "postgres")
        await store.for_alias("postgres").finish(
            claimed,
            {"status": "completed", "content": "Hi", "completed_at": timezone.now()})
        return made_by_claim or hasattr(connections._connections, "postgres")

    async def in_its_own_task() -> bool:
        import asyncio

        return await asyncio.get_running_loop().create_task(a_stream())

    assert elsewhere(lambda: True, in_its_own_task, "event-loop") is False
    assert Generation.objects.using("postgres").get(pk=generation.pk).content == "Hi"


def test_the_request_body_held_by_a_stream_is_its_exact_size():
    import tracemalloc

    from chatstream.provider import _request

    request = _request.UpstreamRequest(provider="p", url="http://x", headers={}, body={
        "model": "m", "stream": True, "messages": [{"role": "user", "content": "Qé " * 1000}]})
    _request.encode_body(request)  # the encoder's own buffers, kept once per process
    tracemalloc.start()
    try:
        body = _request.encode_body(request)
        # What is still allocated by the request module's lines (other threads' servers run
        # meanwhile).
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, _request.__file__)])
    finally:
        tracemalloc.stop()
    held = sum(stat.size for stat in snapshot.statistics("filename"))
    assert body == compact_json(request.body)
    assert held < len(body) + 256, (held, len(body))


def compact_json(value: Any) -> bytes:
    import json

    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def test_a_run_started_early_whose_body_is_never_read_still_closes_upstream_and_saves(
        make_user, simulator, use_model, browser_for):
    """The front calls the provider before its response's headers go out; if the client is
    gone before the body is first iterated, the request task's end must still stop it."""
    import asyncio

    from asgiref.sync import async_to_sync

    from chatstream.stream import _run, astart

    model = use_model("default?tps=20")
    user = browser_for(make_user())
    url = user.send(user.new_conversation(), "Hi", model)
    pk = generation_id(url)

    async def a_request_that_leaves() -> None:
        body = await astart(pk, user.user.pk, PageWire(lambda g: ""), start=True)
        assert body is not None
        for _ in range(200):  # the provider has been called and is streaming
            if simulator.requests and simulator.last_request.chunks_sent:
                break
            await asyncio.sleep(0.01)

    async def serve_then_settle() -> None:
        await asyncio.get_running_loop().create_task(a_request_that_leaves())
        await asyncio.sleep(0)  # the ended task's other done-callbacks run
        while _run._background:  # the wind-down the request's end set off
            await asyncio.gather(*_run._background)

    async_to_sync(serve_then_settle)()
    record = simulator.last_request
    assert record.wait_closed(5) and record.client_closed
    generation = Generation.objects.get(pk=pk)
    assert generation.status == Generation.Status.CANCELLED
    assert generation.completed_at is not None


def test_the_first_words_go_out_before_the_rest_of_their_network_read_is_decoded(
        make_user, simulator, use_model, browser_for):
    """A fast provider's first read can hold the whole reply: its first delta is sent on its
    own, the rest in the next event."""
    import asyncio
    import json

    from asgiref.sync import async_to_sync

    from chatstream.stream import JsonWire, astart

    words = " ".join(f"w{i}" for i in range(300))
    model = use_model(f"fast?text={quote(words)}")
    user = browser_for(make_user())
    pk = generation_id(user.send(user.new_conversation(), "Hi", model))

    async def deltas() -> list[str]:
        body = await astart(pk, user.user.pk, JsonWire(lambda g: ""), start=True)
        assert body is not None
        texts = []
        async for chunk in body:
            if chunk.startswith(b"event: delta"):
                data = chunk.split(b"data: ", 1)[1].split(b"\n", 1)[0]
                texts.append(json.loads(data)["text"])
        await asyncio.sleep(0)
        return texts

    texts = async_to_sync(deltas)()
    assert simulator.last_request.chunks_sent > 100
    assert "".join(texts) == words == Generation.objects.get(pk=pk).content
    assert len(texts) >= 2 and words.startswith(texts[0]) and len(texts[0]) <= 8, texts[:3]


def test_the_front_recognises_exactly_the_stream_paths_of_the_current_urlconf(settings):
    from django.core.handlers.asgi import ASGIRequest

    from chatstream.asgi import Kind, _stream_of

    pk = uuid.uuid4()
    assert _stream_of(f"/chat/g/{pk}/stream/") == (Kind.PAGE, pk)
    assert _stream_of(f"/chat/api/generations/{pk}/stream/") == (Kind.API, pk)
    for other in (f"/chat/g/{pk}/stream/x", f"/chat/g/{pk}/cancel/", f"/chat/g/{pk}/stream",
                  f"/chat/g/{str(pk).upper()}/stream/", f"/chat/g/{pk.hex}/stream/",
                  f"/x/chat/g/{pk}/stream/", "/chat/g/not-a-uuid-not-a-uuid-not-a-uuid-1/stream/",
                  f"/chat/api/generations/{pk}/stream/x", f"/chat/api/g/{pk}/stream/"):
        assert _stream_of(other) is None, other
    # Under a script prefix, the path under it (as Django's request has it) is the one that
    # counts.
    scope = {"type": "http", "method": "GET", "path": f"/site/chat/g/{pk}/stream/",
             "root_path": "/site", "query_string": b"", "headers": []}
    assert _stream_of(ASGIRequest(scope, io.BytesIO()).path_info) == (Kind.PAGE, pk)
    assert _stream_of(ASGIRequest({**scope, "root_path": ""}, io.BytesIO()).path_info) is None
    # A site that maps the path to a view of its own gets its view: the front steps aside.
    site = settings.ROOT_URLCONF
    settings.ROOT_URLCONF = "tests.urls_shadowed"
    assert _stream_of(f"/chat/g/{pk}/stream/") is None
    settings.ROOT_URLCONF = site
    assert _stream_of(f"/chat/g/{pk}/stream/") == (Kind.PAGE, pk)
