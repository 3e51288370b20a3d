"""Every JSON API answer to an authenticated user says what they have left:
``X-RateLimit-Remaining-Requests`` and ``X-RateLimit-Remaining-Tokens``, read from their own
ledger, in one query of it at most; none for a limit that is unlimited. A stream's answer too,
whether the front (``with_fast_streams``) serves it or Django does."""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from chatstream import quota as quota_module
from chatstream import store
from chatstream.json_api import ratelimit
from chatstream.models import Conversation, GroupQuota, QuotaCharge, UserQuota

from .conftest import Browser
from .workers import DATABASES, ROUTE_TO_POSTGRES, postgres_available

pytestmark = pytest.mark.django_db(transaction=True)

REQUESTS = "X-RateLimit-Remaining-Requests"
TOKENS = "X-RateLimit-Remaining-Tokens"


def charge(user: Any, tokens: int, ago: timedelta, **fields: Any) -> QuotaCharge:
    """A settled charge of ``tokens``, admitted ``ago``."""
    at = timezone.now() - ago
    return QuotaCharge.objects.create(
        user=user, generation_id=uuid.uuid4(), model="fast", at=at, prompt_estimate=tokens,
        max_tokens=0, reserved=tokens, charged=tokens, settled_at=at, **fields)


@pytest.fixture
def alice(make_user: Any) -> Any:
    return make_user("alice")


@pytest.fixture
def signed_in(client: Any, alice: Any) -> Any:
    client.force_login(alice)
    return client


def quota(settings: Any, **limits: int) -> None:
    settings.CHATSTREAM_DEFAULT_QUOTA = {name.upper(): value for name, value in limits.items()}


def left(response: Any) -> tuple[str | None, str | None]:
    return response.headers.get(REQUESTS), response.headers.get(TOKENS)


def conversations() -> str:
    return reverse("chatstream:api-conversations")


def send(client: Any, user: Any, body: Any = None) -> Any:
    """A message posted to a new conversation of ``user``'s (``body``: its JSON)."""
    conversation = Conversation.objects.create(user=user, model="fast")
    return client.post(reverse("chatstream:api-messages", args=[conversation.pk]),
                       {"content": "Hi"} if body is None else body,
                       content_type="application/json")


def test_each_header_says_what_is_left_after_some_usage(signed_in, alice, settings):
    quota(settings, requests_per_minute=5, tokens_per_day=10_000)
    charge(alice, 100, timedelta(seconds=10))   # this minute, this day
    charge(alice, 200, timedelta(minutes=2))    # this day only
    charge(alice, 4000, timedelta(hours=30))    # neither
    response = signed_in.get(conversations())
    assert response.status_code == 200
    assert left(response) == ("4", "9700")


def test_the_tokens_left_are_under_the_tightest_token_limit(signed_in, alice, settings):
    quota(settings, tokens_per_day=10_000, tokens_per_month=500)
    charge(alice, 300, timedelta(seconds=1))
    assert left(signed_in.get(conversations())) == (None, "200")
    quota(settings, tokens_per_day=400, tokens_per_month=50_000)
    assert left(signed_in.get(conversations())) == (None, "100")


def test_nothing_left_is_zero_never_below(signed_in, alice, settings):
    quota(settings, requests_per_minute=1, tokens_per_day=100)
    charge(alice, 250, timedelta(seconds=1))
    charge(alice, 1, timedelta(seconds=2))
    assert left(signed_in.get(conversations())) == ("0", "0")


def test_a_header_is_left_out_when_its_limit_is_unlimited(signed_in, alice, settings):
    charge(alice, 100, timedelta(seconds=1))
    settings.CHATSTREAM_DEFAULT_QUOTA = {}
    assert left(signed_in.get(conversations())) == (None, None)
    quota(settings, requests_per_minute=3)
    assert left(signed_in.get(conversations())) == ("2", None)
    quota(settings, tokens_per_month=1000)
    assert left(signed_in.get(conversations())) == (None, "900")
    UserQuota.objects.create(user=alice, unlimited_tokens_per_month=True)
    assert left(signed_in.get(conversations())) == (None, None)


def test_what_the_answer_itself_used_counts(signed_in, alice, settings):
    quota(settings, requests_per_minute=5, tokens_per_day=50_000)
    charge(alice, 1000, timedelta(seconds=5))
    response = send(signed_in, alice)
    assert response.status_code == 201, response.content
    admitted = QuotaCharge.objects.get(generation_id=response.json()["generation"]["id"])
    assert left(response) == ("3", str(50_000 - 1000 - admitted.reserved))


