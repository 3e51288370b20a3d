"""What goes to the browser: the server-sent events of ``generation-stream``, whose names are
part of the public contract (README.md, "Public contract").

``delta`` carries HTML-escaped reply text, ``error`` an HTML notice, ``done`` the final message
HTML; ``: ping`` comments keep idle proxies from closing the connection. A newline in the text
becomes a new ``data:`` line, so model output can never start a field or an event of its own.
"""

from __future__ import annotations

from django.utils.html import escape

HEADERS = {
    "Cache-Control": "no-store",
    # nginx: pass each event on at once instead of buffering the response.
    "X-Accel-Buffering": "no",
    # GZipMiddleware (and similar) skip a response that already has an encoding.
    "Content-Encoding": "identity",
}
CONTENT_TYPE = "text/event-stream; charset=utf-8"
PING = b": ping\n\n"


def event(name: str, data: str) -> str:
    """One event; ``data`` may hold any text (CR, LF and CRLF each start a new data line)."""
    if "\r" in data:
        data = data.replace("\r\n", "\n").replace("\r", "\n")
    return f"event: {name}\ndata: " + data.replace("\n", "\ndata: ") + "\n\n"


def deltas(pieces: list[str]) -> bytes:
    """One ``delta`` event carrying ``pieces`` (batched: what arrived since the last send)."""
    return event("delta", escape("".join(pieces))).encode()


def error(html: str) -> bytes:
    return event("error", html).encode()


def done(html: str) -> bytes:
    return event("done", html).encode()
