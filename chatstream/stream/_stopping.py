"""Stop signals that reach the worker process streaming a generation, wherever it runs.

A Stop is written twice: a durable flag on the row (``cancel_requested``), then a message on the
channel layer (``CHATSTREAM_CHANNEL_LAYER``; in-memory in one process, channels_redis across many).
The streaming side subscribes *first* and checks the flag *second*, so a Stop sent in between is
never lost; without a channel layer it polls the flag every ``CHATSTREAM_STOP_POLL_INTERVAL``.

Each process listens on one channel of its own and routes stop messages to its live generations,
so an open stream costs a group membership, not a receive loop.

The same channel carries "watched" messages: a page that shows a streaming reply (a reload,
another tab) says so, and the streaming process then hands the reply over to that page instead
of cancelling it when the page that started it goes away (see ``Run`` in _run.py).
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


def group_name(generation_id: UUID) -> str:
    return f"chatstream.stop.{generation_id.hex}"


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
        self.callbacks: dict[str, dict[str, Callable[[], None]]] = {}
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
                callback()


_listeners: PerLoop[_Listener] = PerLoop(lambda: _Listener(channel_layer()))


async def subscribe(generation_id: UUID, on_stop: Callable[[], None],
                    on_watched: Callable[[], None] | None = None) -> bool:
    """Call ``on_stop`` when a Stop for ``generation_id`` arrives (``on_watched`` when a page
    shows it); False without a channel layer."""
    layer = channel_layer()
    if layer is None:
        return False
    listener = _listeners.get()
    if listener.layer is not layer:  # the settings changed (tests): listen on the new layer
        if listener.task is not None:
            listener.task.cancel()
        listener = _listeners.set(_Listener(layer))
    channel = await listener.start()
    handlers = {MESSAGE_TYPE: on_stop}
    if on_watched is not None:
        handlers[WATCHED_TYPE] = on_watched
    listener.callbacks[generation_id.hex] = handlers
    await layer.group_add(group_name(generation_id), channel)
    return True


async def unsubscribe(generation_id: UUID) -> None:
    listener = _listeners.peek()
    if listener is None or listener.channel is None:
        return
    listener.callbacks.pop(generation_id.hex, None)
    try:
        await listener.layer.group_discard(group_name(generation_id), listener.channel)
    except Exception:  # the group expires on its own; never fail a finished stream for it
        logger.warning("Could not leave the stop group of %s", generation_id, exc_info=True)


async def publish(generation_id: UUID) -> None:
    """Tell whichever process streams ``generation_id`` to stop (after the flag is written)."""
    layer = channel_layer()
    if layer is None:
        return
    await layer.group_send(
        group_name(generation_id), {"type": MESSAGE_TYPE, "generation": generation_id.hex}
    )


async def publish_watched(generation_ids: list[UUID]) -> None:
    """Tell the processes streaming ``generation_ids`` that a page now shows them."""
    layer = channel_layer()
    if layer is None:
        return
    for generation_id in generation_ids:
        await layer.group_send(
            group_name(generation_id), {"type": WATCHED_TYPE, "generation": generation_id.hex}
        )
