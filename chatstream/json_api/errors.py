"""The API's errors: always ``{"error": {"code", "message"}}`` with the right status."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import (
    BadRequest,
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
)
from django.http import Http404, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.utils.translation import gettext as _

from .._failures import log_failure
from ..exceptions import (
    AlreadyDecided,
    ConversationFull,
    InvalidMessage,
    NotEditable,
    QuotaExceeded,
    Refusal,
    ReplyStillLive,
    TooManyReplies,
)

logger = logging.getLogger("django.request")

# Every answer is one user's data, or about one user's request: never kept by a cache.
HEADERS = {"Cache-Control": "no-store"}


# The API's status and code for each refusal sending.py raises.
REFUSALS: dict[type[Refusal], tuple[int, str]] = {
    InvalidMessage: (400, "invalid"), ReplyStillLive: (409, "still_live"),
    NotEditable: (409, "not_editable"), ConversationFull: (409, "conversation_full"),
    TooManyReplies: (409, "too_many_replies"), QuotaExceeded: (429, "quota_exceeded"),
    AlreadyDecided: (409, "already_decided"),
}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, *,
                 headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = headers or {}
        self.extra = extra

    def response(self) -> JsonResponse:
        return JsonResponse({"error": {"code": self.code, "message": self.message,
                                       **self.extra}},
                            status=self.status, headers={**HEADERS, **self.headers})


def not_found() -> ApiError:
    return ApiError(404, "not_found", _("Not found."))


def as_api_error(error: Exception, path: str) -> ApiError:
    """What to answer for ``error``, raised by a view: the API's own errors, Django's (404,
    403, a body too large) and chatstream's refusals; anything else is a logged 500."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, Http404):
        return not_found()
    if isinstance(error, PermissionDenied):
        return ApiError(403, "forbidden", str(error) or _("You may not do this."))
    if isinstance(error, RequestDataTooBig):
        return ApiError(413, "too_large", _("The request body is too large."))
    if isinstance(error, BadRequest | MultiPartParserError | SuspiciousOperation):
        # A body Django could not read as a form (the CSRF check reads one without a header).
        return ApiError(400, "invalid", _("The request could not be read."))
    if isinstance(error, QuotaExceeded):
        headers = {} if error.retry_after is None else {"Retry-After": str(error.retry_after)}
        return ApiError(429, "quota_exceeded", error.message, headers=headers,
                        limit=error.limit, retry_after=error.retry_after)
    if isinstance(error, Refusal):
        status, code = next((answer for kind, answer in REFUSALS.items()
                             if isinstance(error, kind)), (400, "refused"))
        return ApiError(status, code, error.message)
    # Django's own line for a 500, without the exception's words: they may quote the body.
    log_failure(logger, error, "Internal Server Error: %s", path, extra={"status_code": 500})
    return ApiError(500, "server_error", _("Something went wrong on the server."))
