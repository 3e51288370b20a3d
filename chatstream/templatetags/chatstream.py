from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from django import template
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.timesince import timesince
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from .. import stream, tools
from ..conf import ModelChoice, conf
from ..domain import access, steps
from ..domain.notices import describe
from ..models import Generation, ToolCall
from ..web import rendered
from ..web.feedback import FeedbackState, state_of
from ..web.rendering import render_markdown

register = template.Library()


@register.filter
def chatstream_markdown(text: str) -> SafeString:
    """Untrusted Markdown as sanitised HTML."""
    return render_markdown(text or "")


@register.simple_tag
def reply_html(generation: Generation) -> SafeString:
    """A finished reply's text as sanitised HTML, as kept from its final save (rendered again
    only when what it was rendered with has changed: see chatstream/web/rendered.py)."""
    return rendered.reply_html(generation)


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
def tool_calls_of(generation: Generation) -> list[Any]:
    """The tool calls ``generation``'s reply asked for, in order (as its stream's round left
    them, or as stored)."""
    shown = generation.__dict__.get("shown_calls")
    if shown is not None:
        return sorted(shown, key=lambda call: call.position)
    return list(generation.calls.all()) if generation.tool_calls else []


@register.simple_tag
def round_under_way(generation: Generation, calls: list[ToolCall]) -> bool:
    """Whether the calls ``generation``'s reply asked for (``calls``, as stored) are still being
    recorded or run, not waiting for the user: a page that shows it then looks again (the
    stream that ran the step tells its own page as they change)."""
    if not steps.leads_on(generation):
        return False
    if any(call.status == ToolCall.Status.PENDING_APPROVAL for call in calls):
        return False  # waiting for the user: their decision's answer shows what follows
    return not calls or any(call.status not in tools.FINAL for call in calls)


@register.simple_tag
def awaits_approval(generation: Generation) -> bool:
    """Whether ``generation`` (a step waiting for its previous step's calls) waits for the
    user's decision on one of them."""
    return generation.follows_id is not None and ToolCall.objects.filter(
        generation_id=generation.follows_id, status=ToolCall.Status.PENDING_APPROVAL).exists()


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


@register.filter
def chatstream_seconds(value: timedelta | None) -> float | None:
    """A duration in seconds, for ``floatformat`` (which formats it in the page's language)."""
    return None if value is None else value.total_seconds()


@register.simple_tag
def model_label(key: str) -> str:
    """What the allow-list calls model ``key`` (its LABEL), or the key once it left the list."""
    choice = conf.get_model(key)
    return choice.label if choice is not None else key


FINISH_REASONS = {
    "stop": gettext_lazy("the model finished"),
    "length": gettext_lazy("the token limit was reached"),
    "content_filter": gettext_lazy("the provider's content filter"),
    "tool_calls": gettext_lazy("the model asked for a tool"),
    "function_call": gettext_lazy("the model asked for a tool"),
}


@register.simple_tag
def finish_reason_label(reason: str) -> str:
    """The provider's finish reason as it said it, with what it means when it is a known one."""
    meaning = FINISH_REASONS.get(reason)
    return f"{reason} ({meaning})" if meaning else reason


@register.simple_tag
def feedback_state(generation: Generation) -> FeedbackState:
    """What ``generation``'s feedback controls show, as read with it (see chatstream.web.feedback);
    never a query of its own."""
    return state_of(generation)


@register.simple_tag(takes_context=True)
def regenerate_models(context: template.Context) -> list[ModelChoice]:
    """The models the page's user may regenerate a reply with; [] when there is no choice.

    Without ``CHATSTREAM_ACCESS`` that is the allow-list, known without a query. With it, the
    user's answer, asked only where a query may run: not in the stream's final message
    (rendered on the event loop), where Regenerate shows from the next page load on.
    """
    if conf.ACCESS is None:
        choices = conf.model_choices()
    elif _on_event_loop():
        return []
    else:
        user = getattr(getattr(context, "request", None), "user", None)
        choices = access.models_for(user) if user is not None else []
    return choices if len(choices) > 1 else []


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@register.simple_tag
def thinking_summary(generation: Generation) -> str:
    """The summary of a reply's thinking: "Thinking…" while nothing else is written, then how
    long it took (until the reply's first text), or "Thinking" when that is unknown."""
    took = generation.time_to_first_token
    if took is not None:
        return _("Thought for %(seconds)s s") % {"seconds": max(1, round(took.total_seconds()))}
    return _("Thinking…") if generation.is_live else _("Thinking")