def test_errors_of_an_authenticated_user_carry_them_too(signed_in, alice, settings):
    quota(settings, requests_per_minute=5, tokens_per_day=10_000)
    charge(alice, 100, timedelta(seconds=1))
    missing = signed_in.get(reverse("chatstream:api-generation", args=[uuid.uuid4()]))
    assert missing.status_code == 404 and left(missing) == ("4", "9900")
    invalid = send(signed_in, alice, "[]")
    assert invalid.status_code == 400 and left(invalid) == ("4", "9900")
    stop = signed_in.post(reverse("chatstream:api-generation-stop", args=[uuid.uuid4()]))
    assert stop.status_code == 404 and left(stop) == ("4", "9900")  # an async view's
    for wrong in (signed_in.put(conversations()),  # a sync view's, then an async view's
                  signed_in.get(reverse("chatstream:api-generation-stop", args=[uuid.uuid4()]))):
        assert wrong.status_code == 405 and left(wrong) == ("4", "9900")


def test_a_quota_refusal_keeps_its_retry_after(signed_in, alice, settings):
    quota(settings, requests_per_minute=1, tokens_per_day=10_000)
    charge(alice, 100, timedelta(seconds=20))
    refused = send(signed_in, alice)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "quota_exceeded"
    assert 0 < int(refused.headers["Retry-After"]) <= 40
    assert left(refused) == ("0", "9900")


def test_no_one_signed_in_gets_none(client, alice, settings):
    quota(settings, requests_per_minute=5, tokens_per_day=10_000)
    response = client.get(conversations())
    assert response.status_code == 401 and left(response) == (None, None)


def test_they_are_the_callers_own_never_another_users(signed_in, alice, make_user, settings):
    quota(settings, requests_per_minute=5, tokens_per_day=10_000)
    bob = make_user("bob")
    UserQuota.objects.create(user=bob, requests_per_minute=50, tokens_per_day=90_000)
    charge(bob, 7000, timedelta(seconds=1))
    charge(bob, 1, timedelta(seconds=2))
    charge(alice, 10, timedelta(seconds=3))
    assert left(signed_in.get(conversations())) == ("4", "9990")
    signed_in.force_login(bob)
    assert left(signed_in.get(conversations())) == ("48", "82999")


def test_one_query_of_the_ledger_at_most(signed_in, alice, settings):
    quota(settings, requests_per_minute=5, tokens_per_day=10_000, tokens_per_month=90_000)
    charge(alice, 10, timedelta(seconds=3))
    with CaptureQueriesContext(connection) as queries:
        assert left(signed_in.get(conversations())) == ("4", "9990")
    assert sum("chatstream_quotacharge" in q["sql"] for q in queries) == 1
    settings.CHATSTREAM_DEFAULT_QUOTA = {"CONCURRENT_STREAMS": 2}
    with CaptureQueriesContext(connection) as queries:
        assert left(signed_in.get(conversations())) == (None, None)
    assert sum("chatstream_quotacharge" in q["sql"] for q in queries) == 0


@pytest.mark.parametrize("server", ["asgi_server", "django_asgi_server"])
def test_a_stream_and_its_refusals_carry_them(server, request, alice, settings, use_model):
    quota(settings, requests_per_minute=5, tokens_per_day=100_000)
    browser = Browser(request.getfixturevalue(server).url, alice)
    request.addfinalizer(browser.close)
    model = use_model("fast")
    conversation = Conversation.objects.create(user=alice, model=model)
    sent = browser.post(reverse("chatstream:api-messages", args=[conversation.pk]),
                        json={"content": "Hi"}, htmx=False)
    assert sent.status_code == 201, sent.text
    assert sent.headers[REQUESTS] == "4"
    held = int(sent.headers[TOKENS])  # what the reply holds while it is written is counted
    assert held < 100_000
    with browser.client.stream("GET", sent.json()["stream_url"]) as stream:
        assert stream.status_code == 200
        # (or more, if the reply has already ended and been charged less than it held)
        assert stream.headers[REQUESTS] == "4" and held <= int(stream.headers[TOKENS]) < 100_000
        stream.read()
    missing = browser.client.get(reverse("chatstream:api-generation-stream",
                                         args=[uuid.uuid4()]))
    assert missing.status_code == 404 and missing.headers[REQUESTS] == "4"


# -- the headers' read on every database, and on PostgreSQL's event loop -----------------------


@pytest.fixture
def on_postgres(settings: Any, require_service: Any) -> None:
    require_service("PostgreSQL (CHATSTREAM_TEST_POSTGRES)", postgres_available)
    settings.DATABASE_ROUTERS = [ROUTE_TO_POSTGRES]


LIMITED = {"requests_per_minute": 5, "tokens_per_day": 10_000, "tokens_per_month": 90_000}


def group_of(user: Any, name: str, **limits: Any) -> None:
    group = Group.objects.create(name=name)
    user.groups.add(group)
    if limits:
        GroupQuota.objects.create(group=group, **limits)


