"""``manage.py chatstream_purge``: retention by conversation, dry run by default."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.utils import timezone

from chatstream.models import Conversation, Generation, Message

from .test_admin import make_generation

pytestmark = pytest.mark.django_db

Status = Generation.Status


def days_ago(days: float) -> Any:
    return timezone.now() - timedelta(days=days)


@pytest.fixture
def conversations() -> dict[str, Conversation]:
    """Conversations of every kind the cutoff (30 days) has to tell apart."""
    user = get_user_model().objects.create_user("alice", password="pw")

    def exchange(created: Any, **fields: Any) -> Conversation:
        return make_generation(user, created_at=created, **fields).conversation

    stale = exchange(days_ago(100))
    make_generation(user, conversation=stale, created_at=days_ago(95))
    # Untouched since, but its last exchange was yesterday (updated_at not bumped).
    late_reply = exchange(days_ago(100))
    make_generation(user, conversation=late_reply, created_at=days_ago(0.5))
    # A generation still streaming, however old.
    running = exchange(days_ago(60), status=Status.STREAMING)
    # A user message sent yesterday.
    late_message = exchange(days_ago(60))
    Message.objects.create(conversation=late_message, role=Message.Role.USER, content="hi",
                           created_at=days_ago(0.5))
    recent = exchange(days_ago(2))
    for conversation, updated in ((late_reply, 100), (running, 60), (late_message, 60)):
        Conversation.objects.filter(pk=conversation.pk).update(updated_at=days_ago(updated))
    return {"stale": stale, "late_reply": late_reply, "running": running,
            "late_message": late_message, "recent": recent}


def purge(*args: str) -> str:
    out = StringIO()
    call_command("chatstream_purge", *args, stdout=out)
    return out.getvalue()


def test_dry_run_counts_and_changes_nothing(conversations: dict[str, Conversation]) -> None:
    before = (Conversation.objects.count(), Message.objects.count(), Generation.objects.count())
    output = purge("--older-than", "30")
    assert ("would delete 1 conversation, 4 messages, 2 generations, 0 tool calls, 0 attempts, "
            "0 feedback with no activity since") in output
    assert "--execute" in output
    assert (Conversation.objects.count(), Message.objects.count(),
            Generation.objects.count()) == before


@pytest.mark.parametrize("flag", ["--execute", "--yes"])
def test_execute_deletes_inactive_conversations_with_their_contents(
    conversations: dict[str, Conversation], flag: str
) -> None:
    stale = conversations["stale"]
    output = purge("--older-than", "30", flag)
    assert ("Deleted 1 conversation, 4 messages, 2 generations, 0 tool calls, 0 attempts, 0 "
            "feedback with no activity since") in output
    assert not Conversation.objects.filter(pk=stale.pk).exists()
    assert not Message.objects.filter(conversation_id=stale.pk).exists()
    assert not Generation.objects.filter(conversation_id=stale.pk).exists()
    kept = {name for name, c in conversations.items()
            if Conversation.objects.filter(pk=c.pk).exists()}
    assert kept == {"late_reply", "running", "late_message", "recent"}


def test_execute_works_in_batches(conversations: dict[str, Conversation]) -> None:
    user = get_user_model().objects.get(username="alice")
    for _ in range(4):
        make_generation(user, created_at=days_ago(200))
    output = purge("--older-than", "30", "--execute", "--batch-size", "2")
    assert "Deleted 5 conversations, 12 messages, 6 generations," in output
    assert Conversation.objects.count() == 4


def test_a_shorter_period_reaches_more(conversations: dict[str, Conversation]) -> None:
    purge("--older-than", "1", "--execute")
    assert set(Conversation.objects.values_list("pk", flat=True)) == {
        conversations[name].pk for name in ("late_reply", "running", "late_message")
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--older-than", "0"], "at least 1"),
        (["--older-than", "-7"], "at least 1"),
        (["--older-than", "soon"], "invalid int value"),
        ([], "required"),
        (["--older-than", "30", "--batch-size", "0"], "--batch-size"),
    ],
    ids=["zero", "negative", "not-a-number", "missing", "zero-batch"],
)
def test_bad_arguments_are_refused(conversations: dict[str, Conversation], args: list[str],
                                   message: str) -> None:
    with pytest.raises(CommandError, match=message):
        purge(*args, "--execute")
    assert Conversation.objects.count() == 5
