"""An export file (the format of :mod:`chatstream.domain.exports`) read back as history.

The file is treated as hostile: it is refused over :data:`MAX_BYTES`, and every value is
checked (its type, its length against its column, the choices, the links between rows) before
anything is written; the first problem found is raised as :class:`InvalidExport`, which names
where it is (``conversations[2].generations[0].status``). Everything is written in one
transaction: a file is imported whole or not at all.

What is written is history only, for the user named by the caller (the file's user is
ignored): every status is a final one, so nothing can run. A generation ``pending`` or
``streaming`` in the file (an export taken while a reply was being written) becomes
``interrupted``, its text kept, as the sweeper ends a reply whose worker died; refusing it
would refuse the whole file for one reply. A tool call that had not started
(``pending_approval``, ``approved``) becomes ``cancelled``; one ``running`` becomes ``lost``
(its outcome is unknown). No ``QuotaCharge`` is written and no provider is called: the
history was paid for where it was made. The ids in the file only link its rows together; the
rows get new ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any
from uuid import UUID

import orjson
from django.db import models, transaction
from django.utils.dateparse import parse_datetime

from ..models import Attempt, Conversation, Feedback, Generation, Message, ToolCall
from ..tools import step_messages
from . import exports

MAX_BYTES = 64 * 1024 * 1024  # the largest file read; a bigger one is refused unread

LIVE_BECOMES = {Generation.Status.PENDING: Generation.Status.INTERRUPTED,
                Generation.Status.STREAMING: Generation.Status.INTERRUPTED}
CALL_BECOMES = {ToolCall.Status.PENDING_APPROVAL: ToolCall.Status.CANCELLED,
                ToolCall.Status.APPROVED: ToolCall.Status.CANCELLED,
                ToolCall.Status.RUNNING: ToolCall.Status.LOST}
RATINGS = {name: value for value, name in exports.RATING_NAMES.items()}


class InvalidExport(ValueError):
    """The file is not one this version can import; the message says what and where."""


@dataclass
class Imported:
    """What an import wrote, per model."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("conversations", "messages", "generations", "tool_calls", "attempts", "feedback"), 0))
    conversations: list[Conversation] = field(default_factory=list)


# -- checking -------------------------------------------------------------------------------


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
            raise self.fail(name, f"{error} (found {_shown(value)}).") from None

    def text(self, model: type[models.Model], name: str, column: str | None = None) -> str:
        """A string that fits ``model``'s field ``column`` (``name`` by default)."""
        limit = model._meta.get_field(column or name).max_length  # type: ignore[union-attr]
        return self.get(name, lambda v: _text(v, limit), optional=False)

    def choice(self, name: str, choices: Any) -> str:
        return self.get(name, lambda v: _choice(v, choices))

    def object(self, name: str, *, optional: bool = False) -> Any:
        """The object ``name`` as a Checker (None if ``optional`` and absent or null)."""
        return self.get(name, lambda v: Checker(v, f"{self.where}.{name}"), optional=optional)

    def items(self, name: str) -> list[Any]:
        return self.get(name, _list)

    def each(self, name: str) -> list[Checker]:
        return [Checker(item, f"{self.where}.{name}[{i}]")
                for i, item in enumerate(self.items(name))]


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


