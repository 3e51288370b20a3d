"""One generation's life: claim, stream, checkpoint, finish, stop.

The data path runs one way: upstream bytes -> ``SSEDecoder`` -> ``ChatCompletionAccumulator``
-> :class:`Run` (the text so far) -> browser events and periodic database checkpoints.

Guarantees:

- **Claim once.** Only the request whose ``UPDATE ... WHERE status='pending'`` changes the row
  calls the provider; every other request for the generation follows the stored text.
- **The provider's request lives in one task** (the pump), cancelled the moment the browser
  goes away (the request task's cancellation, or its done-callback when Django is blocked in a
  ``send``), when a Stop arrives, or when a deadline passes.
- **The outcome is saved before the terminal ``done`` event**, and again, shielded, in
  ``finally`` if the browser left first; the partial text is kept on every outcome.
- **Bounded database work**: the claim, a checkpoint at most every
  ``CHATSTREAM_CHECKPOINT_INTERVAL`` seconds while text arrives (a heartbeat every
  ``CHATSTREAM_HEARTBEAT_INTERVAL`` in silence), and one final transaction. Streaming work runs
  on the shared executor, so an open stream holds no database connection between writes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

import httpx
from asgiref.sync import sync_to_async
from django.db import close_old_connections, transaction
from django.utils import timezone

from . import stopping, upstream, wire
from .completions import ChatCompletionAccumulator
from .conf import ModelChoice, conf
from .exceptions import (
    IncompleteStreamError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamHTTPError,
)
from .models import Conversation, Generation, Message
from .notices import describe
from .sse import SSEDecoder

logger = logging.getLogger("chatstream.lifecycle")

Status = Generation.Status
T = TypeVar("T")

WORKER = f"{socket.gethostname()}:{os.getpid()}"[:100]

# Tasks that outlive their request (a final save after an abandoned send); kept referenced.
_background: set[asyncio.Task[Any]] = set()


def _in_pool(func: Callable[..., T]) -> Callable[..., Any]:
    """Run ORM work on the shared executor: no connection pinned to the request's thread.

    Connections there follow ``CONN_MAX_AGE`` as a request's would: closed after the call when
    it is 0, kept (and health-checked) when persistent or pooled.
    """

    def call(*args: Any, **kwargs: Any) -> T:
        close_old_connections()
        try:
            return func(*args, **kwargs)
        finally:
            close_old_connections()

    return sync_to_async(call, thread_sensitive=False)


# ---------------------------------------------------------------------------------------------
# Claiming and the conversation sent upstream


async def aclaim(generation_id: UUID) -> bool:
    """Atomically move a pending generation to streaming; True for the one caller that did."""
    now = timezone.now()
    changed = await Generation.objects.filter(
        pk=generation_id, status=Status.PENDING, cancel_requested=False
    ).aupdate(status=Status.STREAMING, started_at=now, heartbeat_at=now, worker=WORKER)
    return changed == 1


def history(generation: Generation) -> list[dict[str, str]]:
    """The messages sent upstream for ``generation``: stored text only, never request input."""
    prompt = generation.prompt_message
    messages: list[dict[str, str]] = []
    if conf.SYSTEM_PROMPT:
        messages.append({"role": "system", "content": conf.SYSTEM_PROMPT})
    stored = (
        Message.objects.filter(conversation_id=generation.conversation_id)
        .filter(created_at__lte=prompt.created_at)
        .select_related("generation")
        .order_by("created_at", "id")
    )
    replies: dict[int, Message] = {}
    for message in stored:
        if message.role == Message.Role.ASSISTANT:
            answered = message.generation.prompt_message_id if message.generation else None
            if answered is not None and answered != prompt.pk:
                replies[answered] = message  # the latest attempt that produced text wins
            continue
        if message.role == Message.Role.USER and message.pk <= prompt.pk:
            messages.append({"role": "user", "content": message.content})
            messages.append({"role": "__reply__", "content": str(message.pk)})
    # Put each earlier exchange's reply after its question, in order.
    ordered: list[dict[str, str]] = []
    for entry in messages:
        if entry["role"] == "__reply__":
            reply = replies.get(int(entry["content"]))
            if reply is not None:
                ordered.append({"role": "assistant", "content": reply.content})
        else:
            ordered.append(entry)
    return ordered


def estimate_tokens(text: str) -> int:
    """A rough token count (UTF-8 bytes / 4), used only when the provider reports no usage."""
    return -(-len(text.encode("utf-8")) // 4) if text else 0


# ---------------------------------------------------------------------------------------------
# Outcomes


@dataclass
class Outcome:
    status: str
    reason: str = ""
    error_type: str = ""
    notice: str = ""  # the sentence shown to the user, if any


def _disconnected() -> Outcome:
    return Outcome(Status.CANCELLED, "client disconnected", "client_disconnected")


def _stopped() -> Outcome:
    return Outcome(Status.CANCELLED, "stopped by user", "stopped_by_user")


def outcome_for(error: BaseException, *, started: bool) -> Outcome:
    """Map an upstream failure to the stored status, its reason and the user's sentence."""
    if isinstance(error, UpstreamHTTPError):
        outcome = Outcome(Status.FAILED, f"provider answered HTTP {error.status}",
                          error.error_type)
    elif isinstance(error, UpstreamConnectError):
        outcome = Outcome(Status.FAILED, "could not reach the provider", error.error_type)
    elif isinstance(error, TimeoutError):
        outcome = Outcome(Status.INTERRUPTED, "took longer than the maximum duration", "deadline")
    elif isinstance(error, httpx.TimeoutException):
        outcome = (Outcome(Status.INTERRUPTED, "provider went silent", "inactivity") if started
                   else Outcome(Status.FAILED, "provider did not answer", "connect_timeout"))
    elif isinstance(error, UpstreamError):
        outcome = Outcome(Status.INTERRUPTED, error.message[:200], error.error_type)
    elif isinstance(error, httpx.HTTPError):
        outcome = Outcome(Status.INTERRUPTED, "connection to the provider was lost",
                          "connection_lost")
    else:
        outcome = Outcome(Status.INTERRUPTED, "internal error", "internal")
    status = getattr(error, "status", None)
    outcome.notice = describe(outcome.status, error_type=outcome.error_type, http_status=status)
    return outcome


