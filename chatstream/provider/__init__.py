"""The provider client: Chat Completions requests to an OpenAI-compatible server.

Requests are built from settings only (:func:`build_request`) and sent through one connection
pool per event loop (:func:`send`), whose connections reach the network through
:class:`Backend` (httpcore over plain asyncio protocols, on any loop). Reading the reply is the
stream engine's work (chatstream.sse, chatstream.completions).
"""

from ._network import Backend
from ._request import (
    USER_AGENT,
    UpstreamRequest,
    aclose_transports,
    build_request,
    connect_error,
    encode_body,
    get_transport,
    raise_for_status,
    redact,
    send,
    timeout,
)

__all__ = [
    "USER_AGENT",
    "Backend",
    "UpstreamRequest",
    "aclose_transports",
    "build_request",
    "connect_error",
    "encode_body",
    "get_transport",
    "raise_for_status",
    "redact",
    "send",
    "timeout",
]