def _shown(value: Any) -> str:
    shown = repr(value) if not isinstance(value, (dict, list)) else _kind(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _text(value: Any, limit: int | None) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, not {_kind(value)}")
    if "\x00" in value:
        raise ValueError("a string may not hold a NUL character")
    if limit is not None and len(value) > limit:
        raise ValueError(f"longer than {limit} characters")
    return value


def _choice(value: Any, choices: Any) -> str:
    if value not in choices.values:
        raise ValueError(f"expected one of {', '.join(choices.values)}")
    return str(value)


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, not {_kind(value)}")
    return value


def _count(value: Any, limit: int = 2**31 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected a whole number, not {_kind(value)}")
    if not 0 <= value <= limit:
        raise ValueError(f"expected a whole number from 0 to {limit}")
    return value


def _small(value: Any) -> int:
    return _count(value, 32767)


def _moment(value: Any) -> datetime:
    if not isinstance(value, str) or len(value) > 40:
        raise TypeError("expected a date and time (ISO 8601)")
    parsed = parse_datetime(value)
    if parsed is None or parsed.tzinfo is None:
        raise ValueError("expected a date and time with its offset (ISO 8601)")
    return parsed


def _uuid(value: Any) -> str:
    if not isinstance(value, str) or len(value) > 36:
        raise TypeError("expected an id (a UUID)")
    return str(UUID(value))


def _link(value: Any) -> Any:
    """An id linking one row of the file to another: a UUID (generations) or a number."""
    return _count(value, 2**63 - 1) if isinstance(value, int) else _uuid(value)


def _money(value: Any) -> Decimal:
    if not isinstance(value, str) or len(value) > 40:
        raise TypeError("expected a decimal number as a string")
    try:
        amount = Decimal(value)
    except InvalidOperation:
        raise ValueError("expected a decimal number as a string") from None
    if not amount.is_finite() or amount < 0 or amount >= 10**10:
        raise ValueError("expected a decimal number from 0 to 10^10")
    return amount.quantize(Decimal("1e-10"))


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e9:
        raise TypeError("expected a number of seconds")
    return float(value)


def load(data: bytes) -> dict[str, Any]:
    """The file's document, its format and version checked."""
    if len(data) > MAX_BYTES:
        raise InvalidExport(f"The file is {len(data)} bytes; the largest accepted is "
                            f"{MAX_BYTES}.")
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        raise InvalidExport(f"Not JSON: {error}.") from None
    top = Checker(document, "file")
    if document.get("format") != exports.FORMAT:
        raise top.fail("format", f'expected "{exports.FORMAT}" (found '
                                 f"{_shown(document.get('format'))}).")
    version = document.get("version")
    if isinstance(version, bool) or version != exports.VERSION:
        raise top.fail("version", f"this version of chatstream reads version "
                                  f"{exports.VERSION} (found {_shown(version)}).")
    top.items("conversations")
    return document


# -- writing --------------------------------------------------------------------------------


def import_export(data: bytes, user: Any, *, using: str = "default") -> Imported:
    """Write the export file ``data`` as ``user``'s history, whole or not at all."""
    document = load(data)
    result = Imported()
    with transaction.atomic(using=using):
        for item in Checker(document, "file").each("conversations"):
            _conversation(item, user, using, result)
    return result


def _conversation(item: Checker, user: Any, using: str, result: Imported) -> None:
    conversation = Conversation(
        user=user, title=item.text(Conversation, "title"),
        model=item.text(Conversation, "model"),
        created_at=item.get("created_at", _moment), updated_at=item.get("updated_at", _moment))
    conversation.save(using=using)
    messages, replies = _messages(item, conversation, using)
    generations = _generations(item, conversation, user, messages, using)
    for key, message in messages.items():
        if key in replies:
            if replies[key] not in generations:
                raise InvalidExport(f"{item.where}.messages: a message names the generation "
                                    f"{replies[key]}, which is not in this conversation.")
            message.generation = generations[replies[key]]
    Message.objects.using(using).bulk_update(
        [messages[key] for key in replies], ["generation"])
    counts = _details(item, generations, user, using)
    result.conversations.append(conversation)
    for name, count in (("conversations", 1), ("messages", len(messages)),
                        ("generations", len(generations)), *counts.items()):
        result.counts[name] += count


def _messages(item: Checker, conversation: Conversation, using: str
              ) -> tuple[dict[Any, Message], dict[Any, str]]:
    """The conversation's messages, by their id in the file, each edit linked to the version
    it replaces (which must come before it); and the generation each reply names."""
    found: dict[Any, Message] = {}
    replies: dict[Any, str] = {}
    for entry in item.each("messages"):
        key = entry.get("id", _link)
        if key in found:
            raise entry.fail("id", "used by another message.")
        edit_of = entry.get("edit_of", _link, optional=True)
        if edit_of is not None and edit_of not in found:
            raise entry.fail("edit_of", "names no earlier message of this conversation.")
        message = Message(conversation=conversation,
                          role=entry.choice("role", Message.Role),
                          content=entry.get("content", lambda v: _text(v, None)),
                          created_at=entry.get("created_at", _moment),
                          edit_of=found[edit_of] if edit_of is not None else None)
        message.save(using=using)  # one at a time: an edit needs the id of what it replaces
        found[key] = message
        if (reply := entry.get("generation", _uuid, optional=True)) is not None:
            if reply in replies.values():
                raise entry.fail("generation", "another message names the same generation.")
            replies[key] = reply
    return found, replies


def _generations(item: Checker, conversation: Conversation, user: Any,
                 messages: dict[Any, Message], using: str) -> dict[Any, Generation]:
    found: dict[Any, Generation] = {}
    entries = item.each("generations")
    for entry in entries:
        key = entry.get("id", _uuid)
        if key in found:
            raise entry.fail("id", "used by another generation.")
        prompt = entry.get("prompt_message", _link)
        if prompt not in messages or messages[prompt].role != Message.Role.USER:
            raise entry.fail("prompt_message", "names no user message of this conversation.")
        generation = Generation(conversation=conversation, user=user,
                                prompt_message=messages[prompt], **_generation_fields(entry))
        found[key] = generation
    Generation.objects.using(using).bulk_create(found.values())
    _link_generations(entries, found, using)
    return found


def _generation_fields(entry: Checker) -> dict[str, Any]:
    status = entry.choice("status", Generation.Status)
    usage = entry.object("usage")
    fields: dict[str, Any] = {
        name: entry.text(Generation, name)
        for name in ("model", "provider_model", "answered_by", "reason", "finish_reason",
                     "error_type", "request_id", "currency")}
    fields.update(
        step=entry.get("step", _small), http_status=entry.get("http_status", _small,
                                                              optional=True),
        content=entry.get("content", lambda v: _text(v, None)),
        reasoning=entry.get("reasoning", lambda v: _text(v, None)),
        status=LIVE_BECOMES.get(status, status),  # type: ignore[call-overload]
        cost=entry.get("cost", _money, optional=True),
        usage_source=usage.choice("source", Generation.UsageSource),
        **{name: usage.get(name, _count, optional=True)
           for name in ("prompt_tokens", "cached_tokens", "completion_tokens",
                        "reasoning_tokens")},
        **{name: entry.get(name, _moment, optional=name != "created_at")
           for name in ("created_at", "started_at", "first_token_at", "completed_at")},
    )
    if status in LIVE_BECOMES:
        fields.update(reason="imported while it was being written", error_type="imported_live",
                      completed_at=fields["completed_at"] or fields["created_at"])
    return fields


def _link_generations(entries: list[Checker], found: dict[Any, Generation],
                      using: str) -> None:
    """Each generation's ``retry_of`` and ``follows``, once every one of them has its row."""
    linked = []
    for entry in entries:
        generation = found[entry.get("id", _uuid)]
        for name in ("retry_of", "follows"):
            other = entry.get(name, _uuid, optional=True)
            if other is not None and (other not in found or found[other] is generation):
                raise entry.fail(name, "names no other generation of this conversation.")
            setattr(generation, name, found.get(other) if other else None)
        linked.append(generation)
    Generation.objects.using(using).bulk_update(linked, ["retry_of", "follows"])


def _details(item: Checker, generations: dict[Any, Generation], user: Any,
             using: str) -> dict[str, int]:
    """The tool calls, attempts and feedback of the conversation's generations."""
    calls, attempts, feedback = [], [], []
    for entry in item.each("generations"):
        generation = generations[entry.get("id", _uuid)]
        calls += [_call(call, generation) for call in entry.each("tool_calls")]
        attempts += [_attempt(attempt, generation) for attempt in entry.each("attempts")]
        rated = entry.object("feedback", optional=True)
        if rated is not None:
            feedback.append(Feedback(
                generation=generation, user=user,
                rating=RATINGS[rated.get("rating", lambda v: _choice(v, _Ratings))],
                comment=rated.text(Feedback, "comment"),
                created_at=rated.get("created_at", _moment),
                updated_at=rated.get("updated_at", _moment)))
    _unique([(c.generation_id, c.position) for c in calls], item, "a tool call's position")
    _unique([(a.generation_id, a.number) for a in attempts], item, "an attempt's number")
    ToolCall.objects.using(using).bulk_create(calls)
    Attempt.objects.using(using).bulk_create(attempts)
    Feedback.objects.using(using).bulk_create(feedback)
    _calls_asked(generations, calls, using)
    return {"tool_calls": len(calls), "attempts": len(attempts), "feedback": len(feedback)}


class _Ratings:
    values = list(RATINGS)


def _unique(keys: list[tuple[Any, int]], item: Checker, what: str) -> None:
    if len(set(keys)) != len(keys):
        raise InvalidExport(f"{item.where}.generations: {what} is used twice in one "
                            "generation.")


def _call(entry: Checker, generation: Generation) -> ToolCall:
    status = entry.choice("status", ToolCall.Status)
    ended = CALL_BECOMES.get(status)  # type: ignore[call-overload]
    call = ToolCall(
        generation=generation, position=entry.get("position", _small),
        call_id=entry.text(ToolCall, "call_id"), name=entry.text(ToolCall, "name"),
        arguments=entry.get("arguments", lambda v: _text(v, None)),
        result=entry.get("result", lambda v: _text(v, None)),
        status=ended or status,
        **{name: entry.get(name, _moment, optional=name != "created_at")
           for name in ("created_at", "decided_at", "started_at", "finished_at")})
    if ended is not None:
        call.finished_at = call.finished_at or call.started_at or call.created_at
    return call


def _attempt(entry: Checker, generation: Generation) -> Attempt:
    return Attempt(
        generation=generation, number=entry.get("number", _small),
        model=entry.text(Attempt, "model"), status=entry.choice("status", Attempt.Status),
        http_status=entry.get("http_status", _small, optional=True),
        error_type=entry.text(Attempt, "error_type"),
        retry_after=entry.get("retry_after", _seconds, optional=True),
        request_id=entry.text(Attempt, "request_id"),
        **{name: entry.get(name, _moment, optional=name != "started_at")
           for name in ("started_at", "first_token_at", "finished_at")})


def _calls_asked(generations: dict[Any, Generation], calls: list[ToolCall],
                 using: str) -> None:
    """What the app reads besides the rows: a step's ``tool_calls`` (the calls its reply
    asked for, which the page shows) and, for a later step, the messages it was sent after
    its question (the earlier steps' calls and results, which the next reply's history
    repeats)."""
    by_generation: dict[Any, list[ToolCall]] = {}
    for call in calls:
        by_generation.setdefault(call.generation_id, []).append(call)
    changed = []
    for generation in generations.values():
        own = sorted(by_generation.get(generation.pk, []), key=lambda c: c.position)
        generation.tool_calls = [{"id": c.call_id, "type": "function", "name": c.name,
                                  "arguments": c.arguments} for c in own]
        earlier: list[dict[str, Any]] = []
        step, hops = generation.follows, 0
        while step is not None and hops < len(generations):  # the file's links may loop
            earlier[:0] = step_messages(step.content, by_generation.get(step.pk, []))
            step, hops = step.follows, hops + 1
        generation.upstream_messages = (
            [{"role": "user", "content": generation.prompt_message.content}, *earlier]
            if earlier else [])
        changed.append(generation)
    Generation.objects.using(using).bulk_update(changed, ["tool_calls", "upstream_messages"])
