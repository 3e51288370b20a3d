"""Erasure (``chatstream_erase_user``, and deleting the user) and retention
(``CHATSTREAM_RETENTION_DAYS`` applied by ``chatstream_sweep``)."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.apps import apps
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import models
from django.utils import timezone

from chatstream.domain import retention
from chatstream.models import (
    Attempt,
    Conversation,
    Cooldown,
    Feedback,
    Generation,
    GroupQuota,
    Message,
    QuotaAccount,
    QuotaCharge,
    ToolCall,
    UserQuota,
)
from chatstream.stream import sweep

from .history import rich_history, user_in
from .test_checks import chatstream_messages
from .workers import DATABASES

# Every model of chatstream, and how a user's rows of it go.
ERASED = {Conversation: "user", Message: "conversation__user", Generation: "user",
          ToolCall: "generation__user", Attempt: "generation__user", Feedback: "user"}
# Rows with no text: kept by the erasure (the spend ledger and the user's limits stand while
# the user does), gone with the user row.
WITH_THE_USER = {QuotaCharge: "user", QuotaAccount: "user", UserQuota: "user"}
NOT_A_USERS = {GroupQuota, Cooldown}  # a group's limits; a model's circuit breaker

# Foreign keys that are not CASCADE, and why no text is left behind by them.
NOT_CASCADE = {
    # Links inside one conversation, which goes whole.
    (Message, "generation"), (Message, "edit_of"), (Generation, "retry_of"),
    # Who decided: the call is the conversation owner's and goes with it; deleting the
    # decider (another user) keeps the owner's call, and no text of the decider's.
    (ToolCall, "decided_by"),
}


def rows_of(user: Any, using: str, kinds: dict[type[models.Model], str]) -> dict[str, int]:
    return {model.__name__: model.objects.using(using).filter(**{path: user.pk}).count()
            for model, path in kinds.items()}


def test_every_model_is_looked_at_by_the_erasure() -> None:
    """A model added later fails here until it is put in one of the sets above (and, holding
    a user's content, erased)."""
    looked_at = set(ERASED) | set(WITH_THE_USER) | NOT_A_USERS
    assert set(apps.get_app_config("chatstream").get_models()) == looked_at
    for model in apps.get_app_config("chatstream").get_models():
        for field in model._meta.get_fields():
            if not (field.many_to_one or field.one_to_one) or not field.concrete:
                continue
            pointed = field.related_model
            holds = pointed in ERASED or pointed is apps.get_model(settings.AUTH_USER_MODEL)
            if holds and (model, field.name) not in NOT_CASCADE:
                assert field.remote_field.on_delete is models.CASCADE, (model, field.name)


@pytest.mark.django_db(transaction=True, databases=DATABASES)
def test_the_command_erases_every_row_with_the_users_words(database: str) -> None:
    alice, bob = user_in(database), user_in(database, "bob")
    rich_history(alice, database)
    rich_history(alice, database, title="second")
    rich_history(bob, database)
    bobs = rows_of(bob, database, ERASED)
    out = StringIO()
    call_command("chatstream_erase_user", "--username", "alice", "--no-input",
                 "--database", database, stdout=out)
    assert "deleted 2 conversations, 10 messages, 10 generations, 2 tool calls, 4 attempts, " \
        "2 feedback" in out.getvalue()
    assert set(rows_of(alice, database, ERASED).values()) == {0}
    assert rows_of(bob, database, ERASED) == bobs
    # No text left: what stays (until the user row goes) is the ledger and the limits.
    assert rows_of(alice, database, WITH_THE_USER) == {"QuotaCharge": 8, "QuotaAccount": 1,
                                                   "UserQuota": 1}


@pytest.mark.django_db(transaction=True, databases=DATABASES)
def test_deleting_the_user_deletes_all_their_rows(database: str) -> None:
    alice, bob = user_in(database), user_in(database, "bob")
    rich_history(alice, database)
    rich_history(bob, database)
    # Alice decided a call of Bob's: it stays his, without her.
    ToolCall.objects.using(database).filter(generation__user=bob).update(decided_by=alice)
    bobs = rows_of(bob, database, ERASED)
    alice_id = alice.pk
    alice.delete()
    alice.pk = alice_id
    assert set(rows_of(alice, database, ERASED | WITH_THE_USER).values()) == {0}
    assert rows_of(bob, database, ERASED) == bobs


@pytest.mark.django_db
def test_the_erasure_reaches_a_reply_of_theirs_in_another_users_conversation() -> None:
    alice, bob = user_in("default"), user_in("default", "bob")
    conversation = rich_history(bob)
    # A reply written for Alice in Bob's conversation (a site's own code may make one).
    prompt = Message.objects.filter(conversation=conversation, role="user").first()
    stray = Generation.objects.create(conversation=conversation, user=alice,
                                      prompt_message=prompt, model="fast", status="completed",
                                      content="for alice")
    Message.objects.create(conversation=conversation, role="assistant", content="for alice",
                           generation=stray)
    call_command("chatstream_erase_user", "--username", "alice", "--no-input",
                 stdout=StringIO())
    assert not Message.objects.filter(content="for alice").exists()
    assert not Generation.objects.filter(user=alice).exists()
    assert Message.objects.filter(conversation=conversation).count() == 5


@pytest.mark.django_db
def test_the_command_asks_for_the_username(monkeypatch: pytest.MonkeyPatch) -> None:
    alice = user_in("default")
    rich_history(alice)
    monkeypatch.setattr("builtins.input", lambda prompt: "alic")
    with pytest.raises(CommandError, match="Not confirmed"):
        call_command("chatstream_erase_user", "--id", str(alice.pk))
    assert Conversation.objects.filter(user=alice).exists()
    monkeypatch.setattr("builtins.input", lambda prompt: "alice")
    call_command("chatstream_erase_user", "--id", str(alice.pk), stdout=StringIO())
    assert not Conversation.objects.filter(user=alice).exists()
    with pytest.raises(CommandError, match="No user"):
        call_command("chatstream_erase_user", "--username", "nobody", "--no-input")


@pytest.mark.django_db
def test_the_command_without_a_terminal_to_ask_erases_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    alice = user_in("default")
    rich_history(alice)
    monkeypatch.setattr("sys.stdin", StringIO(""))  # cron's, or a pipe's that has ended
    with pytest.raises(CommandError, match="no input to read"):
        call_command("chatstream_erase_user", "--id", str(alice.pk), stdout=StringIO())
    assert Conversation.objects.filter(user=alice).exists()


@pytest.mark.django_db
def test_the_erasure_ends_a_live_reply_first() -> None:
    alice = user_in("default")
    conversation = rich_history(alice)
    prompt = Message.objects.filter(conversation=conversation, role="user").last()
    Generation.objects.create(conversation=conversation, user=alice, prompt_message=prompt,
                              model="fast", status=Generation.Status.PENDING)
    call_command("chatstream_erase_user", "--username", "alice", "--no-input",
                 stdout=StringIO())
    assert not Generation.objects.filter(user=alice).exists()


# --- retention -----------------------------------------------------------------------------

def aged(conversation: Conversation, days: float, using: str = "default") -> None:
    """Everything in ``conversation`` moved ``days`` into the past."""
    delta = timedelta(days=days)
    for model, path in ((Conversation, "pk"), (Message, "conversation"),
                        (Generation, "conversation"), (ToolCall, "generation__conversation"),
                        (Feedback, "generation__conversation")):
        rows = model.objects.using(using).filter(**{path: conversation.pk})
        for row in rows:
            for field in ("created_at", "updated_at", "decided_at", "finished_at"):
                if getattr(row, field, None) is not None:
                    setattr(row, field, getattr(row, field) - delta)
            row.save(using=using)


def kinds_of_age(user: Any, using: str) -> dict[str, Conversation]:
    old = rich_history(user, using, title="old")
    aged(old, 100, using)
    recent = rich_history(user, using, title="recent")
    aged(recent, 5, using)
    live = rich_history(user, using, title="live")
    aged(live, 100, using)
    Generation.objects.using(using).filter(conversation=live, step=2).update(
        status=Generation.Status.STREAMING)
    waiting = rich_history(user, using, title="waiting")
    aged(waiting, 100, using)
    ToolCall.objects.using(using).filter(generation__conversation=waiting).update(
        status=ToolCall.Status.PENDING_APPROVAL)
    rated = rich_history(user, using, title="rated")
    aged(rated, 100, using)
    Feedback.objects.using(using).filter(generation__conversation=rated).update(
        updated_at=timezone.now() - timedelta(days=10))
    return {"old": old, "recent": recent, "live": live, "waiting": waiting, "rated": rated}


def kept(using: str = "default") -> set[str]:
    return set(Conversation.objects.using(using).values_list("title", flat=True))


def swept(*args: str) -> str:
    out = StringIO()
    call_command("chatstream_sweep", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_the_sweep_deletes_what_retention_no_longer_keeps(settings: Any) -> None:
    kinds_of_age(user_in("default"), "default")
    settings.CHATSTREAM_STALE_AFTER = 10**9  # the streaming reply is not the sweep's to end
    settings.CHATSTREAM_APPROVAL_TIMEOUT = 10**9
    settings.CHATSTREAM_RETENTION_DAYS = 30
    dry = swept("--dry-run")
    assert "would delete 1 conversation, 5 messages, 5 generations, 1 tool call, " \
        "2 attempts, 1 feedback" in dry
    assert len(kept()) == 5
    assert "deleted 1 conversation," in swept()
    assert kept() == {"recent", "live", "waiting", "rated"}
    settings.CHATSTREAM_RETENTION_DAYS = 1
    swept()
    assert kept() == {"live", "waiting"}


@pytest.mark.django_db(transaction=True, databases=DATABASES)
def test_retention_selects_and_deletes_in_batches_on_each_database(database: str) -> None:
    kinds_of_age(user_in(database), database)
    stale = retention.stale_conversations(timezone.now() - timedelta(days=30), database)
    assert retention.counts(stale)["conversations"] == 1
    assert retention.delete_conversations(stale, batch_size=1)["generations"] == 5
    assert kept(database) == {"recent", "live", "waiting", "rated"}
    stale = retention.stale_conversations(timezone.now() - timedelta(days=1), database)
    assert retention.delete_conversations(stale, batch_size=1)["conversations"] == 2
    assert kept(database) == {"live", "waiting"}


@pytest.mark.django_db
def test_without_the_setting_or_by_itself_the_sweep_deletes_nothing(settings: Any) -> None:
    kinds_of_age(user_in("default"), "default")
    assert "CHATSTREAM_RETENTION_DAYS is None" in swept("--dry-run")
    swept()
    assert len(kept()) == 5
    settings.CHATSTREAM_RETENTION_DAYS = 1
    sweep()  # the sweep the app runs by itself (CHATSTREAM_SWEEP_INTERVAL)
    assert len(kept()) == 5
    settings.CHATSTREAM_RETENTION_DAYS = 10**6  # further back than any date: "for ever"
    assert "would delete 0 conversations" in swept("--dry-run")
    swept()
    assert len(kept()) == 5


@pytest.mark.django_db
@pytest.mark.parametrize("value", [0, -3, "30", 2.5, True])
def test_a_retention_that_is_not_a_number_of_days_is_refused(value: Any) -> None:
    messages = chatstream_messages(CHATSTREAM_RETENTION_DAYS=value)
    assert [m.id for m in messages if "RETENTION_DAYS" in m.msg] == ["chatstream.E009"]


@pytest.mark.django_db
@pytest.mark.parametrize("value", [None, 1, 3650])
def test_a_retention_of_days_or_none_passes(value: Any) -> None:
    messages = chatstream_messages(CHATSTREAM_RETENTION_DAYS=value)
    assert [m for m in messages if "RETENTION_DAYS" in m.msg] == []
