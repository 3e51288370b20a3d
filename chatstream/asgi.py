"""Streams served in front of Django: the stream URL without the request cycle.

    # asgi.py
    from django.core.asgi import get_asgi_application
    from chatstream.asgi import with_fast_streams

    application = with_fast_streams(get_asgi_application())

A ``GET`` of ``generation-stream`` that carries a valid stream ticket (a signed,
short-lived ``?ticket=`` the page puts in the stream URL of a reply not started yet) starts
that reply here, with the same stream engine as the view, without what a stream does not
need: no middleware, no session or user lookup, no thread kept per request. That is what lets
one worker carry as many streams as a bare proxy (see bench/README.md). Everything else goes to
Django unchanged: a request without a valid ticket, one that resumes (``Last-Event-ID`` or
``?after=``), and one whose reply is not the ticket's to start (already started, or its user
made inactive); see stream/_tickets.py for what a ticket allows.

A fast stream still checks the Host header against ``ALLOWED_HOSTS``, carries the headers the
site's ``SecurityMiddleware`` and ``XFrameOptionsMiddleware`` add to every response, honours
``FORCE_SCRIPT_NAME`` / the server's root path, renders the final message in the language
``LocaleMiddleware`` would pick and with the page's CSRF cookie (so its Retry form posts). What it
skips is the rest of Django's request cycle: the site's other middleware does not see these
requests (the page that minted the ticket, seconds before, went through all of it), and
``request_started`` / ``request_finished`` are not sent. A site that needs either for its
streams simply does not wrap its application: the view serves the same stream.
"""

from __future__ import annotations

import asyncio
import functools
import io
import logging
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, MutableMapping
from functools import partial
from typing import Any
from urllib.parse import parse_qsl
from uuid import UUID

from django.conf import settings
from django.core.exceptions import DisallowedHost

# Django's request made from an ASGI scope, as its ASGIHandler makes it (META, path_info under
# the root path, cookies, get_host(), is_secure()): undocumented, and no public API builds a
# request from a scope (tests/test_django_internals.py holds what is read from it).
from django.core.handlers.asgi import ASGIRequest

# Documented as django.test.signals.setting_changed, the same object: importing it from there
# would import django.test (its client, its test cases) into every server process.
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.urls import (
    NoReverseMatch,
    Resolver404,
    get_resolver,
    get_script_prefix,
    resolve,
    reverse,
    set_script_prefix,
)
from django.utils import translation
from django.utils.module_loading import import_string
from django.views.decorators.csrf import requires_csrf_token

logger = logging.getLogger("chatstream.asgi")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]

_LOCALE_MIDDLEWARE = "django.middleware.locale.LocaleMiddleware"
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# The stream path of the current URLconf's resolver, split around the generation id.
_stream_path: dict[object, tuple[str, str]] = {}


def with_fast_streams(app: ASGIApp) -> ASGIApp:
    """``app`` (Django's ASGI application) with ticketed stream requests served in front of it.

    Call it with Django set up (``get_asgi_application()`` has run): this module itself
    imports nothing that needs the app registry, so it can be imported first.
    """
    from .stream import TICKET_PARAMETER

    mark = f"{TICKET_PARAMETER}=".encode()

    async def application(scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["method"] == "GET"
                and mark in scope.get("query_string", b"")):
            found = _ticketed_stream(scope)
            if found is not None and await _serve(scope, *found, receive, send):
                return
        await app(scope, receive, send)

    return application


def _ticketed_stream(scope: Scope) -> tuple[UUID, str, str | None, bool] | None:
    """The generation, user and language of a stream request with a valid ticket, and whether
    it came over HTTPS (as Django sees it); else None."""
    from .stream import ticket_user_id

    if settings.CSRF_USE_SESSIONS:  # the final message's forms would need the session
        return None
    request = ASGIRequest(scope, io.BytesIO())
    if "HTTP_LAST_EVENT_ID" in request.META or b"after=" in scope["query_string"]:
        return None  # a client resuming: the view sends it the rest of a reply started already
    pk = _stream_pk(request.path_info)
    if pk is None:
        return None
    user_id = ticket_user_id(pk, _ticket(scope["query_string"]),
                             request.COOKIES.get(settings.SESSION_COOKIE_NAME))
    if user_id is None:
        return None
    try:
        request.get_host()
    except DisallowedHost:
        return None  # Django answers it (400) and logs it as it does for any request
    language = None
    if _LOCALE_MIDDLEWARE in settings.MIDDLEWARE:
        language = translation.get_language_from_request(request)
    return pk, user_id, language, request.is_secure()


def _stream_pk(path_info: str) -> UUID | None:
    """The generation id if ``path_info`` is ``generation-stream``'s path, else None.

    The path's shape is worked out once per URLconf: ``resolve()`` would walk the site's
    patterns for every stream started.
    """
    # get_resolver() (undocumented) is the URLconf's cached resolver, a new object whenever
    # Django's URL caches are cleared (a ROOT_URLCONF override, a site reloading its URLconf):
    # no public API tells that the URLconf changed.
    resolver = get_resolver()
    if _stream_path.get(resolver) is None:
        _stream_path.clear()
        _stream_path[resolver] = _split_stream_path()
    head, tail = _stream_path[resolver]
    if (len(path_info) != len(head) + 36 + len(tail) or not path_info.startswith(head)
            or not path_info.endswith(tail)):
        return None
    middle = path_info[len(head):len(head) + 36]
    return UUID(middle) if _UUID.fullmatch(middle) else None


