"""How a stream ended, as stored: status, reason, error type, and the sentence the user reads.

- ``cancelled``: the user stopped it (Stop, or the browser went away).
- ``interrupted``: the stream broke after the provider began it (connection lost, stall,
  deadline, an error object or malformed JSON mid-stream, no ``[DONE]``, worker died).
- ``failed``: the provider refused or could not be reached (HTTP error, connection refused).
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from ..exceptions import UpstreamConnectError, UpstreamError, UpstreamHTTPError
from ..models import Generation
from ..notices import describe

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


def stopped() -> Outcome:
    return Outcome(Status.CANCELLED, "stopped by user", "stopped_by_user")


def for_error(error: BaseException, *, started: bool) -> Outcome:
    """The outcome of a stream that ended with ``error``; ``started``: the provider answered 2xx."""
    if isinstance(error, UpstreamHTTPError):
        outcome = Outcome(Status.FAILED, f"provider answered HTTP {error.status}",
                          error.error_type)
    elif isinstance(error, UpstreamConnectError):
        outcome = Outcome(Status.FAILED, "could not reach the provider", error.error_type)
    elif isinstance(error, TimeoutError):
        outcome = Outcome(Status.INTERRUPTED, "took longer than the maximum duration", "deadline")
    elif isinstance(error, httpx.TimeoutException):
        outcome = (Outcome(Status.INTERRUPTED, "provider went silent", "inactivity") if started
                   else Outcome(Status.FAILED, "provider did not answer", "connect_timeout"))
    elif isinstance(error, UpstreamError):
        outcome = Outcome(Status.INTERRUPTED, error.message[:200], error.error_type)
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
