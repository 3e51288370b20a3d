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

from dataclasses import dataclass, field
from typing import Any

import orjson
from django.db import transaction

from ..models import Attempt, Conversation, Feedback, Generation, Message, ToolCall
from ..tools import step_messages
from . import exports
from . import import_checks as checks
from .import_checks import Checker, InvalidExport

MAX_BYTES = 64 * 1024 * 1024  # the largest file read; a bigger one is refused unread

LIVE_BECOMES = {Generation.Status.PENDING: Generation.Status.INTERRUPTED,
                Generation.Status.STREAMING: Generation.Status.INTERRUPTED}
CALL_BECOMES = {ToolCall.Status.PENDING_APPROVAL: ToolCall.Status.CANCELLED,
                ToolCall.Status.APPROVED: ToolCall.Status.CANCELLED,
                ToolCall.Status.RUNNING: ToolCall.Status.LOST}
RATINGS = {name: value for value, name in exports.RATING_NAMES.items()}


@dataclass
class Imported:
    """What an import wrote, per model."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("conversations", "messages", "generations", "tool_calls", "attempts", "feedback"), 0))
    conversations: list[Conversation] = field(default_factory=list)



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
                                 f"{checks.shown(document.get('format'))}).")
    version = document.get("version")
    if type(version) is not int or version != exports.VERSION:
        raise top.fail("version", f"this version of chatstream reads version "
                                  f"{exports.VERSION} (found {checks.shown(version)}).")
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
        created_at=item.get("created_at", checks.moment),
        updated_at=item.get("updated_at", checks.moment))
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
        key = entry.get("id", checks.link)
        if key in found:
            raise entry.fail("id", "used by another message.")
        edit_of = entry.get("edit_of", checks.link, optional=True)
        if edit_of is not None and edit_of not in found:
            raise entry.fail("edit_of", "names no earlier message of this conversation.")
        message = Message(conversation=conversation,
                          role=entry.choice("role", Message.Role),
                          content=entry.get("content", lambda v: checks.text_of(v, None)),
                          created_at=entry.get("created_at", checks.moment),
                          edit_of=found[edit_of] if edit_of is not None else None)
        message.save(using=using)  # one at a time: an edit needs the id of what it replaces
        found[key] = message
        if (reply := entry.get("generation", checks.uuid_of, optional=True)) is not None:
            if reply in replies.values():
                raise entry.fail("generation", "another message names the same generation.")
            replies[key] = reply
    return found, replies


def _generations(item: Checker, conversation: Conversation, user: Any,
                 messages: dict[Any, Message], using: str) -> dict[Any, Generation]:
    found: dict[Any, Generation] = {}
    entries = item.each("generations")
    for entry in entries:
        key = entry.get("id", checks.uuid_of)
        if key in found:
            raise entry.fail("id", "used by another generation.")
        prompt = entry.get("prompt_message", checks.link)
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
        step=entry.get("step", checks.step), http_status=entry.get("http_status", checks.small,
                                                              optional=True),
        content=entry.get("content", lambda v: checks.text_of(v, None)),
        reasoning=entry.get("reasoning", lambda v: checks.text_of(v, None)),
        status=LIVE_BECOMES.get(status, status),  # type: ignore[call-overload]
        cost=entry.get("cost", checks.money, optional=True),
        usage_source=usage.choice("source", Generation.UsageSource),
        **{name: usage.get(name, checks.count, optional=True)
           for name in ("prompt_tokens", "cached_tokens", "completion_tokens",
                        "reasoning_tokens")},
        **{name: entry.get(name, checks.moment, optional=name != "created_at")
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
        generation = found[entry.get("id", checks.uuid_of)]
        for name in ("retry_of", "follows"):
            other = entry.get(name, checks.uuid_of, optional=True)
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
        generation = generations[entry.get("id", checks.uuid_of)]
        calls += [_call(call, generation) for call in entry.each("tool_calls")]
        attempts += [_attempt(attempt, generation) for attempt in entry.each("attempts")]
        rated = entry.object("feedback", optional=True)
        if rated is not None:
            feedback.append(Feedback(
                generation=generation, user=user,
                rating=RATINGS[rated.get("rating", lambda v: checks.choice_of(v, _Ratings))],
                comment=rated.text(Feedback, "comment"),
                created_at=rated.get("created_at", checks.moment),
                updated_at=rated.get("updated_at", checks.moment)))
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
        generation=generation, position=entry.get("position", checks.small),
        call_id=entry.text(ToolCall, "call_id"), name=entry.text(ToolCall, "name"),
        arguments=entry.get("arguments", lambda v: checks.text_of(v, None)),
        result=entry.get("result", lambda v: checks.text_of(v, None)),
        status=ended or status,
        **{name: entry.get(name, checks.moment, optional=name != "created_at")
           for name in ("created_at", "decided_at", "started_at", "finished_at")})
    if ended is not None:
        call.finished_at = call.finished_at or call.started_at or call.created_at
    return call


def _attempt(entry: Checker, generation: Generation) -> Attempt:
    return Attempt(
        generation=generation, number=entry.get("number", checks.small),
        model=entry.text(Attempt, "model"), status=entry.choice("status", Attempt.Status),
        http_status=entry.get("http_status", checks.small, optional=True),
        error_type=entry.text(Attempt, "error_type"),
        retry_after=entry.get("retry_after", checks.seconds, optional=True),
        request_id=entry.text(Attempt, "request_id"),
        **{name: entry.get(name, checks.moment, optional=name != "started_at")
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