def _split_stream_path() -> tuple[str, str]:
    """The stream path around its generation id, as (head, tail); ("", "") if there is none,
    or if the site maps that path to another view (then Django serves every stream). Under
    ``i18n_patterns`` it is the path of the language active when worked out; streams under
    another language's prefix are served by Django."""
    from .web.views import generation_stream

    sample = str(UUID(int=0))
    try:
        url = reverse("chatstream:generation-stream", args=[sample])
    except NoReverseMatch:
        return "", ""
    path = "/" + url[len(get_script_prefix()):]
    try:
        if resolve(path).func is not generation_stream:
            return "", ""
    except Resolver404:
        return "", ""
    head, _, tail = path.partition(sample)
    return head, tail


def _ticket(query_string: bytes) -> str | None:
    from .stream import TICKET_PARAMETER

    found = None
    for name, value in parse_qsl(query_string.decode("latin-1")):
        if name == TICKET_PARAMETER:
            found = value  # the last one, as request.GET.get() would pick
    return found


async def _serve(scope: Scope, pk: UUID, user_id: str, language: str | None, secure: bool,
                 receive: Receive, send: Send) -> bool:
    """Start the ticket's reply and stream it; False (nothing sent) when it is not the
    ticket's to start: not pending any more, or its user inactive. Django then answers."""
    from . import stream
    from .web import rendering
    from .web.wire import PageWire

    stream.maybe_sweep_soon()
    # The request is made again from the scope for the final render: an open stream keeps
    # no parsed headers, cookies or META around.
    render_final = partial(_render_final, rendering.render_final, scope)
    body = await stream.astart(pk, user_id, PageWire(render_final), start=True)
    if body is None:
        return False
    set_script_prefix(_script_prefix(scope))
    if language:
        translation.activate(language)
    await _stream(body, receive, send, _headers(secure))
    return True


def _script_prefix(scope: Scope) -> str:
    """The script prefix Django's ASGIHandler sets for a request of ``scope`` (reverse()'s
    URLs start with it). Django sets it with set_script_prefix() (undocumented) in its request
    cycle, which these requests skip; no public API sets it."""
    return settings.FORCE_SCRIPT_NAME or scope.get("root_path", "") or "/"


def _render_final(render: Callable[[ASGIRequest, Any], str], scope: Scope,
                  generation: Any) -> str:
    request = ASGIRequest(scope, io.BytesIO())
    final: list[str] = []
    _with_csrf_cookie(request, render, generation, final)
    return final[0]


@requires_csrf_token
def _with_csrf_cookie(request: HttpRequest, render: Callable[[ASGIRequest, Any], str],
                      generation: Any, final: list[str]) -> HttpResponse:
    """Render the final message as a view that needs {% csrf_token %}: the page's CSRF cookie
    is read first, so the final message's token matches it."""
    final.append(render(request, generation))  # type: ignore[arg-type]
    return HttpResponse()


async def _stream(body: AsyncGenerator[bytes, None], receive: Receive, send: Send,
                  headers: list[tuple[bytes, bytes]]) -> None:
    """Send ``body`` as the response; stop it the moment the client disconnects."""
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    sending = asyncio.ensure_future(_send_all(body, send))
    watching = asyncio.ensure_future(_disconnect(receive))
    try:
        await asyncio.wait((sending, watching), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sending, watching):
            task.cancel()
        # The body's own finally (the run's shielded wind-down) runs to its end here.
        await asyncio.gather(sending, watching, return_exceptions=True)


# The middleware whose headers a response of the site carries whatever its view: a fast stream
# gets them too, from the same code, when the site uses them.
_HEADER_MIDDLEWARE = (
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
)


@functools.cache
def _headers(secure: bool) -> list[tuple[bytes, bytes]]:
    """The stream's headers, and those the site's SecurityMiddleware (``nosniff``, HSTS over
    HTTPS, the referrer and cross-origin opener policies) and XFrameOptionsMiddleware add to
    a response to a request made over HTTPS (``secure``) or not. Worked out once each (the
    settings they read are cleared from the cache when they change, as in tests)."""
    from .stream import CONTENT_TYPE, HEADERS

    response = HttpResponse(content_type=CONTENT_TYPE, headers=HEADERS)
    request = HttpRequest()
    request.is_secure = lambda: secure  # type: ignore[method-assign]
    for path in _HEADER_MIDDLEWARE:
        if path in settings.MIDDLEWARE:
            # process_response() (undocumented: the documented interface is calling the
            # middleware, which also runs process_request(), the SECURE_SSL_REDIRECT redirect):
            # only the half that adds headers to a response is wanted.
            import_string(path)(_no_view).process_response(request, response)
    return [(name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in response.items()]


@receiver(setting_changed)
def _settings_changed(**kwargs: Any) -> None:
    _headers.cache_clear()


def _no_view(request: Any) -> Any:
    raise AssertionError("only the middleware's process_response is used")


async def _send_all(body: AsyncGenerator[bytes, None], send: Send) -> None:
    try:
        async for chunk in body:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except OSError:  # the client went away during a send (uvicorn's ClientDisconnected)
        pass
    except Exception:  # the run saves every outcome itself; this is a bug to report
        logger.exception("Stream response failed")
    finally:
        # Also when cancelled in a send that never returned: the body winds down (and saves).
        await body.aclose()


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
