"""SQLite: the streams' writes on one thread of their own, which keeps its connection while
writes wait and closes it once none does."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connections
from django.db.backends.signals import connection_created

from chatstream import store
from chatstream.models import Generation

from .conftest import in_thread
from .test_fast_streams import pending_in

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sqlite() -> store.SqliteStore:
    found = store.for_alias("default")
    assert isinstance(found, store.SqliteStore)
    return found


def test_a_burst_of_claims_takes_each_once_on_one_connection_closed_once_idle(sqlite):
    generations = [pending_in("default") for _ in range(40)]
    opened: list[str] = []

    def count(sender: Any, connection: Any, **kwargs: Any) -> None:
        opened.append(threading.current_thread().name)

    async def burst() -> list[Any]:
        import asyncio

        asks = [(g.pk, g.user_id) for g in generations] * 2  # each asked twice
        return await asyncio.gather(*(sqlite.claim(pk, user) for pk, user in asks))

    connection_created.connect(count)
    try:
        got = in_thread(async_to_sync(burst))
    finally:
        connection_created.disconnect(count)
    won = sorted(str(claimed.pk) for claimed in got if claimed is not None)
    assert won == sorted(str(g.pk) for g in generations)  # each exactly once
    assert set(Generation.objects.values_list("status", flat=True)) == {"streaming"}
    # One connection for the whole burst (a few at most, should the writer catch up with
    # the claims being asked), opened by the writer's thread.
    assert 1 <= len(opened) <= 3 and set(opened) == {"chatstream-sqlite-default_0"}
    # Idle again: the writer's connection is closed.
    assert sqlite._writer.submit(lambda: connections["default"].connection is None).result()


def test_a_write_that_fails_closes_the_connection_and_the_next_one_works(sqlite):
    generation = pending_in("default")

    def broken() -> None:
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT no_such_column FROM chatstream_generation")

    async def writes() -> Any:
        with pytest.raises(Exception, match="no_such_column"):
            await sqlite._write(broken)
        return await sqlite.claim(generation.pk, generation.user_id)

    assert in_thread(async_to_sync(writes)).pk == generation.pk
    assert sqlite._writer.submit(lambda: connections["default"].connection is None).result()
