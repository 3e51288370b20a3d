"""Resources kept per event loop (the upstream connection pool, the PostgreSQL pools), closed
when their loop shuts down.

An event loop has no close hook, but every runner that ends a loop properly
(``asyncio.run``, asgiref's ``async_to_sync``, uvicorn, Django's test client) first calls
``loop.shutdown_asyncgens()``, which closes each async generator the loop has seen. A
generator suspended in ``try: yield`` with the closing in its ``finally`` is therefore called at
shutdown. Without it, a loop that ends with idle keep-alive connections (a server shutting
down; a WSGI site, whose async views each run on a loop of their own) leaves their sockets open
until the garbage collector finds them.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable

# The loop holds its async generators weakly: they are held here, per loop.
_held: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[AsyncGenerator[None, None]]] = (
    weakref.WeakKeyDictionary())


async def close_at_shutdown(close: Callable[[], Awaitable[object]]) -> None:
    """Await ``close()`` when the running loop shuts down."""
    closer = _closer(close)
    await closer.__anext__()  # now suspended at its yield, and known to the loop
    _held.setdefault(asyncio.get_running_loop(), []).append(closer)


async def _closer(close: Callable[[], Awaitable[object]]) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        await close()
