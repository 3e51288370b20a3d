"""The generation admin: a read-only record of every upstream attempt, sized for large sites.

A page of the list costs a fixed number of queries however many rows there are: the user comes
in the same query, the reply text and tool calls are never loaded for the list, and only the
filtered COUNT(*) is run (``show_full_result_count = False``). The detail page shows the
conversation exactly as it was sent upstream (``Generation.upstream_messages``).
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import F, Q, QuerySet
from django.db.models.expressions import OrderBy
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _

from ..conf import conf
from ..domain.history import history
from ..domain.versions import Versions
from ..models import Generation, ToolCall
from ..web import rendered
from ..web.feedback import owner_feedback
from . import exports, privacy, search, summary
from .attempts import AttemptInline, FellBackFilter
from .dates import DateHierarchyMixin
from .feedback import FeedbackFilter, GenerationFeedback
from .readonly import ReadOnlyInline, RecordAdmin
from .summary import DURATION_MS, TTFT_MS
from .timing import milliseconds, precise

# Lookups on these fields read users' text: refused in the URL without the content permission.
CONTENT_FIELDS = frozenset({"content", "reasoning", "tool_calls", "upstream_messages"})
TOOL_CALL_TEXT = ("arguments", "result", "error")


def changelist_url(**filters: Any) -> str:
    """The generation list, filtered by ``filters`` (query-string lookups)."""
    url = reverse("admin:chatstream_generation_changelist")
    return f"{url}?{urlencode(filters)}" if filters else url


class RecentValuesFilter(admin.SimpleListFilter):
    """One choice per value of a column among the latest ``RECENT`` generations.

    A DISTINCT over the whole table would scan it on every page of the list; the latest rows
    come from the ``created_at`` index, so the cost stays the same as the table grows. An
    older value can still be filtered on through the query string (``?model=name``).
    """

    field = ""
    model: type[Any] = Generation
    limit = 100
    RECENT = 10_000

    def extra_values(self) -> list[str]:
        return []

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        rows = self.model._default_manager
        recent = rows.order_by("-created_at").values("pk")[: self.RECENT]
        seen = (
            rows.filter(pk__in=recent)
            .exclude(**{self.field: ""})
            .order_by(self.field)
            .values_list(self.field, flat=True)
            .distinct()[: self.limit]
        )
        values = sorted({*seen, *self.extra_values()})
        return [(value, value) for value in values]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() is None:
            return queryset
        return queryset.filter(**{self.field: self.value()})


class ModelFilter(RecentValuesFilter):
    title = _("model")
    parameter_name = field = "model"

    def extra_values(self) -> list[str]:
        return list(conf.MODELS)  # the allow-list, used or not


class ErrorTypeFilter(RecentValuesFilter):
    title = _("error type")
    parameter_name = field = "error_type"


class AnsweredByFilter(RecentValuesFilter):
    title = _("answered by")
    parameter_name = field = "answered_by"


class GenerationChangeList(ChangeList):
    """The list never loads the reply text or tool calls: they can be megabytes per row."""

    def get_queryset(self, request: HttpRequest, *args: Any, **kwargs: Any) -> QuerySet[Any]:
        return super().get_queryset(request, *args, **kwargs).defer(*CONTENT_FIELDS)


class Timings:
    """Columns shared by the generation list and the conversation's generation inline."""

    @admin.display(description=_("TTFT (ms)"), ordering=OrderBy(F("ttft"), nulls_first=True))
    def ttft_ms(self, obj: Generation) -> int | None:
        return milliseconds(obj.time_to_first_token)

    @admin.display(description=_("duration (s)"),
                   ordering=OrderBy(F("elapsed"), nulls_first=True))
    def duration_s(self, obj: Generation) -> str | None:
        span = obj.duration
        return None if span is None else f"{span.total_seconds():.1f}"


class ToolCallInline(ReadOnlyInline):
    """A generation's calls, without their text (each call's own page shows it)."""

    model = ToolCall
    fk_name = "generation"
    show_change_link = True
    fields = ["position", "name", "status", "started_at", "finished_at", "decided_by"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).defer(*TOOL_CALL_TEXT).select_related("decided_by")