# ---------------------------------------------------------------------------------------------
# A live run


class Run:
    """The streaming half of one claimed generation (one per open ``generation-stream``)."""

    def __init__(self, generation: Generation, model: ModelChoice,
                 messages: list[dict[str, str]]) -> None:
        self.generation = generation
        self.id = generation.pk
        self.model = model
        self.request = upstream.build_request(model, messages)
        self.prompt_estimate = estimate_tokens("".join(m["content"] for m in messages))
        self.decoder = SSEDecoder(max_event_size=conf.MAX_EVENT_SIZE)
        self.acc = ChatCompletionAccumulator()
        self.parts: list[str] = []  # every delta of choice 0, in order
        self.outbox: list[str] = []  # deltas not yet sent to the browser
        self.first_token_at: datetime | None = None
        self.request_id = ""
        self.http_status: int | None = None
        self.started = False  # the provider answered 2xx and began its stream
        self.outcome: Outcome | None = None  # set once the pump has ended
        self.stop_outcome: Outcome | None = None
        self.saved = False
        self._waiter: asyncio.Future[bool] | None = None
        self._pump: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None

    # -- the browser side ----------------------------------------------------------------------

    async def events(self, render_final: Callable[[Generation], str]) -> AsyncIterator[bytes]:
        """The SSE body for the browser; ``render_final`` turns the saved row into HTML."""
        loop = asyncio.get_running_loop()
        self._pump = loop.create_task(self._run_pump())
        self._watch = loop.create_task(self._run_watch())
        request_task = asyncio.current_task()
        if request_task is not None:
            # If Django is cancelled while blocked in send(), nothing closes this generator:
            # tie the upstream to the request task itself.
            request_task.add_done_callback(self._on_request_done)
        try:
            while True:
                if self.outbox:
                    batch = wire.deltas(self.outbox)
                    self.outbox.clear()
                    yield batch
                elif self.outcome is not None:
                    break
                elif not await self._wait(conf.PING_INTERVAL):
                    yield wire.PING
            generation = await self._save(self.outcome)
            if self.outcome.notice:
                yield wire.error(_notice_html(self.outcome.notice))
            yield wire.done(render_final(generation))
        finally:
            await self._abandon()

    async def _abandon(self) -> None:
        """Stop the pump and watcher; save a disconnect if nothing was saved yet."""
        tasks = [t for t in (self._pump, self._watch) if t is not None]
        if self._pump is not None and not self._pump.done() and self.stop_outcome is None:
            self.stop_outcome = _disconnected()
        for task in tasks:
            task.cancel()
        if not self.saved:
            await asyncio.shield(self._finish_after(tasks))

    async def _finish_after(self, tasks: list[asyncio.Task[Any]]) -> None:
        await asyncio.gather(*tasks, return_exceptions=True)
        if not self.saved:
            await self._save(self.outcome or self.stop_outcome or _disconnected())

    def _on_request_done(self, _task: asyncio.Task[Any]) -> None:
        if self.saved or self._pump is None:
            return
        if not self._pump.done() and self.stop_outcome is None:
            self.stop_outcome = _disconnected()
        tasks = [t for t in (self._pump, self._watch) if t is not None]
        for task in tasks:
            task.cancel()
        job = asyncio.get_running_loop().create_task(self._finish_after(tasks))
        _background.add(job)
        job.add_done_callback(_background.discard)

    async def _wait(self, timeout: float) -> bool:
        """Sleep until the pump has news (True) or ``timeout`` seconds pass (False)."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        handle = loop.call_later(timeout, _resolve, waiter, False)
        try:
            return await waiter
        finally:
            handle.cancel()
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None:
            _resolve(self._waiter, True)

    # -- the provider side -----------------------------------------------------------------------

    async def _run_pump(self) -> None:
        try:
            async with asyncio.timeout(conf.MAX_DURATION):
                await self._call_upstream()
            self.outcome = self._natural_end()
        except asyncio.CancelledError:
            self.outcome = self.stop_outcome or _disconnected()
            raise
        except Exception as error:  # every failure becomes a stored, labelled outcome
            if not isinstance(error, UpstreamError | httpx.HTTPError | TimeoutError):
                logger.exception("Generation %s failed unexpectedly", self.id)
            else:
                logger.info("Generation %s: %r", self.id, error)
            if isinstance(error, UpstreamError) and error.status is not None:
                self.http_status = error.status
                self.request_id = error.request_id or self.request_id
            self.outcome = outcome_for(error, started=self.started)
        finally:
            self._wake()

    async def _call_upstream(self) -> None:
        client = upstream.get_client()
        body = upstream.encode_body(self.request)
        for attempt in (1, 2):
            try:
                async with client.stream(
                    "POST", self.request.url, content=body, headers=self.request.headers,
                    timeout=upstream.timeout(),
                ) as response:
                    self.request_id = response.headers.get("x-request-id", "")
                    self.http_status = response.status_code
                    await upstream.raise_for_status(response, self.request)
                    self.started = True
                    await self._relay(response)
                    return
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                # Nothing reached the provider: the one automatic retry is safe.
                if attempt == 2:
                    raise upstream.connect_error(exc, self.request) from exc
                await asyncio.sleep(0.25)

    async def _relay(self, response: httpx.Response) -> None:
        decoder, acc, parts, outbox = self.decoder, self.acc, self.parts, self.outbox
        chunks = response.aiter_raw()
        async for chunk in chunks:
            for event in decoder.feed(chunk):
                delta = acc.feed(event.data, event=event.event)
                if delta:
                    parts.append(delta)
                    outbox.append(delta)
            if outbox:
                if self.first_token_at is None:
                    self.first_token_at = timezone.now()
                self._wake()
            if acc.done:
                await _drain(chunks)
                return
        decoder.close()

    def _natural_end(self) -> Outcome:
        choice = self.acc.choices.get(0)
        if self.acc.done or (choice is not None and choice.finish_reason):
            return Outcome(Status.COMPLETED)
        return outcome_for(
            IncompleteStreamError("The stream ended before the reply was complete."),
            started=True,
        )

    # -- stop signals and checkpoints -----------------------------------------------------------

    def stop(self) -> None:
        """A Stop arrived (from any process): close the upstream now, keep the text."""
        if self._pump is not None and not self._pump.done():
            if self.stop_outcome is None:
                self.stop_outcome = _stopped()
            self._pump.cancel()

    async def _run_watch(self) -> None:
        subscribed = await stopping.subscribe(self.id, self.stop)
        try:
            if await _in_pool(_stop_requested)(self.id):
                self.stop()
                return
            tick = min(conf.CHECKPOINT_INTERVAL, conf.STOP_POLL_INTERVAL)
            saved_parts, last_write, last_poll = 0, time.monotonic(), time.monotonic()
            while True:
                await asyncio.sleep(tick)
                now = time.monotonic()
                dirty = len(self.parts) != saved_parts
                if dirty and now - last_write >= conf.CHECKPOINT_INTERVAL or (
                    now - last_write >= conf.HEARTBEAT_INTERVAL
                ):
                    saved_parts = len(self.parts)
                    last_write = last_poll = now
                    if not await _in_pool(_checkpoint)(self.id, self._checkpoint_fields()):
                        self.stop()
                        return
                elif not subscribed and now - last_poll >= conf.STOP_POLL_INTERVAL:
                    last_poll = now
                    if await _in_pool(_stop_requested)(self.id):
                        self.stop()
                        return
        finally:
            if subscribed:
                await stopping.unsubscribe(self.id)

    def _checkpoint_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"heartbeat_at": timezone.now()}
        if self.parts:
            fields["content"] = "".join(self.parts)
            fields["first_token_at"] = self.first_token_at
        return fields

    # -- the final save ---------------------------------------------------------------------------

    async def _save(self, outcome: Outcome) -> Generation:
        fields = self._final_fields(outcome)
        generation = await _in_pool(_finish)(self.generation, fields)
        self.saved = True
        return generation

    def _final_fields(self, outcome: Outcome) -> dict[str, Any]:
        content = "".join(self.parts)
        choice = self.acc.choices.get(0)
        tool_calls = [
            {"id": c.id, "type": c.type, "name": c.name, "arguments": c.arguments}
            for c in (choice.tool_calls if choice else [])
        ]
        fields: dict[str, Any] = {
            "status": outcome.status,
            "reason": outcome.reason,
            "error_type": outcome.error_type,
            "content": content,
            "finish_reason": (choice.finish_reason or "") if choice else "",
            "tool_calls": tool_calls,
            "request_id": self.request_id,
            "http_status": self.http_status,
            "provider_model": self.acc.model or self.model.model,
            "first_token_at": self.first_token_at,
            "completed_at": timezone.now(),
            "heartbeat_at": None,
        }
        fields.update(self._usage_fields(content, bool(tool_calls)))
        return fields

    def _usage_fields(self, content: str, has_tools: bool) -> dict[str, Any]:
        usage = _valid_usage(self.acc.usage)
        if usage is not None:
            return {**usage, "usage_source": Generation.UsageSource.PROVIDER}
        if content or has_tools:
            return {
                "prompt_tokens": self.prompt_estimate,
                "cached_tokens": None,
                "completion_tokens": estimate_tokens(content)
                + sum(estimate_tokens(c.arguments) for c in self.acc.choices[0].tool_calls),
                "usage_source": Generation.UsageSource.ESTIMATED,
            }
        return {"prompt_tokens": None, "cached_tokens": None, "completion_tokens": None,
                "usage_source": Generation.UsageSource.NONE}


def _valid_usage(usage: dict[str, Any] | None) -> dict[str, int | None] | None:
    """The provider's figures, or None when missing or not plausible (never trusted blindly)."""
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31
               for v in (prompt, completion)):
        return None
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if not (isinstance(cached, int) and 0 <= cached <= prompt):  # type: ignore[operator]
        cached = None
    return {"prompt_tokens": prompt, "completion_tokens": completion, "cached_tokens": cached}


