"""The exceptions chatstream raises, rooted at :class:`ChatstreamError`.

Pure Python: the parser modules import this, so it must not import Django or httpx.
Every exception carries the context needed to act on it (status, provider, request id)
and never an API key.

An :class:`UpstreamError`'s message (its ``str`` and ``repr``) is chatstream's own words: it is
stored as the generation's ``reason``, which every staff member reads, and logged. What the
provider sent (reply text, a raw chunk, the free-text ``message`` of its error object, which
can quote the prompt) stays out of it: only identifiers, sizes and counts go in.
"""

from __future__ import annotations

import re

# What a provider's error code or type must look like to be kept (``rate_limit_exceeded``,
# ``server_error``, ``context_length_exceeded``...): an identifier, not a sentence.
_IDENTIFIER = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def error_code(value: object) -> str | int | None:
    """A provider's error ``code``/``type`` if it is an identifier (or an int), else None."""
    if type(value) is int or (type(value) is str and _IDENTIFIER.fullmatch(value)):
        return value
    return None


class ChatstreamError(Exception):
    """Base class of every error chatstream raises."""


class UpstreamError(ChatstreamError):
    """The provider, or the stream it sent, failed.

    ``error_type`` is a short stable slug stored on the Generation (``http_429``,
    ``connect``, ``stream_error``, ``malformed_chunk``...). ``code`` is the provider's error
    code (or type) when it is an identifier (see :func:`error_code`). ``detail`` is the
    provider's own message, which may quote the prompt or the reply: never in ``str`` or
    ``repr``, and only ever logged at DEBUG.
    """

    error_type = "upstream"

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        request_id: str = "",
        status: int | None = None,
        code: object = None,
        detail: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.provider = provider
        self.request_id = request_id
        self.status = status
        self.code = error_code(code)
        self.detail = detail

    def __repr__(self) -> str:
        code = f", code={self.code!r}" if self.code is not None else ""
        return (
            f"{type(self).__name__}({self.message!r}, provider={self.provider!r}, "
            f"request_id={self.request_id!r}, status={self.status!r}{code})"
        )


class UpstreamHTTPError(UpstreamError):
    """The provider answered with an HTTP error status before streaming."""

    @property
    def error_type(self) -> str:  # type: ignore[override]
        return f"http_{self.status}"


class UpstreamConnectError(UpstreamError):
    """The provider could not be reached (refused, DNS, connect timeout)."""

    error_type = "connect"


class ModelCoolingDown(UpstreamError):
    """Every model a reply may use is cooling down after failing (its circuit breaker is
    open) for longer than the reply may wait: no call was made."""

    error_type = "cooling_down"


class UpstreamStreamError(UpstreamError):
    """The provider sent an error object, or an ``event: error``, in the middle of a stream."""

    error_type = "stream_error"


class MalformedChunkError(UpstreamError):
    """A stream payload was not valid JSON (or not a JSON object).

    ``data`` is the payload's start, for a debugger: like ``detail``, never in the message.
    """

    error_type = "malformed_chunk"

    def __init__(self, message: str, *, data: str = "", **context: object) -> None:
        super().__init__(message, **context)  # type: ignore[arg-type]
        self.data = data


class EventTooLargeError(UpstreamError):
    """One server-sent event grew past the configured maximum size."""

    error_type = "event_too_large"

    def __init__(self, size: int, limit: int, **context: object) -> None:
        super().__init__(
            f"A server-sent event grew to {size} characters, over the limit of {limit}; "
            "raise the decoder's max_event_size if the provider really sends events this large.",
            **context,  # type: ignore[arg-type]
        )
        self.size = size
        self.limit = limit


class IncompleteStreamError(UpstreamError):
    """The stream ended with neither ``[DONE]`` nor a finish reason: it was cut short."""

    error_type = "incomplete"


class ReplyTooLongError(UpstreamError):
    """The reply passed a bound chatstream holds it to, and was cut there.

    ``kind`` (the ``error_type``) says which: ``reply_too_long`` (its characters, or the bytes
    read for it) or ``max_tokens_exceeded`` (far more text than the request's ``max_tokens``).
    """

    def __init__(self, message: str, *, kind: str = "reply_too_long", **context: object) -> None:
        super().__init__(message, **context)  # type: ignore[arg-type]
        self.kind = kind

    @property
    def error_type(self) -> str:  # type: ignore[override]
        return self.kind


class UnsupportedEncodingError(UpstreamError):
    """The provider's reply came in a content coding chatstream does not read (not gzip or
    deflate): nothing of it was read."""

    error_type = "unsupported_encoding"


class UpstreamTimeout(UpstreamError):
    """The provider went silent for too long, or the whole reply took too long."""

    def __init__(self, message: str, *, kind: str, **context: object) -> None:
        super().__init__(message, **context)  # type: ignore[arg-type]
        self.kind = kind

    @property
    def error_type(self) -> str:  # type: ignore[override]
        return self.kind


class Refusal(ChatstreamError):
    """chatstream refuses what was asked (a message, an edit, a Retry), with one sentence for
    the user (``message``): nothing is stored and nothing is sent upstream. Each surface turns
    each kind into its answer: the pages (``chatstream.web.views``) and the JSON API
    (``chatstream.json_api.errors``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class QuotaExceeded(Refusal):
    """A per-user limit refuses this request; nothing was sent upstream."""

    def __init__(self, message: str, *, limit: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.limit = limit
        self.retry_after = retry_after


class RequestRefused(ChatstreamError):
    """A request hook refused the request: nothing was sent upstream.

    Raise it from a hook with a sentence for the user; chatstream keeps the message and a
    ``failed`` Generation (``error_type`` ``"refused"``) that shows the sentence where the reply
    would be. Raised to callers of ``chatstream.api`` with that ``generation`` set.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.generation: object = None  # the refused Generation, once it is stored


class ConversationFull(Refusal):
    """The conversation holds ``CHATSTREAM_MAX_CONVERSATION_MESSAGES`` of the user's messages."""


class TooManyReplies(Refusal):
    """The message has ``CHATSTREAM_MAX_REPLIES_PER_MESSAGE`` replies: no Retry adds one more."""


class InvalidMessage(Refusal, ValueError):
    """The message is empty, or longer than ``CHATSTREAM_MAX_MESSAGE_LENGTH`` characters."""


class ReplyStillLive(Refusal, ValueError):
    """Retry of a reply that is still being written."""


class NotEditable(Refusal, ValueError):
    """An edit of a message that is not its conversation's last, or whose reply is live."""


class AlreadyDecided(Refusal):
    """A decision on a tool call that is no longer waiting for one (decided, expired, or its
    reply stopped)."""
