"""A generation's upstream calls (its attempts) on its page, the list filtered by whether a
fallback answered, and the models cooling down after failing (their circuit breakers), which
staff may end early by deleting them.

An attempt holds no text of the user's: who may view a generation sees its attempts.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import F, Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..conf import conf
from ..models import Attempt, Cooldown
from .readonly import ReadOnlyInline
from .timing import milliseconds, precise

# A generation answered by another model than the one asked: a fallback stood in for it.
FELL_BACK = ~Q(answered_by="") & ~Q(answered_by=F("model"))


class AttemptInline(ReadOnlyInline):
    """A generation's upstream calls in order: the first, its retries, its fallbacks."""

    model = Attempt
    fk_name = "generation"
    fields = ["number", "model", "status", "http_status", "error_type", "retry_after_s",
              "started", "ttft_ms", "finished"]

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Part of the generation's record, with no text in it: its viewers see it.
        return request.user.has_perm("chatstream.view_generation")

    @admin.display(description=_("retry after (s)"))
    def retry_after_s(self, obj: Attempt) -> str:
        return "-" if obj.retry_after is None else f"{obj.retry_after:g}"

    @admin.display(description=_("started"))
    def started(self, obj: Attempt) -> str:
        return precise(obj.started_at)

    @admin.display(description=_("TTFT (ms)"))
    def ttft_ms(self, obj: Attempt) -> str:
        if obj.first_token_at is None:
            return "-"
        return str(milliseconds(obj.first_token_at - obj.started_at))

    @admin.display(description=_("finished"))
    def finished(self, obj: Attempt) -> str:
        return precise(obj.finished_at)


class YesNoFilter(admin.SimpleListFilter):
    """Two choices: the rows that match (``yes``), or the others (``no``)."""

    answers: tuple[Any, Any] = (_("Yes"), _("No"))

    def matching(self) -> Q:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("yes", self.answers[0]), ("no", self.answers[1])]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "yes":
            return queryset.filter(self.matching())
        if self.value() == "no":
            return queryset.exclude(self.matching())
        return queryset


class FellBackFilter(YesNoFilter):
    """Generations a fallback answered (``answered_by`` set and not the model asked)."""

    title = _("fell back")
    parameter_name = "fell_back"
    answers = (_("Yes: a fallback answered"), _("No"))

    def matching(self) -> Q:
        return FELL_BACK


class RunningFilter(YesNoFilter):
    title = _("still running")
    parameter_name = "running"
    answers = (_("Yes"), _("No: ended"))

    def matching(self) -> Q:
        return Q(until__gt=timezone.now())


@admin.register(Cooldown)
class CooldownAdmin(admin.ModelAdmin):
    """The models no call goes to until their cooldown ends. Never added or changed here (the
    breaker writes them); deleting one (Django's delete permission) ends it at once."""

    list_display = ["model", "label", "cooling_until", "error_type", "running", "updated"]
    list_filter = [RunningFilter]
    ordering = ["-until"]
    readonly_fields = ("model", "label", "cooling_until", "error_type", "running", "updated")
    fields = readonly_fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=_("label"))
    def label(self, obj: Cooldown) -> str:
        model = conf.get_model(obj.model)
        return model.label if model is not None else "-"

    @admin.display(description=_("cooling down until"), ordering="until")
    def cooling_until(self, obj: Cooldown) -> str:
        return precise(obj.until)

    @admin.display(description=_("still running"), boolean=True)
    def running(self, obj: Cooldown) -> bool:
        return obj.until > timezone.now()

    @admin.display(description=_("updated"), ordering="updated_at")
    def updated(self, obj: Cooldown) -> str:
        return precise(obj.updated_at)
