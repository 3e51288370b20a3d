"""The caller's quota left, on every answer of the JSON API to an authenticated user:
``X-RateLimit-Remaining-Requests`` (requests left in the rolling minute, under
``requests_per_minute``) and ``X-RateLimit-Remaining-Tokens`` (tokens left under the tightest
of ``tokens_per_day`` and ``tokens_per_month``), each left out when its limit is unlimited.

Read after the view ran (what the answer's own request used counts), in one query of the
ledger at most (``quota.headroom``). A stream served in front of Django (``with_fast_streams``)
reads them while its reply starts, so that its first event waits for them as little as it can:
on the event loop where the ledger's database is PostgreSQL (``quota.aheadroom``, two
statements at most, no thread), else in a thread: the one that reads the stream's session and
claims its reply, when that one does (docs/json-api.md says what they cost).
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth import get_user_model
from django.db import router
from django.http import HttpResponse

from .. import quota, store
from .._failures import log_failure
from .._loops import in_executor
from ..models import QuotaCharge

REQUESTS = "X-RateLimit-Remaining-Requests"
TOKENS = "X-RateLimit-Remaining-Tokens"

logger = logging.getLogger("chatstream.quota")


def headers(user: Any) -> dict[str, str]:
    """The headers that tell ``user`` what they have left (none for an unlimited one)."""
    return _named(quota.headroom(user))


def _named(left: quota.Remaining) -> dict[str, str]:
    found = {}
    if left.requests_minute is not None:
        found[REQUESTS] = str(left.requests_minute)
    if left.tokens is not None:
        found[TOKENS] = str(left.tokens)
    return found


def _read(user: Any) -> dict[str, str]:
    """:func:`headers`, or none if they cannot be read: the answer itself is what matters."""
    try:
        return headers(user)
    except Exception as error:
        log_failure(logger, error, "The quota left by user %s could not be read", user.pk)
        return {}


def with_headers(response: HttpResponse, user: Any) -> HttpResponse:
    """``response`` with ``user``'s quota left (nobody authenticated: as it is)."""
    if user is not None:
        for name, value in _read(user).items():
            response[name] = value
    return response


async def awith_headers(response: HttpResponse, user: Any) -> HttpResponse:
    """:func:`with_headers` from an async view: the ledger is read off the event loop."""
    if user is None:
        return response
    return await in_executor(with_headers)(response, user)


async def for_stream(user_id: Any) -> list[tuple[bytes, bytes]]:
    """The headers of the user ``user_id``, for a stream's ASGI response: read on the event
    loop where the ledger's database is PostgreSQL (its store's pool), else in a thread
    (:func:`for_stream_here`)."""
    reader = store.for_alias(router.db_for_write(QuotaCharge))
    if not isinstance(reader, store.PostgresStore):
        found: list[tuple[bytes, bytes]] = await in_executor(for_stream_here)(user_id)
        return found
    try:
        left = _named(await quota.aheadroom(user_id, reader))
    except Exception as error:
        log_failure(logger, error, "The quota left by user %s could not be read", user_id)
        left = {}
    return _encoded(left)


def for_stream_here(user_id: Any) -> list[tuple[bytes, bytes]]:
    """:func:`for_stream`'s headers read through Django's connection, in the calling thread."""
    return _encoded(_read(get_user_model()(pk=user_id)))


def _encoded(found: dict[str, str]) -> list[tuple[bytes, bytes]]:
    return [(name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in found.items()]
