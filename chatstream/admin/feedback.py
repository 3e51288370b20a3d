"""What users said of their replies, for staff: on the generation list (a column and a filter),
on each generation's page, and in a read-only list of its own.

A rating is metadata; a comment is text the user wrote, shown only with the content
permission (see privacy.py), and each page showing comments is logged. The feedback counted
everywhere is the one by the generation's own user: only they can rate it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from django.contrib import admin
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.defaultfilters import linebreaksbr
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

from ..models import Feedback, Generation
from . import privacy
from .readonly import RecordAdmin

if TYPE_CHECKING:
    FieldNames: TypeAlias = list[str | list[str] | tuple[str, ...]]
    ListDisplay: TypeAlias = list[str | Callable[[Any], str | bool]]

Rating = Feedback.Rating
LABELS: dict[int | None, Any] = dict(Rating.choices)
NOT_RATED = pgettext_lazy("feedback rating", "not rated")


def _owners() -> QuerySet[Feedback]:
    return Feedback.objects.filter(generation=OuterRef("pk"), user=OuterRef("user_id"))


class FeedbackFilter(admin.SimpleListFilter):
    """Generations rated good, rated bad, or not rated by their user (``?rating=``)."""

    title = _("feedback")
    # Not "feedback": a filter's name opens lookups through the relation of that name.
    parameter_name = "rating"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("good", LABELS[Rating.GOOD]), ("bad", LABELS[Rating.BAD]), ("none", NOT_RATED)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value == "none":
            return queryset.exclude(Exists(_owners()))
        if value in ("good", "bad"):
            rating = Rating.GOOD if value == "good" else Rating.BAD
            return queryset.filter(Exists(_owners().filter(rating=rating)))
        return queryset


class GenerationFeedback:
    """The generation admin's feedback column and fields; the list's queryset carries the
    rating as ``feedback_rating`` (chatstream.web.feedback.owner_feedback)."""

    @admin.display(description=_("feedback"), ordering="feedback_rating")
    def feedback(self, obj: Generation) -> str:
        return str(LABELS.get(getattr(obj, "feedback_rating", None), "-"))

    def feedback_fieldset(self, request: HttpRequest) -> tuple[Any, dict[str, Any]]:
        comment = ("feedback_comment" if privacy.can_read_content(request)
                   else "feedback_comment_hidden")
        return (_("Feedback"), {"fields": [("feedback_detail", comment)]})

    def _feedback_of(self, obj: Generation) -> Feedback | None:
        # Read once for the page's two fields.
        if not hasattr(obj, "_owner_feedback"):
            obj._owner_feedback = obj.feedback.filter(  # type: ignore[attr-defined]
                user_id=obj.user_id).first()
        return obj._owner_feedback  # type: ignore[attr-defined]

    @admin.display(description=_("rating"))
    def feedback_detail(self, obj: Generation) -> str:
        feedback = self._feedback_of(obj)
        if feedback is None:
            return str(NOT_RATED)
        return format_html("{} ({})", LABELS[feedback.rating],
                           _("last changed %(when)s") % {"when": date_format(
                               timezone.localtime(feedback.updated_at), "DATETIME_FORMAT")})

    @admin.display(description=_("comment"))
    def feedback_comment(self, obj: Generation) -> str:
        feedback = self._feedback_of(obj)
        if feedback is None or not feedback.comment:
            return "-"
        return linebreaksbr(feedback.comment, autoescape=True)

    @admin.display(description=_("comment"))
    def feedback_comment_hidden(self, obj: Generation) -> str:
        feedback = self._feedback_of(obj)
        return str(privacy.HIDDEN) if feedback is not None and feedback.comment else "-"


@admin.register(Feedback)
class FeedbackAdmin(RecordAdmin, privacy.ContentGuard, admin.ModelAdmin):
    """Every rating, newest change first; the comments for those who may read them."""

    content_fields = frozenset({"comment"})
    audited_as = "feedback"

    list_select_related = ["user", "generation"]
    list_filter = ["rating", ("updated_at", admin.DateFieldListFilter)]
    date_hierarchy = "updated_at"
    list_per_page = 100
    show_full_result_count = False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Feedback goes with its reply: deleted with a conversation or a generation wherever
        # the site lets its staff delete those, never blocking it.
        return self.admin_site.get_model_admin(Generation).has_delete_permission(request)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # The generation's model and date only: never its text.
        return super().get_queryset(request).defer(
            "generation__content", "generation__reasoning", "generation__tool_calls",
            "generation__upstream_messages", "generation__upstream_params")

    def get_list_display(self, request: HttpRequest) -> ListDisplay:
        comment = ["comment_text"] if privacy.can_read_content(request) else []
        return ["updated_at", "rating", "user", "generation_model", "generation_link", *comment]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> FieldNames:
        comment = "comment_text" if privacy.can_read_content(request) else "comment_hidden"
        return ["rating", comment, "user", "generation_model", "generation_link", "created_at",
                "updated_at"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [str(name) for name in self.get_fields(request, obj)]



    def render_change_form(self, request: HttpRequest, context: dict[str, Any],
                           add: bool = False, change: bool = False, form_url: str = "",
                           obj: Any = None) -> HttpResponse:
        if obj is not None and privacy.can_read_content(request):
            privacy.audit(request, "viewed", feedback=obj.pk)
        return super().render_change_form(request, context, add=add, change=change,
                                          form_url=form_url, obj=obj)

    @admin.display(description=_("model"), ordering="generation__model")
    def generation_model(self, obj: Feedback) -> str:
        return obj.generation.model

    @admin.display(description=_("generation"))
    def generation_link(self, obj: Feedback) -> str:
        return format_html('<a href="{}"><code>{}</code></a>',
                           reverse("admin:chatstream_generation_change",
                                   args=[obj.generation_id]),
                           privacy.short_id(obj.generation_id))

    @admin.display(description=_("comment"))
    def comment_text(self, obj: Feedback) -> str:
        return linebreaksbr(obj.comment, autoescape=True) if obj.comment else "-"

    @admin.display(description=_("comment"))
    def comment_hidden(self, obj: Feedback) -> str:
        return str(privacy.HIDDEN)
