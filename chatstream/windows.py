"""Which page of a conversation shows what: the window of exchanges a page holds, and the page
that shows a given exchange. A window counts exchanges by their current version (an edited
message and its earlier versions are one exchange)."""

from __future__ import annotations

from django.db.models import Q, QuerySet
from django.http import Http404
from django.shortcuts import get_object_or_404
from django.urls import reverse

from . import versions
from .conf import conf
from .models import Conversation, Message


def earlier_than(message: Message) -> Q:
    """The messages before ``message`` in the conversation's order (created, then id)."""
    return (Q(created_at__lt=message.created_at)
            | Q(created_at=message.created_at, pk__lt=message.pk))


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
