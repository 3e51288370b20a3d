"""Model output to safe HTML: Markdown rendered on the server, then sanitised with an allow-list.

Model output is untrusted text. Raw HTML in it is never rendered (markdown-it ``html=False``),
and nh3 then removes anything outside the allow-list: no scripts, no event handlers, no
``javascript:`` or ``data:`` URLs. Images load only from ``CHATSTREAM_ALLOWED_IMAGE_HOSTS``;
any other image becomes its alt text, so a reply cannot leak data through an image URL.
"""

from __future__ import annotations

from functools import cache
from typing import Any
from urllib.parse import urlsplit

import nh3
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt

from .conf import conf

TAGS = {
    "p", "br", "hr", "strong", "em", "del", "code", "pre", "blockquote", "ul", "ol", "li",
    "h1", "h2", "h3", "h4", "h5", "h6", "a", "table", "thead", "tbody", "tr", "th", "td", "img",
    "span",
}
ATTRIBUTES = {
    "a": {"href", "title"},
    "img": {"src", "alt", "title"},
    "code": {"class"},
    "th": {"style"},
    "td": {"style"},
    "ol": {"start"},
    "span": {"class"},
}


@cache
def _markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"])
    md.add_render_rule("image", _render_image)
    return md


def _render_image(self: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
    token = tokens[idx]
    src = token.attrGet("src") or ""
    alt = self.renderInlineAsText(token.children or [], options, env)
    host = (urlsplit(src).hostname or "").lower()
    if src.startswith(("http://", "https://")) and host in {
        h.lower() for h in conf.ALLOWED_IMAGE_HOSTS
    }:
        return f'<img src="{escape(src)}" alt="{escape(alt)}">'
    return f'<span class="cs-image-alt">{escape(alt or "[image]")}</span>'


def _filter_attribute(tag: str, attr: str, value: str) -> str | None:
    if tag in ("th", "td") and attr == "style":
        return value if value in ("text-align:left", "text-align:right",
                                  "text-align:center") else None
    if tag == "span" and attr == "class":
        return value if value == "cs-image-alt" else None
    if tag == "code" and attr == "class":
        return value if value.startswith("language-") and value[9:].isidentifier() else None
    return value


def render_markdown(text: str) -> SafeString:
    """``text`` (untrusted Markdown) as sanitised HTML."""
    html = _markdown().render(text)
    clean = nh3.clean(
        html,
        tags=TAGS,
        attributes=ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel="nofollow noopener noreferrer",
        attribute_filter=_filter_attribute,
        strip_comments=True,
    )
    return mark_safe(clean)  # noqa: S308 - nh3 output with the allow-list above
