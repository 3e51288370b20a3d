"""The replies to one message: at most ``CHATSTREAM_MAX_REPLIES_PER_MESSAGE`` (Retry and
Regenerate refused past it, with a sentence, on the page, in the JSON API and from
``chatstream.api``), and a window of them on a page (the newest ``windows.REPLIES_PER_PAGE``,
earlier ones a link away), in the JSON API and in the admin's conversation page: none of them
grows with the number of replies.
"""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from chatstream import api
from chatstream.exceptions import TooManyReplies
from chatstream.models import Conversation, Generation, Message
from chatstream.web.windows import REPLIES_PER_PAGE

from .conftest import Browser
from .workers import DATABASES, Workers, postgres_available

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
Status = Generation.Status
REFUSED = "already has 3 replies, the most it may have"


@pytest.fixture
def signed_in(db: Any) -> tuple[Any, Client]:
    """Alice, and a client signed in as her."""
    alice = get_user_model().objects.create_user("alice", password="pw")
    client = Client()
    client.force_login(alice)
    return alice, client


def asked(user: Any, replies: int, *, using: str = "default") -> Message:
    """A message of ``user``'s with ``replies`` replies, the first ``stopped``, one a minute."""
    conversation = Conversation.objects.using(using).create(user=user, model="fast", title="t")
    start = timezone.now() - timedelta(days=1)
    message = Message.objects.using(using).create(conversation=conversation, role="user",
                                                  content="Hello", created_at=start)
    Generation.objects.using(using).bulk_create(
        Generation(conversation=conversation, user=user, prompt_message=message, model="fast",
                   status=Status.CANCELLED, error_type="stopped_by_user", content=f"reply {i}",
                   created_at=start + timedelta(minutes=i))
        for i in range(replies))
    return message


def replies_of(message: Message) -> list[Generation]:
    return list(message.generations.order_by("created_at"))


def shown(html: str) -> list[str]:
    """The replies a page (or an exchange) shows, by their text, in order."""
    return re.findall(r"<p>(reply \d+)</p>", html)


# --- the limit ------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # Stop writes from a thread of its own
def test_retry_then_stop_repeated_stops_at_the_limit_with_a_sentence_where_refusals_show(
    signed_in, settings, simulator
):
    alice, client = signed_in
    settings.CHATSTREAM_MAX_REPLIES_PER_MESSAGE = 3
    conversation = Conversation.objects.create(user=alice, model="fast")
    response = client.post(reverse("chatstream:message-create", args=[conversation.pk]),
                           {"content": "Hello"}, **HTMX)
    generation = Generation.objects.get()
    for _ in range(2):  # Stop before it starts, then Retry: each adds a reply at 0 tokens
        client.post(reverse("chatstream:generation-cancel", args=[generation.pk]), **HTMX)
        response = client.post(reverse("chatstream:generation-retry", args=[generation.pk]),
                               **HTMX)
        assert response.status_code == 200
        generation = Generation.objects.order_by("-created_at").first()
    client.post(reverse("chatstream:generation-cancel", args=[generation.pk]), **HTMX)
    refused = client.post(reverse("chatstream:generation-retry", args=[generation.pk]),
                          {"model": "fast"}, **HTMX)  # Regenerate counts as a Retry
    assert refused.status_code == 409
    assert 'class="cs-notice cs-refusal" role="alert"' in refused.text and REFUSED in refused.text
    assert Generation.objects.count() == 3 and simulator.requests == []
    # Without JavaScript: the conversation's page, the sentence in its notice slot.
    page = client.post(reverse("chatstream:generation-retry", args=[generation.pk]))
    assert page.status_code == 409
    notice = re.search(r'<div id="cs-notice".*?</div>', page.text, re.DOTALL)
    assert notice is not None and REFUSED in notice.group()
    assert Generation.objects.count() == 3


def test_the_json_api_and_python_refuse_a_retry_past_the_limit_keeping_nothing(
    signed_in, settings, simulator
):
    alice, client = signed_in
    settings.CHATSTREAM_MAX_REPLIES_PER_MESSAGE = 3
    message = asked(alice, 3)
    last = replies_of(message)[-1]
    response = client.post(reverse("chatstream:api-generation-retry", args=[last.pk]),
                           content_type="application/json")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "too_many_replies"
    assert REFUSED in response.json()["error"]["message"]
    with pytest.raises(TooManyReplies, match=REFUSED):
        api.retry(last, model="fast")
    assert message.generations.count() == 3 and simulator.requests == []
    settings.CHATSTREAM_MAX_REPLIES_PER_MESSAGE = 4  # read live: one more is let through
    assert api.retry(last).prompt_message_id == message.pk


