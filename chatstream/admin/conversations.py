"""The conversation admin: read-only, with its messages and generations inline, a page of
each at a time (``?messages=N``, ``?generations=N``): a conversation's page stays the same size
however long the conversation, or however often its messages were retried.

A conversation's title is the start of its first message, so it counts as text. ``str()`` of a
conversation is its short id, for everyone and everywhere Django names it (autocomplete,
delete pages, the admin log); the title is shown by this admin's own columns and headings,
only to staff with the content permission. Messages are not registered on their own: they are
read in their conversation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from django.contrib import admin
from django.contrib.admin.utils import flatten_fieldsets, unquote
from django.core.exceptions import PermissionDenied
from django.core.handlers.asgi import ASGIRequest
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.template.defaultfilters import linebreaksbr
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from ..domain import exports
from ..models import Conversation, Generation, Message
from . import privacy, search
from .dates import DateHierarchyMixin
from .generations import Timings, changelist_url
from .readonly import PagedInline, RecordAdmin

if TYPE_CHECKING:
    # What django-stubs expects from get_fields and get_list_display (its own aliases are
    # private); a plain list[str] does not match, lists being invariant.
    FieldNames: TypeAlias = list[str | list[str] | tuple[str, ...]]
    ListDisplay: TypeAlias = list[str | Callable[[Any], str | bool]]


def _admin_change_url(model_name: str, pk: Any) -> str:
    return reverse(f"admin:chatstream_{model_name}_change", args=[pk])


def label(conversation: Conversation, request: HttpRequest) -> str:
    """The conversation's title for those who may read it, its short id for everyone else."""
    if privacy.can_read_content(request) and conversation.title:
        return conversation.title
    return str(conversation)


class Labelled:
    """``obj`` whose ``str()`` is ``text``: for templates that name the object they show."""

    def __init__(self, obj: Any, text: str) -> None:
        self._obj, self._text = obj, text

    def __str__(self) -> str:
        return self._text

    def __getattr__(self, name: str) -> Any:
        return getattr(self._obj, name)


