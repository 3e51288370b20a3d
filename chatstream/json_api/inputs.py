"""What a JSON API request may send, and the 400 for anything else: its body, its query's
numbers.

A body is a JSON object (RFC 8259: UTF-8, no ``NaN`` or ``Infinity``), or nothing (``{}``);
each field a view reads is of its type, and text is text a database can store (no NUL
character, no half of a surrogate pair, which ``\\ud800`` in JSON can spell). Whatever else a
client sends (other bytes, another content type, a list, a number too long to read, nesting too
deep, a field of the wrong type) is answered 400 with a sentence, before anything is written:
never a 500. So is a query's number or id (``?page=``, ``?before=``) that is not one; one
that names nothing is a 404.
"""

from __future__ import annotations

import json
import re
from typing import Any
from uuid import UUID

from django.http import HttpRequest
from django.http.request import RawPostDataException
from django.utils.translation import gettext as _

from .errors import ApiError

# What no text column stores: PostgreSQL refuses NUL, and no database encodes a lone surrogate.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def body(request: HttpRequest) -> dict[str, Any]:
    """The JSON object posted; {} for an empty body."""
    try:
        raw = request.body
    except RawPostDataException:  # a form, already read by the CSRF check: not JSON
        raise _not_json() from None
    if not raw:
        return {}
    if request.content_type != "application/json":
        raise _not_json()
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, a number too long, too deep
        raise ApiError(400, "invalid_json", _("The request body is not valid JSON.")) from None
    if not isinstance(data, dict):
        raise ApiError(400, "invalid_json", _("The request body must be a JSON object."))
    return data


def text(data: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    """The string field ``name`` of ``data``; None when it is missing or null (unless
    ``required``)."""
    value = data.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise ApiError(400, "invalid", _("%(field)s must be a string.") % {"field": name})
    if _UNSTORABLE.search(value):
        raise ApiError(400, "invalid", _("%(field)s holds a character that cannot be stored (a "
                                         "NUL, or half of a surrogate pair).") % {"field": name})
    return value


def whole_number(request: HttpRequest, name: str) -> int | None:
    """The query's ``name`` as a whole number; None when it is missing or empty."""
    value = request.GET.get(name, "")
    if not value:
        return None
    if not (value.isascii() and value.isdigit() and len(value) <= 18):
        raise ApiError(400, "invalid", _("%(field)s must be a whole number.") % {"field": name})
    return int(value)


def identifier(request: HttpRequest, name: str) -> UUID | None:
    """The query's ``name`` as a record's id (a UUID); None when it is missing or empty."""
    value = request.GET.get(name, "")
    if not value:
        return None
    try:
        return UUID(value)
    except ValueError:
        raise ApiError(400, "invalid", _("%(field)s must be an id.") % {"field": name}) from None


def _not_json() -> ApiError:
    return ApiError(400, "unsupported_content_type",
                    _("Send a JSON object, with Content-Type: application/json."))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
