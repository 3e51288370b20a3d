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
Code blocks are highlighted by Pygments when their fence names a language of
``highlighting.HIGHLIGHTED_LEXERS`` (never guessed): token classes only, no style attributes,
and through the same sanitiser. Highlighting costs time linear in the code whatever its
language and text (highlighting.py says how): the worst code found costs about 20 times what
ordinary Python code of its length does, some 50 µs per character on a shared 2-core machine
(bench/README.md, "Highlighting"); code longer than HIGHLIGHT_LIMIT is shown plain.

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
from markdown_it.common.utils import unescapeAll
from markdown_it.token import Token
from pygments.formatters import HtmlFormatter
from pygments.token import STANDARD_TYPES

from ..conf import conf
from .highlighting import highlighted, lexer_named

if TYPE_CHECKING:
    from ..models import Generation

TAGS = {
    "p", "br", "hr", "strong", "em", "s", "del", "code", "pre", "blockquote", "ul", "ol", "li",
    "h3", "h4", "h5", "h6", "a", "table", "thead", "tbody", "tr", "th", "td", "img", "span",
    "div",
}
ATTRIBUTES = {
    "a": {"href", "title"},
    "img": {"src", "alt", "title"},
    "code": {"class"},
    "th": {"class"},
    "td": {"class"},
    "ol": {"start"},
    "span": {"class"},
    "div": {"class"},
}
SET_ATTRIBUTES = {
    "a": {"target": "_blank"},
    "img": {"referrerpolicy": "no-referrer", "loading": "lazy"},
}
HEADING_SHIFT = 2
_LANGUAGE = re.compile(r"language-[A-Za-z0-9_+#.-]{1,40}")
# A table column's alignment, as a class: a style attribute would break a strict
# Content-Security-Policy (style-src without 'unsafe-inline').
_ALIGN = {f"text-align:{side}": f"cs-align-{side}" for side in ("left", "right", "center")}
# The classes Pygments gives highlighted tokens ("k" for a keyword, "s2" for a double-quoted
# string...): a highlighted span keeps only these, and chatstream.css colours them
# (scripts/pygments_css.py writes those rules).
TOKEN_CLASSES = frozenset(name for name in STANDARD_TYPES.values() if name)
_SPAN_CLASSES = TOKEN_CLASSES | {"cs-image-alt", "cs-code-lang"}
# Longer code is shown as it is: highlighting time grows with it (linearly: highlighting.py).
HIGHLIGHT_LIMIT = 20_000


@cache
def _markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"])
    md.add_render_rule("image", _render_image)
    md.add_render_rule("fence", _render_fence)
    md.add_render_rule("code_block", _render_code_block)
    md.core.ruler.push("chatstream_headings", _shift_headings)
    md.core.ruler.push("chatstream_alignment", _alignment_as_class)
    md.core.ruler.push("chatstream_links", _links_outside_the_allow_list_as_text)
    return md


def _shift_headings(state: Any) -> None:
    for token in state.tokens:
        if token.type in ("heading_open", "heading_close"):
            token.tag = f"h{min(int(token.tag[1]) + HEADING_SHIFT, 6)}"


def _alignment_as_class(state: Any) -> None:
    for token in state.tokens:
        if token.type in ("th_open", "td_open") and token.attrs.get("style"):
            align = _ALIGN.get(str(token.attrs.pop("style")))
            if align:
                token.attrSet("class", align)


def _render_image(self: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
    token = tokens[idx]
    src = token.attrGet("src") or ""
    alt = self.renderInlineAsText(token.children or [], options, env)
    if _allowed_image(src):
        return f'<img src="{escape(src)}" alt="{escape(alt)}">'
    return f'<span class="cs-image-alt">{escape(alt or "[image]")}</span>'


def _render_fence(self: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
    token = tokens[idx]
    info = unescapeAll(token.info).strip()
    return _code(token.content, info.split(maxsplit=1)[0] if info else "")


def _render_code_block(self: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
    return _code(tokens[idx].content, "")


def _code(code: str, language: str) -> str:
    """A code block: its language's label (a fence's first word, when plain) above the code,
    highlighted when a listed lexer has that name. The page adds the Copy button."""
    if not _LANGUAGE.fullmatch(f"language-{language}"):
        language = ""
    lexer = lexer_named(language.lower()) if language else None
    body: str = escape(code)
    if lexer is not None and len(code) <= HIGHLIGHT_LIMIT:
        try:
            body = highlighted(code, lexer, _formatter())
        except Exception:  # a lexer's bug on odd text must not cost the reader the reply
            pass
    if not language:
        return f'<div class="cs-code"><pre><code>{body}</code></pre></div>\n'
    language = escape(language)
    return (f'<div class="cs-code"><span class="cs-code-lang">{language}</span>'
            f'<pre><code class="language-{language}">{body}</code></pre></div>\n')


@cache
def _formatter() -> HtmlFormatter:
    # Classes only (never style attributes: the page's Content-Security-Policy forbids them),
    # and no wrapping element: _code() writes its own.
    return HtmlFormatter(nowrap=True)


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
    if tag in ("th", "td") and attr == "class":
        return value if value in _ALIGN.values() else None
    if tag == "span" and attr == "class":
        return " ".join(name for name in value.split() if name in _SPAN_CLASSES) or None
    if tag == "div" and attr == "class":
        return value if value == "cs-code" else None
    if tag == "code" and attr == "class":
        return value if _LANGUAGE.fullmatch(value) else None
    if tag == "img" and attr == "src":
        return value if _allowed_image(value) else None
    if tag == "a" and attr == "href":
        return value if _allowed_link(value) else None
    return value


def render_markdown(text: str, *, references: dict[str, Any] | None = None) -> SafeString:
    """``text`` (untrusted Markdown) as sanitised HTML.

    ``references``: link reference definitions from earlier text (markdown-it's
    ``env["references"]``), which ``text`` may use; those ``text`` defines are added to it.
    """
    html = _markdown().render(text, {} if references is None else {"references": references})
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
    """The final message HTML of ``generation`` (or, live, the element that streams it),
    rendered for ``request`` (its language, and its CSRF token for the message's forms)."""
    return render_to_string("chatstream/includes/generation.html",
                            {"generation": generation, "final": not generation.is_live},
                            request=request).strip()


def render_tool_call(call: Any) -> str:
    """One tool call's card."""
    return render_to_string("chatstream/includes/tool_call.html", {"call": call}).strip()
