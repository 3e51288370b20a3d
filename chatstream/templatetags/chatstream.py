from __future__ import annotations

from django import template
from django.utils.safestring import SafeString

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