@pytest.mark.django_db(transaction=True, databases=DATABASES)
@pytest.mark.parametrize("alias", ["default", pytest.param("postgres", marks=pytest.mark.postgres)],
                         ids=["sqlite", "postgres"])
def test_retries_at_once_add_no_more_replies_than_the_limit(alias, simulator, require_service):
    if alias == "postgres":
        require_service("PostgreSQL (CHATSTREAM_TEST_POSTGRES)", postgres_available)
    user = get_user_model().objects.db_manager(alias).create_user("burst", password="pw")
    message = asked(user, 1, using=alias)
    first = Generation.objects.using(alias).get(prompt_message=message)
    overrides = {"CHATSTREAM_MAX_REPLIES_PER_MESSAGE": 4}
    with Workers(workers=2, alias=alias, overrides=overrides) as workers:
        browser = Browser(workers.url, user)
        try:
            statuses = asyncio.run(_retry_at_once(browser, workers.url, first, 12))
        finally:
            browser.close()
    assert sorted(statuses) == [200] * 3 + [409] * 9
    assert Generation.objects.using(alias).filter(prompt_message=message).count() == 4


async def _retry_at_once(browser: Browser, url: str, generation: Generation, count: int
                         ) -> list[int]:
    path = reverse("chatstream:generation-retry", args=[generation.pk])
    headers = {"X-CSRFToken": browser.csrf, "HX-Request": "true"}
    async with httpx.AsyncClient(base_url=url, cookies=browser.client.cookies, timeout=60,
                                 headers=headers) as client:
        responses = await asyncio.gather(*(client.post(path) for _ in range(count)))
    return [r.status_code for r in responses]


# --- the page's window ----------------------------------------------------------------------------


def test_a_page_shows_a_messages_newest_replies_and_the_rest_a_link_away(signed_in):
    alice, client = signed_in
    message = asked(alice, 2 * REPLIES_PER_PAGE + 5)
    page = client.get(message.conversation.get_absolute_url()).text
    newest = [f"reply {i}" for i in range(REPLIES_PER_PAGE + 5, 2 * REPLIES_PER_PAGE + 5)]
    assert shown(page) == newest
    seen = shown(page)
    earlier = _link(page, "Earlier replies")
    assert _link(page, "Later replies") is None
    while earlier is not None:  # without JavaScript: the page, the exchange in it
        page = client.get(earlier).text
        window = shown(page)
        assert 0 < len(window) <= REPLIES_PER_PAGE
        seen = window + seen
        later = _link(page, "Later replies")  # the window right after this one
        assert later is not None
        assert _number(shown(client.get(later).text)[0]) == _number(window[-1]) + 1
        earlier = _link(page, "Earlier replies")
    assert seen == [f"reply {i}" for i in range(2 * REPLIES_PER_PAGE + 5)]


def test_the_earlier_replies_of_an_exchange_swap_in_place_for_htmx(signed_in):
    alice, client = signed_in
    message = asked(alice, REPLIES_PER_PAGE + 3)
    page = client.get(message.conversation.get_absolute_url()).text
    link = re.search(r'hx-get="([^"]+)"[^>]*rel="prev"', page)
    assert link is not None and f'hx-target="#exchange-{message.pk}"' in page
    fragment = client.get(link.group(1).replace("&amp;", "&"), **HTMX).text
    assert fragment.lstrip().startswith(f'<div class="cs-exchange" id="exchange-{message.pk}"')
    assert shown(fragment) == ["reply 0", "reply 1", "reply 2"]
    assert "Earlier replies" not in fragment and "Later replies" in fragment


