"""The JSON API's addresses, included by ``chatstream.urls`` under ``api/`` (names in the
``chatstream`` namespace: ``chatstream:api-conversations``...)."""

from __future__ import annotations

from django.urls import path, re_path

from . import views

urlpatterns = [
    path("conversations/", views.conversations, name="api-conversations"),
    path("conversations/<uuid:pk>/", views.conversation, name="api-conversation"),
    path("conversations/<uuid:pk>/messages/", views.messages, name="api-messages"),
    path("messages/<int:pk>/generations/", views.message_generations,
         name="api-message-generations"),
    path("generations/<uuid:pk>/", views.generation, name="api-generation"),
    path("generations/<uuid:pk>/stream/", views.generation_stream,
         name="api-generation-stream"),
    path("generations/<uuid:pk>/stop/", views.stop, name="api-generation-stop"),
    path("generations/<uuid:pk>/tool-calls/", views.tool_calls,
         name="api-generation-tool-calls"),
    path("tool-calls/<uuid:pk>/approve/", views.toolcall_approve, name="api-toolcall-approve"),
    path("tool-calls/<uuid:pk>/deny/", views.toolcall_deny, name="api-toolcall-deny"),
    path("generations/<uuid:pk>/retry/", views.retry, name="api-generation-retry"),
    path("generations/<uuid:pk>/feedback/", views.feedback, name="api-generation-feedback"),
    re_path(r"", views.unknown),
]
