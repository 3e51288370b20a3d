"""chatstream from Python: post a message, run or follow its reply, retry, stop.

The same records, request hooks, quotas, signals and Stop as the pages: a Stop from a page stops
a reply that code started, and the other way round. For a task queue, a management command or
another view::

    from chatstream import api

    generation = api.send(user, "Summarise my week")   # pending; hooks and quota passed
    generation = api.run(generation)                   # to its end, without a browser
    print(generation.status, generation.content)

``run`` goes on to the end whatever ``CHATSTREAM_ON_DISCONNECT`` says: nobody is there to
leave. ``astream`` yields the text as it comes; leaving its loop early counts as a page
leaving (close it with ``contextlib.aclosing`` for that to happen at once).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from asgiref.sync import async_to_sync

from . import stream
from ._loops import in_executor
from .domain import decisions, reporting, sending
from .models import Conversation, Generation, Message, ToolCall

__all__ = ["adecide", "aedit", "arun", "asend", "astop", "astop_replies_of", "astream",
           "decide", "edit", "retry", "run", "send", "stop", "stop_replies_of"]


def send(user: Any, content: str, *, conversation: Conversation | None = None,
         model: str | None = None) -> Generation:
    """Post ``content`` as ``user`` (in a new conversation when ``conversation`` is None) and
    return the pending generation that will answer it.

    Raises ``QuotaExceeded`` (nothing kept), ``RequestRefused`` (a hook refused: the message
    and a failed generation are kept, as ``refusal.generation``), ``ConversationFull``,
    ``PermissionDenied`` (``CHATSTREAM_ACCESS``, or another user's conversation) or
    ``InvalidMessage`` (an empty or too long message). Each but ``PermissionDenied`` is a
    ``chatstream.exceptions.Refusal``, with its sentence for the user as ``message``.
    """
    return sending.send(user, content, conversation=conversation, model=model)


async def asend(user: Any, content: str, *, conversation: Conversation | None = None,
                model: str | None = None) -> Generation:
    """:func:`send`, from async code."""
    generation: Generation = await in_executor(sending.send)(
        user, content, conversation=conversation, model=model)
    return generation


def edit(message: Message, content: str, *, model: str | None = None) -> Generation:
    """Send ``content`` in place of the user message ``message`` (as the page's Edit): a new
    version whose ``edit_of`` is ``message``, and the pending generation answering it. The
    same exceptions as :func:`send`; ``NotEditable`` unless ``message`` is its conversation's
    last current message with no reply being written."""
    message = Message.objects.select_related("conversation__user").get(pk=message.pk)
    return sending.edit(message, content, model=model)


async def aedit(message: Message, content: str, *, model: str | None = None) -> Generation:
    """:func:`edit`, from async code."""
    generation: Generation = await in_executor(edit)(message, content, model=model)
    return generation


def retry(generation: Generation, *, model: str | None = None) -> Generation:
    """A new pending generation answering ``generation``'s question again (as the page's
    Retry; with ``model``, as its Regenerate); the same exceptions as :func:`send`,
    ``ReplyStillLive`` while it is still live, and ``TooManyReplies`` when its message has
    ``CHATSTREAM_MAX_REPLIES_PER_MESSAGE`` replies already (nothing kept)."""
    generation = Generation.objects.select_related(
        "conversation", "prompt_message", "user").get(pk=generation.pk)
    return sending.retry(generation, model=model)


async def astream(generation: Generation, *, after: int = 0) -> AsyncGenerator[str, None]:
    """The reply's text as it comes, from its character ``after`` on (the same count as the
    stream's ``id:``): this runs the generation if nobody has, else follows it where it runs.
    ValueError if ``after`` is past the reply's text (or not a count)."""
    if type(after) is not int or after < 0:
        raise ValueError(f"after must be a count of characters, not {after!r}.")
    if after and await Generation.objects.filter(
            pk=generation.pk, status=Generation.Status.PENDING).aexists():
        # Checked before: a stream that claims it would have to be run, not refused.
        raise ValueError(f"after={after!r}, but nothing of this reply has been sent yet.")
    body = await stream.aopen(generation.pk, generation.user_id,
                              stream.TextWire(after=after), after=after)
    if body is None:
        raise Generation.DoesNotExist(f"No generation {generation.pk} of user "
                                      f"{generation.user_id!r}.")
    sent_any = False
    async with aclosing(body):
        async for piece in body:
            if piece:
                sent_any = True
                yield piece
    if after and not sent_any:
        # A finished reply shorter than ``after`` ends with its final message alone (a page
        # replaces what it shows with it); from Python, that is the caller's mistake.
        stored = await Generation.objects.aget(pk=generation.pk)
        if stream.Sent.at(stored.content, after) is None:
            raise ValueError(f"after={after!r} is past the characters the reply has.")
    step: Generation | None = generation
    while step is not None and (step := await _next_step(step)) is not None:  # later steps
        body = await stream.aopen(step.pk, step.user_id, stream.TextWire())
        assert body is not None  # the user's, as the first step is
        async with aclosing(body):
            async for piece in body:
                if piece:
                    yield piece


async def _next_step(generation: Generation) -> Generation | None:
    """The step that carries on ``generation``'s reply with its tool calls' results (the
    newest, should a Retry have made several), once it may start; None at the reply's end,
    or while a call waits for the user's approval."""
    step: Generation | None = await Generation.objects.filter(
        follows_id=generation.pk, waits_for_tools=False).only(
        "pk", "user_id").order_by("-created_at").afirst()
    return step


async def arun(generation: Generation) -> Generation:
    """Run ``generation`` to its end (or follow it to its end where it already runs), through
    the steps of its reply (each round of tool calls and the next upstream call), and return
    its last step as stored (the one whose calls wait for approval, if any do), once its
    ``generation_finished`` receivers have run."""
    async with aclosing(astream(generation)) as pieces:
        async for _ in pieces:
            pass
    await reporting.sent()
    last = generation
    while (step := await _next_step(last)) is not None:
        last = step
    return await Generation.objects.select_related("conversation", "prompt_message").aget(
        pk=last.pk)


def run(generation: Generation) -> Generation:
    """:func:`arun`, from sync code (a task queue's worker, a management command)."""
    result: Generation = async_to_sync(arun)(generation)
    return result


async def adecide(tool_call: ToolCall, user: Any, *, approve: bool) -> Generation | None:
    """Approve (``approve=True``) or deny ``tool_call``, as ``user`` (its reply's owner: anyone
    else gets ``ToolCall.DoesNotExist``), as the page's buttons do. When it was the last call
    of its step waiting for a decision, the step's approved calls run here, and the next step
    is returned, pending: run or stream it as any generation (it has not started). None while
    other calls wait, or when a request hook refused the next step (it is stored ``failed``).
    ``AlreadyDecided`` (a ``Refusal``) when the call no longer waits for a decision."""
    call, following = await in_executor(decisions.decide)(tool_call.pk, user, approve=approve)
    if following is None or not await stream.aresume(call.generation, following):
        return None
    return following


def decide(tool_call: ToolCall, user: Any, *, approve: bool) -> Generation | None:
    """:func:`adecide`, from sync code."""
    following: Generation | None = async_to_sync(adecide)(tool_call, user, approve=approve)
    return following


async def astop(generation: Generation) -> None:
    """Stop ``generation`` wherever it streams (as the page's Stop): the upstream is closed,
    the text so far kept; one nobody has started yet is cancelled. For a reply written in
    steps, its step under way: its calls that have not started never run."""
    last = await in_executor(sending.last_step)(generation)
    await stream.arequest_stop(last.pk)


def stop(generation: Generation) -> None:
    """:func:`astop`, from sync code."""
    async_to_sync(astop)(generation)


def stop_replies_of(user: Any) -> int:
    """Stop every live reply of ``user`` wherever it runs, as their access was revoked (for a
    site that revokes it out of band, or deactivates users with a queryset ``update()``): each
    upstream is closed, the text so far kept, the reply stored as cancelled with the reason
    "stopped: the user no longer has access to the chat"; those nobody has started yet are
    cancelled and never start. Returns how many there were. Call it once the revocation is
    committed: a reply started after this call is not stopped by it."""
    return stream.stop_replies_of(user, stream.StopCause.ACCESS_REVOKED)


async def astop_replies_of(user: Any) -> int:
    """:func:`stop_replies_of`, from async code."""
    stopped: int = await stream.astop_replies_of(user, stream.StopCause.ACCESS_REVOKED)
    return stopped
