"""What the views, the ASGI front and the Python API call to open, start and stop a stream."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, TypeVar
from uuid import UUID

from asgiref.sync import sync_to_async
from django.db import connections

from .. import quota, store, tools
from .._loops import in_executor
from ..conf import conf
from ..domain import reporting, steps
from ..domain.history import ahistory
from ..models import Generation
from . import _ending, _following, _serving, _stopping, _wire
from . import _outcomes as outcomes
from ._rounds import Round
from ._run import Run
from ._wire import Wire

T = TypeVar("T", bytes, str)

# How long a front that starts the run early lets the provider's request go out before its own
# response headers (both are writes on the same loop; the provider's is on the critical path).
_FIRST_WRITE_WAIT = 0.1


@dataclasses.dataclass(frozen=True, slots=True)
class Claimed:
    """The outcome of a claim made before the stream is opened, in the same trip to a thread as
    the request's session (see chatstream/web/sessions.py): the generation it took, or None
    when it was not this request's to take."""

    generation: Generation | None


async def aopen(generation_id: UUID, user_id: Any, wire: Wire[T], *, after: int = 0,
                start: bool = False, wsgi: bool = False, claimed: Claimed | None = None
                ) -> AsyncGenerator[T, None] | None:
    """The stream of the user's generation, written by ``wire``: its live run if this request
    claims it (see :func:`astart`), else its text after the first ``after`` characters (a
    client resuming: see ``_wire.Sent``) followed to the end (see _following.py); None if the
    generation is not the user's. Raises ``TooManyFollowers`` when this process already serves
    as many followers as the settings allow."""
    body = await astart(generation_id, user_id, wire, start=start, wsgi=wsgi, claimed=claimed)
    if body is None:
        if not await store.for_alias().owns(generation_id, user_id):
            return None
        if await Generation.objects.filter(pk=generation_id, status=Generation.Status.PENDING,
                                           waits_for_tools=True).aexists():
            return _waiting(generation_id, wire)
        return _following.admit(generation_id, user_id, wire, after=after)
    if after:  # a client that claims text of a reply not started: it starts from nothing
        return _from_nothing(body, wire)
    return body


async def _waiting(generation_id: UUID, wire: Wire[T]) -> AsyncGenerator[T, None]:
    """The stream of a step waiting for its previous step's tool calls: nothing to stream
    yet; its form as it is now (the page: what it waits for), as ``done``."""
    generation = await Generation.objects.select_related(
        "conversation", "prompt_message").aget(pk=generation_id)
    yield await wire.done(await in_executor(wire.render)(generation))


async def _from_nothing(body: AsyncGenerator[T, None], wire: Wire[T]) -> AsyncGenerator[T, None]:
    async with aclosing(body):
        yield await wire.reset("", _wire.Sent())
        async for chunk in body:
            yield chunk


async def astart(generation_id: UUID, user_id: Any, wire: Wire[T], *,
                 start: bool = False, wsgi: bool = False, claimed: Claimed | None = None
                 ) -> AsyncGenerator[T, None] | None:
    """Claim the user's pending generation and return its live stream; None if not ours to run.

    One database round trip (the store's claim; on PostgreSQL sent without a thread) stands
    between the request and the provider's. The provider is called when
    the stream is first iterated or, with ``start=True``, before this returns, which then waits
    (up to ``_FIRST_WRITE_WAIT``) until the provider's request is written: it goes out before
    the response's headers, not after. Only for a caller whose own task sends the response,
    as chatstream.asgi's does. (A Django view may run in a task of its own: a sync
    middleware puts the view behind ``async_to_sync``.)

    A server that cannot stream (``wsgi``, or an event loop found wanting: see _serving.py)
    gets the claimed generation back as failed, with its notice, and no provider call.

    ``claimed``: the user's claim, already made (then no other is).
    """
    generation = (claimed.generation if claimed is not None
                  else await store.for_alias().claim(generation_id, user_id))
    if generation is None:
        return None
    model = conf.get_model(generation.model)
    if model is None:  # the allow-list changed since the message was posted
        return _ending.refuse(generation, outcomes.model_not_allowed(), wire)
    if await _serving.problem(wsgi=wsgi) is not None:
        return _ending.refuse(generation, outcomes.unsupported_server(), wire)
    run = Run(generation, await ahistory(generation), model)
    reporting.started(generation)
    if start:
        run.start()
        await run.pump.request_written(_FIRST_WRITE_WAIT)
    return run.events(wire)


async def aresume(step: Generation, following: Generation) -> bool:
    """The last of ``step``'s calls waiting for approval was decided: run its approved calls
    here, then let ``following`` (its next step) start; whether it may (not stopped meanwhile,
    nor refused by a request hook)."""
    model = conf.get_model(step.model)
    if model is None:  # no longer allowed: none of its tools runs (nor will the next step)
        await tools.acancel_waiting(step.pk)
        return await in_executor(steps.make_ready)(following) is True
    resumed = await Round.resume(step, following, model)
    return resumed.ready


async def arequest_stop(generation_id: UUID,
                        cause: outcomes.StopCause = outcomes.StopCause.BY_USER) -> None:
    """Stop a generation wherever it streams: signal, write the durable flag, signal again.

    The first signal reaches a subscribed stream without waiting for the database write; the
    second covers a stream that subscribed in between (it reads the flag after subscribing).
    ``cause`` travels with both, and is stored as the outcome's reason.
    """
    outcome = outcomes.stopped(cause)
    await _stopping.publish(generation_id, cause)
    cancelled = await store.for_alias().request_stop(
        generation_id, reason=outcome.reason, error_type=outcome.error_type,
        settlement=quota.RELEASED)
    if cancelled is not None:  # nobody had started it: it ends here
        if cancelled.follows_id is not None:  # a step waiting for its calls: none runs now
            await tools.acancel_waiting(cancelled.follows_id)
        await in_executor(reporting.finished_now)(cancelled)
    await _stopping.publish(generation_id, cause)


async def release_request_connections() -> None:
    """Give back the database connections of the calling request's thread.

    Under Django's request cycle, a view's sync work (the session, the user) runs on a thread
    kept for the request, whose connections Django closes only when the response ends, which
    for a stream is minutes later. With a connection pool, open streams would hold every
    connection: a streaming view calls this before it streams.
    """
    await sync_to_async(_release_connections)()


def _release_connections() -> None:
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close()