def test_a_page_costs_the_same_queries_and_holds_the_same_replies_however_many_there_are(
    signed_in
):
    alice, client = signed_in

    def cost(replies: int) -> tuple[int, int]:
        message = asked(alice, replies)
        with CaptureQueriesContext(connection) as queries:
            page = client.get(message.conversation.get_absolute_url()).text
        return len(queries), len(re.findall(r'<article[^>]*id="generation-', page))

    cost(1)  # warm caches
    small, large = cost(REPLIES_PER_PAGE + 1), cost(300)
    assert small == large and small[1] == REPLIES_PER_PAGE


@pytest.mark.parametrize("value", ["not-a-uuid", "00000000-0000-0000-0000-000000000000"],
                         ids=["malformed", "not-a-reply-of-it"])
def test_a_window_before_something_that_is_not_a_reply_of_the_message_is_a_404(
    signed_in, value
):
    alice, client = signed_in
    message = asked(alice, 2)
    other = asked(alice, 1).generations.get()
    for before in (value, str(other.pk)):
        address = reverse("chatstream:message-version", args=[message.pk])
        assert client.get(f"{address}?replies_before={before}").status_code == 404


def _number(reply: str) -> int:
    return int(reply.split()[1])


def _link(page: str, label: str) -> str | None:
    found = re.search(rf'<a class="cs-button" href="([^"#]+)[^"]*"[^>]*>[^<]*(?:<span[^>]*>'
                      rf'[^<]*</span> )?{label}', page)
    return found.group(1).replace("&amp;", "&") if found else None


# --- the JSON API ---------------------------------------------------------------------------------


def test_the_json_api_holds_the_newest_replies_and_links_to_the_others(signed_in):
    alice, client = signed_in
    message = asked(alice, 2 * REPLIES_PER_PAGE + 5)
    conversation = client.get(reverse("chatstream:api-conversation",
                                      args=[message.conversation_id])).json()
    [entry] = conversation["messages"]
    seen = [g["content"] for g in entry["generations"]]
    assert len(seen) == REPLIES_PER_PAGE
    older = entry["older_generations"]
    while older is not None:
        window = client.get(older).json()
        assert 0 < len(window["results"]) <= REPLIES_PER_PAGE
        seen = [g["content"] for g in window["results"]] + seen
        newer = client.get(window["newer"]).json()["results"]
        assert newer[0]["created_at"] > window["results"][-1]["created_at"]
        older = window["older"]
    assert seen == [f"reply {i}" for i in range(2 * REPLIES_PER_PAGE + 5)]
    newest = client.get(reverse("chatstream:api-message-generations", args=[message.pk]))
    assert [g["content"] for g in newest.json()["results"]] == seen[-REPLIES_PER_PAGE:]
    assert newest.json()["newer"] is None


# --- the admin ------------------------------------------------------------------------------------


def test_the_admins_conversation_page_shows_a_page_of_each_inline_and_reaches_every_row(
    admin_client
):
    alice = get_user_model().objects.create_user("alice")
    message = asked(alice, 230)
    address = reverse("admin:chatstream_conversation_change", args=[message.conversation_id])

    def rows(html: str, prefix: str) -> list[str]:
        return re.findall(rf'<tr class="form-row has_original" id="{prefix}-\d+"', html)

    page = admin_client.get(address).content.decode()
    assert len(rows(page, "generations")) == 100
    seen = set(re.findall(r"/admin/chatstream/generation/([0-9a-f-]{36})/change/", page))
    pages = 1
    while (next_page := re.search(r'href="(\?[^"#]*generations=\d+)[^"]*">Next', page)):
        page = admin_client.get(address + next_page.group(1).replace("&amp;", "&")
                                ).content.decode()
        seen |= set(re.findall(r"/admin/chatstream/generation/([0-9a-f-]{36})/change/", page))
        pages += 1
    assert pages == 3 and len(rows(page, "generations")) == 30
    assert seen == {str(g.pk) for g in message.generations.all()}


def test_the_admins_conversation_page_costs_the_same_however_many_replies(admin_client):
    alice = get_user_model().objects.create_user("alice")

    def cost(replies: int) -> tuple[int, int]:
        message = asked(alice, replies)
        address = reverse("admin:chatstream_conversation_change", args=[message.conversation_id])
        with CaptureQueriesContext(connection) as queries:
            html = admin_client.get(address).content.decode()
        return len(queries), len(html) // 1000

    cost(1)  # warm caches
    small, large = cost(101), cost(1000)
    assert small[0] == large[0] and abs(small[1] - large[1]) <= 1
