"""Periodic database checkpoints of every live stream in this process, batched.

One task per event loop wakes every ``CHATSTREAM_CHECKPOINT_INTERVAL`` seconds and writes, in
one transaction, the partial text of each stream that changed (and a heartbeat for those silent
for ``CHATSTREAM_HEARTBEAT_INTERVAL``). So each stream costs at most one row write per interval,
and the process one commit, however many streams are open. Once a reply's call has committed
(its first content accepted), its checkpoints also write ``answered_by``, and the first of them
the records of the calls that failed before it, if any (one INSERT for all such streams of the
pass, in the pass's transaction): a worker that dies then leaves the sweeper the model that was
answering, and the calls made. The same pass detects a Stop written to the database (the
conditional UPDATE matches nothing; one more query then reads why) and, when no channel layer
carries Stop, polls the flag of the silent streams; it also reads, once, the flag of each stream
that has just subscribed to Stop messages (one query for all of them). And each pass tells the
followers in other processes of a watched stream what it wrote (see _following.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol
from uuid import UUID

from .. import store
from .._loops import PerLoop
from ..conf import conf
from ..models import Attempt
from . import _stopping

logger = logging.getLogger("chatstream.checkpoints")


class Checkpointed(Protocol):
    id: UUID
    polls_for_stop: bool
    watched_until: float  # monotonic time until which a page is known to show it

    @property
    def checkpointed(self) -> str:
        """The reply's text as of the last checkpoint."""
        ...

    def checkpoint_fields(self, *, heartbeat: bool) -> dict[str, Any] | None: ...

    def calls_to_store(self) -> list[Attempt]:
        """The call records to write with the checkpoint of ``checkpoint_fields``."""
        ...

    def calls_stored(self, written: bool) -> None:
        """The checkpoint given ``calls_to_store``'s records has ended (``written``: they are
        stored)."""
        ...

    def stop(self, cause: str = "") -> None: ...


def interval() -> float:
    """Seconds between checkpoint passes (which also read the Stop flag)."""
    return min(conf.CHECKPOINT_INTERVAL, conf.STOP_POLL_INTERVAL)


class Checkpointer:
    """The batch writer of one event loop."""

    def __init__(self) -> None:
        self.streams: dict[UUID, Checkpointed] = {}
        self.last_write: dict[UUID, float] = {}
        self.unread_flags: set[UUID] = set()  # streams whose Stop flag the next pass reads
        self.task: asyncio.Task[None] | None = None

    def add(self, stream: Checkpointed) -> None:
        self.streams[stream.id] = stream
        self.last_write[stream.id] = time.monotonic()
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run())

    def discard(self, stream: Checkpointed) -> None:
        self.streams.pop(stream.id, None)
        self.last_write.pop(stream.id, None)
        self.unread_flags.discard(stream.id)

    def read_flag_once(self, generation_id: UUID) -> None:
        """The stream has subscribed to Stop messages: the next pass reads its flag, once (a
        Stop written before the subscription)."""
        self.unread_flags.add(generation_id)

    async def _run(self) -> None:
        while self.streams:
            await asyncio.sleep(interval())
            try:
                await self._pass()
            except Exception:  # a failed write must not end the streams; the next pass retries
                logger.exception("Checkpoint pass failed")

    async def _pass(self) -> None:
        now = time.monotonic()
        rows: dict[UUID, dict[str, Any]] = {}
        calls: list[Attempt] = []
        storing: list[Checkpointed] = []  # the streams whose calls go with this pass
        polls: list[UUID] = []
        told: list[tuple[UUID, int]] = []  # watched streams, and where their new text starts
        unread, self.unread_flags = self.unread_flags, set()
        for generation_id, stream in list(self.streams.items()):
            if now < stream.watched_until and not stream.polls_for_stop:
                told.append((generation_id, len(stream.checkpointed)))
            silent_for = now - self.last_write.get(generation_id, now)
            fields = stream.checkpoint_fields(heartbeat=silent_for >= conf.HEARTBEAT_INTERVAL)
            if fields is not None:
                rows[generation_id] = fields  # the conditional UPDATE also reads the flag
                self.last_write[generation_id] = now
                if found_calls := stream.calls_to_store():
                    calls += found_calls
                    storing.append(stream)
            elif stream.polls_for_stop or generation_id in unread:
                polls.append(generation_id)
        lost: set[UUID] = set()
        written = False
        try:
            if rows:
                lost = await store.for_alias().checkpoint(rows, calls=calls)
                written = True
        finally:  # a final save waits for this: it writes the calls not written here
            for stream in storing:
                stream.calls_stored(written and stream.id not in lost)
        # Why each was stopped is read with the flag: for the streams lost above (rare: one
        # more query then), in the same query as the polls.
        stopped: dict[UUID, str] = {}
        if polls or lost:
            stopped = await store.for_alias().stop_requested([*polls, *lost])
        for generation_id in lost | stopped.keys():
            if (found := self.streams.get(generation_id)) is not None:
                found.stop(stopped.get(generation_id, ""))
        # Written first, then told: a follower that reads the database after a message finds
        # at least what the message said.
        for generation_id, at in told:
            if (found := self.streams.get(generation_id)) is not None:
                await _stopping.publish_text(generation_id, at, found.checkpointed[at:])


_checkpointers = PerLoop(Checkpointer)
checkpointer = _checkpointers.get  # the running event loop's checkpointer
