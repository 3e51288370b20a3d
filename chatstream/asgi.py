"""Streams served in front of Django: the stream URL without the request cycle.

    # asgi.py
    from django.core.asgi import get_asgi_application
    from chatstream.asgi import with_fast_streams

    application = with_fast_streams(get_asgi_application())

A ``GET`` of a reply's stream (the page's ``generation-stream``, the JSON API's
``api-generation-stream``) starts or resumes that reply here, with the same stream engine as the
views, without what a stream does not need: no middleware, and no thread kept per request. That
is what lets one worker carry as many streams as a bare proxy (see bench/README.md). Who asks is
settled first:

- the page's signed, short-lived ``?ticket=`` (see stream/_tickets.py) starts the one reply it
  names, if it is still pending, with no session read at all;
- else the session, as Django's SessionMiddleware and AuthenticationMiddleware would see it
  (the site's ``SESSION_ENGINE`` and authentication backends, the session's hash checked), read
  on the event loop for database sessions on PostgreSQL, else by Django's own code in one trip
  to a thread, with the cookie the middleware would send when it changes the session (see
  web/sessions.py).

Everything else goes to Django unchanged, and so does every refusal: a request nobody is
signed in for (the login redirect, the JSON API's 401), a bad resume point, a generation that is
not the user's, a JSON API request when ``CHATSTREAM_API_AUTHENTICATE`` names the site's own
authenticator, a page stream when ``CSRF_USE_SESSIONS`` is on.

A fast stream still checks the Host header against ``ALLOWED_HOSTS``, carries the headers the
site's ``SecurityMiddleware`` and ``XFrameOptionsMiddleware`` add to every response, honours
``FORCE_SCRIPT_NAME`` / the server's root path, streams in the language ``LocaleMiddleware``
would pick, and renders the final message with the page's CSRF cookie (so its Retry form posts).
What it skips is the rest of Django's request cycle: the site's other middleware does not see
these requests (the page that opened them went through all of it), ``request_started`` /
``request_finished`` are not sent, and ``SESSION_SAVE_EVERY_REQUEST`` does not refresh the
session's expiry for a stream. A site that needs any of these for its streams simply does not
wrap its application: the views serve the same streams (a system check, ``chatstream.W004``,
says what that costs).
"""

from __future__ import annotations

import asyncio
import enum
import functools
import io
import logging
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, MutableMapping
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

from .conf import conf

logger = logging.getLogger("chatstream.asgi")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[..., Awaitable[None]]

_LOCALE_MIDDLEWARE = "django.middleware.locale.LocaleMiddleware"
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# The stream paths of the current URLconf's resolver, each split around the generation id.
_stream_paths: dict[object, dict[Kind, tuple[str, str]]] = {}


class Kind(enum.Enum):
    """Which stream a request asks for."""

    PAGE = "chatstream:generation-stream"  # the page's, whose last event renders HTML
    API = "chatstream:api-generation-stream"  # the JSON API's


def with_fast_streams(app: ASGIApp) -> ASGIApp:
    """``app`` (Django's ASGI application) with stream requests served in front of it.

    Call it with Django set up (``get_asgi_application()`` has run): this module itself
    imports nothing that needs the app registry, so it can be imported first.
    """

    async def application(scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["method"] == "GET"
                and scope["path"].endswith(_stream_tails())):
            request = ASGIRequest(scope, io.BytesIO())
            found = _stream_of(request.path_info)
            if found is not None and await _serve(request, *found, receive, send):
                return
        await app(scope, receive, send)

    application.serves_streams_in_front = True  # type: ignore[attr-defined]  # see checks.py
    return application


def _stream_of(path_info: str) -> tuple[Kind, UUID] | None:
    """The stream ``path_info`` (the path under the script prefix) asks for, and its
    generation id; None for any other path."""
    for kind, (head, tail) in _shapes().items():
        if (len(path_info) == len(head) + 36 + len(tail) and path_info.endswith(tail)
                and path_info.startswith(head)):
            middle = path_info[len(head):len(head) + 36]
            return (kind, UUID(middle)) if _UUID.fullmatch(middle) else None
    return None


def _shapes() -> dict[Kind, tuple[str, str]]:
    """The stream paths, worked out once per URLconf: ``resolve()`` would walk the site's
    patterns for every request, where these cost any other request a string compare."""
    # get_resolver() (undocumented) is the URLconf's cached resolver, a new object whenever
    # Django's URL caches are cleared (a ROOT_URLCONF override, a site reloading its URLconf):
    # no public API tells that the URLconf changed.
    resolver = get_resolver()
    shapes = _stream_paths.get(resolver)
    if shapes is None:
        _stream_paths.clear()
        shapes = _stream_paths[resolver] = _split_stream_paths()
    return shapes


def _stream_tails() -> tuple[str, ...]:
    """How every stream path ends (a request whose path ends otherwise is Django's at once)."""
    return tuple(tail for _head, tail in _shapes().values())


def _split_stream_paths() -> dict[Kind, tuple[str, str]]:
    """Each stream's path around its generation id, as (head, tail); a stream is left out if
    its URL cannot be reversed or the site maps its path to another view (then Django serves
    it). Under ``i18n_patterns`` it is the path of the language active when worked out;
    streams under another language's prefix are served by Django."""
    from .json_api import views as api_views
    from .web import views

    views_of = {Kind.PAGE: views.generation_stream, Kind.API: api_views.generation_stream}
    sample = str(UUID(int=0))
    shapes = {}
    for kind, view in views_of.items():
        try:
            url = reverse(kind.value, args=[sample])
        except NoReverseMatch:
            continue
        path = "/" + url[len(get_script_prefix()):]
        try:
            if resolve(path).func is not view:
                continue
        except Resolver404:
            continue
        head, _, tail = path.partition(sample)
        shapes[kind] = (head, tail)
    return shapes


