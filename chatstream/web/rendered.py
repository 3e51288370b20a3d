"""A finished reply's HTML, rendered once and kept on its row; and rendering kept off the loop.

A reply's text is rendered (Markdown, highlighting, the sanitiser: rendering.py) once, at
its final save, and the HTML is stored beside it (``Generation.content_html``) with the
:func:`key` of everything the rendering depends on: the renderer's own code (rendering.py and
highlighting.py), the versions of markdown-it-py, nh3 and Pygments, and the settings it reads
(``CHATSTREAM_ALLOWED_IMAGE_HOSTS``, ``CHATSTREAM_ALLOWED_LINK_HOSTS``). Pages, followers,
resumes and the admin serve the stored HTML (:func:`reply_html`); when the key no longer
matches (a library upgraded, a setting changed), the reply is rendered again on demand, and a
page keeps the new HTML (:func:`keep`).

Rendering costs a few microseconds per character (more in highlighted code), so a long text
rendered on the event loop would hold every stream of the worker: :func:`off_loop` runs
rendering of more than :data:`INLINE_LIMIT` characters in a thread, where the interpreter hands
the loop its turn every few milliseconds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import sync_to_async
from django.db.models import Case, Value, When
from django.utils.safestring import SafeString, mark_safe

from ..conf import conf
from . import highlighting, rendering

if TYPE_CHECKING:
    from ..models import Generation

T = TypeVar("T")

# Up to this many characters are rendered on the event loop: ~1-5 ms at the rates measured in
# bench/bench_blocks.py (prose ~2 µs, highlighted code ~5 µs a character). A thread's hop
# costs ~0.1 ms, more than rendering a short paragraph.
INLINE_LIMIT = 1_000


@cache
def _renderer() -> str:
    """What the renderer is: its code and its libraries' versions (fixed for a process)."""
    try:
        parts = [Path(module.__file__ or "").read_text(encoding="utf-8")
                 for module in (rendering, highlighting)]
    except (OSError, UnicodeDecodeError):  # pragma: no cover - shipped without its source
        parts = [f"chatstream=={version('chatstream')}"]
    for package in ("markdown-it-py", "nh3", "pygments"):
        try:
            parts.append(f"{package}=={version(package)}")
        except PackageNotFoundError:  # pragma: no cover - a vendored copy: its code decides
            parts.append(package)
    return "\n".join(parts)


@cache
def _key(renderer: str, images: tuple[str, ...], links: tuple[str, ...] | None) -> str:
    data = repr((renderer, images, links)).encode()
    return hashlib.sha256(data).hexdigest()[:32]


def key() -> str:
    """The key of what rendering a reply depends on now (see the module docstring)."""
    images = tuple(sorted({host.lower() for host in conf.ALLOWED_IMAGE_HOSTS}))
    links = conf.ALLOWED_LINK_HOSTS
    return _key(_renderer(), images,
                None if links is None else tuple(sorted({host.lower() for host in links})))


def fields(content: str) -> dict[str, str]:
    """The final save's fields that keep ``content`` rendered."""
    return {"content_html": str(rendering.render_markdown(content)) if content else "",
            "content_html_key": key()}


async def afields(content: str) -> dict[str, str]:
    """:func:`fields`, off the event loop when ``content`` is long."""
    return await off_loop(len(content), fields, content)


def cost(generation: Generation) -> int:
    """The characters :func:`reply_html` would render now (none while the kept HTML holds),
    and those of the tool calls its final form shows (their cards escape them)."""
    calls = generation.__dict__.get("shown_calls") or ()
    shown = sum(len(call.arguments) + len(call.result) for call in calls)
    return shown + (0 if generation.content_html_key == key() else len(generation.content))


def reply_html(generation: Generation) -> SafeString:
    """``generation``'s text as sanitised HTML: as kept on its row while its key holds, else
    rendered now (see :func:`keep`)."""
    if generation.content_html_key == key():
        return mark_safe(generation.content_html)  # safe: render_markdown's output, kept
    return rendering.render_markdown(generation.content) if generation.content else mark_safe("")


def keep(generations: Iterable[Generation]) -> None:
    """Render again the finished ones of ``generations`` whose kept HTML was rendered with
    another key, and keep it: one query for all (a page shows many)."""
    current = key()
    stale = [g for g in generations if not g.is_live and g.content_html_key != current]
    for generation in stale:
        generation.content_html = (str(rendering.render_markdown(generation.content))
                                   if generation.content else "")
        generation.content_html_key = current
    if stale:  # one statement (bulk_update would add a transaction around it)
        type(stale[0])._default_manager.db_manager(stale[0]._state.db).filter(
            pk__in=[generation.pk for generation in stale],
        ).update(content_html=Case(*(When(pk=generation.pk, then=Value(generation.content_html))
                                     for generation in stale)),
                 content_html_key=current)


async def off_loop(size: int, func: Callable[..., T], *args: Any) -> T:
    """``func(*args)``, rendering ``size`` characters: here if that is cheap, else in a thread
    (so a long text never holds the event loop)."""
    if size <= INLINE_LIMIT:
        return func(*args)
    result: T = await sync_to_async(func, thread_sensitive=False)(*args)
    return result
