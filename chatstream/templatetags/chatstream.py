from __future__ import annotations

from datetime import datetime, timedelta

from django import template
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.timesince import timesince
from django.utils.translation import gettext as _

from .. import stream
from ..conf import conf
from ..models import Generation
from ..notices import describe
from ..rendering import render_markdown

register = template.Library()


@register.filter
def chatstream_markdown(text: str) -> SafeString:
    """Untrusted Markdown as sanitised HTML."""
    return render_markdown(text or "")


@register.simple_tag(takes_context=True)
def generation_stream_url(context: template.Context, generation: Generation) -> str:
    """``generation``'s stream URL; for a reply not started yet, with a ticket for the page's
    session (a signed proof of the user that lets the start skip the session lookup)."""
    url = reverse("chatstream:generation-stream", args=[generation.pk])
    if generation.status != Generation.Status.PENDING:
        return url  # a ticket only ever starts a reply
    session = getattr(getattr(context, "request", None), "session", None)
    session_key = session.session_key if session is not None else None
    if not session_key:
        return url
    ticket = stream.issue_ticket(generation.pk, generation.user_id, session_key)
    return f"{url}?{urlencode({stream.TICKET_PARAMETER: ticket})}"


@register.simple_tag
def stream_silence() -> str:
    """Seconds after which a page that heard nothing on a live stream connects again: the
    server sends an event at least every ``CHATSTREAM_PING_INTERVAL`` seconds."""
    return f"{conf.PING_INTERVAL * 1.5 + 2:g}"


@register.simple_tag
def generation_label(generation: Generation) -> str:
    """One plain sentence saying how a reply ended."""
    return describe(generation.status, error_type=generation.error_type,
                    http_status=generation.http_status, has_content=bool(generation.content),
                    reason=generation.reason)


@register.filter
def chatstream_ago(value: datetime | None) -> str:
    """How long ago ``value`` was, in one unit: "just now", "5 minutes ago", "3 days ago"."""
    if value is None:
        return ""
    if timezone.now() - value < timedelta(minutes=1):
        return _("just now")
    return _("%(time)s ago") % {"time": timesince(value, depth=1)}