class MessageInline(PagedInline):
    model = Message
    fk_name = "conversation"
    page_parameter = "messages"

    def get_fields(self, request: HttpRequest, obj: Any = None) -> FieldNames:
        text = "text" if privacy.can_read_content(request) else "text_hidden"
        return ["number", "created_at", "role", text, "version", "generation_link"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # The version that replaced each edited message, in the same query.
        return super().get_queryset(request).annotate(replaced_by=Subquery(
            Message.objects.filter(edit_of=OuterRef("pk")).order_by("pk").values("pk")[:1]))

    @admin.display(description=_("message"))
    def number(self, obj: Message) -> str:
        # An anchor for the version links below.
        return format_html('<span id="message-{}">#{}</span>', obj.pk, obj.pk)

    @admin.display(description=_("version"))
    def version(self, obj: Message) -> str:
        links = []
        if obj.edit_of_id is not None:
            links.append(format_html('{} <a href="#message-{}">#{}</a>', _("edit of"),
                                     obj.edit_of_id, obj.edit_of_id))
        replaced_by = getattr(obj, "replaced_by", None)
        if replaced_by is not None:
            links.append(format_html('{} <a href="#message-{}">#{}</a>', _("edited as"),
                                     replaced_by, replaced_by))
        return format_html_join(" · ", "{}", ((link,) for link in links)) if links else "-"

    @admin.display(description=_("content"))
    def text(self, obj: Message) -> str:
        return linebreaksbr(obj.content, autoescape=True)

    @admin.display(description=_("content"))
    def text_hidden(self, obj: Message) -> str:
        return str(privacy.HIDDEN)

    @admin.display(description=_("generation"))
    def generation_link(self, obj: Message) -> str:
        if obj.generation_id is None:
            return "-"
        return format_html('<a href="{}"><code>{}</code></a>',
                           _admin_change_url("generation", obj.generation_id),
                           privacy.short_id(obj.generation_id))


class GenerationInline(Timings, PagedInline):
    model = Generation
    fk_name = "conversation"
    page_parameter = "generations"
    show_change_link = True
    fields = ["created_at", "model", "status", "finish_reason", "ttft_ms", "duration_s",
              "prompt_tokens", "completion_tokens", "error_type"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).defer(
            "content", "tool_calls", "upstream_messages").order_by(
            "created_at", "pk")


@admin.register(Conversation)
class ConversationAdmin(RecordAdmin, DateHierarchyMixin, privacy.ContentGuard,
                        admin.ModelAdmin):
    content_fields = frozenset({"title"})
    list_display_links = None
    list_select_related = ["user"]
    list_filter = ["model", ("updated_at", admin.DateFieldListFilter)]
    date_hierarchy = "updated_at"
    list_per_page = 100
    show_full_result_count = False
    view_on_site = False
    search_help_text = _(
        "User name or e-mail, or conversation id; "
        "with the permission to read conversations, their title too."
    )
    inlines = [MessageInline, GenerationInline]
    change_form_template = "admin/chatstream/conversation/change_form.html"

    def get_list_display(self, request: HttpRequest) -> ListDisplay:
        name = "title_link" if privacy.can_read_content(request) else "id_link"
        return [name, "user", "model", "created_at", "updated_at", "generations_link"]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> FieldNames:
        title = ["title"] if privacy.can_read_content(request) else []
        return ["id", *title, "user", "model", "created_at", "updated_at", "generations_link"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return flatten_fieldsets(self.get_fieldsets(request, obj))

    def get_search_fields(self, request: HttpRequest) -> list[str]:
        # What get_search_results searches (Django shows the search box when this is set).
        fields = [*(f"user__{name}" for name in search.user_fields()), "id"]
        if privacy.can_read_content(request):
            fields.append("title")
        return fields

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Any],
                           search_term: str) -> tuple[QuerySet[Any], bool]:
        text = privacy.can_read_content(request)
        for term in search.terms(search_term):
            match = search.by_user(term)
            if uid := search.as_uuid(term):
                match |= Q(pk=uid)
            if text:
                match |= Q(title__icontains=term)
            queryset = queryset.filter(match)
        return queryset, False

    def has_content_permission(self, request: HttpRequest) -> bool:
        """What the export action asks: the permission to read users' text."""
        return privacy.can_read_content(request)

    @admin.action(description=_("Export selected conversations (JSON)"),
                  permissions=["content"])
    def export_selected(self, request: HttpRequest,
                        queryset: QuerySet[Any]) -> StreamingHttpResponse:
        """The selected conversations in the users' export format (docs/export.md),
        streamed a batch at a time; audited, as every page that shows text."""
        privacy.audit(request, "exported", conversations=queryset.count())
        rows = Conversation.objects.filter(pk__in=queryset.values("pk"))
        content = (exports.aiter_export(rows) if isinstance(request, ASGIRequest)
                   else exports.iter_export(rows))
        response = StreamingHttpResponse(content, content_type="application/json")
        response["Content-Disposition"] = (
            f'attachment; filename="{exports.file_name(None, "json")}"')
        return response

    actions = ["export_selected"]

    def history_view(self, request: HttpRequest, object_id: str,
                     extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # Refused without the permission: a log entry keeps the name it was written with, and
        # a site's own code may have written one naming the conversation by its title.
        # chatstream itself logs nothing here: conversations are not edited in the admin.
        if not privacy.can_read_content(request):
            raise PermissionDenied
        obj = self.get_object(request, unquote(object_id))
        if obj is not None:
            named = label(obj, request)
            extra_context = {**(extra_context or {}), "object": Labelled(obj, named),
                             "title": _("Change history: %s") % named}
            privacy.audit(request, "viewed", conversation=obj.pk, page="history")
        return super().history_view(request, object_id, extra_context)

    def render_change_form(self, request: HttpRequest, context: dict[str, Any],
                           add: bool = False, change: bool = False, form_url: str = "",
                           obj: Any = None) -> HttpResponse:
        if obj is not None:
            context["subtitle"] = label(obj, request)
            # The breadcrumbs name the object with str(): its title, which is text.
            context["original"] = Labelled(obj, context["subtitle"])
            context["content_allowed"] = privacy.can_read_content(request)
            if context["content_allowed"]:
                privacy.audit(request, "viewed", conversation=obj.pk)
        return super().render_change_form(request, context, add=add, change=change,
                                          form_url=form_url, obj=obj)

    @admin.display(description=_("title"), ordering="title")
    def title_link(self, obj: Conversation) -> str:
        return format_html('<a href="{}">{}</a>', _admin_change_url("conversation", obj.pk),
                           obj.title or _("(untitled)"))

    @admin.display(description=_("conversation"))
    def id_link(self, obj: Conversation) -> str:
        return format_html('<a href="{}"><code>{}</code></a>',
                           _admin_change_url("conversation", obj.pk), privacy.short_id(obj.pk))

    @admin.display(description=_("generations"))
    def generations_link(self, obj: Conversation) -> str:
        return format_html('<a href="{}">{}</a>', changelist_url(conversation__id__exact=obj.pk),
                           _("generations"))
