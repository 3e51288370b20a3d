"""Who a JSON API request is from: ``CHATSTREAM_API_AUTHENTICATE``'s user, else the session's.

A site's authenticator (``authenticate(request) -> user | None``, sync or async) speaks for
clients that carry their own credentials, a bearer token say: such a request is not made by a
browser on the strength of its cookies, so it needs no CSRF check. Without it (the setting
unset, or its answer None) the session's user is the caller, and an unsafe method must pass
Django's CSRF check as a form post would: the views are ``csrf_exempt`` so that the token
clients can post, and make that check themselves for the session's users (as Django REST
framework's ``SessionAuthentication`` does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from asgiref.sync import async_to_sync, iscoroutinefunction, sync_to_async
from django.http import HttpRequest
from django.middleware.csrf import CsrfViewMiddleware
from django.utils.module_loading import import_string
from django.utils.translation import gettext as _

from ..conf import conf
from .errors import ApiError

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


def authenticate(request: HttpRequest) -> Any:
    """The request's user (from a sync view); ApiError 401 for nobody, 403 for a session
    request that fails the CSRF check."""
    custom = _authenticator()
    if custom is not None:
        found = async_to_sync(custom)(request) if iscoroutinefunction(custom) else custom(
            request)
        if _signed_in(found):
            return _as_request_user(request, found)
    user = request.user
    if not user.is_authenticated:
        raise not_authenticated()
    if request.method not in SAFE_METHODS:
        _raise_for(csrf_refusal(request))
    return user


async def aauthenticate(request: HttpRequest) -> Any:
    """:func:`authenticate` for an async view."""
    custom = _authenticator()
    if custom is not None:
        found = await custom(request) if iscoroutinefunction(custom) else await sync_to_async(
            custom)(request)
        if _signed_in(found):
            return _as_request_user(request, found)
    user = await request.auser()
    if not user.is_authenticated:
        raise not_authenticated()
    if request.method not in SAFE_METHODS:  # the session may be read: not on the event loop
        _raise_for(await sync_to_async(csrf_refusal)(request))
    return user


def not_authenticated() -> ApiError:
    return ApiError(401, "not_authenticated", _("Sign in to use the chat."))


def _authenticator() -> Callable[[HttpRequest], Any] | None:
    path = conf.API_AUTHENTICATE
    return import_string(path) if path else None


def _signed_in(user: Any) -> bool:
    """An answer that names a user who may sign in (an inactive one may not, as with the
    session's backends)."""
    return (user is not None and bool(getattr(user, "is_authenticated", False))
            and getattr(user, "is_active", True))


def _as_request_user(request: HttpRequest, user: Any) -> Any:
    # What request hooks and signal receivers see as the request's user.
    request.user = user

    async def auser() -> Any:
        return user

    request.auser = auser
    return user


class _CsrfCheck(CsrfViewMiddleware):
    """Django's own CSRF check (token, Origin, Referer), answering the refusal's reason
    instead of its HTML page."""

    def _reject(self, request: HttpRequest, reason: str) -> Any:
        return reason


def csrf_refusal(request: HttpRequest) -> str | None:
    """Why ``request`` fails the CSRF check, or None when it passes."""
    check = _CsrfCheck(lambda request: None)  # type: ignore[arg-type]
    check.process_request(request)
    reason = check.process_view(request, None, (), {})  # type: ignore[arg-type]
    return cast(str | None, reason)


def _raise_for(reason: str | None) -> None:
    if reason is not None:
        raise ApiError(403, "csrf_failed",
                       _("CSRF check failed: %(reason)s Send the csrftoken cookie's value in "
                         "an X-CSRFToken header.") % {"reason": reason})
