"""The generation list as CSV or JSON Lines, streamed row by row.

Rows come from ``QuerySet.iterator(chunk_size=...)``, or ``aiterator`` under ASGI (where Django
reads a synchronous iterator whole into memory before sending a byte), so an export of any size
holds one chunk of rows at a time. A CSV cell that a spreadsheet would run as a formula (text
starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return) gets a leading apostrophe
(OWASP, "CSV Injection"). Text columns are included only for holders of the content permission.
"""

from __future__ import annotations

import csv
import json
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import orjson
from django.contrib.auth import get_user_model
from django.core.handlers.asgi import ASGIRequest
from django.db.models import QuerySet
from django.http import HttpRequest, StreamingHttpResponse
from django.utils import timezone

from ..web.feedback import NAMES, owner_feedback

CHUNK_SIZE = 2000  # rows per database round trip
ROWS_PER_WRITE = 200  # rows joined into one chunk of the response

FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def _ms(end: datetime | None, start: datetime | None) -> int | None:
    return None if end is None or start is None else round((end - start).total_seconds() * 1000)


@dataclass(frozen=True)
class Column:
    """One column: its header, and how to read it from a row of ``QuerySet.values()``."""

    name: str
    fields: tuple[str, ...] = ()  # the values() it needs; default: the field named ``name``
    compute: Callable[..., Any] | None = None  # from those values; default: the one value

    @property
    def sources(self) -> tuple[str, ...]:
        return self.fields or (self.name,)

    def value(self, row: dict[str, Any]) -> Any:
        values = [row[source] for source in self.sources]
        return self.compute(*values) if self.compute else values[0]


def _exact(value: Any) -> str | None:
    """A Decimal as its exact string (JSON has no decimals; a float would round it)."""
    return None if value is None else format(value, "f")


def _rating_name(rating: int | None) -> str | None:
    """A rating as the page and the API name it: "good", "bad", or None when unrated."""
    return NAMES.get(rating) or None


def _username_field() -> str:
    return f"user__{get_user_model().USERNAME_FIELD}"


def metadata_columns() -> list[Column]:
    return [
        Column("id"), Column("created_at"), Column("user_id"),
        Column("username", (_username_field(),)),
        Column("conversation_id"), Column("prompt_message_id"), Column("retry_of_id"),
        Column("model"), Column("provider_model"), Column("status"), Column("reason"),
        Column("finish_reason"), Column("error_type"), Column("http_status"),
        Column("request_id"), Column("worker"), Column("started_at"), Column("first_token_at"),
        Column("completed_at"),
        Column("ttft_ms", ("first_token_at", "started_at"), _ms),
        Column("duration_ms", ("completed_at", "started_at"), _ms),
        Column("prompt_tokens"), Column("cached_tokens"), Column("completion_tokens"),
        Column("reasoning_tokens"), Column("usage_source"), Column("answered_by"),
        Column("cost", (), _exact), Column("currency"),
        Column("feedback", ("feedback_rating",), _rating_name),
    ]


CONTENT_COLUMNS = [
    Column("conversation_title", ("conversation__title",)),
    Column("prompt", ("prompt_message__content",)),
    Column("content"),
    Column("tool_calls"),
    Column("feedback_comment"),
]

# Read through an annotation: the owner's feedback (see chatstream.web.feedback).
ANNOTATIONS = {"feedback_rating": "rating", "feedback_comment": "comment"}


def columns(*, with_content: bool) -> list[Column]:
    return metadata_columns() + (CONTENT_COLUMNS if with_content else [])


def neutralise(text: str) -> str:
    """``text`` made inert for spreadsheets: a leading apostrophe before a formula trigger."""
    return "'" + text if text.startswith(FORMULA_PREFIXES) else text


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, (list, dict)):
        value = json.dumps(value, ensure_ascii=False)
    return neutralise(str(value)) if isinstance(value, (str, UUID)) else str(value)


class _Line:
    """A file-like object whose ``write`` hands back the line (the ``csv`` streaming recipe)."""

    def write(self, value: str) -> str:
        return value


class Format:
    """One export format: a header, then one line per generation."""

    extension = ""
    content_type = ""

    def header(self, cols: list[Column]) -> str:
        return ""

    def row(self, cols: list[Column], row: dict[str, Any]) -> str:
        raise NotImplementedError


class CSVFormat(Format):
    extension = "csv"
    content_type = "text/csv; charset=utf-8"

    def __init__(self) -> None:
        self.writer = csv.writer(_Line())  # one per export: a writer keeps state between rows

    def header(self, cols: list[Column]) -> str:
        return self.writer.writerow([c.name for c in cols])

    def row(self, cols: list[Column], row: dict[str, Any]) -> str:
        return self.writer.writerow([_csv_cell(c.value(row)) for c in cols])


class JSONLinesFormat(Format):
    extension = "jsonl"
    content_type = "application/x-ndjson; charset=utf-8"

    def row(self, cols: list[Column], row: dict[str, Any]) -> str:
        return orjson.dumps({c.name: c.value(row) for c in cols}).decode() + "\n"


FORMATS: dict[str, type[Format]] = {"csv": CSVFormat, "jsonl": JSONLinesFormat}


def prepare(queryset: QuerySet[Any], cols: list[Column]) -> QuerySet[Any, dict[str, Any]]:
    """``queryset`` as plain rows of exactly what ``cols`` read: no model instances."""
    sources = dict.fromkeys(source for column in cols for source in column.sources)
    annotations = {name: owner_feedback(field) for name, field in ANNOTATIONS.items()
                   if name in sources and name not in queryset.query.annotations}
    return queryset.annotate(**annotations).values(*sources)


def _batched(lines: Iterable[str]) -> Iterator[str]:
    batch: list[str] = []
    for line in lines:
        batch.append(line)
        if len(batch) >= ROWS_PER_WRITE:
            yield "".join(batch)
            batch.clear()
    if batch:
        yield "".join(batch)


def iter_lines(queryset: QuerySet[Any], fmt: Format, cols: list[Column]) -> Iterator[str]:
    """The export as text chunks, for WSGI (and the test client)."""
    yield fmt.header(cols)
    rows = queryset.iterator(chunk_size=CHUNK_SIZE)
    yield from _batched(fmt.row(cols, row) for row in rows)


async def aiter_lines(queryset: QuerySet[Any], fmt: Format, cols: list[Column]
                      ) -> AsyncIterator[str]:
    """The export as text chunks, for ASGI: the database is read a chunk at a time."""
    yield fmt.header(cols)
    batch: list[str] = []
    async for row in queryset.aiterator(chunk_size=CHUNK_SIZE):
        batch.append(fmt.row(cols, row))
        if len(batch) >= ROWS_PER_WRITE:
            yield "".join(batch)
            batch.clear()
    if batch:
        yield "".join(batch)


def stream(request: HttpRequest, queryset: QuerySet[Any], extension: str, *,
           with_content: bool) -> StreamingHttpResponse:
    """A download of ``queryset`` as ``extension`` (csv, jsonl), text only ``with_content``."""
    fmt = FORMATS[extension]()
    cols = columns(with_content=with_content)
    queryset = prepare(queryset, cols)
    content: Iterator[str] | AsyncIterator[str]
    if isinstance(request, ASGIRequest):
        content = aiter_lines(queryset, fmt, cols)
    else:
        content = iter_lines(queryset, fmt, cols)
    response = StreamingHttpResponse(content, content_type=fmt.content_type)
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response["Content-Disposition"] = (
        f'attachment; filename="generations-{stamp}.{fmt.extension}"'
    )
    return response
