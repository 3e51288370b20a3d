"""The user's downloads of their own data: one conversation (JSON or Markdown), and all of
their conversations as one JSON file, streamed (see chatstream/domain/exports.py and
docs/export.md).

Only sign-in is asked, not chat access (``CHATSTREAM_ACCESS``): a user the site no longer lets
chat may still take their history away. Another user's conversation is a 404, as on every
page.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET

from ..domain import exports
from ..models import Conversation

JSON = "application/json"
MARKDOWN = "text/markdown; charset=utf-8"


def _attachment(response: HttpResponse | StreamingHttpResponse, name: str) -> None:
    # exports.file_name gives ASCII letters, digits, dots and dashes only: nothing to quote.
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    response["X-Content-Type-Options"] = "nosniff"
    response["Cache-Control"] = "private, no-store"


@login_required
@require_GET
def conversation_export(request: HttpRequest, pk: UUID) -> HttpResponse:
    kind = request.GET.get("format", "json")
    if kind not in ("json", "markdown"):
        return HttpResponseBadRequest(_("Choose the format json or markdown."))
    conversation = get_object_or_404(
        exports.with_history(Conversation.objects.filter(user=request.user)),  # type: ignore[misc]
        pk=pk)
    if kind == "json":
        response = HttpResponse(exports.conversations_json([conversation], request.user),
                                content_type=JSON)
        _attachment(response, exports.file_name(conversation, "json"))
    else:
        response = HttpResponse(exports.conversation_markdown(conversation),
                                content_type=MARKDOWN)
        _attachment(response, exports.file_name(conversation, "md"))
    return response


@login_required
@require_GET
def data_export(request: HttpRequest) -> StreamingHttpResponse:
    content: Iterator[bytes] | AsyncIterator[bytes]
    if isinstance(request, ASGIRequest):
        content = exports.aiter_export(exports.of_user(request.user), request.user)
    else:
        content = exports.iter_export(exports.of_user(request.user), request.user)
    response = StreamingHttpResponse(content, content_type=JSON)
    _attachment(response, exports.file_name(None, "json"))
    return response
