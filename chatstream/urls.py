from __future__ import annotations

from django.urls import include, path

from .web import approvals, exporting, views

app_name = "chatstream"

urlpatterns = [
    path("", views.conversation_list, name="conversation-list"),
    path("search/", views.conversation_search, name="conversation-search"),
    path("new/", views.conversation_create, name="conversation-create"),
    path("export/", exporting.data_export, name="data-export"),
    path("c/<uuid:pk>/", views.conversation_detail, name="conversation-detail"),
    path("c/<uuid:pk>/rename/", views.conversation_rename, name="conversation-rename"),
    path("c/<uuid:pk>/delete/", views.conversation_delete, name="conversation-delete"),
    path("c/<uuid:pk>/export/", exporting.conversation_export, name="conversation-export"),
    path("c/<uuid:pk>/messages/", views.message_create, name="message-create"),
    path("g/<uuid:pk>/stream/", views.generation_stream, name="generation-stream"),
    path("g/<uuid:pk>/cancel/", views.generation_cancel, name="generation-cancel"),
    path("g/<uuid:pk>/retry/", views.generation_retry, name="generation-retry"),
    path("g/<uuid:pk>/feedback/", views.generation_feedback, name="generation-feedback"),
    path("t/<uuid:pk>/approve/", approvals.toolcall_approve, name="toolcall-approve"),
    path("t/<uuid:pk>/deny/", approvals.toolcall_deny, name="toolcall-deny"),
    path("m/<int:pk>/", views.message_version, name="message-version"),
    path("m/<int:pk>/edit/", views.message_edit, name="message-edit"),
    path("api/", include("chatstream.json_api.urls")),
]
