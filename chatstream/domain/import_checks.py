"""The values of an export file, checked as they are read: the type, the length against the
column, the choices. The first wrong one raises :class:`InvalidExport`, which names where it is
(``conversations[2].generations[0].status``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any
from uuid import UUID

from django.db import models
from django.utils.dateparse import parse_datetime


class InvalidExport(ValueError):
    """The file is not one this version can import; the message says what and where."""


class Checker:
    """Reads typed values out of the file's objects, raising :class:`InvalidExport` with the
    path of the first wrong one."""

    def __init__(self, obj: Any, where: str) -> None:
        if not isinstance(obj, dict):
            raise InvalidExport(f"{where}: expected an object, found {_kind(obj)}.")
        self.obj, self.where = obj, where

    def fail(self, name: str, what: str) -> InvalidExport:
        return InvalidExport(f"{self.where}.{name}: {what}")

    def get(self, name: str, check: Callable[[Any], Any], *, optional: bool = False) -> Any:
        if name not in self.obj:
            if optional:
                return None
            raise self.fail(name, "missing.")
        value = self.obj[name]
        if value is None and optional:
            return None
        try:
            return check(value)
        except InvalidExport:
            raise
        except (TypeError, ValueError) as error:
            raise self.fail(name, f"{error} (found {shown(value)}).") from None

    def text(self, model: type[models.Model], name: str, column: str | None = None) -> str:
        """A string that fits ``model``'s field ``column`` (``name`` by default)."""
        limit = model._meta.get_field(column or name).max_length  # type: ignore[union-attr]
        return self.get(name, lambda v: text_of(v, limit), optional=False)

    def choice(self, name: str, choices: Any) -> str:
        return self.get(name, lambda v: choice_of(v, choices))

    def object(self, name: str, *, optional: bool = False) -> Any:
        """The object ``name`` as a Checker (None if ``optional`` and absent or null)."""
        return self.get(name, lambda v: Checker(v, f"{self.where}.{name}"), optional=optional)

    def items(self, name: str) -> list[Any]:
        return self.get(name, list_of)

    def each(self, name: str) -> list[Checker]:
        return [Checker(item, f"{self.where}.{name}[{i}]")
                for i, item in enumerate(self.items(name))]


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


def shown(value: Any) -> str:
    shown = repr(value) if not isinstance(value, (dict, list)) else _kind(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def text_of(value: Any, limit: int | None) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, not {_kind(value)}")
    if "\x00" in value:
        raise ValueError("a string may not hold a NUL character")
    if limit is not None and len(value) > limit:
        raise ValueError(f"longer than {limit} characters")
    return value


def choice_of(value: Any, choices: Any) -> str:
    if value not in choices.values:
        raise ValueError(f"expected one of {', '.join(choices.values)}")
    return str(value)


def list_of(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, not {_kind(value)}")
    return value


def count(value: Any, limit: int = 2**31 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected a whole number, not {_kind(value)}")
    if not 0 <= value <= limit:
        raise ValueError(f"expected a whole number from 0 to {limit}")
    return value


def small(value: Any) -> int:
    return count(value, 32767)


def step(value: Any) -> int:
    if count(value, 32767) < 1:
        raise ValueError("expected a step from 1 (the reply to the message)")
    return int(value)


def moment(value: Any) -> datetime:
    if not isinstance(value, str) or len(value) > 40:
        raise TypeError("expected a date and time (ISO 8601)")
    parsed = parse_datetime(value)
    if parsed is None or parsed.tzinfo is None:
        raise ValueError("expected a date and time with its offset (ISO 8601)")
    try:  # stored in UTC: year 1 at +01:00 is before the first day a database can hold
        return parsed.astimezone(UTC)
    except OverflowError:
        raise ValueError("expected a date and time from year 1 to 9999 in UTC") from None


def uuid_of(value: Any) -> str:
    if not isinstance(value, str) or len(value) > 36:
        raise TypeError("expected an id (a UUID)")
    return str(UUID(value))


def link(value: Any) -> Any:
    """An id linking one row of the file to another: a UUID (generations) or a number."""
    return count(value, 2**63 - 1) if isinstance(value, int) else uuid_of(value)


def money(value: Any) -> Decimal:
    if not isinstance(value, str) or len(value) > 40:
        raise TypeError("expected a decimal number as a string")
    try:
        amount = Decimal(value)
    except InvalidOperation:
        raise ValueError("expected a decimal number as a string") from None
    if not amount.is_finite() or amount < 0 or amount >= 10**10:
        raise ValueError("expected a decimal number from 0 to 10^10")
    return amount.quantize(Decimal("1e-10"))


def seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e9:
        raise TypeError("expected a number of seconds")
    return float(value)
