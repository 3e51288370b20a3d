"""How a stream ended, as stored: status, reason, error type, and the sentence the user reads.

- ``cancelled``: the user stopped it (Stop, or the browser went away), or the user lost the
  right to it while it ran: signed out, deactivated, refused by ``CHATSTREAM_ACCESS`` (see
  :class:`StopCause` and _revocation.py).
- ``interrupted``: the stream broke after the provider began it (connection lost, stall,
  deadline, an error object or malformed JSON mid-stream, no ``[DONE]``, worker died), or the
  reply passed a bound and was cut there (``reply_too_long``, ``max_tokens_exceeded``).
- ``failed``: the provider refused or could not be reached (HTTP error, connection refused), or
  answered in a content coding chatstream does not read (``unsupported_encoding``).

``reason`` is shown to all staff and logged: it is built from our own words and the error's
identifiers (status, error code), never from what the provider wrote (see chatstream.exceptions).
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from django.db.models import TextChoices

from ..domain.notices import describe
from ..exceptions import (
    ModelCoolingDown,
    UnsupportedEncodingError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamHTTPError,
)
from ..models import Generation
from ..provider import redact

Status = Generation.Status


@dataclass
class Outcome:
    status: str
    reason: str = ""
    error_type: str = ""
    notice: str = ""  # the sentence shown to the user, if any


COMPLETED = Outcome(Status.COMPLETED)


def disconnected() -> Outcome:
    return Outcome(Status.CANCELLED, "client disconnected", "client_disconnected")


class StopCause(TextChoices):
    """Why a Stop was sent: the stored ``error_type`` of the reply it cancels (the value) and
    its ``reason`` (the label: stored, shown to staff and logged, so in English)."""

    BY_USER = "stopped_by_user", "stopped by user"
    SIGNED_OUT = "user_signed_out", "stopped: the user signed out"
    DEACTIVATED = "user_deactivated", "stopped: the user was deactivated"
    ACCESS_REVOKED = "access_revoked", "stopped: the user no longer has access to the chat"
    DELETED = "user_deleted", "stopped: the user was deleted"


def stopped(cause: str = StopCause.BY_USER) -> Outcome:
    """A Stop's outcome; a cause this version does not know counts as the user's Stop."""
    known = StopCause(cause) if cause in StopCause.values else StopCause.BY_USER
    return Outcome(Status.CANCELLED, str(known.label), known.value)


def for_error(error: BaseException, *, started: bool) -> Outcome:
    """The outcome of a stream that ended with ``error``; ``started``: the provider answered 2xx."""
    if isinstance(error, UpstreamHTTPError):
        code = f" ({error.code})" if error.code is not None else ""
        outcome = Outcome(Status.FAILED, redact(f"provider answered HTTP {error.status}{code}"),
                          error.error_type)
    elif isinstance(error, UnsupportedEncodingError):
        outcome = Outcome(Status.FAILED, redact(error.message)[:200], error.error_type)
    elif isinstance(error, UpstreamConnectError | ModelCoolingDown):
        outcome = Outcome(Status.FAILED, redact(error.message)[:200], error.error_type)
    elif isinstance(error, TimeoutError):
        outcome = Outcome(Status.INTERRUPTED, "took longer than the maximum duration", "deadline")
    elif isinstance(error, httpx.TimeoutException):
        outcome = (Outcome(Status.INTERRUPTED, "provider went silent", "inactivity") if started
                   else Outcome(Status.FAILED, "provider did not answer", "connect_timeout"))
    elif isinstance(error, UpstreamError):  # our words and ids (redacted: an id might echo one)
        outcome = Outcome(Status.INTERRUPTED, redact(error.message)[:200], error.error_type)
    elif isinstance(error, httpx.HTTPError):
        outcome = Outcome(Status.INTERRUPTED, "connection to the provider was lost",
                          "connection_lost")
    else:
        outcome = Outcome(Status.INTERRUPTED, "internal error", "internal")
    outcome.notice = describe(outcome.status, error_type=outcome.error_type,
                              http_status=getattr(error, "status", None))
    return outcome


def model_not_allowed() -> Outcome:
    return Outcome(Status.FAILED, "model no longer allowed", "model_not_allowed",
                   describe(Status.FAILED, error_type="model_not_allowed"))


def unsupported_server() -> Outcome:
    """The server cannot stream (see _serving.py): the provider was not called."""
    return Outcome(Status.FAILED, "the server cannot stream replies", "unsupported_server",
                   describe(Status.FAILED, error_type="unsupported_server"))
