"""A generation's final fields, fitted to their columns whatever the provider sent.

A final save refused by the database would lose the reply's last text and leave its row
``streaming``; no provider data may cause one, on any database. So every value is fitted to its
column, from the model's own field definitions:

- every string, in text and JSON columns too (the reply, its reasoning, the tool calls), has NUL
  (which PostgreSQL's ``text`` and ``jsonb`` refuse) and lone surrogates (which no UTF-8 column
  takes) replaced by U+FFFD: one character for one, so a reply's length (its stream ids) holds;
- a string in a ``CharField`` (the provider's ``finish_reason``, its model name, the request id
  header) is cut to the column's ``max_length``, and every character of it that is not printable
  (controls, line and paragraph separators, format characters) becomes U+FFFD: such a value is
  shown and logged as one short line, which nothing in it can break;
- a number in JSON that is not finite (which ``jsonb`` refuses) becomes null, an integer outside
  its column's portable range (usage counts, the HTTP status) None.
"""

from __future__ import annotations

import math
import re
from typing import Any

from django.db import models
from django.db.backends.base.operations import BaseDatabaseOperations

REPLACEMENT = "\ufffd"

# What no database column takes: NUL, and halves of a surrogate pair (a str can hold one alone).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")

# The narrowest range each integer field has on a database Django supports.
_RANGES = BaseDatabaseOperations.integer_field_ranges


def text(value: str) -> str:
    """``value`` with NUL and lone surrogates replaced by U+FFFD (its length unchanged)."""
    if "\x00" not in value and value.isascii():
        return value
    return _UNSTORABLE.sub(REPLACEMENT, value)


def line(value: str, length: int) -> str:
    """``value`` cut to ``length`` characters, each unprintable one replaced by U+FFFD."""
    value = value[:length]
    if value.isprintable():
        return value
    return "".join(c if c.isprintable() else REPLACEMENT for c in value)


def fit(model: type[models.Model], fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` (column name to value, for ``model``) with each value fitted to its column."""
    return {name: _fitted(model._meta.get_field(name), value) for name, value in fields.items()}


def _fitted(field: Any, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(field, models.CharField) and isinstance(value, str):
        return line(value, field.max_length or len(value))
    if isinstance(field, models.JSONField):
        return _json(value)
    if isinstance(value, str):
        return text(value)
    if isinstance(field, models.IntegerField) and isinstance(value, int):
        low, high = _RANGES.get(field.get_internal_type(), (-math.inf, math.inf))
        if not low <= value <= high:
            return None if field.null else min(max(value, low), high)
    return value


def _json(value: Any) -> Any:
    if isinstance(value, str):
        return text(value)
    if isinstance(value, dict):
        return {text(str(key)): _json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