# Each scenario: the site's default, and what the user is given on top (``None``: nothing).
OVERRIDES: dict[str, tuple[dict[str, int], Any]] = {
    "unlimited": ({}, None),
    "the default": (LIMITED, None),
    "own override": (LIMITED, lambda user: UserQuota.objects.create(
        user=user, unlimited_tokens_per_day=True, requests_per_minute=50)),
    "lifted entirely": (LIMITED, lambda user: UserQuota.objects.create(
        user=user, unlimited_tokens_per_day=True, unlimited_tokens_per_month=True,
        unlimited_requests_per_minute=True)),
    "groups": ({}, lambda user: (
        group_of(user, "small", tokens_per_day=1000, requests_per_minute=3),
        group_of(user, "large", tokens_per_day=5000),
        group_of(user, "none"))),
    "own over groups": ({"tokens_per_month": 100}, lambda user: (
        group_of(user, "small", tokens_per_day=1000, requests_per_minute=3),
        UserQuota.objects.create(user=user, tokens_per_day=700))),
}


@pytest.mark.django_db(transaction=True, databases=DATABASES)
@pytest.mark.parametrize("read", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres),
                                  pytest.param("postgres-loop", marks=pytest.mark.postgres)])
@pytest.mark.parametrize("scenario", OVERRIDES)
def test_the_quota_left_is_what_the_limits_and_the_ledger_say(scenario, read, request,
                                                               settings):
    """The headers' read (two statements built once; on PostgreSQL's event loop, no query
    through Django) gives the figures of the user's limits and usage as the quota reads them,
    whatever the overrides and wherever the charges lie."""
    if read != "sqlite":
        request.getfixturevalue("on_postgres")
    default, given = OVERRIDES[scenario]
    quota(settings, **default)
    user = get_user_model().objects.create_user("carol")
    other = get_user_model().objects.create_user("dave")  # their charges and override: not hers
    UserQuota.objects.create(user=other, tokens_per_day=3)
    for ago, tokens in ((timedelta(seconds=3), 10), (timedelta(seconds=50), 20),
                        (timedelta(minutes=2), 200), (timedelta(hours=25), 1000),
                        (timedelta(days=40), 5000)):
        charge(user, tokens, ago)
        charge(other, tokens * 7, ago)
    held = charge(user, 0, timedelta(seconds=10))  # a hold still open counts what it reserves
    QuotaCharge.objects.filter(pk=held.pk).update(reserved=300, charged=None, settled_at=None)
    if given is not None:
        given(user)
    expected = quota_module.Remaining(quota_module.limits_for(user), quota_module.usage(user))
    if read == "postgres-loop":
        with CaptureQueriesContext(connections["postgres"]) as queries:
            found = async_to_sync(quota_module.aheadroom)(user.pk, store.for_alias("postgres"))
        assert not queries.captured_queries
    else:
        found = quota_module.headroom(user)
    figures = ("requests_minute", "tokens", "tokens_day", "tokens_month")
    assert ([getattr(found, name) for name in figures]
            == [getattr(expected, name) for name in figures])
    if scenario == "the default":  # and that figure is right
        assert (found.requests_minute, found.tokens) == (5 - 3, 10_000 - 10 - 20 - 200 - 300)


@pytest.mark.django_db(transaction=True, databases=DATABASES)
def test_a_stream_served_in_front_on_postgres_carries_them(on_postgres, asgi_server, request,
                                                           settings, use_model):
    quota(settings, requests_per_minute=5, tokens_per_day=100_000)
    erin = get_user_model().objects.create_user("erin", password="pw")
    group_of(erin, "generous", unlimited_requests_per_minute=True)
    browser = Browser(asgi_server.url, erin)
    request.addfinalizer(browser.close)
    conversation = Conversation.objects.create(user=erin, model=use_model("fast"))
    sent = browser.post(reverse("chatstream:api-messages", args=[conversation.pk]),
                        json={"content": "Hi"}, htmx=False)
    assert sent.status_code == 201, sent.text
    held = int(sent.headers[TOKENS])
    assert REQUESTS not in sent.headers
    with browser.client.stream("GET", sent.json()["stream_url"]) as stream:
        assert stream.status_code == 200
        assert REQUESTS not in stream.headers and held <= int(stream.headers[TOKENS]) < 100_000
        stream.read()


class CountingExecutor(ThreadPoolExecutor):
    """The loop's default executor, counting the work sent to its threads."""

    submitted = 0

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        self.submitted += 1
        return super().submit(*args, **kwargs)


@pytest.mark.django_db(transaction=True, databases=DATABASES)
@pytest.mark.parametrize("alias", ["default", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_streams_headers_take_no_thread_on_postgres(alias, request, settings):
    if alias == "postgres":
        request.getfixturevalue("on_postgres")
    quota(settings, **LIMITED)
    user = get_user_model().objects.create_user("frank")
    charge(user, 10, timedelta(seconds=3))
    executor = CountingExecutor(max_workers=2)

    async def headers() -> list[tuple[bytes, bytes]]:
        asyncio.get_running_loop().set_default_executor(executor)
        return await ratelimit.for_stream(user.pk)

    assert asyncio.run(headers()) == [(b"x-ratelimit-remaining-requests", b"4"),
                                      (b"x-ratelimit-remaining-tokens", b"9990")]
    assert (executor.submitted == 0) == (alias == "postgres")
