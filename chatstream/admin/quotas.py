"""Quota admin: user and group overrides, and every account's usage against its limits."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.http import HttpRequest
from django.utils import timezone
from django.utils.formats import number_format
from django.utils.translation import gettext_lazy as _

from .. import quota
from ..models import GroupQuota, QuotaAccount, QuotaCharge, QuotaOverride, UserQuota
from .readonly import RecordAdmin

if TYPE_CHECKING:
    from django_stubs_ext import FieldsetSpec, StrOrPromise

LIMIT_FIELDSETS: FieldsetSpec = (
    (_("Tokens"), {"fields": [("tokens_per_day", "unlimited_tokens_per_day"),
                              ("tokens_per_month", "unlimited_tokens_per_month")]}),
    (_("Requests"), {"fields": [("requests_per_minute", "unlimited_requests_per_minute"),
                                ("concurrent_streams", "unlimited_concurrent_streams"),
                                ("max_prompt_tokens", "unlimited_max_prompt_tokens")]}),
    (_("Money"), {"fields": [("cost_per_day", "unlimited_cost_per_day"),
                             ("cost_per_month", "unlimited_cost_per_month")]}),
    (_("Models"), {"fields": [("allowed_models", "all_models")]}),
)


def _setting(override: QuotaOverride, name: str) -> str:
    if getattr(override, f"unlimited_{name}"):
        return str(_("unlimited"))
    value = getattr(override, name)
    return "-" if value is None else number_format(value, force_grouping=True)


def _column(name: str, label: StrOrPromise) -> Callable[[QuotaOverride], str]:
    @admin.display(description=label)
    def show(obj: QuotaOverride) -> str:
        return _setting(obj, name)

    return show


class OverrideAdmin(admin.ModelAdmin):
    """Shared by user and group overrides: '-' inherits, 'unlimited' is said explicitly."""

    list_display_limits = [
        _column(name, label) for name, label in (
            ("tokens_per_day", _("tokens / 24 h")), ("tokens_per_month", _("tokens / month")),
            ("requests_per_minute", _("requests / min")),
            ("concurrent_streams", _("concurrent")), ("max_prompt_tokens", _("prompt")),
            ("cost_per_day", _("spend / 24 h")), ("cost_per_month", _("spend / month")),
        )
    ]

    @admin.display(description=_("models"))
    def models_column(self, obj: QuotaOverride) -> str:
        if obj.all_models:
            return str(_("all"))
        return obj.allowed_models or "-"


@admin.register(UserQuota)
class UserQuotaAdmin(OverrideAdmin):
    list_display = ["user", *OverrideAdmin.list_display_limits, "models_column", "note",
                    "updated_at"]
    list_select_related = ["user"]
    search_fields = ["user__username", "note"]
    raw_id_fields = ["user"]
    fieldsets = ((None, {"fields": ["user", "note"]}), *LIMIT_FIELDSETS)


@admin.register(GroupQuota)
class GroupQuotaAdmin(OverrideAdmin):
    list_display = ["group", *OverrideAdmin.list_display_limits, "models_column", "note",
                    "updated_at"]
    list_select_related = ["group"]
    search_fields = ["group__name", "note"]
    fieldsets = ((None, {"fields": ["group", "note"]}), *LIMIT_FIELDSETS)


class UsageChangeList(ChangeList):
    """Loads the page's limits and usage in a few queries, not a few per row."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        accounts = list(self.result_list)
        users = [account.user for account in accounts]
        limits = quota.limits_for_many(users)
        usage = quota.usage_for_many([u.pk for u in users], now=timezone.now())
        for account in accounts:
            account.limits = limits[account.pk]
            account.usage = usage[account.pk]


def _against(used: Any, limit: Any, show: Callable[[Any], str] = quota.grouped) -> str:
    return f"{show(used)} / {'∞' if limit is None else show(limit)}"


@admin.register(QuotaAccount)
class QuotaAccountAdmin(RecordAdmin, admin.ModelAdmin):
    """Each user's usage against their limits (read-only; edit limits as overrides)."""

    list_display = ["user", "tokens_day", "tokens_month", "cost_day", "cost_month",
                    "requests_minute", "live", "last_admitted_at", "admissions"]
    list_select_related = ["user"]
    search_fields = ["user__username"]
    ordering = ["-last_admitted_at"]

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return UsageChangeList

    @admin.display(description=_("tokens in 24 h / limit"))
    def tokens_day(self, obj: Any) -> str:
        return _against(obj.usage.tokens_day, obj.limits.tokens_per_day)

    @admin.display(description=_("tokens this month / limit"))
    def tokens_month(self, obj: Any) -> str:
        return _against(obj.usage.tokens_month, obj.limits.tokens_per_month)

    @admin.display(description=_("spent in 24 h / limit"))
    def cost_day(self, obj: Any) -> str:
        return _against(obj.usage.cost_day, obj.limits.cost_per_day, quota.money)

    @admin.display(description=_("spent this month / limit"))
    def cost_month(self, obj: Any) -> str:
        return _against(obj.usage.cost_month, obj.limits.cost_per_month, quota.money)

    @admin.display(description=_("requests in 60 s / limit"))
    def requests_minute(self, obj: Any) -> str:
        return _against(obj.usage.requests_minute, obj.limits.requests_per_minute)

    @admin.display(description=_("live replies / limit"))
    def live(self, obj: Any) -> str:
        return _against(obj.usage.live, obj.limits.concurrent_streams)



@admin.register(QuotaCharge)
class QuotaChargeAdmin(RecordAdmin, admin.ModelAdmin):
    """The ledger: one row per admitted reply, its hold and what it was charged."""

    list_display = ["at", "user", "model", "reserved", "charged", "reserved_cost",
                    "charged_cost", "source", "settled_at"]
    list_select_related = ["user"]
    list_filter = ["source", "model"]
    search_fields = ["user__username", "=generation_id"]
    date_hierarchy = "at"

