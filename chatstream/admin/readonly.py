"""Records, not documents: admins whose rows are viewed, never added, changed or deleted here."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import flatten
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, QueryDict

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


class PagedInline(ReadOnlyInline):
    """A read-only inline that shows ``per_page`` of its rows at a time, so its page stays the
    same size however many rows the object has: ``?<page_parameter>=N`` on the object's page
    shows the Nth, and the inline links to the pages before and after."""

    per_page = 100
    page_parameter = "page"

    def get_formset(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        formset = super().get_formset(request, obj, **kwargs)
        return type(formset.__name__, (_PageOfRows, formset), {
            "per_page": self.per_page, "page_parameter": self.page_parameter,
            "query": request.GET.copy()})


class _PageOfRows(BaseInlineFormSet):
    """The rows of one page (read once, one more to know whether a next page exists), and the
    addresses of the pages around it (``pages``, for the template)."""

    per_page: int
    page_parameter: str
    query: QueryDict

    def get_queryset(self) -> Any:
        if not hasattr(self, "_page_rows"):
            asked = self.query.get(self.page_parameter) or ""
            number = max(int(asked), 1) if asked.isascii() and asked.isdigit() and len(
                asked) < 7 else 1
            start = (number - 1) * self.per_page
            rows = list(super().get_queryset()[start:start + self.per_page + 1])
            self._page_rows = rows[:self.per_page]
            self.pages = {"number": number,
                          "previous": self._url(number - 1) if number > 1 else "",
                          "next": self._url(number + 1) if len(rows) > self.per_page else ""}
        return self._page_rows

    def _url(self, number: int) -> str:
        query = self.query.copy()
        query[self.page_parameter] = str(number)
        return f"?{query.urlencode()}"
