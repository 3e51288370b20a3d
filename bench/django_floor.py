"""The least a Django view does for a message POST: the floor under chatstream's, on the same
site (bench_start.py, figure 2).

The URLconf of ``bench/floor_settings.py`` (the project's settings otherwise): the composer's
POST URL is answered by :func:`message`, the view a user would write to store a message and
nothing else (the session and the user, the CSRF check and every other middleware as the site
has them; the user's conversation read, the message inserted, a line of HTML answered); every
other URL is the project's. No generation, history, quota or template.
"""

from __future__ import annotations

from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import path
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from chatstream.models import Conversation, Message
from project.urls import urlpatterns as site_urls


@login_required
@require_POST
def message(request: HttpRequest, pk: UUID) -> HttpResponse:
    conversation = get_object_or_404(Conversation, pk=pk, user=request.user)
    content = request.POST.get("content", "").strip()
    if not content:
        return HttpResponse("Write a message first.", status=400)
    saved = Message.objects.create(conversation=conversation, role=Message.Role.USER,
                                   content=content)
    return HttpResponse(format_html('<article id="message-{}">{}</article>', saved.pk,
                                    saved.content))


urlpatterns = [path("chat/c/<uuid:pk>/messages/", message), *site_urls]
