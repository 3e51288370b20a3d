"""Search boxes that stay fast on large tables.

Django's admin search ORs ``icontains`` over every search field, joined tables included, so a
search for a user compares every generation's user name in turn. Here a term is matched against
the small user table once (``user_id IN (SELECT ...)``), a request id or a UUID by equality (both
indexed), and text only for staff allowed to read it. As in Django, words are ANDed and
"quoted phrases" stay whole.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from functools import reduce
from uuid import UUID

from django.contrib.auth import get_user_model
from django.core.exceptions import FieldDoesNotExist
from django.db.models import Q
from django.utils.text import smart_split, unescape_string_literal


def terms(search_term: str) -> Iterator[str]:
    """The words of ``search_term``, a quoted phrase counting as one."""
    for bit in smart_split(search_term):
        if bit.startswith(('"', "'")) and bit[0] == bit[-1] and len(bit) > 1:
            bit = unescape_string_literal(bit)
        if bit:
            yield bit


def user_fields() -> list[str]:
    """The user model's name and e-mail fields, as far as it has them."""
    user_model = get_user_model()
    fields = []
    for name in dict.fromkeys([user_model.USERNAME_FIELD, user_model.get_email_field_name()]):
        try:
            user_model._meta.get_field(name)
        except FieldDoesNotExist:
            continue
        fields.append(name)
    return fields


def by_user(term: str, relation: str = "user") -> Q:
    """Rows whose user's name or e-mail contains ``term``."""
    users = get_user_model()._default_manager.filter(
        reduce(operator.or_, (Q(**{f"{field}__icontains": term}) for field in user_fields()))
    )
    return Q(**{f"{relation}__in": users.values("pk")})


def as_uuid(term: str) -> UUID | None:
    try:
        return UUID(term)
    except ValueError:
        return None
