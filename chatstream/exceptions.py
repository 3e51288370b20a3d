"""The exceptions chatstream raises, rooted at :class:`ChatstreamError`.

Pure Python: the parser modules import this, so it must not import Django or httpx.
Every exception carries the context needed to act on it (status, provider, request id)
and never an API key.
"""

from __future__ import annotations


class ChatstreamError(Exception):
    """Base class of every error chatstream raises."""


class UpstreamError(ChatstreamError):
    """The provider, or the stream it sent, failed.

    ``error_type`` is a short stable slug stored on the Generation (``http_429``,
    ``connect``, ``stream_error``, ``malformed_chunk``...).
    """

    error_type = "upstream"

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        request_id: str = "",
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.provider = provider
        self.request_id = request_id
        self.status = status

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.message!r}, provider={self.provider!r}, "
            f"request_id={self.request_id!r}, status={self.status!r})"
        )


class UpstreamHTTPError(UpstreamError):
    """The provider answered with an HTTP error status before streaming."""

    @property
    def error_type(self) -> str:  # type: ignore[override]
        return f"http_{self.status}"


class UpstreamConnectError(UpstreamError):
    """The provider could not be reached (refused, DNS, connect timeout)."""

    error_type = "connect"


class UpstreamStreamError(UpstreamError):
    """The provider sent an error object, or an ``event: error``, in the middle of a stream."""

    error_type = "stream_error"

    def __init__(self, message: str, *, code: str | int | None = None, **context: object) -> None:
        super().__init__(message, **context)  # type: ignore[arg-type]
        self.code = code


class MalformedChunkError(UpstreamError):
    """A stream payload was not valid JSON (or not a JSON object)."""

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


class UpstreamTimeout(UpstreamError):
    """The provider went silent for too long, or the whole reply took too long."""

    def __init__(self, message: str, *, kind: str, **context: object) -> None:
        super().__init__(message, **context)  # type: ignore[arg-type]
        self.kind = kind

    @property
    def error_type(self) -> str:  # type: ignore[override]
        return self.kind


class QuotaExceeded(ChatstreamError):
    """A per-user limit refuses this request; nothing was sent upstream."""

    def __init__(self, message: str, *, limit: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.limit = limit
        self.retry_after = retry_after
