"""Stream tickets: a signed, short-lived permission to open one generation's stream.

A page that shows a live reply connects to ``generation-stream`` with ``?ticket=...``. The
ticket holds the user's id and a timestamp, signed with ``SECRET_KEY`` under a salt made of the
generation's id and the session key the page was rendered for. So it opens that one stream, for
that user, from that browser session (the request's session cookie must match), for
``CHATSTREAM_STREAM_TICKET_MAX_AGE`` seconds. Checking it reads no session and no user: see
:mod:`chatstream.asgi` for serving the stream without Django's request cycle at all.

A missing, forged, expired or foreign ticket (or a session cookie that changed since) is never
an error: the request is then authenticated by its session, as any other view's would be.
``SECRET_KEY_FALLBACKS`` is honoured, so rotating the key does not break pages already open.
A ticket stays valid until it expires even if its session ends (logout); keep the lifetime
short.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

from django.core import signing

from ..conf import conf

SALT = "chatstream.stream-ticket"
PARAMETER = "ticket"


def _signer(generation_id: UUID | str, session_key: str) -> signing.TimestampSigner:
    return signing.TimestampSigner(salt=f"{SALT}:{UUID(str(generation_id)).hex}:{session_key}")


def issue(generation_id: UUID | str, user_id: Any, session_key: str) -> str:
    """A ticket for ``user_id``, in session ``session_key``, to open ``generation_id``'s stream."""
    return _signer(generation_id, session_key).sign(str(user_id))


def user_id(generation_id: UUID | str, ticket: str | None, session_key: str | None
            ) -> str | None:
    """The user id a valid ticket carries; None for any other ticket, or without a session."""
    if not ticket or not session_key:
        return None
    try:
        return _signer(generation_id, session_key).unsign(
            ticket, max_age=timedelta(seconds=conf.STREAM_TICKET_MAX_AGE))
    except (signing.BadSignature, ValueError):
        return None
