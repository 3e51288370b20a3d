"""What answers a reply's stream request, for the pages and the JSON API alike.

Each has a view of its own (``chatstream.web.views.generation_stream``, the JSON API's
``generation_stream``) with its own wire and its own way of saying no; both read the resume
point, answer under WSGI and wrap the events in a response here.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any
from uuid import UUID

from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import aget_object_or_404
from django.utils.translation import gettext_lazy

from .. import stream
from ..models import Generation

# What a stream request is refused with.
BAD_RESUME_POINT = gettext_lazy(
    "A stream resumes after a number of characters: Last-Event-ID or after= must be a whole "
    "number.")
TOO_MANY_PAGES = gettext_lazy(
    "This reply is open in too many pages at once. Close one, then reload.")
NEEDS_ASGI = gettext_lazy(
    "Streaming needs an ASGI server (uvicorn, daphne, or runserver with daphne).")


def resume_point(request: HttpRequest) -> int | None:
    """How many characters of the reply the client has (``Last-Event-ID``, which EventSource
    sends when it reconnects by itself, else ``?after=``); 0 for none, None if not a number."""
    value = request.headers.get("Last-Event-ID") or request.GET.get("after") or "0"
    if not (value.isascii() and value.isdigit() and len(value) <= 18):
        return None
    return int(value)


async def stream_response(body: AsyncGenerator[bytes, None], *, wsgi: bool
                          ) -> HttpResponse | StreamingHttpResponse:
    if wsgi:  # buffered to its end anyway: a refusal, never a reply (see buffered_refusal)
        events = b"".join([event async for event in body])
        return HttpResponse(events, content_type=stream.CONTENT_TYPE, headers=stream.HEADERS)
    return StreamingHttpResponse(body, content_type=stream.CONTENT_TYPE, headers=stream.HEADERS)


async def buffered_refusal(pk: UUID, user_id: Any, wire: stream.Wire[bytes]
                           ) -> HttpResponse | StreamingHttpResponse | None:
    """Under WSGI an async stream is buffered to its end: never pretend to stream. A pending
    reply is answered at once with its failure (an ``error`` and a ``done`` event); None when
    there is nothing to answer so (the caller says streaming needs ASGI); Http404 for a
    generation that is not the user's."""
    body = await stream.astart(pk, user_id, wire, wsgi=True)
    if body is None:
        await aget_object_or_404(Generation.objects.only("pk"), pk=pk, user_id=user_id)
        return None
    return await stream_response(body, wsgi=True)
