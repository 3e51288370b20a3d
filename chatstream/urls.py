from __future__ import annotations

from django.urls import include, path

from . import views

app_name = "chatstream"

urlpatterns = [
    path("", views.conversation_list, name="conversation-list"),
    path("new/", views.conversation_create, name="conversation-create"),
    path("c/<uuid:pk>/", views.conversation_detail, name="conversation-detail"),
    path("c/<uuid:pk>/rename/", views.conversation_rename, name="conversation-rename"),
    path("c/<uuid:pk>/delete/", views.conversation_delete, name="conversation-delete"),
    path("c/<uuid:pk>/messages/", views.message_create, name="message-create"),
    path("g/<uuid:pk>/stream/", views.generation_stream, name="generation-stream"),
    path("g/<uuid:pk>/cancel/", views.generation_cancel, name="generation-cancel"),
    path("g/<uuid:pk>/retry/", views.generation_retry, name="generation-retry"),
    path("api/", include("chatstream.json_api.urls")),
]
