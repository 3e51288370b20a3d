from __future__ import annotations

from django.contrib import admin

from ..models import Conversation, Generation, Message


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ["__str__", "user", "model", "created_at", "updated_at"]
    list_select_related = ["user"]
    raw_id_fields = ["user"]


@admin.register(Generation)
class GenerationAdmin(admin.ModelAdmin):
    list_display = ["created_at", "user", "model", "status", "finish_reason", "usage_source"]
    list_select_related = ["user"]
    list_filter = ["status", "model"]

    def has_add_permission(self, request):  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


admin.site.register(Message)
