"""Who may read what users wrote, and the trail left when someone does.

The text of users' conversations (replies, the messages sent upstream, conversation titles,
tool calls) is shown, searched and exported only to staff holding
``chatstream.view_generation_content``. Everyone else with view permission sees metadata and,
in place of each text, :data:`HIDDEN`. Every page or export that does show text to someone is
logged to ``chatstream.admin`` (who, what, never the text itself).

No model's ``str()`` holds text (a conversation is "Conversation 4f1d2c9e", a message
"Message 12 (user)"): Django's admin names objects with ``str()`` where no permission of ours
is asked, in the autocomplete view, delete confirmation pages and ``LogEntry.object_repr``
(history pages, "Recent actions"). Text is shown only through columns and fields that check
:func:`can_read_content`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.utils.translation import gettext_lazy as _

CONTENT_PERMISSION = "chatstream.view_generation_content"

HIDDEN = _("hidden: you lack the permission to read conversation text")

logger = logging.getLogger("chatstream.admin")


def can_read_content(request: HttpRequest) -> bool:
    """True if the staff member behind ``request`` may read users' conversation text."""
    return request.user.has_perm(CONTENT_PERMISSION)


def audit(request: HttpRequest, action: str, **details: Any) -> None:
    """Record that ``request.user`` read users' text (``action``), with ids, never the text."""
    described = " ".join(f"{key}={value}" for key, value in details.items())
    logger.info("content %s by %r (id %s) %s", action, request.user.get_username(),
                request.user.pk, described)


if TYPE_CHECKING:  # a mixin for ModelAdmin: type-check it as one
    _Base = admin.ModelAdmin[Any]
else:
    _Base = object


class ContentGuard(_Base):
    """For a ModelAdmin of records holding users' text in ``content_fields``: without the
    content permission, a query string cannot filter on them (``?title__icontains=...`` would
    probe the text); with it, each list shown is audited (``audited_as``: its log key)."""

    content_fields: ClassVar[frozenset[str]] = frozenset()
    audited_as: ClassVar[str] = "filters"

    def lookup_allowed(self, lookup: str, value: Any, request: HttpRequest) -> bool:
        if lookup.split("__")[0] in self.content_fields and not can_read_content(request):
            return False
        return super().lookup_allowed(lookup, value, request)

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        response = super().changelist_view(request, extra_context)
        if response.status_code == 200 and can_read_content(request):
            audit(request, "listed", **{self.audited_as: request.GET.urlencode() or "-"})
        return response


def short_id(value: Any) -> str:
    """The first 8 characters of an id: enough to tell records apart on a page."""
    return str(value)[:8]
