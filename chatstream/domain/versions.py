"""Versions of a user message.

A message sent by editing an earlier one points at the version it replaces
(``Message.edit_of``); the versions of one exchange are that chain, oldest first, and its
current version is the one nothing edits. Only the conversation's last current user message may
be edited, so a conversation holds at most as many edits as the messages it may hold (its
``CHATSTREAM_MAX_CONVERSATION_MESSAGES`` counts every version), and all of its chains are read
in one query of two columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q
from django.utils.translation import gettext as _

from ..models import Generation, Message

# A message no later version replaces: the version an exchange shows and sends upstream.
CURRENT = Q(edits__isnull=True)


@dataclass
class Versions:
    """The edits of one conversation: which version each replaces, and the other way round."""

    replaces: dict[int, int]
    replaced_by: dict[int, int] = field(init=False)

    def __post_init__(self) -> None:
        self.replaced_by = {old: new for new, old in self.replaces.items()}

    @classmethod
    def of(cls, conversation_id: Any) -> Versions:
        """The conversation's edits (one query)."""
        return cls(dict(Message.objects.filter(conversation_id=conversation_id,
                                               edit_of__isnull=False)
                        .values_list("pk", "edit_of_id")))

    def chain(self, pk: int) -> list[int]:
        """The versions of the exchange ``pk`` belongs to, oldest first."""
        # An edit is always newer than the version it replaces (a larger pk): each walk ends.
        first = pk
        while (older := self.replaces.get(first, first)) < first:
            first = older
        versions = [first]
        while (newer := self.replaced_by.get(versions[-1], 0)) > versions[-1]:
            versions.append(newer)
        return versions


def last_current(conversation_id: Any) -> int | None:
    """The pk of the conversation's last current user message: the one that may be edited."""
    return (Message.objects.filter(CURRENT, conversation_id=conversation_id,
                                   role=Message.Role.USER)
            .order_by("-created_at", "-id").values_list("pk", flat=True).first())


def refusal(message: Message) -> str | None:
    """Why ``message`` may not be edited now, in one sentence; None when it may."""
    if message.role != Message.Role.USER or last_current(message.conversation_id) != message.pk:
        return _("Only your last message can be edited.")
    if Generation.objects.filter(prompt_message=message, status__in=Generation.LIVE).exists():
        return _("Wait for the reply to end, or stop it, before editing your message.")
    return None
