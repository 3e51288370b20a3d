"""Pages that follow a reply another request streams: fanned out, not polled per page.

A page follows a reply it did not start: a reload, a second tab, a second GET of the stream.
Each process keeps one :class:`Feed` per followed reply, shared by all its followers there, and
a follower only reads the feed's text. The feed is fed from where the reply is:

- **This process streams it** (the same event loop): the run itself wakes the feed with every
  delta. No message, no query.
- **Another process streams it, over a channel layer**: the feed joins the reply's follow group
  and says, every few seconds, that a page watches; the streaming process then sends its new
  text to that group at each checkpoint pass, and a last message once the outcome is saved.
  The database is read when following starts, at the end, and only if the group falls silent
  (the streaming process died, or a message was lost).
- **No channel layer**: the feed reads the database once per checkpoint interval, for all of
  its followers.

So N pages following one reply cost what one does. Followers are bounded per process:
``CHATSTREAM_MAX_FOLLOWERS`` pages per reply and ``CHATSTREAM_MAX_FOLLOWERS_PER_USER`` followed
replies per user; one more is refused (:class:`TooManyFollowers`) before its response starts.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import AsyncGenerator, Callable
from typing import Any, Protocol, TypeVar, cast
from uuid import UUID

from .. import store
from .._loops import PerLoop
from ..conf import conf
from ..models import Generation, ToolCall
from ..web import rendered
from . import _stopping
from ._checkpoints import checkpointer, interval
from ._wire import Sent, Wire

logger = logging.getLogger("chatstream.following")

T = TypeVar("T", bytes, str)


class TooManyFollowers(Exception):
    """This process already serves as many followers as the settings allow."""


class LocalRun(Protocol):
    """What a feed reads of a run streaming in this process (see ``Run`` in _run.py)."""

    generation: Generation

    @property
    def saved(self) -> bool: ...

    def text_so_far(self) -> str: ...

    def watched(self) -> None: ...

    def listen(self, listener: Callable[[], None]) -> Callable[[], None]: ...


class Feed:
    """What this process knows of one followed reply: its text, and whether it is still live."""

    def __init__(self, generation_id: UUID) -> None:
        self.id = generation_id
        self.text = ""
        self.live = True
        self.final: Generation | None = None  # the reply as saved, once it has ended
        self.followers = 0
        self.run: LocalRun | None = None
        self.version = 0  # bumped at each change; a follower waits for the next one
        self._waiters: list[asyncio.Future[None]] = []
        self._heard = time.monotonic()  # last message from the streaming process
        self._resync = False  # a message showed a gap: read the database
        self.task: asyncio.Task[None] | None = None

    # -- for followers -------------------------------------------------------------------------

    @property
    def catch_up(self) -> float:
        """Seconds within which the feed has every character sent by the process streaming
        the reply elsewhere: a checkpoint written, then read or told."""
        return 3 * interval() + 1.0

    def current(self) -> tuple[str, bool]:
        if self.run is not None:
            return self.run.text_so_far(), not self.run.saved
        return self.text, self.live

    async def wait(self, version: int, within: float) -> bool:
        """Until the feed changes after ``version`` (True), or ``within`` seconds (False)."""
        if self.version != version:
            return True
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(within):
                await waiter
            return True
        except TimeoutError:
            return False
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def changed(self) -> None:
        self.version += 1
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- from where the reply is ---------------------------------------------------------------

    def stored(self, generation: Generation) -> None:
        """The reply as the database has it (a prefix of what messages may already have said)."""
        if len(generation.content) > len(self.text):
            self.text = generation.content
        self.live = generation.is_live
        if not self.live:
            self.final = generation
        self.changed()

    def heard(self, message: dict[str, Any]) -> None:
        """A message from the streaming process: text from offset ``at``, or the end."""
        self._heard = time.monotonic()
        if message.get("type") == _stopping.ENDED_TYPE:
            self._resync = True  # the outcome is saved: read it
        else:
            at, piece = int(message.get("at", 0)), str(message.get("text", ""))
            if at > len(self.text):
                self._resync = True  # joined late, or a message was lost
            elif at + len(piece) > len(self.text):
                self.text += piece[len(self.text) - at:]
        self.changed()

    async def drive(self) -> None:
        """Keep the feed current while it has followers (its own task)."""
        run = checkpointer().streams.get(self.id)
        if run is not None:
            await self._drive_local(cast("LocalRun", run))
            return
        subscribed = await _stopping.subscribe_follow(self.id, self.heard)
        try:
            await self._drive_remote(subscribed)
        finally:
            if subscribed:
                await _stopping.unsubscribe_follow(self.id)

    async def _drive_local(self, run: LocalRun) -> None:
        def heard() -> None:
            if run.saved:
                self.final = run.generation
            self.changed()

        self.run = run
        stop_listening = run.listen(heard)
        self.changed()
        try:
            while not run.saved:
                run.watched()  # a page shows it: it carries on if its own page goes away
                await asyncio.sleep(conf.HANDOVER_GRACE / 3)
            self.final = run.generation
        finally:
            stop_listening()

    async def poll(self) -> None:
        """Follow by reading the database each checkpoint interval (no channel layer)."""
        await self._drive_remote(subscribed=False)

    async def _drive_remote(self, subscribed: bool) -> None:
        follow = store.for_alias().follow
        self.stored(await follow(self.id))
        # Without a channel layer the database is the only way; with one, it is read only
        # when the streaming process has said nothing for a few of its checkpoint passes.
        every = interval()
        silence = self.catch_up
        announced = 0.0
        while self.live:
            now = time.monotonic()
            if subscribed and now - announced >= conf.HANDOVER_GRACE / 3:
                announced = now
                await _stopping.publish_watched([self.id])
            await asyncio.sleep(every)
            if not subscribed or self._resync or time.monotonic() - self._heard > silence:
                self._resync = False
                self._heard = time.monotonic()
                self.stored(await follow(self.id))


class _Feeds:
    """One event loop's feeds, and how many each user follows."""

    def __init__(self) -> None:
        self.feeds: dict[UUID, Feed] = {}
        self.per_user: dict[Any, int] = {}

    def acquire(self, generation_id: UUID, user_id: Any) -> Feed:
        feed = self.feeds.get(generation_id)
        if feed is not None and feed.followers >= conf.MAX_FOLLOWERS:
            raise TooManyFollowers
        if self.per_user.get(user_id, 0) >= conf.MAX_FOLLOWERS_PER_USER:
            raise TooManyFollowers
        if feed is None:
            feed = self.feeds[generation_id] = Feed(generation_id)
            feed.task = asyncio.get_running_loop().create_task(self._drive(feed))
        feed.followers += 1
        self.per_user[user_id] = self.per_user.get(user_id, 0) + 1
        return feed

    def release(self, feed: Feed, user_id: Any) -> None:
        feed.followers -= 1
        left = self.per_user.get(user_id, 1) - 1
        if left:
            self.per_user[user_id] = left
        else:
            self.per_user.pop(user_id, None)
        if feed.followers == 0 and self.feeds.get(feed.id) is feed:
            del self.feeds[feed.id]
            if feed.task is not None:
                feed.task.cancel()

    async def _drive(self, feed: Feed) -> None:
        try:
            await feed.drive()
            return
        except asyncio.CancelledError:
            raise
        except Exception:  # the channel layer, say: the database still serves
            logger.exception("Following generation %s failed; reading the database instead",
                             feed.id)
        feed.run = None
        try:
            await feed.poll()
        except asyncio.CancelledError:
            raise
        except Exception:  # nothing left to follow with: the followers end, as stored
            logger.exception("Following generation %s failed", feed.id)
            feed.live = False
            feed.changed()


