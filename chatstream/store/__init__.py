"""The stream's database side: one :class:`Store` per database alias, chosen once.

A stream's database work (the claim, its checkpoints, the final save, ownership, following,
Stop) goes through :func:`for_alias`: the ORM on the shared executor (:class:`OrmStore`, every
database Django supports) or, on PostgreSQL with psycopg 3, the same statements sent on the
event loop (:class:`PostgresStore`). The guarantees are the store's, whichever it is: one claim
per generation across processes, bounded writes, the outcome and its quota settlement in one
transaction.

Other reads on a stream's start (its session, the JSON API's rate-limit headers) use the same
means: a queryset the ORM builds once with a :class:`Slot` for each value (:func:`compiled`),
read through Django's connection (:func:`fetch`) or on the loop (``PostgresStore.rows``), its
rows converted as the ORM converts them (:func:`from_row`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from django.db import router
from django.db.models import Model

from ..models import Generation
from ._base import Settlement, Store
from ._fallback import finish_anyway
from ._orm import OrmStore, cancel_pending, claim, mark_watched, request_stop, save_reply
from ._postgres import PostgresStore, usable
from ._sql import WORKER, Slot, built, compiled, fetch, instance_from_row

__all__ = [
    "WORKER",
    "OrmStore",
    "PostgresStore",
    "Settlement",
    "Slot",
    "Store",
    "aclose",
    "cancel_pending",
    "claim",
    "compiled",
    "fetch",
    "finish_anyway",
    "for_alias",
    "from_row",
    "mark_watched",
    "request_stop",
    "save_reply",
]

M = TypeVar("M", bound=Model)

_stores: dict[str, Store] = {}


def for_alias(db: str | None = None) -> Store:
    """The store of database alias ``db`` (by default, where the router writes generations)."""
    db = db or router.db_for_write(Generation)
    found = _stores.get(db)
    if found is None:
        found = _stores[db] = PostgresStore(db) if built(usable, db) else OrmStore(db)
    return found


async def aclose() -> None:
    """Close the running loop's database pools now (each is closed with its loop anyway)."""
    for found in list(_stores.values()):
        if isinstance(found, PostgresStore):
            await found.aclose()


def from_row(model: type[M], db: str, row: Sequence[Any]) -> M:
    """A ``model`` instance from a row of its concrete columns (in field order) that a store
    read, converted as the ORM converts what it reads."""
    return built(instance_from_row, model, db, row)
