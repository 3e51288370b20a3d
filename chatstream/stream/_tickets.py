"""Stream tickets: a signed, short-lived permission to start one reply.

A page that shows a reply not started yet connects to ``generation-stream`` with
``?ticket=...``. The ticket holds the user's id and a timestamp, signed with ``SECRET_KEY`` under
a salt made of the generation's id and the session key the page was rendered for. Checking it
reads no session and no user, so the reply's start costs one database round trip (the claim);
see :mod:`chatstream.asgi` for serving it without Django's request cycle at all.

What a ticket allows, exactly: to **start** (claim) the one reply it names, which must still be
pending, for the user it names, from the browser session it was made for (the request's
session cookie must match), within ``CHATSTREAM_STREAM_TICKET_MAX_AGE`` seconds (10 by default),
and only while that user is active (the claim's own statement checks ``is_active``; a user
model without it counts as active, as Django's ModelBackend counts it). Once the reply has
started, the ticket opens nothing: a reload, a second tab or a replay is the session's to
authenticate. What would end the session ends what its tickets could still start: a password
change cancels the user's replies not started yet (:func:`end_pending`), and logging out and
deactivation stop every live reply of the user, started or not (see _revocation.py). A ticket
in an access log or a shared URL is therefore worth nothing to anyone without the session
cookie, and nothing at all once its reply has started.

A missing, forged, expired or foreign ticket (or a session cookie that changed since) is never
an error: the request is then authenticated by its session, as any other view's would be.
``SECRET_KEY_FALLBACKS`` is honoured, so rotating the key does not break pages already open.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any
from uuid import UUID

from django.contrib.auth import get_user_model
from django.core import signing
from django.db import transaction
from django.db.models.signals import post_save

from .. import quota, store
from ..conf import conf
from ..domain import reporting
from ..models import Generation

SALT = "chatstream.stream-ticket"
PARAMETER = "ticket"


def _signer(generation_id: UUID | str, session_key: str) -> signing.TimestampSigner:
    return signing.TimestampSigner(salt=f"{SALT}:{UUID(str(generation_id)).hex}:{session_key}")


def issue(generation_id: UUID | str, user_id: Any, session_key: str) -> str:
    """A ticket for ``user_id``, in session ``session_key``, to start ``generation_id``."""
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


def end_pending(user_pk: Any) -> None:
    """The user's session ended (or may have): cancel their replies not started yet, so no
    ticket made for that session can start one."""
    pending = Generation.objects.filter(user_id=user_pk, status=Generation.Status.PENDING)
    for generation_id in pending.values_list("pk", flat=True):
        cancelled = store.cancel_pending(generation_id, reason="session ended before it started",
                                         error_type="session_ended", settlement=quota.RELEASED)
        if cancelled is not None:
            transaction.on_commit(partial(reporting.finished_now, cancelled),
                                  using=cancelled._state.db)


def _user_saved(sender: Any, *, instance: Any, created: bool = False, **kwargs: Any) -> None:
    # ``_password`` holds the new raw password from set_password() until save() has run its
    # validators, which is after post_save: a password set in this save. (A deactivation is
    # _revocation.py's.)
    if not created and getattr(instance, "_password", None) is not None:
        end_pending(instance.pk)


def connect_receivers() -> None:
    """Listen for what ends a session (called once, when the app is ready)."""
    post_save.connect(_user_saved, sender=get_user_model(),
                      dispatch_uid="chatstream.tickets.user_saved")