_feeds: PerLoop[_Feeds] = PerLoop(_Feeds)


class Place:
    """A follower's place among a reply's followers in this process, given back once."""

    def __init__(self, feeds: _Feeds, feed: Feed, user_id: Any) -> None:
        self.feeds, self.feed, self.user_id = feeds, feed, user_id
        self.taken = True

    def release(self) -> None:
        if self.taken:
            self.taken = False
            self.feeds.release(self.feed, self.user_id)


def admit(generation_id: UUID, user_id: Any, wire: Wire[T], *, after: int = 0
          ) -> AsyncGenerator[T, None]:
    """A follower's stream of the reply, written by ``wire``, from its character ``after`` on
    (see ``_wire.Sent``):
    a place among its followers in this process, taken now (TooManyFollowers if none is left)
    and given back when the stream ends, or when it is dropped without ever being read (a
    browser gone before its response started)."""
    feeds = _feeds.get()
    place = Place(feeds, feeds.acquire(generation_id, user_id), user_id)
    body = _follow(place, wire, after)
    weakref.finalize(body, place.release)
    return body


async def _follow(place: Place, wire: Wire[T], after: int) -> AsyncGenerator[T, None]:
    """The text after ``after``, then the reply as it grows, then its final message; first,
    whatever ``wire`` sends a client that has the text before ``after`` (``Wire.resume``).

    A client that has more than this process knows yet (it was sent the text by the process
    streaming the reply, which has not told this one) waits until the feed catches up; one
    that claims more than the reply has gets its whole text so far (``reset``) or, once it
    has ended, only the final message, which replaces what the page shows.

    A client that has text (``after``) shows it live until ``done``, even when the reply has
    ended meanwhile (its connection came back late): it is sent the blocks of that text again,
    the rest, and the last block, so that the final message changes nothing of what it shows.
    Only a client that shows none of the reply gets its final message alone.
    """
    feed = place.feed
    catch_up = time.monotonic() + feed.catch_up
    sent: Sent | None = None  # where this client is in the text, once the feed has reached it
    shows_text = False  # whether this client shows any of the reply's text before `done`
    try:
        while True:
            version = feed.version
            text, live = feed.current()
            if sent is None:
                sent = Sent.at(text, after)
                if sent is None and live and feed.run is None and time.monotonic() < catch_up:
                    if not await feed.wait(version, min(catch_up - time.monotonic(),
                                                        conf.PING_INTERVAL)):
                        yield wire.ping
                    continue
                if sent is None and live:
                    sent, shows_text = Sent(), True
                    yield await wire.reset(sent.piece(text), sent)
                elif sent is None:
                    break
                elif after:  # live or not: the client shows the text before `after`
                    shows_text = True
                    if earlier := await wire.resume(Sent().piece(text[:sent.raw])):
                        yield earlier
            if not live:
                break  # the rest goes with the final message
            if piece := sent.rest(text):
                shows_text = True
                yield await _delta(wire, piece, sent)
            if not await feed.wait(version, conf.PING_INTERVAL):
                yield wire.ping
        generation = feed.final or await store.for_alias().follow(feed.id)
        if generation.tool_calls:  # its final form shows its calls
            generation.shown_calls = [  # type: ignore[attr-defined]
                call async for call in ToolCall.objects.filter(generation_id=generation.pk)]
        final = await rendered.off_loop(rendered.cost(generation), wire.render, generation)
        if not shows_text:  # a reply it shows none of: its final message is all it takes
            wire.ended()
        if sent is not None and (piece := sent.rest(generation.content)):
            yield await _delta(wire, piece, sent)
        yield await wire.done(final)
    finally:
        place.release()


async def _delta(wire: Wire[T], piece: str, sent: Sent) -> T:
    """A ``delta`` of ``piece``, with the blocks it finished."""
    chunk = wire.delta(piece, sent)
    return chunk + await wire.blocks() if wire.pending else chunk