def _resolve(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


async def _drain(chunks: AsyncIterator[bytes]) -> None:
    """Read what follows ``[DONE]`` (normally nothing) so the connection can be reused."""
    try:
        async with asyncio.timeout(0.25):
            async for _ in chunks:
                pass
    except (TimeoutError, httpx.HTTPError):
        pass


def _notice_html(notice: str) -> str:
    from django.utils.html import format_html

    return format_html('<p class="cs-notice" role="alert">{}</p>', notice)


# -- database work (sync, run on the shared executor) --------------------------------------------


def _stop_requested(generation_id: UUID) -> bool:
    return Generation.objects.filter(pk=generation_id, cancel_requested=True).exists()


def _checkpoint(generation_id: UUID, fields: dict[str, Any]) -> bool:
    """Save the partial text; False if the row stopped being ours (Stop, or swept)."""
    return bool(
        Generation.objects.filter(
            pk=generation_id, status=Status.STREAMING, cancel_requested=False
        ).update(**fields)
    )


def _finish(generation: Generation, fields: dict[str, Any]) -> Generation:
    with transaction.atomic():
        Generation.objects.filter(pk=generation.pk).update(**fields)
        for name, value in fields.items():
            setattr(generation, name, value)
        if fields["content"]:
            Message.objects.update_or_create(
                generation=generation,
                defaults={
                    "conversation_id": generation.conversation_id,
                    "role": Message.Role.ASSISTANT,
                    "content": fields["content"],
                },
            )
        Conversation.objects.filter(pk=generation.conversation_id).update(
            updated_at=timezone.now()
        )
        from . import quota

        quota.settle(generation)
    return generation


# ---------------------------------------------------------------------------------------------
# Entry points used by the views


async def astart(generation: Generation, render_final: Callable[[Generation], str]
                 ) -> AsyncIterator[bytes] | None:
    """Claim ``generation`` and return its live event stream, or None if another request has it."""
    if not await aclaim(generation.pk):
        return None
    model = conf.get_model(generation.model)
    messages = await _in_pool(history)(generation)
    # The request's own connection is not needed while streaming: give it back now.
    await sync_to_async(close_old_connections)()
    if model is None:  # the allow-list changed since the message was posted
        return _refuse(generation, render_final)
    return Run(generation, model, messages).events(render_final)


async def _refuse(generation: Generation, render_final: Callable[[Generation], str]
                  ) -> AsyncIterator[bytes]:
    outcome = Outcome(Status.FAILED, "model no longer allowed", "model_not_allowed",
                      describe(Status.FAILED, error_type="model_not_allowed"))
    fields = {"status": outcome.status, "reason": outcome.reason, "error_type": outcome.error_type,
              "content": "", "completed_at": timezone.now(), "heartbeat_at": None}
    generation = await _in_pool(_finish)(generation, fields)
    yield wire.error(_notice_html(outcome.notice))
    yield wire.done(render_final(generation))


async def afollow(generation_id: UUID, render_final: Callable[[Generation], str]
                  ) -> AsyncIterator[bytes]:
    """Replay the stored text, then follow the checkpoints of a stream running elsewhere."""
    sent = 0
    last_send = time.monotonic()
    while True:
        generation = await _in_pool(_load)(generation_id)
        if len(generation.content) > sent:
            yield wire.deltas([generation.content[sent:]])
            sent = len(generation.content)
            last_send = time.monotonic()
        if not generation.is_live:
            yield wire.done(render_final(generation))
            return
        if time.monotonic() - last_send >= conf.PING_INTERVAL:
            yield wire.PING
            last_send = time.monotonic()
        await asyncio.sleep(conf.CHECKPOINT_INTERVAL)


def _load(generation_id: UUID) -> Generation:
    return Generation.objects.select_related("conversation", "prompt_message").get(
        pk=generation_id
    )


async def arequest_stop(generation: Generation) -> Generation:
    """Stop ``generation`` wherever it streams; a pending one is cancelled on the spot."""
    await _in_pool(_request_stop)(generation.pk)
    await stopping.publish(generation.pk)
    return await _in_pool(_load)(generation.pk)


def _request_stop(generation_id: UUID) -> None:
    now = timezone.now()
    with transaction.atomic():
        cancelled = Generation.objects.filter(pk=generation_id, status=Status.PENDING).update(
            status=Status.CANCELLED, reason="stopped by user", error_type="stopped_by_user",
            cancel_requested=True, completed_at=now, usage_source=Generation.UsageSource.NONE,
        )
        if cancelled:
            from . import quota

            quota.settle(Generation.objects.get(pk=generation_id))
        else:
            Generation.objects.filter(pk=generation_id, status=Status.STREAMING).update(
                cancel_requested=True
            )


def sweep(*, now: datetime | None = None) -> dict[str, int]:
    """Close generations whose worker died (stale heartbeat) or that nobody ever streamed."""
    from datetime import timedelta

    from . import quota

    now = now or timezone.now()
    counts = {"interrupted": 0, "abandoned": 0}
    stale = Generation.objects.filter(
        status=Status.STREAMING, heartbeat_at__lt=now - timedelta(seconds=conf.STALE_AFTER)
    )
    for generation in stale.only("pk"):
        with transaction.atomic():
            row = (Generation.objects.select_for_update().filter(
                pk=generation.pk, status=Status.STREAMING,
                heartbeat_at__lt=now - timedelta(seconds=conf.STALE_AFTER)).first())
            if row is None:
                continue
            row.status = Status.INTERRUPTED
            row.reason = "worker stopped responding"
            row.error_type = "worker_lost"
            row.completed_at = now
            row.heartbeat_at = None
            if row.content:
                row.usage_source = Generation.UsageSource.ESTIMATED
                row.completion_tokens = estimate_tokens(row.content)
                row.prompt_tokens = estimate_tokens(
                    "".join(m["content"] for m in history(row)))
                Message.objects.update_or_create(
                    generation=row, defaults={"conversation_id": row.conversation_id,
                                              "role": Message.Role.ASSISTANT,
                                              "content": row.content})
            row.save()
            quota.settle(row)
            counts["interrupted"] += 1
    abandoned = Generation.objects.filter(
        status=Status.PENDING, created_at__lt=now - timedelta(seconds=conf.PENDING_TIMEOUT)
    )
    for generation in abandoned.only("pk"):
        with transaction.atomic():
            changed = Generation.objects.filter(pk=generation.pk, status=Status.PENDING).update(
                status=Status.CANCELLED, reason="never streamed", error_type="abandoned",
                completed_at=now)
            if changed:
                quota.settle(Generation.objects.get(pk=generation.pk))
                counts["abandoned"] += 1
    return counts


asweep = _in_pool(sweep)

_last_lazy_sweep = 0.0


async def amaybe_sweep() -> None:
    """Run the sweeper from the app itself, at most every CHATSTREAM_SWEEP_INTERVAL seconds."""
    global _last_lazy_sweep
    interval = conf.SWEEP_INTERVAL
    now = time.monotonic()
    if not interval or now - _last_lazy_sweep < interval:
        return
    _last_lazy_sweep = now
    job = asyncio.get_running_loop().create_task(asweep())
    _background.add(job)
    job.add_done_callback(_background.discard)


__all__ = ["Outcome", "Run", "aclaim", "afollow", "arequest_stop", "astart", "history", "sweep"]
