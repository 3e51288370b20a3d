"""What the simulator saw: one :class:`RecordedRequest` per Chat Completions request.

The server thread writes these records while tests read them from other threads (or, through
``GET /_simulator/requests``, other processes), so every change happens under one lock and
``wait_*`` methods block on events, never on the server's loop. Times named ``*_at`` are
``time.monotonic()`` readings (one clock for all processes on Linux), except ``received_at``,
which is ``time.time()``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

_POLL = 0.002  # seconds between checks in the async twins, which must not block their loop


@dataclass(eq=False)
class RecordedRequest:
    """One request to ``/v1/chat/completions`` and what became of its response."""

    id: str
    model: str = ""
    scenario: str = ""
    status: int = 0
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    connection_id: int = 0
    received_at: float = field(default_factory=time.time)
    received_monotonic: float = field(default_factory=time.monotonic)
    chunks_sent: int = 0
    first_chunk_at: float | None = None
    completed: bool = False
    client_closed: bool = False
    client_closed_at: float | None = None
    chunks_sent_at_close: int | None = None
    chunks_after_close: int = 0
    finished_at: float | None = None
    connection_closed_at: float | None = None
    _ended: threading.Event = field(default_factory=threading.Event, repr=False)
    _connection_closed: threading.Event = field(default_factory=threading.Event, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def wait_closed(self, timeout: float = 5.0) -> bool:
        """Block until the client closed the connection or the response ended; False on timeout."""
        return self._ended.wait(timeout)

    # The async twins take ``timeout`` like their sync originals (Django's a-prefix convention).
    async def await_closed(self, timeout: float = 5.0) -> bool:  # noqa: ASYNC109
        """Async twin of :meth:`wait_closed` that keeps the calling event loop running."""
        return await _until_set(self._ended, timeout)

    def wait_connection_closed(self, timeout: float = 5.0) -> bool:
        """Block until the connection that carried this request was closed, by either side, even
        after its response was written whole; False on timeout. (A client that cut a response
        short closes its connection; whether the response was written whole before is a race
        between the server's writes and the sockets' buffers.)"""
        return self._connection_closed.wait(timeout)

    async def await_connection_closed(self, timeout: float = 5.0) -> bool:  # noqa: ASYNC109
        """Async twin of :meth:`wait_connection_closed`."""
        return await _until_set(self._connection_closed, timeout)

    @property
    def ended(self) -> bool:
        """The response is over: completed, cut, or abandoned by the client."""
        return self._ended.is_set()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy (what ``GET /_simulator/requests`` returns)."""
        with self._lock:
            return {name: getattr(self, name) for name in _PUBLIC}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RecordedRequest:
        """Rebuild a record read from another process's ``/_simulator/requests``."""
        record = cls(**{name: data[name] for name in _PUBLIC if name in data})
        if record.finished_at is not None or record.client_closed:
            record._ended.set()
        if record.connection_closed_at is not None:
            record._connection_closed.set()
        return record

    # The server's side. Each runs in the simulator's thread.

    def _chunk_sent(self) -> None:
        with self._lock:
            if self.client_closed:
                self.chunks_after_close += 1
                return
            self.chunks_sent += 1
            if self.first_chunk_at is None:
                self.first_chunk_at = time.monotonic()

    def _closed_by_client(self, at: float) -> None:
        with self._lock:
            if self.client_closed or self.finished_at is not None:
                return
            self.client_closed = True
            self.client_closed_at = at
            self.chunks_sent_at_close = self.chunks_sent
        self._ended.set()

    def _connection_lost(self, at: float) -> None:
        with self._lock:
            self.connection_closed_at = at
        self._connection_closed.set()

    def _write_after_close(self) -> None:
        with self._lock:
            self.chunks_after_close += 1

    def _finish(self, *, completed: bool) -> None:
        with self._lock:
            if self.finished_at is None:
                self.finished_at = time.monotonic()
                self.completed = completed and not self.client_closed
        self._ended.set()


_PUBLIC = [name for name in RecordedRequest.__dataclass_fields__ if not name.startswith("_")]


async def _until_set(event: threading.Event, timeout: float) -> bool:  # noqa: ASYNC109
    """Poll ``event`` until it is set (True) or ``timeout`` passes (False), never blocking."""
    deadline = time.monotonic() + timeout
    while not event.is_set():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(_POLL)
    return True


class RequestLog:
    """The thread-safe list of records, with a condition to wait for new ones."""

    def __init__(self) -> None:
        self._records: list[RecordedRequest] = []
        self._changed = threading.Condition()

    def add(self, record: RecordedRequest) -> None:
        with self._changed:
            self._records.append(record)
            self._changed.notify_all()

    def snapshot(self) -> list[RecordedRequest]:
        with self._changed:
            return list(self._records)

    def clear(self) -> None:
        with self._changed:
            self._records.clear()

    def wait_for(self, count: int, timeout: float) -> list[RecordedRequest]:
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._records) >= count, timeout):
                raise TimeoutError(
                    f"Expected {count} request(s) at the simulator within {timeout}s, "
                    f"got {len(self._records)}."
                )
            return list(self._records)

    async def await_for(self, count: int, timeout: float) -> list[RecordedRequest]:  # noqa: ASYNC109
        deadline = time.monotonic() + timeout
        while True:
            records = self.snapshot()
            if len(records) >= count:
                return records
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"Expected {count} request(s) at the simulator within {timeout}s, "
                    f"got {len(records)}."
                )
            await asyncio.sleep(_POLL)
