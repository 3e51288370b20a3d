"""Model output to safe HTML: Markdown rendered on the server, then sanitised with an allow-list.

Model output is untrusted text. Raw HTML in it is never rendered (markdown-it ``html=False``),
and nh3 then removes anything outside the allow-list: no scripts, no event handlers, no
``javascript:`` or ``data:`` URLs, no relative URLs (a link must say where it goes). Images load
only from ``CHATSTREAM_ALLOWED_IMAGE_HOSTS``, without a referrer; any other image becomes its
alt text, so a reply cannot leak data through an image URL (prompt-injection exfiltration).
Links open in a new tab: following one in the chat's own tab would end a reply still streaming.
With ``CHATSTREAM_ALLOWED_LINK_HOSTS`` set, a link is kept only if it is ``http(s)`` to one of
those hosts (matched as images are); any other becomes its text followed by its URL, as text, so
the reader still sees where it pointed. That includes ``mailto:`` and relative links, which name
no web host; an empty list allows no links at all.
Headings are moved two levels down (``#`` becomes ``<h3>``) so a reply never outranks the
page's own ``<h1>`` and the per-message ``<h2>``.

:func:`render_final` renders a finished generation's whole message, as the stream's ``done``
event carries it (to the chat page, and to fast streams served in front of Django).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from functools import cache
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import nh3
from django.http import HttpRequest
from django.template.loader import render_to_string
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt
from markdown_it.token import Token

from .conf import conf

if TYPE_CHECKING:
    from .models import Generation

TAGS = {
    "p", "br", "hr", "strong", "em", "s", "del", "code", "pre", "blockquote", "ul", "ol", "li",
    "h3", "h4", "h5", "h6", "a", "table", "thead", "tbody", "tr", "th", "td", "img", "span",
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
SET_ATTRIBUTES = {
    "a": {"target": "_blank"},
    "img": {"referrerpolicy": "no-referrer", "loading": "lazy"},
}
HEADING_SHIFT = 2
_LANGUAGE = re.compile(r"language-[A-Za-z0-9_+#.-]{1,40}")
_ALIGN = {"text-align:left", "text-align:right", "text-align:center"}


@cache
def _markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"])
    md.add_render_rule("image", _render_image)
    md.core.ruler.push("chatstream_headings", _shift_headings)
    md.core.ruler.push("chatstream_links", _links_outside_the_allow_list_as_text)
    return md


def _shift_headings(state: Any) -> None:
    for token in state.tokens:
        if token.type in ("heading_open", "heading_close"):
            token.tag = f"h{min(int(token.tag[1]) + HEADING_SHIFT, 6)}"


def _render_image(self: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
    token = tokens[idx]
    src = token.attrGet("src") or ""
    alt = self.renderInlineAsText(token.children or [], options, env)
    if _allowed_image(src):
        return f'<img src="{escape(src)}" alt="{escape(alt)}">'
    return f'<span class="cs-image-alt">{escape(alt or "[image]")}</span>'


def _links_outside_the_allow_list_as_text(state: Any) -> None:
    if conf.ALLOWED_LINK_HOSTS is None:
        return
    for token in state.tokens:
        if token.type == "inline" and token.children:
            token.children = list(_unlink(token.children))


def _unlink(children: list[Token]) -> Iterator[Token]:
    """``children`` (an inline token's), each link to a host not allowed replaced by its text
    and its URL (once, when the text already is the URL: an autolink)."""
    href: str | None = None  # of the link being shown as text
    text = ""
    for child in children:
        if child.type == "link_open":
            target = str(child.attrGet("href") or "")
            if not _allowed_link(target):
                href, text = target, ""
                continue
        elif child.type == "link_close" and href is not None:
            if href and text != href:
                yield Token("text", "", 0, content=f" ({href})")
            href = None
            continue
        elif href is not None and child.type in ("text", "code_inline"):
            text += child.content
        yield child


def _allowed_image(src: str) -> bool:
    return _allowed_host(src, conf.ALLOWED_IMAGE_HOSTS)


def _allowed_link(href: str) -> bool:
    hosts = conf.ALLOWED_LINK_HOSTS
    return hosts is None or _allowed_host(href, hosts)


def _allowed_host(url: str, hosts: Iterable[str]) -> bool:
    """Whether ``url`` is http(s) to one of ``hosts``: exactly, in any case, no subdomain."""
    allowed = {host.lower() for host in hosts}
    if not allowed or not url.lower().startswith(("http://", "https://")):
        return False
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    # A user-info part ("http://allowed@evil/") is parsed differently by some clients.
    return "@" not in parts.netloc and (parts.hostname or "").lower() in allowed


def _filter_attribute(tag: str, attr: str, value: str) -> str | None:
    if tag in ("th", "td") and attr == "style":
        return value if value in _ALIGN else None
    if tag == "span" and attr == "class":
        return value if value == "cs-image-alt" else None
    if tag == "code" and attr == "class":
        return value if _LANGUAGE.fullmatch(value) else None
    if tag == "img" and attr == "src":
        return value if _allowed_image(value) else None
    if tag == "a" and attr == "href":
        return value if _allowed_link(value) else None
    return value


def render_markdown(text: str) -> SafeString:
    """``text`` (untrusted Markdown) as sanitised HTML."""
    html = _markdown().render(text)
    clean = nh3.clean(
        html,
        tags=TAGS,
        attributes=ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        url_relative="deny",
        link_rel="nofollow noopener noreferrer",
        set_tag_attribute_values=SET_ATTRIBUTES,
        attribute_filter=_filter_attribute,
        strip_comments=True,
    )
    return mark_safe(clean)  # safe: nh3's output, with the allow-list above


def render_final(request: HttpRequest, generation: Generation) -> str:
    """The final message HTML of ``generation``, rendered for ``request`` (its language, and its
    CSRF token for the message's Retry form)."""
    return render_to_string("chatstream/includes/generation.html",
                            {"generation": generation, "final": True}, request=request).strip()
