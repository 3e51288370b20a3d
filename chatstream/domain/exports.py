"""A user's conversations as a file: JSON (the versioned format ``chatstream-export``, which
:mod:`chatstream.domain.imports` reads back) or Markdown (for reading).

The JSON holds, per conversation, every message (every version of an edited one, linked by
``edit_of``) and every generation (its status, usage, cost, reasoning, tool calls, upstream
attempts and the owner's feedback); docs/export.md describes it field by field. A cost is a
Decimal, written as its exact string. All of a user's data is written a batch of conversations
at a time (:func:`iter_export`, :func:`aiter_export`): the memory it takes is one
batch's, whatever the size of the history.

In Markdown, a message's text is a block quote (every line of it starts with ``> ``): whatever
it holds (a heading, a code fence left open, HTML), it stays inside its quote, so it cannot
forge the export's own headings, which are outside any quote. The title and the other
one-line values are escaped (every ASCII punctuation character gets a backslash).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable, Iterator
from datetime import datetime
from decimal import Decimal
from typing import Any

import orjson
from asgiref.sync import sync_to_async
from django.db.models import Prefetch, QuerySet
from django.utils import timezone
from django.utils.text import slugify
from django.utils.translation import gettext as _

from ..models import Attempt, Conversation, Feedback, Generation, Message, ToolCall

FORMAT = "chatstream-export"
VERSION = 1
BATCH_SIZE = 20  # conversations read (and written out) together

RATING_NAMES: dict[int, str] = {Feedback.Rating.GOOD: "good", Feedback.Rating.BAD: "bad"}

MESSAGE_FIELDS = ("id", "role", "content", "created_at")
GENERATION_FIELDS = (
    "id", "step", "model", "provider_model", "answered_by", "status", "reason",
    "finish_reason", "error_type", "http_status", "request_id", "content", "reasoning",
    "created_at", "started_at", "first_token_at", "completed_at", "currency",
)
USAGE_FIELDS = {"prompt_tokens": "prompt_tokens", "cached_tokens": "cached_tokens",
                "completion_tokens": "completion_tokens",
                "reasoning_tokens": "reasoning_tokens", "source": "usage_source"}
TOOL_CALL_FIELDS = ("id", "position", "call_id", "name", "arguments", "status", "result",
                    "created_at", "decided_at", "started_at", "finished_at")
ATTEMPT_FIELDS = ("number", "model", "status", "http_status", "error_type", "retry_after",
                  "request_id", "started_at", "first_token_at", "finished_at")


def exact(value: Decimal | None) -> str | None:
    """A Decimal as its exact string (JSON has no decimals; a float would round it)."""
    return None if value is None else format(value, "f")


def _pick(obj: Any, names: Iterable[str]) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in names}


def message_data(message: Message) -> dict[str, Any]:
    return {**_pick(message, MESSAGE_FIELDS), "edit_of": message.edit_of_id,
            "generation": message.generation_id}


def generation_data(generation: Generation, owner_id: Any) -> dict[str, Any]:
    feedback = next((f for f in generation.feedback.all() if f.user_id == owner_id), None)
    return {
        **_pick(generation, GENERATION_FIELDS),
        "prompt_message": generation.prompt_message_id,
        "retry_of": generation.retry_of_id,
        "follows": generation.follows_id,
        "usage": {name: getattr(generation, field) for name, field in USAGE_FIELDS.items()},
        "cost": exact(generation.cost),
        "tool_calls": [_pick(call, TOOL_CALL_FIELDS) for call in generation.calls.all()],
        "attempts": [_pick(attempt, ATTEMPT_FIELDS) for attempt in generation.attempts.all()],
        "feedback": None if feedback is None else {
            "rating": RATING_NAMES.get(feedback.rating, ""), "comment": feedback.comment,
            "created_at": feedback.created_at, "updated_at": feedback.updated_at},
    }


def with_history(conversations: QuerySet[Conversation]) -> QuerySet[Conversation]:
    """``conversations`` with what their export reads, in a fixed number of queries."""
    generations = Generation.objects.defer(
        "content_html", "upstream_messages", "upstream_params", "tool_calls", "fallbacks",
    ).order_by("created_at", "pk").prefetch_related(
        Prefetch("calls", ToolCall.objects.order_by("position")),
        Prefetch("attempts", Attempt.objects.order_by("number")),
        "feedback")
    return conversations.prefetch_related(
        Prefetch("messages", Message.objects.order_by("created_at", "pk")),
        Prefetch("generations", generations))


def conversation_data(conversation: Conversation) -> dict[str, Any]:
    """One conversation as the format holds it (read through :func:`with_history`)."""
    return {
        "id": conversation.pk, "title": conversation.title, "model": conversation.model,
        "created_at": conversation.created_at, "updated_at": conversation.updated_at,
        "messages": [message_data(m) for m in conversation.messages.all()],
        "generations": [generation_data(g, conversation.user_id)
                        for g in conversation.generations.all()],
    }


def _header(user: Any) -> dict[str, Any]:
    return {"format": FORMAT, "version": VERSION, "exported_at": timezone.now(),
            "user": {"username": user.get_username()} if user is not None else None}


def dumps(document: dict[str, Any]) -> bytes:
    return orjson.dumps(document, option=orjson.OPT_INDENT_2)


def conversations_json(conversations: Iterable[Conversation], user: Any = None) -> bytes:
    """A whole export file of ``conversations`` (read through :func:`with_history`)."""
    return dumps({**_header(user), "conversations": [conversation_data(c)
                                                      for c in conversations]})


# -- all of a user's data, streamed ---------------------------------------------------------


def _opening(user: Any) -> bytes:
    head = orjson.dumps(_header(user))
    return head[:-1] + b',"conversations":['


def _batch(conversations: QuerySet[Conversation], after: Any, first: bool
           ) -> tuple[bytes, Any]:
    """The next batch of ``conversations`` after the id ``after`` (None: the first), as the
    text that goes into the ``conversations`` list; and the last id written (None once there is
    none left). Ids are read a batch at a time (keyset pagination): no cursor stays open
    between two batches."""
    pks = conversations.order_by("pk")
    if after is not None:
        pks = pks.filter(pk__gt=after)
    ids = list(pks.values_list("pk", flat=True)[:BATCH_SIZE])
    if not ids:
        return b"]}\n", None
    batch = with_history(conversations.model.objects.using(conversations.db)
                         .filter(pk__in=ids).order_by("pk"))
    parts = []
    for conversation in batch:
        parts.append(orjson.dumps(conversation_data(conversation)))
        _release(conversation)
    return (b"" if first else b",") + b",".join(parts), ids[-1]


def _release(conversation: Conversation) -> None:
    """Drop what the prefetch keeps on ``conversation``: each row it read points back to its
    parent, a cycle only the garbage collector's full passes would free, so a long export
    would hold every batch it wrote until one ran."""
    for generation in conversation.generations.all():
        generation._prefetched_objects_cache.clear()  # type: ignore[attr-defined]
    conversation._prefetched_objects_cache.clear()  # type: ignore[attr-defined]


def of_user(user: Any, using: str = "default") -> QuerySet[Conversation]:
    return Conversation.objects.using(using).filter(user_id=user.pk)


def iter_export(conversations: QuerySet[Conversation], user: Any = None) -> Iterator[bytes]:
    """``conversations`` (all of ``user``'s: :func:`of_user`) as one JSON file, a chunk per
    batch of conversations."""
    yield _opening(user)
    after, first = None, True
    while True:
        chunk, after = _batch(conversations, after, first)
        yield chunk
        if after is None:
            return
        first = False


async def aiter_export(conversations: QuerySet[Conversation], user: Any = None
                       ) -> AsyncIterator[bytes]:
    """:func:`iter_export` for ASGI: each batch read on the request's thread for the
    database, never on the event loop; Django's ASGI handler would read a sync iterator whole
    before sending a byte."""
    yield _opening(user)
    after, first = None, True
    while True:
        chunk, after = await sync_to_async(_batch)(conversations, after, first)
        yield chunk
        if after is None:
            return
        first = False


def file_name(conversation: Conversation | None, extension: str) -> str:
    """A file name that is safe in a header and on any disk: ASCII letters, digits, dashes."""
    if conversation is None:
        return f"chatstream-export-{timezone.now():%Y%m%d-%H%M%S}.{extension}"
    stem = slugify(conversation.title)[:50].strip("-") or "conversation"
    return f"{stem}-{str(conversation.pk)[:8]}.{extension}"


# -- Markdown -------------------------------------------------------------------------------

_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
_LINE_ENDS = re.compile(r"\r\n|\r|\n")


def inline(text: str) -> str:
    """``text`` as one line of Markdown that shows as written: line ends made spaces, every
    ASCII punctuation character escaped."""
    return _PUNCTUATION.sub(r"\\\1", _LINE_ENDS.sub(" ", text))


def quoted(text: str) -> str:
    """``text`` as a block quote: every line starts with ``> ``, so nothing in it reaches the
    document's level (CommonMark ends any block opened inside a quote with the quote)."""
    return "\n".join(f"> {line}" if line else ">" for line in _LINE_ENDS.split(text))


def _when(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment else "-"


def _reply_markdown(generation: Generation, owner_id: Any) -> list[str]:
    heading = _("Reply from %(model)s, %(status)s") % {
        "model": inline(generation.answered_by or generation.model),
        "status": generation.get_status_display()}
    out = [f"### {heading} ({_when(generation.created_at)})", ""]
    if generation.reasoning:
        out += ["*" + _("Reasoning") + "*", "", quoted(generation.reasoning), ""]
    for call in generation.calls.all():
        called = _("Tool call %(name)s, %(status)s") % {
            "name": inline(call.name), "status": call.get_status_display()}
        out += [f"*{called}*", "", quoted(call.arguments), ""]
        if call.result:
            out += ["*" + _("Result") + "*", "", quoted(call.result), ""]
    if generation.content:
        out += [quoted(generation.content), ""]
    feedback = next((f for f in generation.feedback.all() if f.user_id == owner_id), None)
    if feedback is not None:
        rated = _("Your rating: %(rating)s") % {"rating": feedback.get_rating_display()}
        out += [f"*{rated}*", ""]
        if feedback.comment:
            out += [quoted(feedback.comment), ""]
    return out


def conversation_markdown(conversation: Conversation) -> str:
    """The conversation for reading: each user message (every version) and its replies, with
    their reasoning, tool calls and the owner's ratings (read through :func:`with_history`)."""
    replies: dict[int, list[Generation]] = {}
    for generation in conversation.generations.all():
        replies.setdefault(generation.prompt_message_id, []).append(generation)
    edited = {m.edit_of_id for m in conversation.messages.all() if m.edit_of_id}
    facts = ((_("Model"), inline(conversation.model) or "-"),
             (_("Created"), _when(conversation.created_at)),
             (_("Exported"), _when(timezone.now())))
    title = conversation.title or _("(untitled)")
    out = [f"# {inline(title)}", "",
           *(f"- {label}: {value}" for label, value in facts), ""]
    for message in conversation.messages.all():
        if message.role != Message.Role.USER:
            continue  # a reply is written from its generation, below its question
        label = _("You") if message.pk not in edited else _("You (a version edited later)")
        out += [f"## {label} ({_when(message.created_at)})", "", quoted(message.content), ""]
        for generation in replies.get(message.pk, []):
            out += _reply_markdown(generation, conversation.user_id)
    return "\n".join(out)
