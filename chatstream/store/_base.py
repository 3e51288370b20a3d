"""The interface of a stream's database work, which each store implements."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol
from uuid import UUID

from ..models import Attempt, Generation, QuotaCharge


class Settlement(Protocol):
    """How a reply's quota hold settles, computed by the quota from the reply's outcome and
    handed to the store as data, to apply in the transaction that saves the outcome."""

    def against(self, charge: QuotaCharge) -> dict[str, Any]:
        """The fields of the hold ``charge`` as settled (charged, charged_cost, source)."""
        ...

    def cost_fields(self, generation: Generation) -> dict[str, Any]:
        """The ``cost`` and ``currency`` of ``generation`` as it ends, from its usage."""
        ...


class Store:
    """What a stream asks of its database, from the event loop; one store per database alias.

    Every method is a coroutine and none holds a connection between calls, so an open stream
    pins no thread and no connection.
    """

    async def claim(self, generation_id: UUID, user_id: Any) -> Generation | None:
        """Move the user's pending generation to streaming and return it, or None if it wasn't
        ours to take.

        Of any number of concurrent callers, in any process, exactly one gets the claim. A user
        whose ``is_active`` is False never gets one (a user model without that field counts
        as active, as Django's ModelBackend counts it): the statement itself checks.
        """
        raise NotImplementedError

    async def checkpoint(self, rows: dict[UUID, dict[str, Any]], *,
                         calls: Sequence[Attempt] = ()) -> set[UUID]:
        """Write each live generation's fields (its text so far, a heartbeat) and, of those
        still ours, the records of their upstream calls in ``calls`` (new rows), in one
        transaction; return those no longer ours (a Stop was requested, or the sweeper closed
        them)."""
        raise NotImplementedError

    async def finish(self, generation: Generation, fields: dict[str, Any],
                     settlement: Settlement | None = None,
                     attempts: Sequence[Attempt] = ()) -> None:
        """Store the outcome ``fields`` (set on ``generation`` too), the reply message, the
        records of its upstream calls (``attempts``, new rows) and, with ``settlement``, the
        quota hold settled, in one transaction."""
        raise NotImplementedError

    async def stop_requested(self, generation_ids: Iterable[UUID]) -> dict[UUID, str]:
        """Which of ``generation_ids`` carry the durable Stop flag, each with why (the
        ``error_type`` the Stop wrote)."""
        raise NotImplementedError

    async def watched_since(self, generation_id: UUID, seconds: float) -> bool:
        """Whether a page has shown the generation within the last ``seconds``."""
        raise NotImplementedError

    async def follow(self, generation_id: UUID) -> Generation:
        """The generation as stored now, for a page following it (noting that it watches)."""
        raise NotImplementedError

    async def owns(self, generation_id: UUID, user_id: Any) -> bool:
        """Whether the generation exists and is the user's."""
        raise NotImplementedError

    async def request_stop(self, generation_id: UUID, *, reason: str, error_type: str,
                           settlement: Settlement) -> Generation | None:
        """Write the durable Stop flag with why. A generation nobody streams yet is cancelled
        with it, its hold settled by ``settlement``: then it is returned."""
        raise NotImplementedError
