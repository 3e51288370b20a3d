"""Stop signals that reach the worker process streaming a generation, wherever it runs.

A Stop is written twice: a durable flag on the row (``cancel_requested``), then a message on the
channel layer (``CHATSTREAM_CHANNEL_LAYER``; in-memory in one process, channels_redis across many).
The streaming side subscribes *first* and checks the flag *second*, so a Stop sent in between is
never lost; without a channel layer it polls the flag every ``CHATSTREAM_STOP_POLL_INTERVAL``.
Both carry the Stop's cause (``StopCause``: the user's Stop, or their sign-out, deactivation,
refused access: see _revocation.py), which the stream stores as its outcome's reason: the
message as ``cause``, the row as its ``error_type`` and ``reason``, written with the flag.

Each process listens on one channel of its own and routes stop messages to its live generations,
so an open stream costs a group membership, not a receive loop.

The same channel carries "watched" messages: a page that shows a streaming reply (a reload,
another tab) says so, and the streaming process then hands the reply over to that page instead
of cancelling it when the page that started it goes away (see ``Run`` in _run.py). And it
carries what followers in other processes need (see _following.py): the streaming process sends
a watched reply's new text to the reply's follow group, and a last message once it is saved.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any
from uuid import UUID

from .._loops import PerLoop
from ..conf import conf

logger = logging.getLogger("chatstream.stopping")

MESSAGE_TYPE = "chatstream.stop"
WATCHED_TYPE = "chatstream.watched"
TEXT_TYPE = "chatstream.text"
ENDED_TYPE = "chatstream.ended"

Handler = Callable[[dict[str, Any]], None]


def group_name(generation_id: UUID) -> str:
    """The group of the process streaming the reply (Stop, "watched")."""
    return f"chatstream.stop.{generation_id.hex}"


def follow_group_name(generation_id: UUID) -> str:
    """The group of the processes following the reply (its text, its end)."""
    return f"chatstream.follow.{generation_id.hex}"


def channel_layer() -> Any:
    """The configured channel layer, or None when Stop must poll the database."""
    alias = conf.CHANNEL_LAYER
    if not alias:
        return None
    from channels.layers import get_channel_layer
    from django.conf import settings

    if alias not in getattr(settings, "CHANNEL_LAYERS", {}):
        return None
    return get_channel_layer(alias)


class _Listener:
    """One receive loop per event loop, dispatching stop messages to local callbacks."""

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.callbacks: dict[str, dict[str, Handler]] = {}
        self.channel: str | None = None
        self.task: asyncio.Task[None] | None = None
        self.ready = asyncio.Lock()

    async def start(self) -> str:
        async with self.ready:
            if self.task is None or self.task.done():
                self.channel = await self.layer.new_channel("chatstream.")
                self.task = asyncio.get_running_loop().create_task(self._run())
        assert self.channel is not None
        return self.channel

    async def _run(self) -> None:
        pause = 0.0
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a broken layer must not kill the streams; retry
                # quickly first (a Redis read timeout under load is common and harmless:
                # the message waits in Redis), then back off to a second.
                pause = min(max(pause * 2, 0.05), 1.0)
                logger.warning("Stop listener: %r; retrying in %.2f s", error, pause)
                await asyncio.sleep(pause)
                continue
            pause = 0.0
            handlers = self.callbacks.get(message.get("generation", ""), {})
            callback = handlers.get(message.get("type", ""))
            if callback is not None:
                callback(message)


_listeners: PerLoop[_Listener] = PerLoop(lambda: _Listener(channel_layer()))


async def _listener() -> _Listener | None:
    layer = channel_layer()
    if layer is None:
        return None
    listener = _listeners.get()
    if listener.layer is not layer:  # the settings changed (tests): listen on the new layer
        if listener.task is not None:
            listener.task.cancel()
        listener = _listeners.set(_Listener(layer))
    await listener.start()
    return listener


async def _join(generation_id: UUID, group: str, handlers: dict[str, Handler]) -> bool:
    listener = await _listener()
    if listener is None:
        return False
    listener.callbacks.setdefault(generation_id.hex, {}).update(handlers)
    await listener.layer.group_add(group, listener.channel)
    return True


async def _leave(generation_id: UUID, group: str, types: tuple[str, ...]) -> None:
    listener = _listeners.peek()
    if listener is None or listener.channel is None:
        return
    handlers = listener.callbacks.get(generation_id.hex, {})
    for name in types:
        handlers.pop(name, None)
    if not handlers:
        listener.callbacks.pop(generation_id.hex, None)
    try:
        await listener.layer.group_discard(group, listener.channel)
    except Exception:  # the group expires on its own; never fail a finished stream for it
        logger.warning("Could not leave %s", group, exc_info=True)


async def subscribe(generation_id: UUID, on_stop: Callable[[str], None],
                    on_watched: Callable[[], None] | None = None) -> bool:
    """Call ``on_stop(cause)`` when a Stop for ``generation_id`` arrives (``on_watched`` when
    a page shows it); False without a channel layer."""
    handlers: dict[str, Handler] = {
        MESSAGE_TYPE: lambda message: on_stop(str(message.get("cause", ""))),
    }
    if on_watched is not None:
        handlers[WATCHED_TYPE] = lambda _message: on_watched()
    return await _join(generation_id, group_name(generation_id), handlers)


async def unsubscribe(generation_id: UUID) -> None:
    await _leave(generation_id, group_name(generation_id), (MESSAGE_TYPE, WATCHED_TYPE))


async def subscribe_follow(generation_id: UUID, on_message: Handler) -> bool:
    """Call ``on_message`` with each text and end message of ``generation_id``; False without
    a channel layer."""
    return await _join(generation_id, follow_group_name(generation_id),
                       {TEXT_TYPE: on_message, ENDED_TYPE: on_message})


async def unsubscribe_follow(generation_id: UUID) -> None:
    await _leave(generation_id, follow_group_name(generation_id), (TEXT_TYPE, ENDED_TYPE))


async def publish_text(generation_id: UUID, at: int, text: str) -> None:
    """Tell the reply's followers its text from character ``at`` on (maybe none: "alive")."""
    await _tell_followers(generation_id, {"type": TEXT_TYPE, "at": at, "text": text})


async def publish_ended(generation_id: UUID) -> None:
    """Tell the reply's followers that its outcome is saved."""
    await _tell_followers(generation_id, {"type": ENDED_TYPE})


async def _tell_followers(generation_id: UUID, message: dict[str, Any]) -> None:
    # Followers read the database when the group falls silent: a message the layer could not
    # carry costs them a read, and must never cost the stream its own outcome.
    layer = channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(follow_group_name(generation_id),
                               {**message, "generation": generation_id.hex})
    except Exception:
        logger.warning("Could not tell the followers of %s", generation_id, exc_info=True)


async def publish(generation_id: UUID, cause: str = "") -> None:
    """Tell whichever process streams ``generation_id`` to stop (after the flag is written);
    ``cause`` is the outcome's ``StopCause`` (the user's Stop when empty)."""
    layer = channel_layer()
    if layer is None:
        return
    await layer.group_send(group_name(generation_id),
                           {"type": MESSAGE_TYPE, "generation": generation_id.hex, "cause": cause})


async def publish_watched(generation_ids: list[UUID]) -> None:
    """Tell the processes streaming ``generation_ids`` that a page now shows them."""
    layer = channel_layer()
    if layer is None:
        return
    for generation_id in generation_ids:
        await layer.group_send(
            group_name(generation_id), {"type": WATCHED_TYPE, "generation": generation_id.hex}
        )