@admin.register(Generation)
class GenerationAdmin(RecordAdmin, DateHierarchyMixin, Timings, GenerationFeedback,
                      admin.ModelAdmin):
    list_display = [
        "created_at", "user_link", "conversation_link", "model", "status", "finish_reason",
        "ttft_ms", "duration_s", "prompt_tokens", "cached_tokens", "completion_tokens",
        "usage_source", "http_status", "error_type", "feedback",
    ]
    list_display_links = ["created_at"]
    list_select_related = ["user"]
    list_filter = [
        "status", ModelFilter, FellBackFilter, AnsweredByFilter, "usage_source", ErrorTypeFilter,
        FeedbackFilter,
        ("created_at", admin.DateFieldListFilter),
    ]
    date_hierarchy = "created_at"
    list_per_page = 100
    show_full_result_count = False
    search_help_text = _(
        "User name or e-mail, request id, generation or conversation id; "
        "with the permission to read conversations, their text too."
    )
    change_list_template = "admin/chatstream/generation/change_list.html"
    change_form_template = "admin/chatstream/generation/change_form.html"
    inlines = [AttemptInline, ToolCallInline]
    fieldsets = [
        (None, {"fields": [("status", "finish_reason", "http_status", "error_type"), "reason",
                           "id"]}),
        (_("Where"), {"fields": ["user_detail", "conversation_detail", "retry_of",
                                 "prompt_version", ("step", "follows", "waits_for_tools")]}),
        (_("Provider"), {"fields": [("model", "provider_model"), ("answered_by", "fallbacks"),
                                    ("request_id", "worker"), "upstream_params"]}),
        (_("Timing"), {"fields": [("ttft_ms", "duration_s"),
                                  ("created", "started", "first_token", "completed")]}),
        (_("Usage"), {"fields": [("prompt_tokens", "cached_tokens", "completion_tokens",
                                  "reasoning_tokens", "usage_source")]}),
    ]

    # --- a record: viewable, never added, changed or deleted through the admin (RecordAdmin) --

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return flatten_fieldsets(self.get_fieldsets(request, obj))

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        return [*super().get_fieldsets(request, obj), self.feedback_fieldset(request)]

    # --- queries -------------------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # For sorting by these columns ("slowest first"); the cells read the model's fields.
        # The owner's rating comes in the same query (the feedback column).
        return super().get_queryset(request).annotate(ttft=TTFT_MS, elapsed=DURATION_MS,
                                                      feedback_rating=owner_feedback("rating"))

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return GenerationChangeList

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        # The detail page shows the user and the prompt message: one query.
        queryset = self.get_queryset(request).select_related("user", "prompt_message")
        model = queryset.model
        field = model._meta.pk if from_field is None else model._meta.get_field(from_field)
        try:
            return queryset.get(**{field.name: field.to_python(object_id)})
        except (model.DoesNotExist, ValidationError, ValueError):
            return None

    def get_search_fields(self, request: HttpRequest) -> list[str]:
        # What get_search_results searches (Django shows the search box when this is set).
        fields = [*(f"user__{name}" for name in search.user_fields()), "request_id", "id",
                  "conversation_id"]
        if privacy.can_read_content(request):
            fields += ["content", "prompt_message__content"]
        return fields

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Any], bool]:
        text = privacy.can_read_content(request)
        for term in search.terms(search_term):
            match = search.by_user(term) | Q(request_id=term)
            if uid := search.as_uuid(term):
                match |= Q(pk=uid) | Q(conversation_id=uid)
            if text:
                match |= Q(content__icontains=term) | Q(prompt_message__content__icontains=term)
            queryset = queryset.filter(match)
        return queryset, False

    def lookup_allowed(self, lookup: str, value: Any, request: HttpRequest) -> bool:
        # A query string like ?content__icontains=... would let anyone probe the text.
        if lookup.split("__")[0] in CONTENT_FIELDS and not privacy.can_read_content(request):
            return False
        return super().lookup_allowed(lookup, value, request)

    # --- columns -------------------------------------------------------------------------------

    @admin.display(description=_("user"), ordering="user")
    def user_link(self, obj: Generation) -> str:
        return format_html('<a href="{}" title="{}">{}</a>',
                           changelist_url(user__id__exact=obj.user_id),
                           _("This user's generations"), obj.user)

    @admin.display(description=_("conversation"))
    def conversation_link(self, obj: Generation) -> str:
        return format_html('<a href="{}"><code>{}</code></a>',
                           reverse("admin:chatstream_conversation_change",
                                   args=[obj.conversation_id]),
                           privacy.short_id(obj.conversation_id))

    @admin.display(description=_("user"))
    def user_detail(self, obj: Generation) -> str:
        return format_html('{} · <a href="{}">{}</a>', obj.user,
                           changelist_url(user__id__exact=obj.user_id),
                           _("all generations by this user"))

    @admin.display(description=_("conversation"))
    def conversation_detail(self, obj: Generation) -> str:
        return format_html(
            '<a href="{}"><code>{}</code></a> · <a href="{}">{}</a>',
            reverse("admin:chatstream_conversation_change", args=[obj.conversation_id]),
            obj.conversation_id,
            changelist_url(conversation__id__exact=obj.conversation_id),
            _("all generations in this conversation"),
        )

    @admin.display(description=_("question"))
    def prompt_version(self, obj: Generation) -> str:
        """Which version of an edited message this answers (one query, on this page only)."""
        chain = Versions.of(obj.conversation_id).chain(obj.prompt_message_id)
        if len(chain) == 1:
            return str(_("never edited"))
        return str(_("answers version %(k)d of %(n)d of its message") % {
            "k": chain.index(obj.prompt_message_id) + 1, "n": len(chain)})

    @admin.display(description=_("created"))
    def created(self, obj: Generation) -> str:
        return precise(obj.created_at)

    @admin.display(description=_("started"))
    def started(self, obj: Generation) -> str:
        return precise(obj.started_at)

    @admin.display(description=_("first token"))
    def first_token(self, obj: Generation) -> str:
        return precise(obj.first_token_at)

    @admin.display(description=_("completed"))
    def completed(self, obj: Generation) -> str:
        return precise(obj.completed_at)

    # --- the detail page's text ------------------------------------------------------------------

    def render_change_form(self, request: HttpRequest, context: dict[str, Any],
                           add: bool = False, change: bool = False, form_url: str = "",
                           obj: Any = None) -> HttpResponse:
        allowed = privacy.can_read_content(request)
        context["content_allowed"] = allowed
        context["hidden_notice"] = privacy.HIDDEN
        if obj is not None:
            context["user_generations_url"] = changelist_url(user__id__exact=obj.user_id)
            context["conversation_generations_url"] = changelist_url(
                conversation__id__exact=obj.conversation_id)
            if allowed:
                context["sent_upstream"] = history(obj)
                rendered.keep([obj])
                context["reply_html"] = rendered.reply_html(obj)
                context["reasoning"] = obj.reasoning  # plain text, escaped by the template
                context["tool_calls_json"] = (
                    json.dumps(obj.tool_calls, indent=2, ensure_ascii=False)
                    if obj.tool_calls else ""
                )
                privacy.audit(request, "viewed", generation=obj.pk)
        return super().render_change_form(request, context, add=add, change=change,
                                          form_url=form_url, obj=obj)

    # --- the summary page and exports ----------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("summary/", view(self.summary_view), name=f"{prefix}_summary"),
            path("export.csv", view(self.export_csv_view), name=f"{prefix}_export_csv"),
            path("export.jsonl", view(self.export_jsonl_view), name=f"{prefix}_export_jsonl"),
            *super().get_urls(),
        ]

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        query = request.GET.copy()
        query.pop(PAGE_VAR, None)
        extra_context = {**(extra_context or {}), "export_query": query.urlencode()}
        return super().changelist_view(request, extra_context)

    def summary_view(self, request: HttpRequest) -> TemplateResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return summary.render(self, request)

    def export_csv_view(self, request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
        return self._export(request, "csv")

    def export_jsonl_view(self, request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
        return self._export(request, "jsonl")

    def _export(self, request: HttpRequest, extension: str
                ) -> HttpResponse | StreamingHttpResponse:
        """The list as filtered, searched and ordered on screen, streamed as ``extension``."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        query = request.GET.copy()
        query.pop(PAGE_VAR, None)  # every row, not one page
        request.GET = query  # type: ignore[assignment]  # the change list reads request.GET
        try:
            queryset = self.get_changelist_instance(request).queryset
        except IncorrectLookupParameters:
            return HttpResponseRedirect(f"{changelist_url()}?e=1")
        with_content = privacy.can_read_content(request)
        if with_content:
            privacy.audit(request, "exported", format=extension,
                          filters=request.GET.urlencode() or "-")
        return exports.stream(request, queryset, extension, with_content=with_content)
