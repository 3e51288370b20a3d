"""The caller's quota left, on every answer of the JSON API to an authenticated user:
``X-RateLimit-Remaining-Requests`` (requests left in the rolling minute, under
``requests_per_minute``) and ``X-RateLimit-Remaining-Tokens`` (tokens left under the tightest
of ``tokens_per_day`` and ``tokens_per_month``), each left out when its limit is unlimited.

Read after the view ran (what the answer's own request used counts), in one query of the
ledger at most (``quota.headroom``). A stream's answer (its server-sent events) carries none:
its start is kept as quick as a bare proxy's, and the query would cost more than that allows
(docs/json-api.md says what it was measured at).
"""

from __future__ import annotations

import logging
from typing import Any

from django.http import HttpResponse, StreamingHttpResponse

from .. import quota
from .._failures import log_failure
from .._loops import in_executor

REQUESTS = "X-RateLimit-Remaining-Requests"
TOKENS = "X-RateLimit-Remaining-Tokens"

logger = logging.getLogger("chatstream.quota")


def headers(user: Any) -> dict[str, str]:
    """The headers that tell ``user`` what they have left (none for an unlimited one)."""
    left = quota.headroom(user)
    found = {}
    if left.requests_minute is not None:
        found[REQUESTS] = str(left.requests_minute)
    if left.tokens is not None:
        found[TOKENS] = str(left.tokens)
    return found


def with_headers(response: HttpResponse, user: Any) -> HttpResponse:
    """``response`` with ``user``'s quota left (nobody authenticated, or a stream: as it is).
    The answer goes out without them if they cannot be read."""
    if user is None or isinstance(response, StreamingHttpResponse):
        return response
    try:
        found = headers(user)
    except Exception as error:  # the answer itself is what matters
        log_failure(logger, error, "The quota left by user %s could not be read", user.pk)
        return response
    for name, value in found.items():
        response[name] = value
    return response


async def awith_headers(response: HttpResponse, user: Any) -> HttpResponse:
    """:func:`with_headers` from an async view: the ledger is read off the event loop."""
    if user is None or isinstance(response, StreamingHttpResponse):
        return response
    return await in_executor(with_headers)(response, user)
