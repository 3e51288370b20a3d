"""Records, not documents: admins whose rows are viewed, never added, changed or deleted here."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import flatten
from django.http import HttpRequest

INLINE_TEMPLATE = "admin/chatstream/edit_inline/readonly_tabular.html"


class RecordAdmin:
    """Mixin for a ModelAdmin of records: view permission only."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyInline(RecordAdmin, admin.TabularInline):
    template = INLINE_TEMPLATE
    extra = 0
    can_delete = False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return flatten(self.get_fields(request, obj))
