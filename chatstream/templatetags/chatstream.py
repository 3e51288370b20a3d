from __future__ import annotations

from datetime import datetime, timedelta

from django import template
from django.utils import timezone
from django.utils.safestring import SafeString
from django.utils.timesince import timesince
from django.utils.translation import gettext as _

from ..models import Generation
from ..notices import describe
from ..rendering import render_markdown

register = template.Library()


@register.filter
def chatstream_markdown(text: str) -> SafeString:
    """Untrusted Markdown as sanitised HTML."""
    return render_markdown(text or "")


@register.simple_tag
def generation_label(generation: Generation) -> str:
    """One plain sentence saying how a reply ended."""
    return describe(generation.status, error_type=generation.error_type,
                    http_status=generation.http_status, has_content=bool(generation.content))


@register.filter
def chatstream_ago(value: datetime | None) -> str:
    """How long ago ``value`` was, in one unit: "just now", "5 minutes ago", "3 days ago"."""
    if value is None:
        return ""
    if timezone.now() - value < timedelta(minutes=1):
        return _("just now")
    return _("%(time)s ago") % {"time": timesince(value, depth=1)}
