"""chatstream.store._pool: the async PostgreSQL pool a stream's claim, checkpoints and final save
use, against the machine's PostgreSQL."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from django.conf import settings as django_settings

from chatstream.store._pool import Pool, PoolClosed


@pytest.fixture
async def connect(require_service: Any) -> AsyncIterator[Callable[[], Any]]:
    """A connect function for the pool that counts the connections it made (and closes any
    a failing test left open)."""
    import psycopg

    require_service("PostgreSQL", lambda: "postgres" in django_settings.DATABASES)
    made: list[Any] = []
    connecting = [0, 0]  # now, most at once

    async def connect() -> Any:
        connecting[0] += 1
        connecting[1] = max(connecting)
        try:
            made.append(await psycopg.AsyncConnection.connect(
                os.environ["CHATSTREAM_TEST_POSTGRES"], autocommit=True))
        finally:
            connecting[0] -= 1
        return made[-1]

    connect.made = made  # type: ignore[attr-defined]
    connect.most_at_once = lambda: connecting[1]  # type: ignore[attr-defined]
    yield connect
    for connection in made:
        await connection.close()


async def pid(pool: Pool) -> int:
    async with pool.connection() as connection:
        return int(connection.info.backend_pid)


async def test_a_connection_is_made_once_and_then_reused(connect):
    pool = Pool(connect, max_size=4)
    assert {await pid(pool) for _ in range(5)} == {connect.made[0].info.backend_pid}
    assert len(connect.made) == 1
    await pool.close()
    assert connect.made[0].closed


async def test_no_more_than_max_size_connections_made_one_at_a_time_and_waiting_tasks_get_them(
        connect):
    pool = Pool(connect, max_size=3)
    running = 0
    most = 0

    async def statement() -> None:
        nonlocal running, most
        async with pool.connection() as connection:
            running += 1
            most = max(most, running)
            await connection.execute("SELECT pg_sleep(0.02)")
            running -= 1

    await asyncio.gather(*(statement() for _ in range(20)))
    assert most == 3  # the pool grew while tasks waited, to its size and no further
    assert len(connect.made) == 3
    assert connect.most_at_once() == 1
    await pool.close()


async def test_a_connection_left_in_a_transaction_is_closed_not_reused(connect):
    pool = Pool(connect, max_size=1)
    async with pool.connection() as connection:
        await connection.execute("BEGIN")
        await connection.execute("SELECT 1")
    assert connection.closed
    async with pool.connection() as again:
        assert again is not connection
        assert (await (await again.execute("SELECT 1")).fetchone()) == (1,)
    await pool.close()


async def test_a_cancelled_statement_leaves_the_pool_usable(connect):
    pool = Pool(connect, max_size=1)

    async def sleeper() -> None:
        async with pool.connection() as connection:
            await connection.execute("SELECT pg_sleep(10)")

    task = asyncio.ensure_future(sleeper())
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with asyncio.timeout(5), pool.connection() as connection:  # its place is free again
        # psycopg cancels the statement on the server; the connection comes back idle, or
        # (in any other state) is closed and replaced.
        assert (await (await connection.execute("SELECT 1")).fetchone()) == (1,)
    assert sum(not made.closed for made in connect.made) == 1
    await pool.close()


async def test_a_waiting_task_cancelled_as_it_is_handed_a_connection_passes_it_on(connect):
    pool = Pool(connect, max_size=1)
    holder = pool.connection()
    held = await holder.__aenter__()
    waiters = [asyncio.ensure_future(pid(pool)) for _ in range(2)]
    await asyncio.sleep(0.05)  # both wait
    await holder.__aexit__(None, None, None)  # handed to the first waiter ...
    waiters[0].cancel()  # ... which is cancelled before it runs
    async with asyncio.timeout(5):
        assert await waiters[1] == held.info.backend_pid
    assert waiters[0].cancelled()
    assert len(connect.made) == 1
    await pool.close()


async def test_a_failed_connect_gives_its_place_back(connect):
    failures = [RuntimeError("the server is down")]

    async def flaky() -> Any:
        if failures:
            raise failures.pop()
        return await connect()

    pool = Pool(flaky, max_size=1)
    with pytest.raises(RuntimeError, match="down"):
        await pid(pool)
    async with asyncio.timeout(5):
        assert await pid(pool) == connect.made[0].info.backend_pid
    await pool.close()


async def test_connections_idle_longer_than_max_idle_are_closed(connect):
    pool = Pool(connect, max_size=2, max_idle=0.05)
    first = await pid(pool)
    await asyncio.sleep(0.1)
    assert await pid(pool) != first
    assert connect.made[0].closed
    await pool.close()


async def test_a_closed_pool_fails_its_waiters_and_closes_what_comes_back(connect):
    pool = Pool(connect, max_size=1)
    holder = pool.connection()
    held = await holder.__aenter__()
    waiter = asyncio.ensure_future(pid(pool))
    await asyncio.sleep(0.05)
    await pool.close()
    with pytest.raises(PoolClosed):
        await waiter
    assert not held.closed  # lent: still in use ...
    await holder.__aexit__(None, None, None)
    assert held.closed  # ... and closed as it comes back
    with pytest.raises(PoolClosed):
        await pid(pool)


# A loop that ends while a connection is being made (a worker shutting down during a burst of
# stream starts). Run in a child process: the failure is a hang.
SHUTDOWN_MID_CONNECT = """
import asyncio, os, sys
import psycopg

URL = os.environ["CHATSTREAM_TEST_POSTGRES"]


async def ours():
    import django

    django.setup()  # the test run's settings (DJANGO_SETTINGS_MODULE)
    from chatstream.store._pool import Pool

    pool = Pool(lambda: psycopg.AsyncConnection.connect(URL, autocommit=True), max_size=4)
    asyncio.ensure_future(pool.connection().__aenter__())  # a stream waiting for a connection
    await asyncio.sleep(0)  # its connect has begun; the loop now ends


async def psycopg_pool():
    from psycopg_pool import AsyncConnectionPool

    pool = AsyncConnectionPool(URL, min_size=4, open=False, kwargs={"autocommit": True})
    await pool.open()  # its workers begin to connect; the loop now ends
    await asyncio.sleep(0)


for _ in range(5):
    asyncio.run({"ours": ours, "psycopg_pool": psycopg_pool}[sys.argv[1]]())
print("ended")
"""


def shut_down_mid_connect(which: str) -> bool:
    """Whether five event loops, each ending while ``which`` pool makes connections, ended."""
    import subprocess
    import sys

    try:
        done = subprocess.run([sys.executable, "-c", SHUTDOWN_MID_CONNECT, which],
                              capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    assert done.returncode == 0, done.stderr
    return done.stdout.strip() == "ended"


def test_a_loop_that_ends_while_the_pool_connects_ends(require_service):
    require_service("PostgreSQL", lambda: "postgres" in django_settings.DATABASES)
    assert shut_down_mid_connect("ours")


def test_psycopg_pool_still_keeps_such_a_loop_from_ending(require_service):
    """Why chatstream has a pool of its own: psycopg_pool's workers catch the cancellation of
    a loop's shutdown mid-connect and try again, so the loop never ends. When this fails,
    psycopg_pool has fixed it: use its ``AsyncConnectionPool`` and delete ``_pool.py``."""
    require_service("PostgreSQL", lambda: "postgres" in django_settings.DATABASES)
    assert not shut_down_mid_connect("psycopg_pool")
