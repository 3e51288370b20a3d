"""Every database read and write of a generation's life, as plain sync functions.

The streaming path calls them through :func:`in_pool`: on the shared executor, so an open
stream pins no thread and no connection between writes. Connections there follow
``CONN_MAX_AGE`` as a request's would: closed after each call when it is 0, kept (and
health-checked) when persistent or pooled.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar
from uuid import UUID

from asgiref.sync import sync_to_async
from django.db import close_old_connections, transaction
from django.utils import timezone

from .models import Conversation, Generation, Message

Status = Generation.Status
T = TypeVar("T")

WORKER = f"{socket.gethostname()}:{os.getpid()}"[:100]


def in_pool(func: Callable[..., T]) -> Callable[..., Any]:
    """``func`` as a coroutine function run on the shared executor."""

    def call(*args: Any, **kwargs: Any) -> T:
        close_old_connections()
        try:
            return func(*args, **kwargs)
        finally:
            close_old_connections()

    return sync_to_async(call, thread_sensitive=False)


@dataclass
class Claim:
    """A generation this process now streams, with the messages to send upstream."""

    generation: Generation
    messages: list[dict[str, str]]


def claim(generation_id: UUID, user_id: Any) -> Claim | None:
    """Atomically move the user's pending generation to streaming; None if it wasn't ours to take.

    One conditional UPDATE decides: of any number of concurrent callers, exactly one wins.
    """
    now = timezone.now()
    won = Generation.objects.filter(
        pk=generation_id, user_id=user_id, status=Status.PENDING, cancel_requested=False
    ).update(status=Status.STREAMING, started_at=now, heartbeat_at=now, worker=WORKER)
    if not won:
        return None
    generation = load(generation_id)
    return Claim(generation, history(generation))


def load(generation_id: UUID) -> Generation:
    return Generation.objects.select_related("conversation", "prompt_message").get(
        pk=generation_id
    )


def watched_since(generation_id: UUID, seconds: float) -> bool:
    """Whether a page has shown this live generation within the last ``seconds``."""
    return Generation.objects.filter(
        pk=generation_id, watched_at__gte=timezone.now() - timedelta(seconds=seconds)
    ).exists()


def unwatched(generation_ids: Iterable[UUID], seconds: float) -> set[UUID]:
    """Which of ``generation_ids`` no page has shown within the last ``seconds``."""
    ids = set(generation_ids)
    watched = Generation.objects.filter(
        pk__in=list(ids), watched_at__gte=timezone.now() - timedelta(seconds=seconds)
    ).values_list("pk", flat=True)
    return ids - set(watched)


def mark_watched(**lookup: Any) -> list[UUID]:
    """Note that a page now shows the streaming generations matching ``lookup``; their ids."""
    rows = Generation.objects.filter(status=Status.STREAMING, **lookup)
    ids = list(rows.values_list("pk", flat=True))
    if ids:
        Generation.objects.filter(pk__in=ids).update(watched_at=timezone.now())
    return ids


def follow(generation_id: UUID) -> Generation:
    """Load a generation for a page following it, noting that the page still watches."""
    mark_watched(pk=generation_id)
    return load(generation_id)


def history(generation: Generation) -> list[dict[str, str]]:
    """The messages sent upstream for ``generation``: stored text only, never request input.

    Each earlier question is followed by the latest reply that produced text; replies to the
    question being answered now (earlier attempts) are left out.
    """
    from .conf import conf

    prompt = generation.prompt_message
    messages: list[dict[str, str]] = []
    if conf.SYSTEM_PROMPT:
        messages.append({"role": "system", "content": conf.SYSTEM_PROMPT})
    stored = list(
        Message.objects.filter(conversation_id=generation.conversation_id,
                               created_at__lte=prompt.created_at)
        .select_related("generation")
        .order_by("created_at", "id")
    )
    replies: dict[int, Message] = {}
    for message in stored:
        if message.role == Message.Role.ASSISTANT and message.generation is not None:
            replies[message.generation.prompt_message_id] = message
    for message in stored:
        if message.role == Message.Role.USER and message.pk <= prompt.pk:
            messages.append({"role": "user", "content": message.content})
            reply = replies.get(message.pk)
            if reply is not None and message.pk != prompt.pk:
                messages.append({"role": "assistant", "content": reply.content})
    return messages


def stop_requested(generation_ids: Iterable[UUID]) -> set[UUID]:
    """Which of ``generation_ids`` carry the durable Stop flag."""
    return set(Generation.objects.filter(pk__in=list(generation_ids), cancel_requested=True)
               .values_list("pk", flat=True))


def checkpoint(rows: dict[UUID, dict[str, Any]]) -> set[UUID]:
    """Save partial text and heartbeats in one transaction; return the rows no longer ours.

    A row stops being ours when a Stop was requested or the sweeper closed it: the conditional
    UPDATE then matches nothing, and the caller stops that stream.
    """
    lost = set()
    with transaction.atomic():
        for generation_id, fields in rows.items():
            if not Generation.objects.filter(
                pk=generation_id, status=Status.STREAMING, cancel_requested=False
            ).update(**fields):
                lost.add(generation_id)
    return lost


def finish(generation: Generation, fields: dict[str, Any]) -> Generation:
    """Store a generation's outcome, its reply message and its quota settlement, at once."""
    from . import quota

    with transaction.atomic():
        Generation.objects.filter(pk=generation.pk).update(**fields)
        for name, value in fields.items():
            setattr(generation, name, value)
        if fields.get("content"):
            Message.objects.update_or_create(
                generation=generation,
                defaults={"conversation_id": generation.conversation_id,
                          "role": Message.Role.ASSISTANT, "content": fields["content"]},
            )
        Conversation.objects.filter(pk=generation.conversation_id).update(
            updated_at=timezone.now())
        quota.settle(generation)
    return generation


def request_stop(generation_id: UUID) -> None:
    """Write the durable Stop flag; a generation nobody streams yet is cancelled on the spot."""
    from . import quota

    with transaction.atomic():
        cancelled = Generation.objects.filter(pk=generation_id, status=Status.PENDING).update(
            status=Status.CANCELLED, reason="stopped by user", error_type="stopped_by_user",
            cancel_requested=True, completed_at=timezone.now(),
            usage_source=Generation.UsageSource.NONE,
        )
        if cancelled:
            quota.settle(Generation.objects.get(pk=generation_id))
        else:
            Generation.objects.filter(pk=generation_id, status=Status.STREAMING).update(
                cancel_requested=True)
