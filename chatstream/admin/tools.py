"""The tool call admin: every call a reply asked for, read-only, its text behind the content
permission (the arguments and results can hold what the user wrote)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from ..models import ToolCall
from . import privacy
from .generations import TOOL_CALL_TEXT, RecentValuesFilter
from .readonly import RecordAdmin
from .timing import precise


class ToolNameFilter(RecentValuesFilter):
    title = _("tool")
    parameter_name = field = "name"
    model = ToolCall


def _generation_link(obj: ToolCall) -> str:
    return format_html('<a href="{}"><code>{}</code></a> · {}',
                       reverse("admin:chatstream_generation_change", args=[obj.generation_id]),
                       privacy.short_id(obj.generation_id),
                       _("step %(step)d") % {"step": obj.generation.step})


@admin.register(ToolCall)
class ToolCallAdmin(RecordAdmin, privacy.ContentGuard, admin.ModelAdmin):
    content_fields = frozenset(TOOL_CALL_TEXT)
    audited_as = "tool call filters"
    list_display = ["created_at", "name", "status", "generation_link", "user", "started",
                    "finished", "decided_by"]
    list_filter = ["status", ToolNameFilter, ("created_at", admin.DateFieldListFilter)]
    list_select_related = ["generation__user", "decided_by"]
    list_per_page = 100
    show_full_result_count = False
    search_fields = ["=id", "=generation__id", "=call_id"]
    search_help_text = _("Call id, generation id or the provider's call id.")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).select_related("generation__user", "decided_by")

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        text = list(TOOL_CALL_TEXT) if privacy.can_read_content(request) else ["text_hidden"]
        return [
            (None, {"fields": [("name", "status"), "id", "generation_link", ("position",
                                                                           "call_id")]}),
            (_("Decision"), {"fields": [("decided_by", "decided_at")]}),
            (_("Timing"), {"fields": [("created", "started", "finished")]}),
            (_("Text"), {"fields": text}),
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [name for _, options in self.get_fieldsets(request, obj)
                for row in options["fields"]
                for name in (row if isinstance(row, tuple) else (row,))]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        response = super().change_view(request, object_id, form_url, extra_context)
        if response.status_code == 200 and privacy.can_read_content(request):
            privacy.audit(request, "viewed", tool_call=object_id)
        return response

    @admin.display(description=_("generation"))
    def generation_link(self, obj: ToolCall) -> str:
        return _generation_link(obj)

    @admin.display(description=_("user"), ordering="generation__user")
    def user(self, obj: ToolCall) -> Any:
        return obj.generation.user

    @admin.display(description=_("created"))
    def created(self, obj: ToolCall) -> str:
        return precise(obj.created_at)

    @admin.display(description=_("started"), ordering="started_at")
    def started(self, obj: ToolCall) -> str:
        return precise(obj.started_at)

    @admin.display(description=_("finished"), ordering="finished_at")
    def finished(self, obj: ToolCall) -> str:
        return precise(obj.finished_at)

    @admin.display(description=_("text"))
    def text_hidden(self, obj: ToolCall) -> str:
        return str(privacy.HIDDEN)
