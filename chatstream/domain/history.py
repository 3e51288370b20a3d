"""What is sent upstream for a generation: the conversation's stored text, never request input.

:func:`build_history` runs once, when a generation is created (the message view stores the
result in ``Generation.upstream_messages``); :func:`history` reads it back, and rebuilds it only
for rows made before that field existed.

What is sent fits the model's context budget (``CONTEXT_TOKENS``, estimated as the quota
estimates a prompt: :func:`chatstream.domain.usage.estimate_tokens` of each text, plus
:data:`MESSAGE_OVERHEAD` per message and :data:`REPLY_PRIMING` once): the system prompt and the
new message always, then the newest earlier turns that fit, whole. The conversation is read
newest first, in batches that double, and no further than the first turn that does not fit: a
long conversation costs what is sent, not its length.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from django.db.models import OuterRef, Q, Subquery

from .._loops import in_executor
from ..conf import conf
from ..models import Generation, Message, ToolCall
from ..tools import step_messages
from .usage import estimate_tokens, message_text

# Tokens a provider adds per message (role, separators) and once to prime the reply: the same
# figures as the quota's estimate of a prompt (``quota.estimate_prompt``), so what is sent is
# admitted at an estimate within the budget.
MESSAGE_OVERHEAD = 4
REPLY_PRIMING = 3

# Turns read by the first query; each further query reads twice as many, up to the last size.
FIRST_BATCH = 8
LAST_BATCH = 256

Turn = list[dict[str, Any]]


def history(generation: Generation) -> list[dict[str, str]]:
    """The messages sent upstream for ``generation``, as stored when it was created."""
    return list(generation.upstream_messages) or build_history(generation)


async def ahistory(generation: Generation) -> list[dict[str, str]]:
    """:func:`history` from the event loop (a row made before the messages were stored has
    them built in a thread)."""
    if generation.upstream_messages:
        return list(generation.upstream_messages)
    built: list[dict[str, str]] = await in_executor(build_history)(generation)
    return built


def after_step(previous: Generation, calls: Iterable[ToolCall]) -> list[dict[str, Any]]:
    """What the step after ``previous`` sends, before request hooks: what ``previous`` sent,
    the assistant message that asked for ``calls`` (its reply's) and their results."""
    sent = list(Generation.objects.filter(pk=previous.pk).values_list(
        "upstream_messages", flat=True).get())
    return [*sent, *step_messages(previous.content, calls)]


def context_budget(model: str) -> int:
    """The context budget, in estimated tokens, of the allow-listed model ``model``."""
    choice = conf.get_model(model)
    return choice.context_tokens if choice is not None else conf.CONTEXT_TOKENS


def _estimate(messages: list[dict[str, str]]) -> int:
    """Estimated tokens of ``messages`` sent as they are (text plus per-message overhead)."""
    return sum(estimate_tokens(message_text(m)) + MESSAGE_OVERHEAD for m in messages)


def build_history(generation: Generation, *, first: bool = False) -> list[dict[str, str]]:
    """The messages to send upstream for ``generation``: stored text only, never request input.

    The system prompt and the new message always; before the new message, the newest earlier
    turns that fit the model's context budget, oldest left out first, whole turns only. An
    edited message is left out with its replies: only the current version of each is sent. Each
    earlier question is followed by the latest reply that produced text; replies to the
    question being answered now (earlier attempts) are left out. Called when a generation is
    created (its ``upstream_messages`` keep the result), and for rows made before that field.
    ``first``: the caller knows no message came before, so none is looked for.
    """
    prompt = generation.prompt_message
    system = [{"role": "system", "content": conf.SYSTEM_PROMPT}] if conf.SYSTEM_PROMPT else []
    new = [{"role": "user", "content": prompt.content}]
    return _within(generation.model, system, () if first else _earlier_turns(prompt), new)


def fit(messages: list[dict[str, Any]], model: str) -> list[dict[str, Any]]:
    """``messages`` (as a request hook left them) within ``model``'s context budget, as
    :func:`build_history` fits the stored ones: the leading system messages and the last turn
    (from the last user message on: the question, and the tool calls and results of the
    steps answering it so far) always, then the newest earlier turns (a user message and what
    follows it) that fit, whole."""
    lead = 0
    while lead < len(messages) - 1 and messages[lead].get("role") == "system":
        lead += 1
    last = len(messages) - 1
    while last > lead and messages[last].get("role") != "user":
        last -= 1
    if messages[last].get("role") != "user":
        last = len(messages) - 1
    turns: list[Turn] = []
    for message in messages[lead:last]:
        if not turns or message.get("role") == "user":
            turns.append([])
        turns[-1].append(message)
    return _within(model, messages[:lead], reversed(turns), messages[last:])


def _within(model: str, head: list[dict[str, str]], turns: Iterable[Turn],
            last: list[dict[str, str]]) -> list[dict[str, str]]:
    """``head``, the first of ``turns`` (newest first) that fit ``model``'s budget with ``head``
    and ``last`` (read no further than the first that does not), and ``last``."""
    room = context_budget(model) - REPLY_PRIMING - _estimate([*head, *last])
    kept: list[Turn] = []
    for turn in turns:
        room -= _estimate(turn)
        if room < 0:
            break
        kept.append(turn)
    return [*head, *(message for turn in reversed(kept) for message in turn), *last]


def _earlier_turns(prompt: Message) -> Iterator[Turn]:
    """The turns before ``prompt``, newest first: each question with its latest reply that has
    text, read in batches (two queries each: the questions with the id of that reply, then
    those replies) for as long as the caller asks for more. A reply written in steps (its model
    called tools) carries its steps' tool calls and results as they were sent, before its
    text: one more query for the batches that hold such replies."""
    # Stored before the prompt only: a retry of an earlier question sends what came before it.
    replies = (Message.objects.filter(role=Message.Role.ASSISTANT,
                                      generation__prompt_message=OuterRef("pk"),
                                      created_at__lte=prompt.created_at)
               .exclude(content="").order_by("-created_at", "-id"))
    # Current versions only: a message edited since, and its replies, are no longer sent.
    questions = (Message.objects.filter(conversation_id=prompt.conversation_id,
                                        role=Message.Role.USER, edits__isnull=True,
                                        created_at__lte=prompt.created_at, pk__lt=prompt.pk)
                 .annotate(reply=Subquery(replies.values("pk")[:1]))
                 .order_by("-created_at", "-id"))
    size, after = FIRST_BATCH, Q()
    while True:
        batch: list[tuple[int, datetime, str, int | None]] = list(
            questions.filter(after).values_list("pk", "created_at", "content", "reply")[:size])
        # (A subquery's value may come back as text: made an id as the primary key's are.)
        chosen = [(question, _id(reply) if reply is not None else None)
                  for _pk, _at, question, reply in batch]
        answers = _replies([reply for _question, reply in chosen if reply is not None])
        ids = [(question, *answers.get(reply, (None, None))) if reply is not None
               else (question, None, None) for question, reply in chosen]
        exchanges = _tool_exchanges([by for *_, by in ids if by])
        for question, answer, by in ids:
            yield [{"role": "user", "content": question}, *exchanges.get(by, ()),
                   *([{"role": "assistant", "content": answer}] if answer else [])]
        if len(batch) < size:
            return
        pk, at = batch[-1][:2]
        after = Q(created_at__lt=at) | Q(created_at=at, pk__lt=pk)
        size = min(2 * size, LAST_BATCH)


_id = Message._meta.pk.to_python


def _replies(ids: list[int]) -> dict[int, tuple[str | None, Any]]:
    """The reply messages ``ids``, each as its text and its generation when that is a later
    step of its reply (None for a first one). A plain query by primary key: the ORM builds
    it in a fraction of the time a correlated subquery per column took."""
    if not ids:
        return {}
    rows = Message.objects.filter(pk__in=ids).values_list("pk", "content", "generation__step",
                                                          "generation")
    return {pk: (content, by if step and step > 1 else None) for pk, content, step, by in rows}


def _tool_exchanges(steps: list[Any]) -> dict[Any, list[dict[str, Any]]]:
    """For each of ``steps`` (generations after the first of their reply), the tool calls and
    results it was sent after its question: what its reply's earlier steps learnt."""
    if not steps:
        return {}
    sent = Generation.objects.filter(pk__in=steps).values_list("pk", "upstream_messages")
    exchanges = {}
    for pk, messages in sent:
        last = len(messages) - 1
        while last >= 0 and messages[last].get("role") != "user":
            last -= 1
        exchanges[pk] = messages[last + 1:]
    return exchanges
