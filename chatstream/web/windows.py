"""Which page of a conversation shows what: the window of exchanges a page holds, and the page
that shows a given exchange. A window counts exchanges by their current version (an edited
message and its earlier versions are one exchange).

Within an exchange, the replies to the version shown are windowed too: a page holds the newest
``REPLIES_PER_PAGE`` of them (or those before one, ``?replies_before=<its id>`` on the version's
own address), so a page holds at most ``CONVERSATION_PAGE_SIZE`` exchanges of at most
``REPLIES_PER_PAGE`` replies, however often a message was retried.
"""

from __future__ import annotations

import uuid

from django.db.models import Q, QuerySet
from django.http import Http404
from django.shortcuts import get_object_or_404
from django.urls import reverse

from ..conf import conf
from ..domain import versions
from ..models import Conversation, Generation, Message

# The replies of one message a page shows: the newest, earlier ones a link away.
REPLIES_PER_PAGE = 10


def earlier_than(record: Message | Generation) -> Q:
    """The rows before ``record`` in its order (created, then id): messages in their
    conversation, replies to their message."""
    return (Q(created_at__lt=record.created_at)
            | Q(created_at=record.created_at, pk__lt=record.pk))


def page_anchor(conversation: Conversation, before: str | None) -> Message | None:
    """The user message a page of earlier exchanges ends before (``?before=<its id>``); a
    value that names none of this conversation's is a 404."""
    if before is None:
        return None
    try:
        pk = int(before)
    except ValueError:
        raise Http404 from None
    if not 0 < pk < 2**63:
        raise Http404
    # With its conversation's id: Django 5.2.0 reads it when it sets the relation's cache.
    return get_object_or_404(conversation.messages.only("pk", "created_at", "conversation"),
                             pk=pk, role=Message.Role.USER)


def newer_page_url(conversation: Conversation, before: Message) -> str:
    """The page after the one ending before ``before``: the exchanges before the one
    ``CONVERSATION_PAGE_SIZE`` later, or the newest ones when there are no more than that."""
    size = conf.CONVERSATION_PAGE_SIZE
    later = (exchanges(conversation).exclude(earlier_than(before)).order_by("created_at", "id")
             .values_list("pk", flat=True)[size:size + 1])
    return next((f"?before={pk}" for pk in later), conversation.get_absolute_url())


def exchanges(conversation: Conversation) -> QuerySet[Message]:
    """The conversation's exchanges, by their current version (what a page window counts)."""
    return conversation.messages.filter(versions.CURRENT, role=Message.Role.USER)


def page_of(conversation: Conversation, message: Message) -> Message | None:
    """The ``before`` anchor of the page showing the exchange whose current version is
    ``message``: None for the newest page, else the exchange just after that page."""
    size = conf.CONVERSATION_PAGE_SIZE
    later = list(exchanges(conversation).exclude(earlier_than(message)).exclude(pk=message.pk)
                 .order_by("created_at", "id").only("pk", "created_at", "conversation")[:size])
    return later[0] if len(later) == size else None


def exchange_url(conversation: Conversation, message: Message) -> str:
    """A page showing the exchange of ``message``: the newest one when it is there, else the
    page that ends with it; for an earlier version, the page showing that version."""
    if message.edits.exists():
        return reverse("chatstream:message-version", args=[message.pk])
    page = page_of(conversation, message)
    query = f"?before={page.pk}" if page is not None else ""
    return f"{conversation.get_absolute_url()}{query}#exchange-{message.pk}"


def newest_replies(replies: QuerySet[Generation], *, before: Generation | None = None
                   ) -> QuerySet[Generation]:
    """The newest ``REPLIES_PER_PAGE`` of ``replies`` (those before ``before``) and one more,
    newest first: what :func:`reply_window` makes a window of. Sliced, it also serves a
    ``Prefetch``, one query for the replies of every message of a page."""
    if before is not None:
        replies = replies.filter(earlier_than(before))
    return replies.order_by("-created_at", "-id")[:REPLIES_PER_PAGE + 1]


def reply_window(newest: list[Generation]) -> tuple[list[Generation], bool]:
    """The window of replies read by :func:`newest_replies`, oldest first, and whether earlier
    ones exist."""
    return newest[:REPLIES_PER_PAGE][::-1], len(newest) > REPLIES_PER_PAGE


def reply_anchor(message: Message, before: str | None) -> Generation | None:
    """The reply of ``message`` a window of its replies ends before (``?replies_before=<its
    id>``); a value that names none of its replies is a 404."""
    if before is None:
        return None
    try:
        pk = uuid.UUID(before)
    except ValueError:
        raise Http404 from None
    return get_object_or_404(Generation.objects.only("pk", "created_at", "prompt_message"),
                             pk=pk, prompt_message=message)


def replies_url(message: Message, before: Generation | None) -> str:
    """The address of ``message``'s version page showing its replies before ``before`` (its
    newest ones for None)."""
    url = reverse("chatstream:message-version", args=[message.pk])
    return url if before is None else f"{url}?replies_before={before.pk}"


def later_replies(message: Message, before: Generation) -> Generation | None:
    """Where the window after the one ending before ``before`` ends: before the reply
    ``REPLIES_PER_PAGE`` later, or (None) with the newest when there are no more than that."""
    later = (message.generations.exclude(earlier_than(before)).order_by("created_at", "id")
             .only("pk")[REPLIES_PER_PAGE:REPLIES_PER_PAGE + 1])
    return next(iter(later), None)
