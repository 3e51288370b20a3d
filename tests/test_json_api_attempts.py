"""A generation's JSON says which model answered (``answered_by``) and lists its upstream calls
(``attempts``), read in one query per answer however many generations it holds."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from chatstream.models import Attempt, Conversation, Generation, Message

pytestmark = pytest.mark.django_db


def reply(user: Any, conversation: Conversation, *, attempts: int = 0,
          **fields: Any) -> Generation:
    """A finished reply to a new message of ``conversation``, with ``attempts`` upstream calls:
    all but the last failed, the last answered."""
    message = Message.objects.create(conversation=conversation, role="user", content="Hi")
    now = timezone.now()
    values = {"status": "completed", "content": "Hello.", "started_at": now,
              "first_token_at": now, "completed_at": now, **fields}
    generation = Generation.objects.create(conversation=conversation, user=user,
                                           prompt_message=message, model="fast", **values)
    for number in range(1, attempts + 1):
        last = number == attempts
        Attempt.objects.create(
            generation=generation, number=number, model="spare" if last else "fast",
            status="succeeded" if last else "failed", http_status=200 if last else 429,
            error_type="" if last else "rate_limited", retry_after=None if last else 1.5,
            started_at=now + timedelta(seconds=number),
            first_token_at=now + timedelta(seconds=number, milliseconds=200) if last else None,
            finished_at=now + timedelta(seconds=number + 1))
    return generation


@pytest.fixture
def alice(make_user: Any) -> Any:
    return make_user("alice")


def test_a_generation_says_who_answered_and_lists_its_attempts(client: Any, alice: Any) -> None:
    conversation = Conversation.objects.create(user=alice, model="fast")
    generation = reply(alice, conversation, attempts=2, answered_by="spare")
    client.force_login(alice)
    data = client.get(reverse("chatstream:api-generation", args=[generation.pk])).json()
    assert data["model"] == "fast" and data["answered_by"] == "spare"
    first, second = Attempt.objects.order_by("number")
    assert data["attempts"] == [
        {"number": 1, "model": "fast", "status": "failed", "http_status": 429,
         "error_type": "rate_limited", "retry_after": 1.5,
         "started_at": first.started_at.isoformat(), "first_token_at": None,
         "finished_at": first.finished_at.isoformat()},
        {"number": 2, "model": "spare", "status": "succeeded", "http_status": 200,
         "error_type": "", "retry_after": None, "started_at": second.started_at.isoformat(),
         "first_token_at": second.first_token_at.isoformat(),
         "finished_at": second.finished_at.isoformat()},
    ]


def test_no_call_made_is_no_one_answering_and_no_attempt(client: Any, alice: Any) -> None:
    conversation = Conversation.objects.create(user=alice, model="fast")
    generation = reply(alice, conversation, status="failed", content="")
    client.force_login(alice)
    data = client.get(reverse("chatstream:api-generation", args=[generation.pk])).json()
    assert data["answered_by"] is None and data["attempts"] == []


def queries_for(client: Any, url: str) -> tuple[int, dict[str, Any]]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, response.content
    return len(queries), response.json()


@pytest.mark.parametrize("where", ["conversation", "replies"])
def test_a_list_of_generations_reads_their_attempts_in_one_query(client: Any, alice: Any,
                                                                 where: str) -> None:
    def url(conversation: Conversation) -> str:
        if where == "conversation":
            return reverse("chatstream:api-conversation", args=[conversation.pk])
        message = conversation.messages.get()
        return reverse("chatstream:api-message-generations", args=[message.pk])

    client.force_login(alice)
    counts, found = [], []
    for replies in (1, 4):
        conversation = Conversation.objects.create(user=alice, model="fast")
        first = reply(alice, conversation, attempts=3, answered_by="spare")
        for _ in range(replies - 1):  # more replies to the same message, each with attempts
            Generation.objects.create(
                conversation=conversation, user=alice, prompt_message=first.prompt_message,
                model="fast", status="completed", answered_by="fast")
        for g in conversation.generations.exclude(pk=first.pk):
            Attempt.objects.create(generation=g, number=1, model="fast", status="succeeded")
        count, data = queries_for(client, url(conversation))
        counts.append(count)
        found.append(data)
    assert counts[0] == counts[1]
    generations = (found[1]["messages"][0]["generations"] if where == "conversation"
                   else found[1]["results"])
    assert len(generations) == 4
    assert sorted(len(g["attempts"]) for g in generations) == [1, 1, 1, 3]
    assert {g["answered_by"] for g in generations} == {"fast", "spare"}


def test_a_message_sent_answers_with_its_reply_not_yet_attempted(client: Any, alice: Any
                                                                 ) -> None:
    conversation = Conversation.objects.create(user=alice, model="fast")
    client.force_login(alice)
    response = client.post(reverse("chatstream:api-messages", args=[conversation.pk]),
                           {"content": "Hi"}, content_type="application/json")
    assert response.status_code == 201, response.content
    generation = response.json()["generation"]
    assert generation["status"] == "pending"
    assert generation["answered_by"] is None and generation["attempts"] == []