def _ticket(query_string: bytes) -> str | None:
    from .stream import TICKET_PARAMETER

    found = None
    for name, value in parse_qsl(query_string.decode("latin-1")):
        if name == TICKET_PARAMETER:
            found = value  # the last one, as request.GET.get() would pick
    return found


async def _serve(request: ASGIRequest, kind: Kind, pk: UUID, receive: Receive, send: Send
                 ) -> bool:
    """Stream ``kind`` of generation ``pk`` to ``request``, and True; False, with
    nothing sent, for any request that is not a plain start or resume by its owner (Django then
    answers it, as it answers every refusal: a login redirect, a 400, a 404, a 429)."""
    from . import stream
    from .web import sessions
    from .web.streaming import resume_point

    scope = request.scope
    if not _ours(request, kind):
        return False
    after = resume_point(request)
    if after is None:
        return False
    wire = _wire(kind, scope)
    stream.maybe_sweep_soon()
    body = None
    cookies: list[tuple[bytes, bytes]] = []
    if kind is Kind.PAGE and not after:  # a ticket starts its reply, and nothing else
        ticket_user = stream.ticket_user_id(pk, _ticket(scope["query_string"]),
                                            request.COOKIES.get(settings.SESSION_COOKIE_NAME))
        if ticket_user is not None:
            body = await stream.astart(pk, ticket_user, wire, start=True)
    quota_left: asyncio.Future[list[tuple[bytes, bytes]]] | None = None
    if body is None:
        # Every answer of the JSON API says what its caller has left: read with the session
        # where that takes a thread, else alongside the claim.
        from .json_api import ratelimit

        signed = await sessions.signed_in(
            request, pk, ratelimit.for_stream_here if kind is Kind.API else None)
        user_id, cookies = signed.user_id, signed.headers
        if user_id is None:
            return False
        if kind is Kind.API:
            quota_left = asyncio.ensure_future(
                ratelimit.for_stream(user_id) if signed.also is None else _given(signed.also))
        try:
            body = await stream.aopen(pk, user_id, wire, after=after, start=True,
                                      claimed=signed.claimed)
        except stream.TooManyFollowers:
            return await _refused(kind, 429, cookies, send, quota_left)
        if body is None:
            return await _refused(kind, 404, cookies, send, quota_left)
    set_script_prefix(_script_prefix(scope))
    if _LOCALE_MIDDLEWARE in settings.MIDDLEWARE:
        translation.activate(translation.get_language_from_request(request))
    headers = _headers(request.is_secure()) + cookies
    await _stream(body, receive, send, headers + (await quota_left if quota_left else []))
    return True


async def _given(value: Any) -> Any:
    return value


async def _refused(kind: Kind, status: int, headers: list[tuple[bytes, bytes]], send: Send,
                   quota_left: asyncio.Future[list[tuple[bytes, bytes]]] | None) -> bool:
    """A refusal is Django's to answer (False), unless reading the session changed it on the
    way (Django cycles a session only a fallback key verified, and deletes the old one): its new
    cookie must reach the browser, and Django would see the old one. Then it is answered here,
    as the view answers it, with the cookie (and the quota left, as the view's)."""
    left = await quota_left if quota_left else []
    if not any(name == b"set-cookie" for name, _value in headers):
        return False
    headers = headers + left
    from .json_api.errors import ApiError, not_found
    from .web.streaming import TOO_MANY_PAGES

    busy = {"Retry-After": "5"}
    if kind is Kind.API:
        response: HttpResponse = (not_found() if status == 404 else ApiError(
            429, "too_many_streams", str(TOO_MANY_PAGES), headers=busy)).response()
    elif status == 404:
        response = HttpResponse(status=404)
    else:
        response = HttpResponse(TOO_MANY_PAGES, status=429, headers=busy)
    await send({"type": "http.response.start", "status": response.status_code,
                "headers": [(name.lower().encode("latin-1"), value.encode("latin-1"))
                            for name, value in response.items()] + headers})
    await send({"type": "http.response.body", "body": response.content})
    return True


def _ours(request: ASGIRequest, kind: Kind) -> bool:
    """Whether the front may answer ``request`` at all: its Host is allowed (else Django
    answers 400 and logs it, as for any request), and what answers it needs nothing the front
    leaves out."""
    if kind is Kind.PAGE and settings.CSRF_USE_SESSIONS:  # the final message's forms
        return False
    if kind is Kind.API and conf.API_AUTHENTICATE:  # the site's own credentials
        return False
    try:
        request.get_host()
    except DisallowedHost:
        return False
    return True


def _wire(kind: Kind, scope: Mapping[str, Any]) -> Any:
    from . import stream
    from .json_api import encoding
    from .web import rendering
    from .web.wire import PageWire

    if kind is Kind.API:
        return stream.JsonWire(encoding.generation_text)
    # The request is made again from the scope for the final render: an open stream keeps
    # no parsed headers, cookies or META around.
    return PageWire(partial(_render_final, rendering.render_final, scope))


def _script_prefix(scope: Mapping[str, Any]) -> str:
    """The script prefix Django's ASGIHandler sets for a request of ``scope`` (reverse()'s
    URLs start with it). Django sets it with set_script_prefix() (undocumented) in its request
    cycle, which these requests skip; no public API sets it."""
    return settings.FORCE_SCRIPT_NAME or scope.get("root_path", "") or "/"


def _render_final(render: Callable[[ASGIRequest, Any], str], scope: Mapping[str, Any],
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
