"""The circuit breaker: models cooling down after failing, shared by every worker process.

A model cools down when a call of it answers with a ``Retry-After`` (for that long, at most
``CHATSTREAM_BREAKER_COOLDOWN``), or when ``CHATSTREAM_BREAKER_FAILURES`` calls of it in a row
failed in this process (for ``BREAKER_COOLDOWN``). The cooldown is a row of ``Cooldown``, written
so that a new cooldown never shortens a running one; while it runs, no process calls the model
(its replies go to their fallbacks, or wait, or fail: see _attempts.py).

Each process reads the cooldowns from a snapshot, refreshed in the background at most once a
second when a call consults it; a reply waits for the read only when the snapshot is older than
``WAIT_AFTER`` (the process just started, or was idle), so a busy process's stream starts never
wait for it. A process learns of its own cooldowns at once, of another's within about two
seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timedelta
from typing import Any

from django.core.signals import setting_changed
from django.db.models import Value
from django.db.models.functions import Greatest
from django.utils import timezone

from .._failures import log_failure
from .._loops import in_executor
from ..conf import conf
from ..models import Cooldown

logger = logging.getLogger("chatstream.upstream")

REFRESH_EVERY = 1.0  # seconds between two reads of the cooldowns, at most
WAIT_AFTER = 2.0  # seconds after which a reply waits for a read rather than use what is known


class Breaker:
    """This process's view of the cooldowns, and its count of failures in a row per model."""

    def __init__(self) -> None:
        self.until: dict[str, datetime] = {}  # model key -> end of its cooldown
        self.failures: dict[str, int] = {}  # model key -> calls failed in a row, here
        self._read_at = -REFRESH_EVERY  # monotonic time of the last read
        self._reading: asyncio.Task[None] | None = None
        self._known = False  # the database read once (since the last forget)
        self._written: dict[str, tuple[float, datetime]] = {}  # cooldowns opened here, and when

    async def ready(self) -> None:
        """Before a reply's first call: what this process knows of the cooldowns is recent.
        A busy process reads them in the background (see :meth:`cooling`); one that has not
        read them for ``WAIT_AFTER`` seconds (it just started, or was idle) waits for a read."""
        if self._known and time.monotonic() - self._read_at < WAIT_AFTER:
            return
        self._refresh_soon(at_once=True)
        if self._reading is not None:
            await asyncio.shield(self._reading)

    def cooling(self, key: str) -> float:
        """Seconds ``key`` still cools down (0: it may be called)."""
        self._refresh_soon()
        until = self.until.get(key)
        if until is None:
            return 0.0
        left = (until - timezone.now()).total_seconds()
        return left if left > 0 else 0.0

    def succeeded(self, key: str) -> None:
        self.failures.pop(key, None)

    async def failed(self, key: str, *, retry_after: float | None, error_type: str) -> None:
        """A call of ``key`` failed (with the provider's ``retry_after``, if it sent one): cool
        it down if that makes ``BREAKER_FAILURES`` in a row, or for the ``Retry-After``."""
        failures = self.failures[key] = self.failures.get(key, 0) + 1
        seconds = None
        if retry_after is not None and retry_after > 0:
            seconds = min(retry_after, conf.BREAKER_COOLDOWN)
        if failures >= conf.BREAKER_FAILURES:
            seconds = conf.BREAKER_COOLDOWN
            self.failures[key] = 0  # counted again from the end of this cooldown
        if seconds is None:
            return
        until = timezone.now() + timedelta(seconds=seconds)
        if until > self.until.get(key, until - timedelta(seconds=1)):
            self.until[key] = until
        self._written[key] = (time.monotonic(), until)
        logger.warning("Model %r cools down for %.1f s after %s (%d failed in a row)",
                       key, seconds, error_type, failures)
        try:
            await in_executor(_cool)(key, until, error_type)
        except Exception as error:  # the breaker must never fail a reply
            log_failure(logger, error, "Model %r: its cooldown was not written", key)

    def forget(self) -> None:
        """Drop what this process knows (the next consultation reads the database)."""
        self.until.clear()
        self.failures.clear()
        self._written.clear()
        self._read_at = -REFRESH_EVERY
        self._known = False

    def _refresh_soon(self, *, at_once: bool = False) -> None:
        now = time.monotonic()
        if now - self._read_at < REFRESH_EVERY and not at_once:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        reading = self._reading  # one read at a time, unless its loop has gone
        if reading is not None and not reading.done() and reading.get_loop() is loop:
            return
        self._read_at = now
        self._reading = loop.create_task(self._refresh())

    async def _refresh(self) -> None:
        started = time.monotonic()
        try:
            found = await in_executor(_running)()
        except Exception as error:
            log_failure(logger, error, "The models' cooldowns could not be read")
        else:
            # The database's word (a cooldown staff ended is gone), but for the cooldowns this
            # process opened while the read was under way, which it may not hold yet.
            for key, (at, until) in list(self._written.items()):
                if at < started:
                    del self._written[key]
                elif until > found.get(key, until - timedelta(seconds=1)):
                    found[key] = until
            self.until = found
        finally:
            self._known = True  # or, the read failing, with what this process knows


def _cool(key: str, until: datetime, error_type: str) -> None:
    """Write ``key``'s cooldown until ``until``, never shortening the one running."""
    rows = Cooldown.objects.filter(model=key)
    changes = {"until": Greatest("until", Value(until)), "error_type": error_type,
               "updated_at": timezone.now()}
    if not rows.update(**changes):
        Cooldown.objects.bulk_create([Cooldown(model=key, until=until, error_type=error_type)],
                                     ignore_conflicts=True)
        rows.update(**changes)


def _running() -> dict[str, datetime]:
    return dict(Cooldown.objects.filter(until__gt=timezone.now())
                .values_list("model", "until"))


breaker = Breaker()


def _forget_on_change(*, setting: str, **_kwargs: Any) -> None:
    # Another allow-list (a test's, say) starts with no cooldown known to this process.
    if setting.startswith("CHATSTREAM_"):
        breaker.forget()


setting_changed.connect(_forget_on_change)
